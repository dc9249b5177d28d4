"""QRE features: factored route vs eigh of the dense n x n PIP, measured side by side.

Prints, per (n, d): time of the factored route (Gram-eigh and thin SVD), time of the dense
route, their ratio, the max relative difference of the features, and peak memory of each route
(tracemalloc sees NumPy's buffers). Ends with an extrapolation to 1,101 encoders x 10,000
sentences on this machine.

    python benchmarks/bench_qre.py                 # full grid (dense n = 10,000 takes minutes)
    python benchmarks/bench_qre.py --quick         # small grid for a smoke run
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from encmap.qre.features import qre_features
from encmap.qre.reference import dense_qre_features
from encmap.qre.spectrum import factor_pip


def embeddings(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Anisotropic float32 embeddings like a real encoder's (decaying spectrum, a common mean)."""
    rng = np.random.default_rng(seed)
    scales = 1.0 / np.sqrt(1.0 + np.arange(d))
    E = rng.standard_normal((n, d)) * scales + 0.5 * rng.standard_normal(d) * scales
    return E.astype(np.float32)


def measure(fn, *args, **kw):
    tracemalloc.start()
    t = time.perf_counter()
    out = fn(*args, **kw)
    dt = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, dt, peak / 2**20


def factored(E, method):
    return qre_features(factor_pip(E, method=method), eps=1e-6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    # (n, d, run the dense route). The dense route is eigh of the n x n PIP: its cost depends on
    # n only, so at n = 10,000 it runs for two widths and the other rows reuse the first one's
    # time (marked *); their accuracy is checked against the factored SVD route instead.
    if args.quick:
        grid = [(1000, 384, True), (2000, 768, True)]
    else:
        grid = [(10000, 768, True), (10000, 4096, True), (10000, 384, False), (10000, 1024, False),
                (1000, 768, True), (2000, 768, True), (4000, 768, True)]
    rows = []
    print(f"{'n':>6} {'d':>5} {'gram s':>8} {'svd s':>8} {'dense s':>9} {'dense/gram':>10} {'dense/svd':>9} "
          f"{'max rel diff':>12} {'gram MB':>8} {'svd MB':>8} {'dense MB':>9}")
    dense_time: dict[int, tuple[float, float]] = {}
    for n, d, dense in grid:
        E = embeddings(n, d)
        fg, tg, mg = measure(factored, E, "gram")
        fs, ts, ms = measure(factored, E, "svd")
        if dense:
            fd, td, mdn = measure(dense_qre_features, E, eps=1e-6)
            dense_time.setdefault(n, (td, mdn))
            mark = " "
        else:
            fd = fs
            td, mdn = dense_time[n]
            mark = "*"
        diff = float(max(np.max(np.abs(fg - fd) / np.abs(fd)), np.max(np.abs(fs - fd) / np.abs(fd))))
        row = dict(n=n, d=d, gram_s=tg, svd_s=ts, dense_s=td, dense_measured=dense, ratio_gram=td / tg,
                   ratio_svd=td / ts, max_rel_diff=diff, gram_mb=mg, svd_mb=ms, dense_mb=mdn)
        rows.append(row)
        print(f"{n:>6} {d:>5} {tg:>8.2f} {ts:>8.2f} {td:>8.2f}{mark} {td / tg:>10.1f} {td / ts:>9.1f} "
              f"{diff:>12.2e} {mg:>8.0f} {ms:>8.0f} {mdn:>8.0f}{mark}", flush=True)
    # The pipeline's route is factor_pip(method="auto") = SVD: extrapolate from its times.
    big = max(x["n"] for x in rows)
    per = {r["d"]: r["svd_s"] for r in rows if r["n"] == big}
    d0 = 768 if 768 in per else max(per)
    total_h = 1101 * per[d0] / 3600
    print(f"\nExtrapolation (SVD route): 1,101 encoders x n = {big}: {per[d0]:.2f} s each at d = {d0} -> "
          f"{total_h:.2f} h; at d = {max(per)} ({per[max(per)]:.1f} s each) -> {1101 * per[max(per)] / 3600:.1f} h "
          "(features only, embedding not included)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "extrapolated_hours_1101": total_h}, fh, indent=2)


if __name__ == "__main__":
    main()
