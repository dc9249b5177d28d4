"""Where leave-one-model-out stops paying (issue 71): the default predictor's grouped rows (ridge on
35 columns, the head's width, with its conformal intervals) under leave-one-model-out and under
GroupKFold(5), on a stand-in (:func:`stand_in`: a latent state the scores are linear in, seen
through noise) at growing numbers of models; Spearman, interval
coverage and CPU seconds of each, side by side in one process.

LOO trains each fold on m - 1 models, GroupKFold(5) on 4m/5: the gap between their Spearman is how
much the 5-fold figure under-describes the predictor fitted on all m; it shrinks as m grows while
LOO's cost (m fits a row, m (m - 1) for the intervals' nested CV+) grows. ``regress.max_loo_groups``
is set where the gap has fallen into the noise.

    python benchmarks/bench_loo.py --models 25,50,100,200
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import yaml

from encmap.downstream.intervals import coverage, heldout_intervals
from encmap.downstream.regression import cross_predict, outer_splits, prediction_quality


def stand_in(m: int, models: int, T: int, seed: int = 0):
    """m encoders of ``models`` models: a 5-d latent state per encoder (its model's plus its own),
    seen through 35 noisy columns (the head's width); each task's score linear in it plus noise.
    X (m, 35), Y (m, T), groups (m,)."""
    rng = np.random.default_rng(seed)
    model = np.sort(rng.integers(0, models, m))
    Z = rng.standard_normal((models, 5))[model] + 0.5 * rng.standard_normal((m, 5))
    X = Z @ rng.standard_normal((5, 35)) + 2.0 * rng.standard_normal((m, 35))
    Y = Z @ rng.standard_normal((5, T)) + rng.standard_normal((m, T))
    return X, Y, np.array([f"m{k}" for k in model])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="25,50,100,200")
    ap.add_argument("--per", type=float, default=2.8, help="encoders per model (the default map: 70 / 25)")
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--params", type=Path, default=Path(__file__).parents[1] / "params.yaml")
    a = ap.parse_args(argv)
    params = yaml.safe_load(a.params.read_text())["regress"]
    print("models  encoders  protocol     Spearman  coverage  CPU s")
    for models in (int(x) for x in a.models.split(",")):
        m = int(round(models * a.per))
        X, Y, groups = stand_in(m, models, a.tasks)
        w = None
        for name, limit in (("LOO", 10 ** 9), ("GroupKFold5", 3)):
            p = params | {"max_loo_groups": limit}
            c = time.process_time()
            rho, cov = [], []
            for t in range(a.tasks):
                splits = outer_splits(groups, "grouped", p, 0)
                pred = cross_predict("ridge", X, Y[:, t], groups, splits, "grouped", p, 0, w)
                rho.append(prediction_quality(Y[:, t], pred)["spearman"])
                cov.append(coverage(Y[:, t], heldout_intervals(X, Y[:, t], groups, splits, p, 0, w))[0])
            print(f"{models:6d}  {m:8d}  {name:11s}  {np.mean(rho):8.3f}  {np.mean(cov):8.3f}  "
                  f"{time.process_time() - c:6.1f}", flush=True)
    print("    python benchmarks/bench_loo.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:]))


if __name__ == "__main__":
    main()
