"""Step of rule ``evaluate``: every encoder of one model scored on every task, from one forward pass."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

from .. import __version__
from ..artifacts.failures import run_model, write_failure
from ..artifacts.tasks import read_tasks, task_texts
from ..downstream.metrics import score_tasks
from ..encoders.embed import embed_model, model_job_device
from ..encoders.variants import model_variants
from ..io import file_sha256, read_curated, rounded, swap_dir
from ..parallel import map_single_threaded
from ..validation import EncmapError

#: Digits kept in score files: far below any difference that matters, and stable across BLAS builds.
DIGITS = 6


def evaluate_step(model: str, spec: dict[str, Any], tasks_path: str, sentences: str, outdir: str, *,
                  evaluate: dict[str, Any], device: str = "auto", threads: int | None = None,
                  degenerate: str = "error", n: int | None = None, forward: dict | None = None) -> list[str]:
    """Score every encoder of one model on every task; ``<outdir>/<encoder>.json`` each.

    All evaluation texts are embedded in one pass of the model, with the same machinery and
    variant ids as the embed step; encoders fitted to a corpus (TF-IDF + SVD) are fitted on the
    curated sentences, as for the map. With ``evaluate.mteb.tasks`` set (online), MTEB tasks by
    name join them as ``mteb:<Task>`` (:mod:`encmap.downstream.mteb_tasks`). Nothing is
    written unless every encoder is scored. A model that cannot be loaded or scored stops the run
    naming it (``evaluate.on_error: stop``) or leaves only a failure record (``skip``); the
    regression then has no scores for its encoders. ``forward``: the forward-pass settings, as
    the embed step's (:func:`~encmap.encoders.embed.forward_settings`).
    """
    built = read_tasks(tasks_path)
    probes, sha = read_curated(sentences, n)
    if built["sentences_sha256"] != sha:
        raise EncmapError(f"{tasks_path} was built against another sentence set than {sentences}; rerun 'tasks'")
    tasks = built["tasks"]
    texts = sorted({t for task in tasks.values() for t in task_texts(task)})
    rows = {t: i for i, t in enumerate(texts)}
    def score():
        # The model's GPU (its own, on a CUDA machine) is held for its passes only, not its classifiers.
        with model_job_device(model, spec, device) as dev:
            def embed(some: list[str]):
                return embed_model(model, spec, some, dev, threads=threads, degenerate=degenerate, fit_texts=probes,
                                   forward=forward)

            res = embed(texts)
            online = {}
            if evaluate["mteb"]["tasks"]:  # online: MTEB tasks by name, every variant from shared passes
                from ..downstream.mteb_tasks import mteb_tasks, run_mteb

                online = run_mteb(mteb_tasks(evaluate["mteb"]["tasks"]), [v.id for v in res.variants],
                                  lambda some: embed(some).arrays, split=evaluate["mteb"]["split"])
        # Each variant's classifiers on one BLAS thread, variants side by side in `threads` processes.
        return res, online, map_single_threaded(partial(score_tasks, tasks=tasks, rows=rows, params=evaluate,
                                                        random_state=evaluate["seed"]),
                                                [res.arrays[v.id] for v in res.variants], threads)

    done = run_model(model, "evaluate", evaluate["on_error"], score)
    if isinstance(done, str):
        write_failure(outdir, model, "evaluate", done, {v.id: v.to_dict() for v in model_variants(model, spec)},
                      sha, len(probes))
        return []
    res, online, scored = done
    tasks_sha = file_sha256(tasks_path)
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
