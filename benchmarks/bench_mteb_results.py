"""Published MTEB scores for the whole `encmap catalogue` catalogue, read from a copy of MTEB's results
repository: what the reader yields (models with a score, models complete, n per task) and what it
costs (seconds, peak memory), for the current reader and, side by side, the reader of an earlier
commit (``--old COMMIT``: its ``published_scores`` loaded from ``git show``).

    tar -xJf ../shared/data/mteb-results-eng-v1.tar.xz -C /tmp/mteb
    python benchmarks/bench_mteb_results.py /tmp/mteb --old 706dec9

Each reader runs in its own process (peak RSS is that process's). An old reader that crashes is
reported with its error, then run again without the models whose files crash it (found one at a
time), as a user would have to.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def catalogue_models() -> dict[str, tuple[str, str | None]]:
    """Output encoder -> (MTEB name, pinned revision) of every `encmap catalogue` entry (default filters)."""
    from encmap.encoders.catalogue import catalogue, registry_records

    entries, _ = catalogue(registry_records())
    return {f"{k}__out": (e["meta"]["mteb_name"], e["meta"]["mteb_revision"]) for k, e in entries.items()}


def run_new(results: str, models: dict) -> dict:
    from encmap.downstream.mteb_results import published_scores

    pub = published_scores(models, results=results, benchmark="MTEB(eng, v1)", tasks=[], split=None)
    return {"scores": pub.scores, "tasks": pub.tasks, "counts": {k: v for k, v in pub.counts().items()
                                                                 if k != "per_task"}}


def run_old(results: str, models: dict, commit: str) -> dict:
    src = subprocess.run(["git", "show", f"{commit}:src/encmap/downstream/mteb_results.py"], cwd=REPO,
                         check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType("encmap.downstream._old_mteb_results")
    mod.__package__ = "encmap.downstream"
    exec(compile(src, f"{commit}:mteb_results.py", "exec"), mod.__dict__)
    dropped, errors = [], []
    while True:
        try:
            t0 = time.perf_counter()
            scores, names = mod.published_scores(models, results=results, benchmark="MTEB(eng, v1)", tasks=[],
                                                 split="test")
            seconds = time.perf_counter() - t0  # the run that went through, without the crashing models
            break
        except Exception as e:  # find the model whose files crash it, drop it, go on
            errors.append(f"{type(e).__name__}: {e}")
            bad = next(enc for enc in sorted(models) if _crashes(mod, results, {enc: models[enc]}))
            dropped.append(models[bad][0])
            models = {k: v for k, v in models.items() if k != bad}
    tasks = [n.removeprefix("mteb:") for n in names]
    return {"scores": {e: {t.removeprefix("mteb:"): v for t, v in s.items()} for e, s in scores.items()},
            "tasks": tasks, "crashed_with": errors[:1], "dropped": dropped, "seconds": seconds}


def _crashes(mod, results, one) -> bool:
    try:
        mod.published_scores(one, results=results, benchmark="MTEB(eng, v1)", tasks=[], split="test")
        return False
    except Exception:
        return True


def child(args) -> None:
    import warnings

    warnings.simplefilter("ignore")
    models = catalogue_models()
    t0 = time.perf_counter()
    res = run_new(args.results, models) if args.which == "new" else run_old(args.results, models, args.old)
    res.setdefault("seconds", time.perf_counter() - t0)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["models"] = len(models)
    Path(args.out).write_text(json.dumps(res))


def summary(res: dict) -> dict:
    import numpy as np

    scores, tasks = res["scores"], res["tasks"]
    per_task = np.array([sum(t in s for s in scores.values()) for t in tasks])
    return {"models": res["models"], "models_with_a_score": sum(bool(s) for s in scores.values()),
            "models_complete": sum(len(s) == len(tasks) for s in scores.values()),
            "scores": int(sum(len(s) for s in scores.values())),
            "n_per_task_min_median_max": [int(per_task.min()), float(np.median(per_task)), int(per_task.max())],
            "seconds": round(res["seconds"], 1), "peak_rss_mb": round(res["peak_rss_mb"])} | (
        {"crashed_with": res["crashed_with"], "models_dropped_to_run": res["dropped"]} if "dropped" in res else {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a copy of MTEB's results repository (holding results/)")
    ap.add_argument("--old", help="also run the reader of this commit, side by side")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--which", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.which:
        return child(args)
    figures = {}
    for which in ["new"] + (["old"] if args.old else []):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, __file__, args.results, "--which", which, "--out", f.name]
            subprocess.run(cmd + (["--old", args.old] if args.old else []), check=True)
            res = json.loads(Path(f.name).read_text())
        figures[which if which == "new" else f"old ({args.old})"] = summary(res)
        if which == "new":
            new_scores = res["scores"]
        else:  # where both give a score it must be the same number (the selection differs, not the arithmetic)
            both = [(e, t) for e, s in res["scores"].items() for t in s if t in new_scores.get(e, {})]
            differ = [(e, t) for e, t in both if abs(res["scores"][e][t] - new_scores[e][t]) > 1e-12]
            figures["old vs new"] = {"scored_by_both": len(both), "differ": len(differ), "examples": differ[:5]}
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
