"""Step of rule ``pairwise``: exact QRE (both directions) and linear CKA between every two encoders.

The results store one fingerprint per encoder and a code/params key (:mod:`encmap.artifacts.paircache`),
so a rerun recomputes only the pairs that involve a changed encoder.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from .. import __version__
from ..artifacts.embeddings import check_is_encoder, stale_sentences
from ..artifacts.features import read_feature_matrix
from ..artifacts.paircache import code_key, content_checksum, fingerprints, previous_matrices, reuse_index, reuse_pairs
from ..artifacts.pip import load_spectrum
from ..io import atomic_write_json, read_h5, write_h5
from ..qre.spectrum import Spectrum
from ..similarity.blocks import MEASURES, pair_flop, pair_measures
from ..validation import EncmapError


def pairwise_step(features: str, pip_files: list[str], out_qre: str, out_cka: str, timing: str, *, eps: float,
                  device: str = "cpu", block_columns: int = 4096, threads: int | None = None,
                  memory_bytes: float | None = None, code: str) -> None:
    """Exact S(ρ_i‖ρ_j) and linear CKA between every two encoders on the map, from their stored PIPs.

    Writes ``out_qre`` (``qre`` (m, m), row i column j = S(ρ_i,ε‖ρ_j,ε)), ``out_cka`` (``cka``,
    ``cka_debiased`` (m, m)), both with ``encoder_ids`` and the PIP files' ``fingerprints``, and
    ``timing`` (JSON: seconds, pairs computed and reused, FLOP), kept apart so the matrices
    reproduce byte for byte. Pairs of unchanged encoders are taken from the previous outputs.
    ``device``: "auto" / "cuda[:k]" run the block GEMMs on a GPU when there is one (torch,
    float64); otherwise NumPy/BLAS on ``threads`` cores (MPS has no float64).
    ``memory_bytes``: when the U's to hold (n r_i x 8 bytes each) exceed this (default: half the
    machine's memory), each U is derived once into a memory-mapped scratch file beside
    ``out_qre`` (removed afterwards) and the blocks read from there: at 1,101 encoders the U's
    are ~33 GB.

    ``code``: the hash of the stage's code digest (its rule passes it): part of the key under
    which stored pairs are reused, so an edit to any file the stage runs recomputes them.
    """
    args = (features, pip_files, out_qre, out_cka, timing)
    kw = dict(eps=eps, block_columns=block_columns, threads=threads, memory_bytes=memory_bytes, code=code)
    if device == "cpu":  # no torch import
        return _pairwise(*args, dev="cpu", **kw)
    from ..device import job_device

    with job_device(device, gpu=True, what="pairwise") as dev:  # a GPU of its own on a CUDA machine
        return _pairwise(*args, dev=dev, **kw)


def _pairwise(features: str, pip_files: list[str], out_qre: str, out_cka: str, timing: str, *, eps: float,
              dev: str, block_columns: int, threads: int | None, memory_bytes: float | None, code: str) -> None:
    fm = read_feature_matrix(features)
    sha, ids = fm["attrs"]["sentences_sha256"], fm["ids"]
    by_id = {Path(f).stem: f for f in pip_files}
    missing = [e for e in ids if e not in by_id]
    if missing:
        raise EncmapError(f"{features}: encoder {missing[0]!r} is on the map but has no PIP among the inputs; "
                          "rerun the pip stage")
    for e in ids:
        attrs = read_h5(by_id[e], [])[1]
        check_is_encoder(by_id[e], attrs, e, "PIP")
        if attrs["sentences_sha256"] != sha:
            raise stale_sentences(by_id[e], "PIP", e)
    fps = fingerprints([by_id[e] for e in ids])
    key = code_key(code, {"eps": eps})
    stored = None
    prev_q = previous_matrices(out_qre, ["qre"], key)
    prev_c = previous_matrices(out_cka, ["cka", "cka_debiased"], key)
    if prev_q and prev_c and prev_q[:2] == prev_c[:2]:
        stored = prev_q[2] | prev_c[2]
    idx = reuse_index(*(prev_q[:2] if stored else ([], [])), ids, fps)
    m = len(ids)
    todo, filled = reuse_pairs(idx, np.ones((m, m), bool), stored)
    # U is derived from the embeddings on read (an SVD or a GEMM each): only for encoders with a
    # pair to compute; the others enter only through their rank (a zero-stride stand-in for U).
    need = set(np.flatnonzero(todo.any(axis=0) | todo.any(axis=1)).tolist())
    specs = [_rank_only(by_id[e]) for e in ids]
    ranks = [s.rank for s in specs]
    u_bytes = sum(s.U.size * 8 for i, s in enumerate(specs) if i in need)
    if memory_bytes is None:
        memory_bytes = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    spill = Path(out_qre).parent / f".{Path(out_qre).name}.u.tmp" if u_bytes > memory_bytes else None
    try:
        for i in sorted(need):
            specs[i] = load_spectrum(by_id[ids[i]])[0]
            if spill is not None:
                specs[i] = _spilled(specs[i], spill / f"{i}.npy")
        t0 = time.perf_counter()
        with threadpool_limits(threads):
            res = pair_measures(specs, eps=eps, todo=todo, block_columns=block_columns,
                                device=dev if dev.startswith("cuda") else None)
        seconds = time.perf_counter() - t0
    finally:
        del specs[:]
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
    for k in MEASURES:
        if k in filled:
            res[k] = np.where(np.isnan(res[k]), filled[k], res[k])
    n = int(fm["F"].shape[1])
    flop = pair_flop(ranks, n, todo)
    common = {"encoder_ids": np.array(ids, dtype=object), "fingerprints": np.array(fps, dtype=object)}
    attrs_out = {"eps": eps, "sentences_sha256": sha, "m": m, "n": n, "key": key,
                 "encmap_version": __version__}
    q = {"qre": res["qre"]} | common
    c = {"cka": res["cka"], "cka_debiased": res["cka_debiased"]} | common
    write_h5(out_qre, q, attrs_out | {"checksum": content_checksum(q, key),
                                      "note": "qre[i, j] = S(rho_i,eps || rho_j,eps), exact (factored), natural log"})
    write_h5(out_cka, c, attrs_out | {"checksum": content_checksum(c, key), "note": "linear CKA of the embeddings "
                                      "(the PIPs' kernel): biased HSIC and Song et al.'s unbiased HSIC"})
    computed = int(todo.sum())
    atomic_write_json(timing, {"pairwise_seconds": round(seconds, 3), "pairs": m * (m - 1) // 2,
                               "pairs_computed": computed, "pairs_reused": m * (m - 1) // 2 - computed,
                               "gflop": round(flop / 1e9, 3), "device": dev if dev.startswith("cuda") else "cpu",
                               "u_spilled_to_disk": spill is not None,
                               "block_columns": block_columns,
                               "gflop_per_s": round(flop / 1e9 / max(seconds, 1e-9), 2) if computed else None})


def _spilled(spec, path: Path):
    """``spec`` with U moved to a memory-mapped .npy file (read-only), its RAM freed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=spec.U.shape)
    mm[...] = spec.U
    mm.flush()
    del mm
    return Spectrum(U=np.load(path, mmap_mode="r"), lam=spec.lam, trace=spec.trace)


def _rank_only(pip_file: str):
    """A :class:`~encmap.qre.spectrum.Spectrum` with the stored λ and a zero-stride U (no memory, no SVD)."""
    data, attrs = read_h5(pip_file, ["lam"])
    return Spectrum(U=np.broadcast_to(0.0, (int(attrs["n"]), data["lam"].shape[0])), lam=data["lam"],
                    trace=float(attrs["trace"]))
