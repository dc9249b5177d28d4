"""Step of rule ``regress``: predict every task's score from the QRE features (the library it runs:
:mod:`encmap.downstream.prediction`)."""

from __future__ import annotations

import json
import sys
from typing import Any

from ..artifacts.failures import failure_report
from ..artifacts.features import read_feature_matrix, read_pairwise_qre
from ..downstream.figures import draw_baselines, draw_predictions
from ..downstream.mteb_results import PREFIX, mteb_models, published_scores
from ..downstream.prediction import (PREDICTION_FIELDS, heldout_errors, read_eval_scores, run_regression, table_text,
                                     write_regressors)
from ..downstream.regression import fit_final, join_blocks, predictor_blocks
from ..downstream.score_tables import read_score_table, score_table_text
from ..io import atomic_write_json, atomic_write_text, csv_table, rounded
from ..maps.distances import symmetrised_qre
from ..validation import EncmapError


def embed_failures(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The models ``gather`` left off the feature matrix because they failed (its ``failed`` attribute)."""
    failed = attrs.get("failed", "{}")
    return failure_report(json.loads(failed) if isinstance(failed, str) else failed)


def regress_step(features: str, eval_dirs: list[str], out: dict[str, str], *, regress: dict[str, Any],
                 pairwise: str | None = None, jobs: int | None = None) -> None:
    """``results/regression/``: table, predictions, scores, metrics, figure, fitted regressors, and the
    published MTEB targets (``mteb_scores``: the table ``encmap mteb-scores`` writes) with their
    sources report (``mteb_sources``).

    ``pairwise``: the exact pairwise QRE (``results/similarity/qre_pairwise.h5``) for the map's
    neighbours baseline (left out without it). ``jobs``: worker processes for the independent
    fits (the outputs do not depend on it).
    """
    fm = read_feature_matrix(features)
    distances = symmetrised_qre(read_pairwise_qre(pairwise, fm)) if pairwise else None
    failures = embed_failures(fm["attrs"])
    origins: dict[tuple[str, str], str] = {}  # (encoder, task) -> the file its score was read from
    scores, tasks = read_eval_scores(eval_dirs, fm["attrs"]["sentences_sha256"], failures, origins)
    for table in regress["score_tables"]:
        extra = read_score_table(table["path"], fm["ids"], table["tasks"])
        for e, s in extra.items():
            scores.setdefault(e, {}).update(s)
            origins.update({(e, t): f"score table {table['path']}" for t in s})
        tasks += [t for t in table["tasks"] if t not in tasks]
    mt = regress["mteb"]
    published = None
    if mt["results"] is not None:
        published = published_scores(mteb_models(fm["records"], mt["bare_only"]), results=mt["results"],
                                     benchmark=mt["benchmark"], tasks=mt["tasks"], split=mt["split"])
        print(published.summary(), file=sys.stderr)
        for e, s in published.scores.items():
            s = {PREFIX + t: v for t, v in s.items()}
            clash = set(s) & set(scores.get(e, {}))
            if clash:
                raise EncmapError(f"encoder {e!r}: {sorted(clash)[0]} is both run (evaluate.mteb) and read from "
                                  "published results (regress.mteb); keep one")
            scores.setdefault(e, {}).update(s)
            origins.update({(e, t): f"MTEB results {mt['results']}" for t in s})
        tasks += [PREFIX + t for t in published.tasks if PREFIX + t not in tasks]
    groups = [r["model"] for r in fm["records"]]
    res = run_regression(fm, scores, tasks, groups, regress, jobs, origins, distances)
    tasks = res["tasks"]
    ids = fm["ids"]
    predictor = regress["predictor"]
    blocks = predictor_blocks(predictor, fm["F"], fm["spectral"])
    final = fit_final(fm["F"], res["Y"], tasks, groups, regress, regress["seed"], jobs, blocks=blocks)
    pred_rows = [p | {"encoder": ids[p["encoder"]], "model": groups[p["encoder"]]} for p in res["predictions"]]
    score_rows = [{"encoder": e, "model": g} | {t: res["Y"][i, j] for j, t in enumerate(tasks)}
                  for i, (e, g) in enumerate(zip(ids, groups))]
    atomic_write_text(out["table"], table_text(res["rows"]))
    atomic_write_text(out["predictions"], csv_table(pred_rows, PREDICTION_FIELDS))
    atomic_write_text(out["scores"], csv_table(score_rows, ["encoder", "model", *tasks]))
    draw_predictions(pred_rows, tasks, out["figure_png"], out["figure_svg"], features=predictor)
    draw_baselines(res["rows"], tasks, out["baselines_png"], out["baselines_svg"])
    write_regressors(out["regressors"], final, tasks, ids, fm["attrs"] | {"n": fm["F"].shape[1]}, predictor,
                     heldout_errors(res["predictions"], tasks, predictor),
                     {"X": join_blocks(blocks)[0], "Y": res["Y"], "groups": groups, "params": regress}
                     if "intervals" in regress else None)
    atomic_write_json(out["metrics"], rounded(res["summary"]) | {
        "predictor": predictor, "interval_level": regress.get("intervals", {}).get("level"), "tasks": len(tasks), "encoders": len(ids), "models": len(set(groups)),
        "failed_models": len(failures), "failed_encoders": sum(len(f["encoders"]) for f in failures),
        "tasks_with_too_few_scores": len(res["left_out"])}
        | ({f"mteb_{k}": published.counts()[k] for k in ("models_with_a_score", "models_complete", "scores",
                                                          "files_left_out")} if published else {}))
    atomic_write_json(out["failures"], {"failures": failures})
    # The published targets as encmap mteb-scores writes them, and where each one comes from.
    atomic_write_text(out["mteb_scores"], score_table_text(published.rows() if published else []))
    atomic_write_json(out["mteb_sources"], published.report() if published else
                      {"split": None, "counts": None, "models": [], "note": "regress.mteb.results is null"})
