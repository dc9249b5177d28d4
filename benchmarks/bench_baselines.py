"""The regression protocol with every feature set on a finished run, spectral baselines included,
without rerunning its pipeline: the run's QRE features, its encoders' spectra (from their stored
PIPs: entropy and profile, as the features stage now writes them) and its offline tasks' scores.

    python benchmarks/bench_baselines.py RUN_DIR --json baselines.json

Prints, per CV protocol and regressor, the mean Spearman over tasks of every feature set, and
per task the Spearman of each (out of fold, ridge and ElasticNet).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    import yaml

    from encmap.artifacts.features import read_feature_matrix
    from encmap.artifacts.pip import load_spectrum
    from encmap.downstream.regression import regression_table, summary
    from encmap.workflow.layout import LAYOUT
    from encmap.downstream.prediction import families_of, read_eval_scores, score_matrix
    from encmap.qre.spectral import spectral_profile, von_neumann_entropy

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    root = args.run
    params = yaml.safe_load((root / "params.yaml").read_text())
    fm = read_feature_matrix(root / "results/features/qre.h5")
    eps = float(fm["attrs"]["eps"])
    specs = [load_spectrum(root / LAYOUT["pip"].format(model=r["model"], encoder=r["id"]))[0] for r in fm["records"]]
    spectral = {"profile": np.vstack([spectral_profile(s, eps) for s in specs]),
                "entropy": np.array([von_neumann_entropy(s, eps) for s in specs])}
    scores, tasks = read_eval_scores(sorted(str(p) for p in (root / "results/eval").iterdir() if p.is_dir()),
                                     fm["attrs"]["sentences_sha256"])
    Y = score_matrix(fm["ids"], scores, tasks)
    groups = [r["model"] for r in fm["records"]]
    t0 = time.perf_counter()
    rows, _ = regression_table(fm["F"], Y, tasks, groups, fm["records"], params["regress"], params["regress"]["seed"],
                               args.jobs, families=families_of(fm["records"]), spectral=spectral)
    out = {"encoders": len(fm["ids"]), "tasks": tasks, "seconds": round(time.perf_counter() - t0, 1),
           "summary": summary(rows), "rows": rows}
    for prot in ("grouped", "family", "random"):
        for reg in ("ridge", "elasticnet"):
            line = {fs: round(v[reg][prot]["spearman"], 3) for fs, v in out["summary"].items()
                    if reg in v and prot in v[reg] and v[reg][prot]["spearman"] is not None}
            print(prot, reg, json.dumps(line))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
