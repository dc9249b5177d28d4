"""The regression on files (I/O module): evaluation results and score tables in, the regression
table, the fitted regressors and predictions for new encoders out.

What ``encmap regress``, ``encmap place`` and the ``regress`` stage share; the protocol itself
(cross-validation, regressors, baselines) is :mod:`encmap.downstream.regression`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..artifacts.embeddings import check_is_encoder
from ..artifacts.failures import FAILED, read_failure
from ..artifacts.features import read_feature_matrix
from ..io import csv_table, read_h5, read_json, write_h5
from ..validation import EncmapError, check_score_spread
from .mteb_results import PREFIX
from .regression import REGRESSORS, join_blocks, predictor_blocks, regression_table, require_groups, summary
from .score_tables import read_groups, read_score_table


def read_eval_scores(eval_dirs: list[str], sentences_sha256: str, failures: list[dict[str, Any]] | None = None,
                     origins: dict[tuple[str, str], str] | None = None
                     ) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Main scores ``{encoder: {task: score}}`` from ``results/eval/<model>/`` directories, and the tasks.

    Every result must come from the sentence set the features were computed on (its probe
    sentences were removed from the tasks); a stale one is an error naming its file. A model
    that failed under ``evaluate.on_error: skip`` has no scores; its record is appended to
    ``failures`` (model, stage, error, encoders). ``origins``, when given, gets the file each
    (encoder, task) score was read from (errors about a score name it).
    """
    scores: dict[str, dict[str, float]] = {}
    tasks: list[str] = []
    for d in eval_dirs:
        failure = read_failure(d)
        if failure is not None:
            if failure.get("sentences_sha256") != sentences_sha256:
                raise EncmapError(f"{d}/{FAILED}: recorded against another sentence set than the features; "
                                  "rerun the 'evaluate' rule for this model")
            print(f"warning: model {failure['model']!r} has no scores ({failure['stage']} failed: "
                  f"{failure['error']})", file=sys.stderr)
            if failures is not None:
                failures.append({k: failure[k] for k in ("model", "stage", "error")}
                                | {"encoders": sorted(failure["encoders"])})
            continue
        files = sorted(Path(d).glob("*.json"))
        if not files:
            raise EncmapError(f"{d}: no evaluation results; rerun the 'evaluate' rule for this model")
        for f in files:
            r = read_json(f, "rerun the 'evaluate' rule for this model")
            check_is_encoder(f, r, f.stem, "scores", Path(d).name)
            if f.stem in scores:
                raise EncmapError(f"{f}: encoder {f.stem!r} has scores in two directories")
            if r.get("sentences_sha256") != sentences_sha256:
                raise EncmapError(f"{f}: scored against another sentence set than the features "
                                  f"({str(r.get('sentences_sha256'))[:12]}… vs {sentences_sha256[:12]}…); "
                                  "rerun the 'evaluate' rule for this model")
            scores[r["encoder_id"]] = {t: s["main_score"] for t, s in r["tasks"].items()}
            if origins is not None:
                origins.update({(r["encoder_id"], t): str(f) for t in r["tasks"]})
            tasks += [t for t in r["tasks"] if t not in tasks]
    return scores, tasks


def score_matrix(ids: list[str], scores: dict[str, dict[str, float]], tasks: list[str]) -> np.ndarray:
    """(m, T) scores in feature-matrix row order; NaN where an encoder has no score for a task."""
    return np.array([[scores.get(e, {}).get(t, np.nan) for t in tasks] for e in ids], dtype=np.float64)


def families_of(records: list[dict[str, Any]] | None) -> list[str] | None:
    """Each encoder's family (``meta.family``; a model without one is a family of its own)."""
    if records is None:
        return None
    return [str(r["meta"].get("family") or f"model:{r['model']}") for r in records]


