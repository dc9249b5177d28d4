"""Curation: clean, filter, de-duplicate and sample the probe sentences, stratified by source and genre.

Curation is a pure function of the candidates and the params, so the same params give
byte-identical files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from ..validation import EncmapError
from .candidates import Candidate
from .cleaning import clean, keep, normalise_key


@dataclass(frozen=True)
class CuratedSet:
    """The curated sentences and their manifest rows (same order)."""

    sentences: list[str]
    manifest: list[dict[str, str]]

    def text(self) -> str:
        return "".join(s + "\n" for s in self.sentences)

    def sha256(self) -> str:
        return hashlib.sha256(self.text().encode("utf-8")).hexdigest()


def curate(candidates: Iterable[Candidate], *, n: int, seed: int, min_words: int, max_words: int,
           min_alpha: float, weights: dict[str, float] | None = None) -> CuratedSet:
    """Clean, filter, de-duplicate and sample n sentences, stratified by source then genre.

    Parameters
    ----------
    candidates : iterable of Candidate
    n : int
        Sentences to draw. Fails if the pool is smaller.
    seed : int
        Seed of the sampler; the output depends on nothing else.
    weights : dict, optional
        Relative share of each source (default equal shares).

    Returns
    -------
    CuratedSet
    """
    seen_exact: set[str] = set()
    seen_norm: set[str] = set()
    pool: dict[str, dict[str, list[Candidate]]] = {}
    for c in candidates:
        t = clean(c.text)
        if not keep(t, min_words, max_words, min_alpha) or t in seen_exact:
            continue
        seen_exact.add(t)
        k = normalise_key(t)
        if k in seen_norm:
            continue
        seen_norm.add(k)
        pool.setdefault(c.source, {}).setdefault(c.genre, []).append(Candidate(t, c.source, c.genre, c.document))
    total = sum(len(v) for g in pool.values() for v in g.values())
    if total < n:
        per = {s: sum(len(v) for v in g.values()) for s, g in pool.items()}
        raise EncmapError(f"sentence sources give only {total} usable sentences after filtering and "
                          f"de-duplication ({per}), fewer than n = {n}")
    rng = np.random.default_rng(seed)
    sources = sorted(pool)
    w = np.array([float((weights or {}).get(s, 1.0)) for s in sources])
    if not np.all(np.isfinite(w) & (w > 0)):  # a NaN or infinite share never allocates: refuse, do not spin
        raise EncmapError(f"source weights must be finite and > 0, got {dict(zip(sources, w.tolist()))}")
    caps = np.array([sum(len(v) for v in pool[s].values()) for s in sources])
    quota = _allocate(n, w / w.sum(), caps)
    chosen: list[Candidate] = []
    for s, q in zip(sources, quota):
        genres = sorted(pool[s])
        gcaps = np.array([len(pool[s][g]) for g in genres])
        gquota = _allocate(int(q), np.ones(len(genres)) / len(genres), gcaps)
        for g, k in zip(genres, gquota):
            items = pool[s][g]
            idx = np.sort(rng.choice(len(items), size=int(k), replace=False))
            chosen.extend(items[i] for i in idx)
    order = rng.permutation(len(chosen))
    chosen = [chosen[i] for i in order]
    manifest = [{"id": f"s{i:05d}", "source": c.source, "genre": c.genre, "document": c.document}
                for i, c in enumerate(chosen)]
    return CuratedSet([c.text for c in chosen], manifest)


def _allocate(n: int, share: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Split n into integer quotas ∝ share, never above caps, redistributing the excess."""
    quota = np.zeros(len(share), dtype=int)
    open_ = caps > 0
    remaining = n
    while remaining > 0 and open_.any():
        s = np.where(open_, share, 0.0)
        s = s / s.sum()
        want = np.floor(s * remaining).astype(int)
        if want.sum() == 0:  # hand out the rounding remainder one by one, largest share first
            want[np.argsort(-s, kind="stable")[:remaining]] = 1
            want[~open_] = 0
        add = np.minimum(want, caps - quota)
        quota += add
        remaining -= int(add.sum())
        open_ = quota < caps
    return quota


def write_curated(cs: CuratedSet, txt_path: str | Path, manifest_path: str | Path, sha_path: str | Path) -> None:
    """Write sentences (UTF-8, one a line), the manifest (TSV) and the sha256, atomically."""
    from ..io import atomic_write_text

    atomic_write_text(txt_path, cs.text())
    rows = ["id\tsource\tgenre\tdocument"] + [
        "\t".join(r[k].replace("\t", " ") for k in ("id", "source", "genre", "document")) for r in cs.manifest
    ]
    atomic_write_text(manifest_path, "\n".join(rows) + "\n")
    atomic_write_text(sha_path, f"{cs.sha256()}  {Path(txt_path).name}\n")
