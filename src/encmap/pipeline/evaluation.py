"""Downstream scores: build the evaluation tasks once, score every encoder of one model."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from .. import __version__
from ..io import atomic_write_json
from ..validation import EncmapError
from .common import rounded, swap_dir

#: Digits kept in score files: far below any difference that matters, and stable across BLAS builds.
DIGITS = 6


def tasks_step(evaluate: dict[str, Any], sentences: str, out: str) -> None:
    """``data/eval/tasks.json``: every configured task, probe sentences removed (counted per task)."""
    from ..sentences import file_sha256, read_sentences
    from ..tasks import build_tasks

    built = build_tasks(evaluate, read_sentences(sentences))
    atomic_write_json(out, built | {"sentences_sha256": file_sha256(sentences), "encmap_version": __version__})


def read_tasks(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise EncmapError(f"{p}: evaluation tasks not found; run the 'tasks' rule first")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EncmapError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None


def evaluate_step(model: str, spec: dict[str, Any], tasks_path: str, sentences: str, outdir: str, *,
                  evaluate: dict[str, Any], device: str = "auto", threads: int | None = None,
                  degenerate: str = "error") -> list[str]:
    """Score every encoder of one model on every task; ``<outdir>/<encoder>.json`` each.

    All evaluation texts are embedded in one pass of the model, with the same machinery and
    variant ids as the embed step; encoders fitted to a corpus (TF-IDF + SVD) are fitted on the
    curated sentences, as for the map. With ``evaluate.mteb.tasks`` set (online), MTEB tasks by
    name join them as ``mteb:<Task>`` (:mod:`encmap.mtebrun`). Nothing is written unless every
    encoder is scored.
    """
    from ..evaluate import score_tasks
    from ..models import embed_model, model_device
    from ..parallel import map_single_threaded
    from ..sentences import file_sha256, read_sentences
    from ..tasks import task_texts

    built = read_tasks(tasks_path)
    sha = file_sha256(sentences)
    if built["sentences_sha256"] != sha:
        raise EncmapError(f"{tasks_path} was built against another sentence set than {sentences}; rerun 'tasks'")
    tasks = built["tasks"]
    texts = sorted({t for task in tasks.values() for t in task_texts(task)})
    rows = {t: i for i, t in enumerate(texts)}
    dev, probes = model_device(spec, device), read_sentences(sentences)

    def embed(some: list[str]):
        return embed_model(model, spec, some, dev, threads=threads, degenerate=degenerate, fit_texts=probes)

    res = embed(texts)
    online = {}
    if evaluate["mteb"]["tasks"]:  # online: MTEB tasks by name, every variant from shared passes
        from ..mtebrun import mteb_tasks, run_mteb

        online = run_mteb(mteb_tasks(evaluate["mteb"]["tasks"]), [v.id for v in res.variants],
                          lambda some: embed(some).arrays, split=evaluate["mteb"]["split"])
    tasks_sha = file_sha256(tasks_path)
    # Each variant's classifiers on one BLAS thread, variants side by side in `threads` processes.
    scored = map_single_threaded(partial(score_tasks, tasks=tasks, rows=rows, params=evaluate,
                                         random_state=evaluate["seed"]),
                                 [res.arrays[v.id] for v in res.variants], threads)
    results = {}
    for v, scores in zip(res.variants, scored):
        results[v.id] = {
            "encoder_id": v.id, "model": model, "encoder": v.to_dict(),
            "tasks": {name: rounded(s, DIGITS) | {"removed": tasks[name]["removed"]} for name, s in scores.items()}
            | {name: rounded(s, DIGITS) for name, s in online.get(v.id, {}).items()},
            "n_texts": len(texts), "degenerate": res.degenerate.get(v.id, ""), "tasks_sha256": tasks_sha,
            "sentences_sha256": sha, "encmap_version": __version__}
        print(f"{v.id}: " + ", ".join(f"{k} {s['main_score']:.3f}" for k, s in scores.items()), file=sys.stderr)

    def write(tmp: Path) -> None:
        for e, r in results.items():
            (tmp / f"{e}.json").write_text(json.dumps(r, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    swap_dir(Path(outdir), write)
    return list(results)
