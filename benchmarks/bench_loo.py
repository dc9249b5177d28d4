"""Where leave-one-model-out stops paying (issue 71): the default predictor's grouped rows (ridge on
the head, with its conformal intervals) under leave-one-model-out and under GroupKFold(5), on the
stand-in of ``bench_regress_scale.py`` at growing numbers of models; Spearman, interval coverage
and CPU seconds of each, side by side in one process.

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

from bench_regress_scale import stand_in
from encmap.downstream.intervals import coverage, heldout_intervals
from encmap.downstream.regression import (cross_predict, join_blocks, outer_splits, prediction_quality,
                                          predictor_blocks)


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
        _, Y, groups, _, spectral, _ = stand_in(m, 16, models, max(3, models // 4), a.tasks)
        X, w = join_blocks(predictor_blocks("head", np.zeros((m, 1)), spectral))
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
