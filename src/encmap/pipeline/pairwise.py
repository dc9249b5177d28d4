"""Step of rule ``pairwise``: exact QRE (both directions) and linear CKA between every two encoders.

The results store one fingerprint per encoder and a code/params key (:mod:`encmap.artifacts.paircache`),
so a rerun recomputes only the pairs that involve a changed encoder.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from .. import __version__
from ..artifacts.embeddings import check_is_encoder, stale_sentences
from ..artifacts.features import read_feature_matrix
from ..artifacts.paircache import code_key, content_checksum, fingerprints, previous_matrices, reuse_index, reuse_pairs
from ..artifacts.pip import load_spectrum, read_pip_source
from ..io import atomic_write_json, read_h5, write_h5
from ..qre.spectrum import Spectrum
from ..similarity.blocks import MEASURES, pair_flop, pair_measures
from ..validation import EncmapError


#: PIP sources read ahead of the device on the GPU route: each holds one encoder's embeddings
#: (n d x 8 bytes, 61 MB at n = 10,000, d = 768); a few keep the reads ahead of a fast card.
PREFETCH = 4


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
              dev: str, block_columns: int, threads: int | None, memory_bytes: float | None, code: str,
              torch_device: str | None = None) -> None:
    """``torch_device``: run the device route (U derived in torch, reads ahead) on this torch
    device although ``dev`` is not CUDA (the tests' way to run it on a CPU)."""
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
    t_step = time.perf_counter()
    if dev.startswith("cuda") or torch_device is not None:
        # U is derived on the device; the embeddings are read (and hashed) a few encoders ahead,
        # in threads, while the device derives and multiplies: the host only reads.
        with _Prefetch([by_id[ids[i]] for i in sorted(need)], ahead=PREFETCH, threads=threads) as reads:
            sources = {i: partial(reads.get, by_id[ids[i]]) for i in need}
            t0 = time.perf_counter()
            res = pair_measures(specs, eps=eps, todo=todo, block_columns=block_columns,
                                device=torch_device or dev, sources=sources)
            seconds = time.perf_counter() - t0
        waited, spilled = reads.waited, False
    else:
        res, seconds, waited, spilled = _on_cpu(specs, need, by_id, ids, out_qre, todo, eps=eps, block_columns=block_columns,
                                       threads=threads, memory_bytes=memory_bytes)
    step_seconds = time.perf_counter() - t_step
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
                               "step_seconds": round(step_seconds, 3), "waiting_for_reads_seconds": round(waited, 3),
                               "u_spilled_to_disk": spilled,
                               "block_columns": block_columns,
                               "gflop_per_s": round(flop / 1e9 / max(seconds, 1e-9), 2) if computed else None})


def _on_cpu(specs: list, need: set, by_id: dict, ids: list, out_qre: str, todo: np.ndarray, *, eps: float,
            block_columns: int, threads: int | None, memory_bytes: float | None) -> tuple[dict, float, float, bool]:
    """NumPy route: every needed U derived on read (spilled to a memory-mapped scratch file when
    they exceed ``memory_bytes``), then the blocks. Returns the measures, the seconds of the
    blocks and of the reads, and whether the U's were spilled."""
    u_bytes = sum(s.U.size * 8 for i, s in enumerate(specs) if i in need)
    if memory_bytes is None:
        memory_bytes = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    spill = Path(out_qre).parent / f".{Path(out_qre).name}.u.tmp" if u_bytes > memory_bytes else None
    try:
        t0 = time.perf_counter()
        for i in sorted(need):
            specs[i] = load_spectrum(by_id[ids[i]])[0]
            if spill is not None:
                specs[i] = _spilled(specs[i], spill / f"{i}.npy")
        t1 = time.perf_counter()
        with threadpool_limits(threads):
            res = pair_measures(specs, eps=eps, todo=todo, block_columns=block_columns)
        return res, time.perf_counter() - t1, t1 - t0, spill is not None
    finally:
        del specs[:]
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)


class _Prefetch:
    """Read PIP sources (:func:`~encmap.artifacts.pip.read_pip_source`) in threads, at most
    ``ahead`` beyond the last one taken, in the given order; :meth:`get` waits for one (or reads
    it now when it was taken before: the device had no room to keep its U)."""

    def __init__(self, order: list[str], *, ahead: int, threads: int | None):
        self.order, self.ahead = list(order), max(1, ahead)
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(self.ahead, threads or os.cpu_count() or 1)))
        self.futures: dict[str, Future] = {}
        self.next = 0
        self.waited = 0.0
        self._fill()

    def _fill(self) -> None:
        while self.next < len(self.order) and len(self.futures) < self.ahead:
            path = self.order[self.next]
            self.futures[path] = self.pool.submit(read_pip_source, path)
            self.next += 1

    def get(self, path: str):
        t0 = time.perf_counter()
        future = self.futures.pop(path, None)
        source = future.result()[0] if future is not None else read_pip_source(path)[0]
        self._fill()
        self.waited += time.perf_counter() - t0
        return source

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for f in self.futures.values():
            f.cancel()
        self.pool.shutdown(wait=True)


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