def run_regression(fm: dict[str, Any], scores: dict[str, dict[str, float]], tasks: list[str], groups: list[str],
                   params: dict[str, Any], jobs: int | None = None,
                   origins: dict[tuple[str, str], str] | None = None,
                   distances: np.ndarray | None = None) -> dict[str, Any]:
    """The protocol of :mod:`encmap.downstream.regression` on a feature matrix and scores (``jobs`` worker
    processes); families from the matrix's encoder records, when it has them. ``origins``: the
    file each (encoder, task) score came from, named when a score is refused. ``distances``
    (m, m): the map's, for the neighbours baseline."""
    Y = score_matrix(fm["ids"], scores, tasks)
    check_score_spread(Y, fm["ids"], tasks, (lambda e, t: origins.get((e, t))) if origins else None)
    few = [t for j, t in enumerate(tasks) if np.isfinite(Y[:, j]).sum() < 3]
    empty = [t for t in few if not t.startswith(PREFIX)]
    if empty:
        raise EncmapError(f"task {empty[0]!r}: fewer than 3 encoders on the map have a score")
    if few:  # published MTEB tasks that too few mapped models were evaluated on: sat out, named
        print(f"warning: {len(few)} MTEB task(s) left out of the regression, fewer than 3 encoders with a score: "
              + ", ".join(few), file=sys.stderr)
        keep = [j for j, t in enumerate(tasks) if t not in few]
        tasks, Y = [tasks[j] for j in keep], Y[:, keep]
    rows, preds = regression_table(fm["F"], Y, tasks, groups, fm["records"], params, params["seed"], jobs,
                                   families=families_of(fm["records"]), spectral=fm.get("spectral"),
                                   distances=distances)
    return {"rows": rows, "predictions": preds, "summary": summary(rows), "Y": Y, "tasks": tasks, "left_out": few}


TABLE_FIELDS = ["task", "protocol", "features", "regressor", "n", "folds", "units", "spearman", "spearman_low",
                "spearman_high", "p_value", "pearson", "mae", "bias", "coverage", "width", "note"]
#: results/regression/predictions.csv: one held-out prediction a row, with its conformal interval
#: (``low``, ``high``; empty where the row has none).
PREDICTION_FIELDS = ["encoder", "model", "task", "protocol", "features", "regressor", "actual", "predicted", "low",
                     "high"]


def table_text(rows: list[dict[str, Any]]) -> str:
    """The regression table as CSV text."""
    return csv_table(rows, TABLE_FIELDS)


#: The protocols whose out-of-fold errors say what a new encoder's predicted score is worth, in
#: order of preference: a new encoder is usually a model the map has never seen.
HELDOUT_PROTOCOLS = ("grouped", "random")


def heldout_errors(predictions: list[dict[str, Any]], tasks: list[str], predictor: str) -> dict[str, Any]:
    """Out-of-fold MAE and RMSE (T, R) of the ``predictor``'s regressors, model held out (``random``
    folds for a map of fewer than 3 models): what a new encoder's predicted score is expected to
    miss by. ``predictions``: :func:`encmap.downstream.regression.regression_table`'s."""
    mine = [p for p in predictions if p["features"] == predictor]
    protocol = next((pr for pr in HELDOUT_PROTOCOLS if any(p["protocol"] == pr for p in mine)), None)
    mae = np.full((len(tasks), len(REGRESSORS)), np.nan)
    rmse = mae.copy()
    for i, t in enumerate(tasks):
        for r, reg in enumerate(REGRESSORS):
            d = np.array([p["actual"] - p["predicted"] for p in mine
                          if p["task"] == t and p["regressor"] == reg and p["protocol"] == protocol])
            if d.size:
                mae[i, r], rmse[i, r] = np.mean(np.abs(d)), np.sqrt(np.mean(d ** 2))
    return {"mae": mae, "rmse": rmse, "protocol": protocol}


