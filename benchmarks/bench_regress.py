"""The regression's CPU time on the tiny test project's shape, before vs after, side by side.

``regression_table`` + ``fit_final`` on seeded data of the tiny pipeline's shape (11 encoders of 4
models, n = 200 features, 7 tasks; the tiny config's grids), one worker, then its two figures
(PNG and SVG each), each run in a fresh process: this checkout's ``src`` against ``--before`` (another checkout, its ``src`` first on
``PYTHONPATH``), alternating, ``--repeats`` times each. Prints CPU and wall seconds and checks that
both give the same table (the same bytes of its rows) and the same figure bytes.

    git worktree add /tmp/before <commit>
    python benchmarks/bench_regress.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import hashlib, json, time
import numpy as np
from encmap.downstream.regression import fit_final, regression_table
rng = np.random.default_rng(0)
params = {"seed": 0, "max_loo_groups": 20, "folds": 3, "inner_folds": 2, "pca_dims": [2, 4],
          "elasticnet_alphas": [0.01, 0.1], "l1_ratios": [0.5], "ridge_alphas": [0.1, 10.0, 1000.0], "max_iter": 10000}
m, n, T, models = 11, 200, 7, 4
F = rng.standard_normal((m, n))
Y = rng.standard_normal((m, T)) + F[:, :T]
groups = [f"g{i % models}" for i in range(m)]
records = [{"d": 16 + i, "layer": None if i % 4 == 0 else i % 5, "meta": {"parameters": 1000 * i}} for i in range(m)]
spectral = {"entropy": rng.random(m), "profile": rng.random((m, 16)), "head": rng.random((m, 8)),
            "log_rank": rng.random(m)}
tasks = [f"t{j}" for j in range(T)]
c, t = time.process_time(), time.perf_counter()
rows, preds = regression_table(F, Y, tasks, groups, records, params, 0, 1, None, spectral)
final = fit_final(F, Y, tasks, groups, params, 0, 1)
cpu, wall = time.process_time() - c, time.perf_counter() - t
digest = hashlib.sha256((repr(rows) + repr(preds) + repr(final["weights"].tolist())).encode()).hexdigest()
# The step's two figures (PNG and SVG each), as regress_step draws them.
import tempfile
from pathlib import Path
from encmap.downstream.figures import draw_baselines, draw_predictions
pred_rows = [p | {"model": groups[p["encoder"]]} for p in preds]
with tempfile.TemporaryDirectory() as d:
    c = time.process_time()
    draw_predictions(pred_rows, tasks, f"{d}/p.png", f"{d}/p.svg")
    draw_baselines(rows, tasks, f"{d}/b.png", f"{d}/b.svg")
    fig_cpu = time.process_time() - c
    figures = hashlib.sha256(b"".join(Path(d, f).read_bytes() for f in ("p.png", "p.svg", "b.png", "b.svg"))).hexdigest()
print(json.dumps({"cpu_s": cpu, "wall_s": wall, "rows": len(rows), "digest": digest, "fig_cpu_s": fig_cpu,
                  "figures": figures}))
'''


def run(src: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a checkout of the commit to compare with")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    res: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(args.repeats):
        res["before"].append(run(Path(args.before).resolve() / "src"))
        res["after"].append(run(REPO / "src"))
    for k, runs in res.items():
        print(f"{k:7s} fits cpu " + " / ".join(f"{r['cpu_s']:.1f}" for r in runs) + " s, wall "
              + " / ".join(f"{r['wall_s']:.1f}" for r in runs) + f" s, {runs[0]['rows']} rows; figures cpu "
              + " / ".join(f"{r['fig_cpu_s']:.1f}" for r in runs) + " s")
    same = {r["digest"] for rs in res.values() for r in rs}
    print("the same table, predictions and fitted regressors:", len(same) == 1)
    print("the same figure bytes:", len({r["figures"] for rs in res.values() for r in rs}) == 1)


if __name__ == "__main__":
    main()
