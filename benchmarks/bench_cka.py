"""Linear CKA: feature-space route vs the n x n Gram route, side by side; all pairs of a run.

Prints, for n x d embeddings (default n = 10,000, d = 768 against d' = 384): the time of each
route (biased and debiased), their ratio and the largest difference of the values. With
``--run DIR`` it also times linear CKA (biased and debiased) over every pair of encoders of a
finished run (``DIR/results/features/qre.h5`` names the encoders on the map, their embeddings
are read from ``DIR/results/embeddings``).

    python benchmarks/bench_cka.py                    # routes at n = 10,000
    python benchmarks/bench_cka.py --run .            # + all pairs of the default map
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from encmap.similarity.cka import gram_cka, linear_cka, linear_cka_matrix


def embeddings(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) / np.sqrt(1.0 + np.arange(d))).astype(np.float32)


def routes(n: int, d: int, e: int) -> dict:
    X = embeddings(n, d, 0).astype(np.float64)
    Y = (np.tanh(X[:, :e] * 3) + 0.1 * embeddings(n, e, 1)).astype(np.float64)
    out: dict = {"n": n, "d": d, "d2": e}
    for debiased in (False, True):
        t = time.perf_counter()
        fast = linear_cka(X, Y, debiased=debiased)
        t_fast = time.perf_counter() - t
        t = time.perf_counter()
        slow = gram_cka(X @ X.T, Y @ Y.T, debiased=debiased)
        t_slow = time.perf_counter() - t
        key = "debiased" if debiased else "biased"
        out[key] = {"feature_s": round(t_fast, 3), "gram_s": round(t_slow, 3), "ratio": round(t_slow / t_fast, 1),
                    "value": fast, "abs_diff": abs(fast - slow)}
    return out


def all_pairs(run: Path) -> dict:
    import h5py

    with h5py.File(run / "results/features/qre.h5", "r") as f:
        recs = [json.loads(x) for x in f["encoders"][()]]
    t = time.perf_counter()
    E = []
    for r in recs:
        with h5py.File(run / "results/embeddings" / r["model"] / f"{r['id']}.h5", "r") as f:
            E.append(f["embeddings"][()].astype(np.float64))
    t_load = time.perf_counter() - t
    d = np.array([e.shape[1] for e in E], dtype=np.float64)
    n, m = E[0].shape[0], len(E)
    flop = n * (d.sum() ** 2 - (d ** 2).sum()) + 2 * n * (d ** 2).sum()  # pairs + self terms
    t = time.perf_counter()
    B, U = linear_cka_matrix(E)
    dt = time.perf_counter() - t
    return {"encoders": m, "pairs": m * (m - 1) // 2, "n": n, "load_s": round(t_load, 1), "cka_s": round(dt, 1),
            "gflop_per_s": round(flop / dt / 1e9, 1), "biased_mean_offdiag": float(B[~np.eye(m, dtype=bool)].mean()),
            "debiased_mean_offdiag": float(U[~np.eye(m, dtype=bool)].mean())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--d2", type=int, default=384)
    ap.add_argument("--run", type=Path, help="a finished run's directory: time all pairs of its map")
    a = ap.parse_args()
    print(json.dumps(routes(a.n, a.d, a.d2), indent=2))
    if a.run:
        print(json.dumps(all_pairs(a.run), indent=2))


if __name__ == "__main__":
    main()
