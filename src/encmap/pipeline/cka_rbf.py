"""Step of rule ``cka_rbf``: RBF CKA (biased, debiased) between the encoders of ``similarity.subset``.

RBF kernels need the n x n Gram matrices, so they are computed on a seeded sample of
``similarity.rbf.sample`` sentences and only over the subset. Pairs of unchanged encoders are
reused from the previous output (:mod:`encmap.artifacts.paircache`).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from .. import __version__
from ..artifacts.embeddings import read_embeddings
from ..artifacts.features import left_off, read_feature_matrix
from ..artifacts.paircache import code_key, content_checksum, previous_matrices, reuse_index, reuse_pairs
from ..io import atomic_write_json, write_h5
from ..sampling import sample_rows
from ..similarity.cka import gram_cka_matrix, rbf_gram
from ..similarity.subset import subset_on_map, subset_pairs


def cka_rbf_step(features: str, emb_dirs: list[str], out: dict[str, str], *, subset: dict[str, Any],
                 rbf: dict[str, Any], threads: int | None = None, code: str) -> None:
    """RBF CKA between every two encoders of the configured subset.

    ``out`` names ``rbf`` (HDF5: ``cka_rbf``, ``cka_rbf_debiased`` (k, k) over the subset, NaN
    for pairs not compared, with ``encoder_ids`` and the embeddings files' ``fingerprints``) and
    ``timing`` (JSON). ``subset``, ``rbf``: those parts of params.yaml's ``similarity``.

    ``code``: the hash of the stage's code digest (its rule passes it), part of the key under
    which stored pairs are reused.
    """
    fm = read_feature_matrix(features)
    subset, notes = subset_on_map(subset, fm["ids"], left_off(fm["attrs"]))
    print("".join(f"warning: {note}\n" for note in notes), end="", file=sys.stderr)
    ids, pairs = subset_pairs(fm["records"], fm["F"], subset)
    n = int(fm["F"].shape[1])
    X, fps = read_embeddings(emb_dirs, ids, {r["id"]: r for r in fm["records"]}, fm["attrs"]["sentences_sha256"], n)
    t0 = time.perf_counter()
    rbf, rbf_attrs, computed = _rbf_pairs(X, ids, fps, pairs, rbf, out["rbf"], threads, code)
    seconds = time.perf_counter() - t0
    datasets = rbf | {"encoder_ids": np.array(ids, dtype=object), "fingerprints": np.array(fps, dtype=object)}
    write_h5(out["rbf"], datasets, rbf_attrs | {
        "checksum": content_checksum(datasets, rbf_attrs["key"]), "sentences_sha256": fm["attrs"]["sentences_sha256"],
        "encmap_version": __version__,
        "note": "RBF CKA (sigma^2 = threshold^2 x median squared distance, as gram_rbf) on a seeded sample of sentences"})
    atomic_write_json(out["timing"], {"rbf_seconds": round(seconds, 3), "rbf_pairs_computed": computed,
                                      "rbf_pairs": len(pairs) // 2})


def _rbf_pairs(X: dict[str, np.ndarray], ids: list[str], fps: list[str], pairs: list[tuple[str, str]], rb: dict,
               stored: str, threads: int | None, code: str) -> tuple[dict[str, np.ndarray], dict, int]:
    """RBF CKA (biased, debiased) over the unordered pairs among ``pairs``; (k, k) matrices over ``ids``.

    Pairs of unchanged encoders come from ``stored`` (the previous output). Returns the
    matrices, the attributes to store with them and how many pairs were computed.
    """
    key = code_key(code, rb)
    k = len(ids)
    pos = {e: i for i, e in enumerate(ids)}
    wanted = np.zeros((k, k), bool)
    for a, b in pairs:
        wanted[pos[a], pos[b]] = wanted[pos[b], pos[a]] = True
    prev = previous_matrices(stored, ["cka_rbf", "cka_rbf_debiased"], key)
    idx = reuse_index(*(prev[:2] if prev else ([], [])), ids, fps)
    todo, filled = reuse_pairs(idx, wanted, prev[2] if prev else None)
    rows = sample_rows(X[ids[0]].shape[0], rb["sample"], np.random.default_rng([rb["seed"], 0]))
    need = set(np.flatnonzero(todo.any(axis=0) | todo.any(axis=1)).tolist())
    with threadpool_limits(threads):
        grams = [rbf_gram(X[e][rows], rb["threshold"]) if i in need else None for i, e in enumerate(ids)]
        rbf = {name: gram_cka_matrix(grams, debiased=deb, todo=todo)
               for name, deb in (("cka_rbf", False), ("cka_rbf_debiased", True))}
    for name in rbf:
        if name in filled:
            rbf[name] = np.where(np.isnan(rbf[name]), filled[name], rbf[name])
    attrs = {"threshold": rb["threshold"], "sample": len(rows), "seed": rb["seed"], "key": key}
    return rbf, attrs, int(todo.sum())
