"""What a leaderboard already tells: each MTEB task predicted from a model's published scores on
the benchmark's other tasks (leave-task-out), on MTEB's real results, the bar the QRE features
must clear to add anything for MTEB targets.

Every model folder of a copy of MTEB's results repository is read with encmap's reader (one
score per model and task, :mod:`encmap.downstream.mteb_results`); models with at least
``--min-tasks`` of the benchmark's tasks are kept. Per task, the models that have its score are
regressed on their other tasks' scores (missing ones imputed from the training models) with the
regression protocol of ``regress`` (ridge and ElasticNet, 5 folds of models held out: each model
its own group, ``random`` folds beside), against the training folds' mean.

    python benchmarks/bench_leave_task_out.py /tmp/mteb --json lto.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    import yaml

    from encmap.downstream.mteb_results import published_scores, results_folder
    from encmap.downstream.regression import regression_table

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a copy of MTEB's results repository")
    ap.add_argument("--benchmark", default="MTEB(eng, v1)")
    ap.add_argument("--min-tasks", type=int, default=28, help="keep models with at least this many scores")
    ap.add_argument("--json")
    args = ap.parse_args()
    folder = results_folder(args.results)
    names = sorted(p.name.replace("__", "/", 1) for p in folder.iterdir() if p.is_dir())
    t0 = time.perf_counter()
    pub = published_scores({n: (n, None) for n in names}, results=args.results, benchmark=args.benchmark, tasks=[],
                           split=None)
    models = [m for m in names if len(pub.scores[m]) >= args.min_tasks]
    tasks = pub.tasks
    Y = np.array([[pub.scores[m].get(t, np.nan) for t in tasks] for m in models])
    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())["regress"]
    rows, _ = regression_table(np.zeros((len(models), 1)), Y, tasks, models, None, params, params["seed"],
                               feature_sets=("tasks", "mean"))
    by = {}
    for r in rows:
        by.setdefault((r["protocol"], r["features"], r["regressor"]), []).append(r)
    summary = {f"{p}/{fs}/{reg}": {"tasks": len(rs), "spearman_median": float(np.nanmedian([r["spearman"] for r in rs])),
                                    "spearman_min": float(np.nanmin([r["spearman"] for r in rs])),
                                    "mae_median": float(np.nanmedian([r["mae"] for r in rs]))}
               for (p, fs, reg), rs in sorted(by.items())}
    out = {"models_read": len(names), "models_kept": len(models), "min_tasks": args.min_tasks, "tasks": len(tasks),
           "scores_used": int(np.isfinite(Y).sum()), "seconds": round(time.perf_counter() - t0, 1),
           "summary": summary,
           "per_task": {r["task"]: round(r["spearman"], 3) for r in rows
                        if r["protocol"] == "grouped" and r["features"] == "tasks" and r["regressor"] == "ridge"}}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
