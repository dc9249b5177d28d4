"""WordNet (Debian ``wordnet-base``): synsets, their definitions and example sentences."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..validation import EncmapError
from .candidates import INSTALL_HINT, WORDNET_DIR, Candidate


@dataclass(frozen=True)
class Synset:
    """One WordNet synset as ``data.<pos>`` records it."""

    pos: str            # noun | verb | adj | adv
    offset: str         # byte offset in data.<pos>: the synset's id within its part of speech
    lexfile: int        # lexicographer file number (0-44, names in the lexnames(5WN) manual)
    definition: str     # the gloss without its examples
    examples: tuple[str, ...]  # quoted example sentences, as written


def wordnet_synsets(name: str, path: str | None = None) -> Iterator[Synset]:
    """Every synset of WordNet's ``data.noun|verb|adj|adv`` files under ``path``."""
    root = Path(path or WORDNET_DIR)
    files = [root / f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise EncmapError(f"source {name!r}: {missing[0]} not found; install: {INSTALL_HINT['wordnet']}")
    for f in files:
        with open(f, encoding="utf-8", errors="strict") as fh:
            for line in fh:
                if line.startswith("  ") or " | " not in line:
                    continue  # licence header
                offset, lexfile = line.split(" ", 2)[:2]
                gloss = line.split(" | ", 1)[1].strip()
                examples = tuple(ex.strip() for ex in re.findall(r'"([^"]+)"', gloss) if ex.strip())
                definition = re.sub(r'"[^"]*"', "", gloss).strip(" ;")
                yield Synset(f.suffix[1:], offset, int(lexfile), definition, examples)


def as_sentence(example: str) -> str:
    """WordNet writes examples lower-case without a final stop; make them sentences."""
    ex = example[0].upper() + example[1:]
    return ex if ex[-1] in ".!?" else ex + "."


def read_wordnet(name: str, path: str | None = None) -> Iterator[Candidate]:
    """Example sentences of WordNet synsets (quoted text after ' | ' in data.*)."""
    for syn in wordnet_synsets(name, path):
        for ex in syn.examples:
            yield Candidate(as_sentence(ex), name, f"{syn.pos}.{syn.lexfile:02d}", f"{syn.pos}:{syn.offset}")
