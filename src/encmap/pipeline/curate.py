"""Step of rule ``curate``: the fixed set of probe sentences (``data/sentences/<set>.*``)."""

from __future__ import annotations

from itertools import chain

from ..corpus.curation import curate, write_curated
from ..corpus.sources import read_source, source_files_tsv
from ..io import atomic_write_text


def curate_step(sentences: dict, txt: str, manifest: str, sha: str, sources: str | None = None) -> None:
    """Build the sentence set described by ``params['sentences']``.

    ``sources``: also write a TSV of every file each source was read from, with its sha256
    (what exactly went in: a Debian wordnet-base update or another Brown release shows here).
    """
    cands = chain.from_iterable(read_source(s) for s in sentences["sources"])
    weights = {s["name"]: s["weight"] for s in sentences["sources"]}
    cs = curate(cands, n=sentences["n"], seed=sentences["seed"], min_words=sentences["min_words"],
                max_words=sentences["max_words"], min_alpha=sentences["min_alpha"], weights=weights)
    table = source_files_tsv(sentences["sources"]) if sources else None
    write_curated(cs, txt, manifest, sha)
    if sources:
        atomic_write_text(sources, table)
