"""The conformal intervals' choices on a finished run (issue 71): for the head predictors, ridge,
model held out (``grouped``: one model at a time) and the ``frontier`` split, the coverage and mean
width of the intervals under each CV+ fold count (0: one model a fold, jackknife+ over models) and
conformity score, with the CPU seconds each costs; beside them the Spearman, MAE and mean signed
error of the predictions (the same under every choice).

Reads the run's ``results/features/qre.h5``, ``results/eval/`` and params.yaml; writes nothing.

    python benchmarks/bench_intervals.py --root . --folds 0,5,10 --scores absolute,distance
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import numpy as np
import yaml

from encmap.artifacts.features import read_feature_matrix
from encmap.downstream.intervals import coverage, heldout_intervals
from encmap.downstream.prediction import read_eval_scores, score_matrix
from encmap.downstream.regression import (cross_predict, join_blocks, outer_splits, prediction_quality,
                                          predictor_blocks, tested_rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."))
    ap.add_argument("--features", default="head,head+scale")
    ap.add_argument("--folds", default="0,5,10")
    ap.add_argument("--scores", default="absolute,distance")
    a = ap.parse_args(argv)
    params = yaml.safe_load((a.root / "params.yaml").read_text())["regress"]
    fm = read_feature_matrix(a.root / "results/features/qre.h5")
    scores, tasks = read_eval_scores(sorted(glob.glob(str(a.root / "results/eval/*"))),
                                     fm["attrs"]["sentences_sha256"], [])
    Y, g = score_matrix(fm["ids"], scores, tasks), np.array([r["model"] for r in fm["records"]])
    print(f"{len(fm['ids'])} encoders of {len(set(g))} models, {len(tasks)} tasks; level {params['intervals']['level']}")
    print("features    folds score     protocol  Spearman    MAE    bias  coverage (min)  width  CPU s")
    for fs in a.features.split(","):
        X, w = join_blocks(predictor_blocks(fs, fm["F"], fm["spectral"]))
        for folds in (int(f) for f in a.folds.split(",")):
            for score in a.scores.split(","):
                p = params | {"intervals": params["intervals"] | {"folds": folds, "score": score}}
                for protocol in ("grouped", "frontier"):
                    c, q, cov, width = time.process_time(), [], [], []
                    for t in range(len(tasks)):
                        have = np.flatnonzero(np.isfinite(Y[:, t]))
                        x, y, gg = X[have], Y[have, t], g[have]
                        splits = outer_splits(gg, protocol, p, 0, y, "ridge")
                        idx = tested_rows(splits)
                        pred = cross_predict("ridge", x, y, gg, splits, protocol, p, 0, w)
                        cv, wd = coverage(y[idx], heldout_intervals(x, y, gg, splits, p, 0, w)[idx])
                        q.append(prediction_quality(y[idx], pred[idx]))
                        cov.append(cv)
                        width.append(wd)
                    m = {k: np.mean([r[k] for r in q]) for k in ("spearman", "mae", "bias")}
                    print(f"{fs:11s} {folds:5d} {score:9s} {protocol:9s} {m['spearman']:8.3f} {m['mae']:6.3f} "
                          f"{m['bias']:+7.3f}  {np.mean(cov):.3f} ({min(cov):.2f})  {np.mean(width):5.3f} "
                          f"{time.process_time() - c:6.1f}", flush=True)
    print("    python benchmarks/bench_intervals.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:]))


if __name__ == "__main__":
    main()