def write_regressors(path: str | Path, final: dict[str, Any], tasks: list[str], ids: list[str],
                     attrs: dict[str, Any], predictor: str, errors: dict[str, Any] | None = None,
                     training: dict[str, Any] | None = None) -> None:
    """The fitted regressors (:func:`encmap.downstream.regression.fit_final`'s ``final``) as HDF5:
    ``weights`` (T, R, p), ``intercepts`` (T, R), ``tasks`` (T), ``regressors`` (R), ``encoder_ids``
    (m), with the feature settings they were trained on (``attrs``: sentences_sha256, eps,
    direction, and the features' width ``n``) and the ``predictor``; ``errors``
    (:func:`heldout_errors`): ``heldout_mae`` and ``heldout_rmse`` (T, R) and their protocol.
    ``training``: what a new encoder's conformal interval and extrapolation check are computed
    from (:func:`encmap.downstream.regression.fit_final`'s): the predictor's rows ``train_X``
    (m, p), the scores ``train_Y`` (m, T), each row's model ``train_groups`` (m) and the settings
    of the intervals (``interval_params``: :data:`INTERVAL_PARAMS` of the ``regress`` section)."""
    extra = {} if errors is None else {"heldout_mae": errors["mae"], "heldout_rmse": errors["rmse"]}
    if training is not None:
        extra |= {"train_X": training["X"], "train_Y": training["Y"],
                  "train_groups": np.array(training["groups"], dtype=object)}
    write_h5(path, {"weights": final["weights"], "intercepts": final["intercepts"], "tasks": np.array(tasks),
                    "regressors": np.array(REGRESSORS), "encoder_ids": np.array(ids)} | extra,
             {"chosen": final["chosen"], "sentences_sha256": attrs["sentences_sha256"], "eps": float(attrs["eps"]),
              "direction": str(attrs["direction"]), "n": int(attrs["n"]), "predictor": predictor,
              "encmap_version": __version__}
             | ({"heldout_protocol": str(errors["protocol"])} if errors is not None else {})
             | ({"interval_params": {k: training["params"][k] for k in INTERVAL_PARAMS}} if training else {}))


#: The ``regress`` settings a new encoder's conformal interval is refitted with (stored with the
#: regressors, so that ``encmap place`` uses the run's, not what params.yaml says now).
INTERVAL_PARAMS = ("intervals", "max_loo_groups", "folds", "ridge_alphas", "ridge_alpha_cv", "seed", "predictor")


def placed_intervals(regressors: str | Path, F: np.ndarray, spectral: dict[str, np.ndarray] | None,
                     predicted: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, Any]]:
    """Each task's conformal interval for new encoders' ridge predictions, and why each prediction
    extrapolates.

    The interval is the regress stage's (:mod:`encmap.downstream.intervals`: CV+ over the map's
    models, refitted here from the training rows stored with the regressors, with the run's
    settings), for the ridge fitted on every model. ``F`` (k, n), ``spectral``: the new encoders'
    features and spectral summaries; ``predicted``: :func:`predict_scores`'s. Returns ``{task:
    {"low" (k,), "high" (k,), "level", "extrapolating": k reasons ("" where it does not)}}``;
    {} for regressors written without their training rows (an older encmap).
    """
    import json

    from ..io import h5_datasets
    from .intervals import extrapolation, fitted_intervals, predict_intervals, reach, standardiser, too_few

    if "train_X" not in h5_datasets(regressors):
        return {}
    saved, meta = read_h5(regressors, ["train_X", "train_Y", "train_groups", "tasks", "encoder_ids"])
    ip = meta["interval_params"]
    ip = json.loads(ip) if isinstance(ip, str) else ip
    X_new, weights = join_blocks(predictor_blocks(ip["predictor"], F, spectral))
    X, Y = saved["train_X"], saved["train_Y"]
    groups, ids = saved["train_groups"].astype(str), [str(e) for e in saved["encoder_ids"]]
    space = standardiser(X, weights)
    Z, Z_new, far = space(X), space(X_new), float(reach(X, groups, weights).max())
    out = {}
    for t, task in enumerate(str(x) for x in saved["tasks"]):
        have = np.flatnonzero(np.isfinite(Y[:, t]))
        bounds = np.full((len(X_new), 2), np.nan)  # too few scored encoders for an interval at the level
        if not too_few(len(have), ip["intervals"]["level"]) and len(np.unique(groups[have])) >= 2:
            bounds = predict_intervals(fitted_intervals(X[have], Y[have, t], groups[have], ip, int(ip["seed"]),
                                                        weights), X_new)
        ridge = predicted[task]["ridge"]
        out[task] = {"low": bounds[:, 0], "high": bounds[:, 1], "level": float(ip["intervals"]["level"]),
                     "extrapolating": [extrapolation(Z_new[i], Z, ids, far, float(ridge[i]), Y[:, t])
                                       for i in range(len(X_new))]}
    return out


