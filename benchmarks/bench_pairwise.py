"""Exact pairwise QRE + linear CKA at scale: blocked GEMMs vs the machine's dgemm floor.

Every pair (i < j) needs C = U_iᵀ U_j: 2 n Σ_{i<j} r_i r_j FLOP in all. The floor is that count
at this machine's measured dgemm rate (one large float64 GEMM of the same inner size n). Measured
side by side in one run, on m synthetic spectra (seeded, ranks drawn from a spread of widths):

- ``blocked``: :func:`encmap.pairs.pair_measures` as the pipeline runs it (NumPy/BLAS);
- ``former``: the code this replaced, one GEMM and one Python-level reduction per pair;
- ``torch``: the blocked route on CUDA (float64), against torch's own float64 GEMM rate there;
- ``one changed``: only the pairs of one encoder (what a rerun after changing it computes).

Then extrapolates to 1,101 encoders with the same rank mix, from the measured efficiency.

    python benchmarks/bench_pairwise.py --m 53 --n 10000
    python benchmarks/bench_pairwise.py --m 300 --n 10000 --skip-cpu     # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from encmap.qre.pairwise import PreparedSpectrum, qre_both
from encmap.qre.spectrum import Spectrum
from encmap.similarity.blocks import BLOCK_COLUMNS, pair_flop, pair_measures
from encmap.similarity.cka import CKAFactor, cka_from_product

WIDTHS = (64, 128, 256, 384, 512, 768)
METHOD_M = 1101


def spectra(m: int, n: int, seed: int = 0) -> list[Spectrum]:
    """m spectra with ranks from :data:`WIDTHS` (U Gaussian / √n: the timing does not need exact orthonormality)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in rng.choice(WIDTHS, size=m).tolist():
        lam = np.sort(rng.random(r))[::-1] + 1e-3
        out.append(Spectrum(U=rng.standard_normal((n, r)) / np.sqrt(n), lam=lam / lam.sum(), trace=1.0))
    return out


def former(specs: list[Spectrum], eps: float) -> np.ndarray:
    """The former route (before the blocks), for comparison: C = U_iᵀ U_j and its reductions pair by pair."""
    m = len(specs)
    prep = [PreparedSpectrum(s, eps) for s in specs]
    fac = [CKAFactor(s.U, s.lam) for s in specs]
    q = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            C = specs[i].U.T @ specs[j].U
            q[i, j], q[j, i] = qre_both(prep[i], prep[j], eps, 1e-8, C)
            cka_from_product(C, fac[i], fac[j])
    return q


def dgemm_rate(n: int, k: int = 4096, device: str | None = None, repeats: int = 3) -> float:
    """FLOP/s of one float64 (k x n) @ (n x k) GEMM, best of ``repeats``."""
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((n, k)), rng.standard_normal((n, k))
    if device is not None:
        import torch

        A, B = torch.as_tensor(A, device=device), torch.as_tensor(B, device=device)
    best = np.inf
    for _ in range(repeats):
        if device is not None:
            torch.cuda.synchronize()
        t = time.perf_counter()
        C = A.T @ B
        if device is not None:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    del C
    return 2.0 * n * k * k / best


def timed(fn, *args, **kw) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=53)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--block-columns", type=int, default=BLOCK_COLUMNS)
    ap.add_argument("--skip-cpu", action="store_true", help="only the GPU route (large m)")
    ap.add_argument("--skip-former", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    specs = spectra(args.m, args.n)
    ranks = [s.rank for s in specs]
    m, n = args.m, args.n
    flop = pair_flop(ranks, n, np.ones((m, m), bool))
    r = np.array(ranks, float)
    # The same rank mix at the method's scale: E[Σ_{i<j} r_i r_j] = M(M-1)/2 · E[r]² (independent draws).
    flop_method = 2.0 * n * METHOD_M * (METHOD_M - 1) / 2 * r.mean() ** 2
    res: dict = {"m": m, "n": n, "pairs": m * (m - 1) // 2, "mean_rank": float(r.mean()), "gflop": flop / 1e9,
                 "block_columns": args.block_columns, "method_pflop": flop_method / 1e15}
    print(f"m = {m} encoders, n = {n}, ranks from {WIDTHS} (mean {r.mean():.0f}): {res['pairs']:,} pairs, "
          f"{flop / 1e9:,.0f} GFLOP of U_i^T U_j")
    one = np.zeros((m, m), bool)
    one[0, 1:] = True  # encoder 0 changed: its m - 1 pairs
    routes = []
    if not args.skip_cpu:
        rate = dgemm_rate(n)
        res["cpu_dgemm_gflops"] = rate / 1e9
        full, t_block = timed(pair_measures, specs, eps=1e-6, block_columns=args.block_columns)
        routes.append(("cpu", "blocked", t_block, rate))
        if not args.skip_former:
            pp, t_pair = timed(former, specs, 1e-6)
            routes.append(("cpu", "former", t_pair, rate))
            res["former_max_rel_diff"] = float(np.nanmax(np.abs(pp - full["qre"]) / np.abs(full["qre"]).clip(1e-300)))
        _, t_one = timed(pair_measures, specs, eps=1e-6, block_columns=args.block_columns, todo=one)
        res["cpu_one_changed_s"] = t_one
        res["cpu_one_changed_pairs"] = int(one.sum())
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        grate = dgemm_rate(n, device="cuda")
        res["gpu_dgemm_gflops"] = grate / 1e9
        res["gpu_name"] = torch.cuda.get_device_name()
        pair_measures(specs[:3], eps=1e-6, device="cuda")  # warm-up: CUDA context, cuBLAS handles
        torch.cuda.synchronize()
        g, t_gpu = timed(pair_measures, specs, eps=1e-6, block_columns=args.block_columns, device="cuda")
        routes.append(("gpu", "blocked", t_gpu, grate))
        if not args.skip_cpu:
            res["gpu_vs_cpu_max_rel_diff"] = float(np.nanmax(np.abs(g["qre"] - full["qre"]) / np.abs(full["qre"]).clip(1e-300)))
        _, t_one = timed(pair_measures, specs, eps=1e-6, block_columns=args.block_columns, todo=one, device="cuda")
        res["gpu_one_changed_s"] = t_one
    for where, name, t, rate in routes:
        floor = flop / rate
        res[f"{where}_{name.replace(' ', '_')}"] = {"seconds": t, "floor_seconds": floor, "ratio": t / floor,
                                                     "gflops": flop / t / 1e9}
        print(f"  {where} {name:9s}: {t:8.2f} s = {flop / t / 1e9:8.1f} GFLOP/s; dgemm floor {floor:8.2f} s "
              f"({rate / 1e9:,.0f} GFLOP/s) -> {t / floor:.2f}x the floor; 1,101 encoders at this efficiency: "
              f"{flop_method / (flop / t) / 3600:.2f} h")
    for where in ("cpu", "gpu"):
        if f"{where}_one_changed_s" in res:
            print(f"  {where} one changed encoder ({m - 1} pairs): {res[f'{where}_one_changed_s']:.2f} s")
    for k in ("former_max_rel_diff", "gpu_vs_cpu_max_rel_diff"):
        if k in res:
            print(f"  {k.replace('_', ' ')} of the QRE matrix: {res[k]:.1e}")
    print(f"  1,101 encoders x n = {n} with this rank mix: {flop_method / 1e15:.2f} PFLOP")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
