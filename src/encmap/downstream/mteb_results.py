"""Published MTEB scores as the regression's targets, read with mteb's own result classes.

For each model entry that names its MTEB model (``meta.mteb_name``, written by ``encmap zoo``),
the scores of its output encoder (``<model>__out``: the embedding MTEB evaluates) are read from
MTEB's results: online through ``mteb.ResultCache`` (``download_from_remote``), offline from a
directory laid out as MTEB's results repository (``<dir>/results/<org__model>/<revision>/
<TaskName>.json``). ``ResultCache.load_results`` parses the files into ``BenchmarkResults``.

What one score is, exactly: the task's ``main_score`` in one split (default ``test``), averaged
over the subsets the task has in the chosen benchmark (``TaskResult.validate_and_filter_scores``
with the benchmark's task: e.g. only ``en`` of AmazonCounterfactualClassification in
``MTEB(eng, v1)``; every subset for a task named in a task list), as the leaderboard does; a
result that lacks one of those subsets is incomplete and gives no score (mteb reads it as NaN). The
results of the entry's pinned revision are used when the results have them; otherwise those of
the only revision there is, or mteb's ``join_revisions`` of several. A model or task without
results stays missing (never imputed); the regression sits it out per task.
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

from ..validation import EncmapError

#: Prefix of published MTEB tasks among the regression's tasks.
PREFIX = "mteb:"


def mteb_models(records: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:
    """``{encoder id: (MTEB name, revision)}`` for the output encoders of entries naming one."""
    out = {}
    for r in records:
        meta = r.get("meta") or {}
        if meta.get("mteb_name") and r["pooling"] == "output" and r["dim"] is None:
            out[r["id"]] = (meta["mteb_name"], meta.get("mteb_revision"))
    return out


def _tasks(benchmark: str | None, names: list[str]):
    import mteb

    try:
        if names:
            return list(mteb.get_tasks(tasks=names))
        return list(mteb.get_benchmark(benchmark).tasks)
    except (KeyError, ValueError) as e:
        raise EncmapError(f"regress.mteb: unknown MTEB benchmark or task ({e})") from None


def published_scores(models: dict[str, tuple[str, str | None]], *, results: str, benchmark: str | None,
                     tasks: list[str], split: str) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Scores ``{encoder: {"mteb:<Task>": score}}`` and the task names, for ``models``.

    ``results``: ``remote`` (download MTEB's results repository through mteb's cache) or the path
    of a directory holding ``results/<org__model>/<revision>/<Task>.json``.
    """
    import mteb

    task_objs = _tasks(benchmark, tasks)
    by_task = {t.metadata.name: t for t in task_objs}
    names = [PREFIX + t for t in sorted(by_task)]
    if not models:
        return {}, names
    remote = results == "remote"
    if not remote and not (Path(results) / "results").is_dir():
        raise EncmapError(f"regress.mteb.results {results}: no 'results' folder in it (expected MTEB's results "
                          "repository: results/<org__model>/<revision>/<Task>.json)")
    cache = mteb.ResultCache() if remote else mteb.ResultCache(cache_path=results)
    if remote:
        cache.download_from_remote()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mteb warns for every model without a model_meta.json
        loaded = cache.load_results(models=sorted({n for n, _ in models.values()}), tasks=task_objs,
                                    require_model_meta=False, include_remote=remote)
    runs: dict[str, dict[str, Any]] = {}
    for mr in loaded.model_results:
        runs.setdefault(mr.model_name, {})[mr.model_revision] = mr
    scores: dict[str, dict[str, float]] = {}
    for enc, (name, revision) in sorted(models.items()):
        revs = runs.get(name, {})
        if not revs:
            print(f"warning: encoder {enc!r}: no MTEB results for {name!r}", file=sys.stderr)
            continue
        if revision in revs:
            mr = revs[revision]
        elif len(revs) == 1:
            mr = next(iter(revs.values()))
        else:
            mr = type(loaded)(model_results=list(revs.values())).join_revisions().model_results[0]
        got = {}
        for tr in mr.task_results:
            if tr.task_name not in by_task:
                continue
            tr = tr.validate_and_filter_scores(task=by_task[tr.task_name])
            # NaN when a subset of the task is missing: mteb fills it so; the score stays missing.
            score = float(tr.get_score(splits=[split])) if tr.scores.get(split) else float("nan")
            if math.isfinite(score):
                got[PREFIX + tr.task_name] = score
        scores[enc] = got
    return scores, names
