"""What stitching costs: every method and MLP depth timed on a sample of pairs, then extrapolated.

Reads a finished run (``DIR/results/features/qre.h5`` and the embeddings), draws ``--pairs``
ordered pairs of encoders (seeded) from the configured subset, and times each stitch method
and each MLP depth on them with the params' sentence sample, split and training settings, one
pair at a time (no stacking of targets, so the figures are per pair). Prints seconds per pair
per method and the extrapolated cost of (a) the default subset with every MLP depth 0-6 and
(b) the full sweep: all m (m - 1) ordered pairs of the map, every method and depth.

    python benchmarks/bench_stitch.py --run . --pairs 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from encmap.artifacts.features import read_feature_matrix
from encmap.params import load_params
from encmap.similarity.stitch import fit_predict, judged, split_rows
from encmap.similarity.subset import select_pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, default=Path("."), help="a finished run (repo root)")
    ap.add_argument("--params", type=Path, default=None, help="params file (default: RUN/params.yaml)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--depths", default="0,1,2,3,4,5,6")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import h5py

    sim = load_params(a.params or a.run / "params.yaml")["similarity"]
    st = sim["stitch"]
    fm = read_feature_matrix(a.run / "results/features/qre.h5")
    recs = {r["id"]: r for r in fm["records"]}
    ids, pairs = select_pairs(fm["records"], sim["subset"]["groups"], sim["subset"]["encoders"])
    rng = np.random.default_rng(a.seed)
    sample = [pairs[i] for i in sorted(rng.choice(len(pairs), size=min(a.pairs, len(pairs)), replace=False))]
    n = fm["F"].shape[1]
    rows = np.sort(np.random.default_rng([st["seed"], 0]).choice(n, size=min(st["sample"], n), replace=False))
    split = split_rows(len(rows), val=st["val"], test=st["test"], random_state=st["seed"])

    def load(e: str) -> np.ndarray:
        with h5py.File(a.run / "results/embeddings" / recs[e]["model"] / f"{e}.h5", "r") as f:
            return f["embeddings"][()].astype(np.float64)[rows]

    jobs = [(m, None) for m in ("affine", "ridge", "procrustes", "mean", "random-source")]
    jobs += [("mlp", int(d)) for d in a.depths.split(",")]
    secs: dict[str, list[float]] = {}
    r2: dict[str, list[float]] = {}
    for s, t in sample:
        X, Y = load(s), load(t)
        for method, depth in jobs:
            label = f"mlp{depth}" if method == "mlp" else method
            t0 = time.perf_counter()
            P, extra = fit_predict(X, Y, method, split, depth=depth or 0, alphas=st["ridge_alphas"],
                                   random_state=st["seed"], mlp=st["mlp"])
            res = judged(Y[split.test], P, extra, k=st["knn_k"])
            secs.setdefault(label, []).append(time.perf_counter() - t0)
            r2.setdefault(label, []).append(res["r2"])
    per_pair = {k: float(np.mean(v)) for k, v in secs.items()}
    linear = sum(v for k, v in per_pair.items() if not k.startswith("mlp"))
    mlp_all = sum(v for k, v in per_pair.items() if k.startswith("mlp"))
    m = len(fm["ids"])
    out = {
        "pairs_timed": [f"{s} -> {t}" for s, t in sample], "sentences": len(rows), "train": len(split.train),
        "seconds_per_pair": {k: round(v, 3) for k, v in per_pair.items()},
        "mean_r2": {k: round(float(np.mean(v)), 4) for k, v in r2.items()},
        "subset_pairs": len(pairs),
        "subset_all_depths_minutes": round(len(pairs) * (linear + mlp_all) / 60, 1),
        "map_pairs": m * (m - 1),
        "full_sweep_hours": round(m * (m - 1) * (linear + mlp_all) / 3600, 2),
        "full_sweep_linear_only_hours": round(m * (m - 1) * linear / 3600, 2),
        "note": "one pair at a time; the stitch stage stacks a source's targets for affine, ridge and the controls",
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