def read_heldout_errors(regressors: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{task: {regressor: {"mae", "rmse"}}}`` stored with the fitted regressors ({} when an older
    encmap wrote them without)."""
    from ..io import h5_datasets

    if "heldout_mae" not in h5_datasets(regressors):
        return {}
    saved, _ = read_h5(regressors, ["heldout_mae", "heldout_rmse", "tasks", "regressors"])
    return {str(t): {str(reg): {"mae": float(saved["heldout_mae"][i, r]), "rmse": float(saved["heldout_rmse"][i, r])}
                     for r, reg in enumerate(saved["regressors"])} for i, t in enumerate(saved["tasks"])}


def predict_scores(regressors: str | Path, F: np.ndarray, attrs: dict[str, Any],
                   spectral: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Each task's predicted main score for new encoders, per regressor.

    ``F`` (k, n): their QRE features; ``spectral``: their spectral summaries (``entropy`` (k,),
    ``profile`` (k, 16)), needed when the regressors were fitted on a spectral predictor
    (``regress.predictor``). ``attrs`` are the feature settings the new rows were computed with
    (sentences_sha256, eps, direction); they must be the ones the regressors were trained on.
    ``regressors`` is the HDF5 file of :func:`write_regressors` (``weights`` (T, R, p),
    ``intercepts`` (T, R), attribute ``predictor``). Returns ``{task: {regressor: predictions (k,)}}``.
    """
    p = Path(regressors)
    if not p.is_file():
        raise EncmapError(f"{p}: no fitted regressors; run the 'regress' rule first")
    saved, meta = read_h5(p, ["weights", "intercepts", "tasks", "regressors"])
    for key in ("sentences_sha256", "direction"):
        if str(meta[key]) != str(attrs[key]):
            raise EncmapError(f"{p}: regressors were trained on features with {key} {meta[key]!r}, "
                              f"not {attrs[key]!r}; rerun the 'regress' rule")
    if float(meta["eps"]) != float(attrs["eps"]) or int(meta["n"]) != F.shape[1]:
        raise EncmapError(f"{p}: regressors were trained on features of n = {meta['n']}, eps = {meta['eps']}; "
                          f"these have n = {F.shape[1]}, eps = {attrs['eps']}")
    X, _ = join_blocks(predictor_blocks(str(meta.get("predictor", "qre")), F, spectral))
    W, b = saved["weights"], saved["intercepts"]
    if W.shape[-1] != X.shape[1]:
        raise EncmapError(f"{p}: regressors on {W.shape[-1]} columns, the new encoders' predictor "
                          f"{meta.get('predictor', 'qre')!r} has {X.shape[1]}; rerun the 'regress' rule")
    return {t: {reg: X @ W[i, r] + b[i, r] for r, reg in enumerate(saved["regressors"])}
            for i, t in enumerate(saved["tasks"])}


def regress_tables(features: str, scores: str, groups: str | None, params: dict[str, Any],
                   jobs: int | None = None) -> str:
    """``encmap regress``: the protocol on any feature matrix and score table; the table as text.

    The matrix needs datasets ``features`` (m, n) and ``encoder_ids`` (m); without ``encoders``
    (encmap's per-encoder records) the baselines that need them are left out and ``groups`` (CSV
    encoder,group) is required, else groups default to each encoder's model. ``jobs``: worker
    processes.
    """
    fm = read_feature_matrix(features, require_records=False)
    table = read_score_table(scores, fm["ids"])
    tasks = sorted({t for s in table.values() for t in s})
    if groups:
        g = read_groups(groups, fm["ids"])
        require_groups(g, "grouped", f"{groups}: ")  # asked for by name: say so rather than leave the protocol out
    elif fm["records"] is None:
        raise EncmapError(f"{features}: no encoder records (dataset 'encoders') to take each encoder's model from; "
                          "give --groups CSV encoder,group (the grouped CV holds out whole groups)")
    else:
        g = [r["model"] for r in fm["records"]]
    if fm["records"] is None:
        print(f"{features}: no encoder records (dataset 'encoders'): the width, layer and parameters baselines "
              "are left out", file=sys.stderr)
    res = run_regression(fm, table, tasks, g, params, jobs, {(e, t): f"score table {scores}" for e, s in table.items()
                                                             for t in s})
    return table_text(res["rows"])
