"""``encmap place``: put a new encoder on an existing map without refitting it.

The new model is embedded on the run's own sentence set with the same machinery as the embed
step (every variant its spec asks for, one forward pass), factored and turned into QRE features
with the settings stored in the run's artifacts (ε, direction, centring, row normalisation),
compared with every encoder on the map in the full feature space (ℓ1), and placed with
openTSNE's ``transform`` against the stored reference map.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts.features import SPECTRAL, read_feature_matrix
from .io import atomic_write_text, csv_table, read_h5
from .params import load_params, validate_params
from .validation import EncmapError, check_id
from .workflow.deps import check_outside_outputs
from .workflow.layout import FEATURE_MATRIX, LAYOUT, MAP_MODEL, PLACED, REGRESSORS, SENTENCES

UNKNOWN_META = {"family": "unknown", "architecture": "unknown", "parameters": None, "languages": [],
                "objective": "unknown", "kind": "pretrained"}


def source_ref(source: str) -> str:
    """``path:DIR`` / ``package:NAME`` / ``hub:ID`` as given; a bare ``org/name`` means the hub."""
    if re.match(r"^(hub|path|package):.+", source):
        return source
    if re.match(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$", source):
        return f"hub:{source}"
    raise EncmapError(f"source {source!r}: give a hub id (org/name), hub:ID, path:DIR or package:NAME")


def default_model_id(source: str) -> str:
    """A path-safe model id from the source's last component (``hub:BAAI/bge-small-en`` → ``bge-small-en``)."""
    name = re.split(r"[/:]", source.rstrip("/"))[-1].lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", name).strip("-._") or "placed"
    return check_id(name[:100], "model id from the source")


def place_spec(source: str, *, backend: str = "sentence-transformers", layers: list[int] | None = None,
               pooling: list[str] | None = None, meta: dict[str, Any] | None = None,
               trust_remote_code: bool = False) -> dict[str, Any]:
    """A params.yaml model entry for a new sentence-transformers / transformers checkpoint.

    Remote code stays off unless ``trust_remote_code`` is passed explicitly.
    """
    if backend not in ("sentence-transformers", "transformers"):
        raise EncmapError(f"--backend {backend!r}: the command line builds sentence-transformers or transformers "
                          "entries; for another backend write the entry in a YAML file and pass --spec")
    spec: dict[str, Any] = {"backend": backend, "source": source_ref(source), "revision": None, "max_seq_length": 128,
                            "batch_size": 32, "prompt": "", "layers": list(layers or []),
                            "pooling": list(pooling or ["mean"]), "dims": [], "renormalize_truncated": True,
                            "init": "pretrained", "seed": 0, "dtype": "float32", "trust_remote_code": bool(trust_remote_code),
                            "meta": UNKNOWN_META | (meta or {})}
    if backend == "sentence-transformers":
        spec["output"] = True
    elif not spec["layers"]:
        raise EncmapError("--backend transformers needs --layers (hidden states to pool)")
    return spec


def place_encoder(model: str, spec: dict[str, Any], *, params_path: str | Path = "params.yaml",
                  root: str | Path = ".", out_dir: str | Path | None = None, device: str = "auto",
                  threads: int | None = None) -> dict[str, Any]:
    """Embed, featurise and place every variant of ``spec`` on the run's map under ``root``.

    Writes ``<out_dir>/placed.csv``, ``neighbours.csv`` and ``map.html`` (default
    ``results/place/<model>/``: :data:`~encmap.workflow.layout.PLACED`; the tracked map is left as
    it is) and returns
    ``{"ids", "coords", "neighbours": {id: [(neighbour, ℓ1), ...]}, "out_dir", "predicted", "same_as"}``
    (``same_as``: per variant, the map encoder it is identical to and drawn on, or None);
    ``predicted`` holds each variant's predicted score per task and regressor (and
    ``scores.csv``) when the run has fitted regressors (:data:`~encmap.workflow.layout.REGRESSORS`),
    ``intervals`` ridge's conformal interval per variant and task, with the reason its prediction
    extrapolates ("" where it does not).
    PIP and features are computed by the functions the pipeline's ``pip`` and ``features`` stages
    run, with the settings stored in the run's artifacts.
    """
    from threadpoolctl import threadpool_limits

    from .artifacts.failures import run_model
    from .artifacts.features import encoder_record
    from .artifacts.pip import as_stored, load_spectrum
    from .encoders.embed import embed_model, forward_settings, model_device
    from .encoders.variants import science_spec
    from .io import read_curated
    from .maps.distances import feature_distances, nearest_neighbours, same_encoder, symmetrised_qre
    from .maps.fields import FIELDS, coords_csv, neighbours_csv
    from .maps.page import page_data, render_page
    from .maps.tsne import TSNEMap, place_on_map
    from .qre.features import encoder_features
    from .qre.pairwise import pairwise_qre_matrix
    from .qre.spectrum import encoder_pip

    root = Path(root)
    params = load_params(root / params_path)
    check_id(model, "model id")
    if model in params["models"]:
        raise EncmapError(f"model id {model!r} is already in {params_path}; choose another with --id")
    validate_params(params | {"models": params["models"] | {model: spec}}, f"model entry {model!r}")
    out = Path(out_dir) if out_dir else root / PLACED.format(model=model)
    check_outside_outputs(out, root, params)  # before any work: the pipeline's files stay as they are
    fm = read_feature_matrix(root / FEATURE_MATRIX)
    model_h5 = root / MAP_MODEL
    ref, mattrs = read_h5(model_h5, ["coords", "space", "pca_mean", "pca_components", "representative",
                                     "encoder_ids"])
    if [str(x) for x in ref["encoder_ids"]] != fm["ids"] or mattrs["sentences_sha256"] != fm["attrs"]["sentences_sha256"]:
        raise EncmapError(f"{model_h5} and {FEATURE_MATRIX} disagree on the encoders or sentences; "
                          "rerun the map stage")
    sentences = root / SENTENCES.format(set=params["sentences"]["set"])
    texts, sha = read_curated(sentences, params["sentences"]["n"])
    if sha != fm["attrs"]["sentences_sha256"]:
        raise EncmapError(f"{sentences} (sha256 {sha[:12]}…) is not the sentence set the map was computed on "
                          f"({fm['attrs']['sentences_sha256'][:12]}…); rerun the pipeline first")
    # Factoring settings as the map's own PIP artifacts were made (not as params.yaml says now).
    first = fm["records"][0]
    _, pattrs = read_h5(root / LAYOUT["pip"].format(model=first["model"], encoder=first["id"]), [])
    eps, direction = float(fm["attrs"]["eps"]), str(fm["attrs"]["direction"])

    # A checkpoint that cannot be loaded or embedded: an error naming the model, as in the embed step.
    res = run_model(model, "place", "stop", lambda: embed_model(model, science_spec(spec), texts,
                                                                  model_device(spec, device), threads=threads,
                                                                  degenerate="error",
                                                                  forward=forward_settings(params["embed"])))
    ids, feats, records, spectra = [], [], [], []
    summaries: dict[str, list] = {k: [] for k in SPECTRAL}
    # The pip and features stages' own functions, BLAS on one thread as their jobs run
    # (encmap.workflow.jobs) and U as the stored artifact gives it back: a twin lands at distance 0.
    with threadpool_limits(1, user_api="blas"):
        for v in res.variants:
            factored, E = encoder_pip(res.arrays[v.id], tol=float(pattrs["tol"]), center=bool(pattrs["center"]),
                                      normalize_rows=bool(pattrs["normalize_rows"]), name=f"encoder {v.id!r}")
            s = as_stored(factored, E)
            f = encoder_features(s, direction=direction, eps=eps)
            ids.append(v.id)
            feats.append(f["features"])
            for key in SPECTRAL:
                summaries[key].append(f[key])
            spectra.append(s)
            records.append(encoder_record({"encoder": v.to_dict() | {"spec": spec}, "d": E.shape[1]}, spec["meta"]))
    F_new = np.vstack(feats)
    k = int(mattrs["neighbours"])
    L = feature_distances(F_new, "manhattan", fm["F"])
    order = np.argsort(L, axis=1, kind="stable")[:, :k]
    tmap = TSNEMap(ref["coords"], ref["space"], ref["pca_mean"], ref["pca_components"], str(mattrs["metric"]),
                   float(mattrs["perplexity"]), int(mattrs["seed"]), ref["representative"])
    # A new encoder identical to one on the map is drawn on it (the map draws identical encoders as one).
    same = same_encoder(L, np.abs(F_new).sum(axis=1), np.abs(fm["F"]).sum(axis=1))
    same_as = np.where(same.any(axis=1), np.argmin(np.where(same, L, np.inf), axis=1), -1)  # the nearest such
    if tmap.precomputed:
        # Distances of each new encoder to every map encoder: exact symmetrised QRE.
        ref_specs = [load_spectrum(root / LAYOUT["pip"].format(model=r["model"], encoder=r["id"]))[0]
                     for r in fm["records"]]
        X_new = np.vstack([symmetrised_qre(pairwise_qre_matrix([s, *ref_specs], eps=eps))[0, 1:] for s in spectra])
    else:
        X_new = F_new
    coords = place_on_map(tmap, X_new, random_state=tmap.seed, same_as=same_as)
    twin_ids = [fm["ids"][j] if j >= 0 else None for j in same_as]
    nbrs = {e: [(fm["ids"][j], float(L[i, j])) for j in order[i]] for i, e in enumerate(ids)}

    atomic_write_text(out / "placed.csv", coords_csv(ids, coords, records, twin_ids))
    atomic_write_text(out / "neighbours.csv", neighbours_csv(ids, order, np.take_along_axis(L, order, axis=1), "l1",
                                                             names=fm["ids"]))
    predicted, intervals = _predicted_scores(root / REGRESSORS, ids, F_new, fm["attrs"], out,
                                             {k: np.array(v) for k, v in summaries.items()})
    ref_idx, ref_dist = nearest_neighbours(feature_distances(fm["F"], "manhattan"), k)
    placed = [{"id": e, "x": coords[i, 0], "y": coords[i, 1], "record": records[i], "neighbours": nbrs[e],
               "same_as": twin_ids[i], "predicted": [[t, p["ridge"], *(
                   [intervals[e][t]["low"], intervals[e][t]["high"], intervals[e][t]["extrapolating"]]
                   if t in intervals.get(e, {}) else [None, None, ""])] for t, p in predicted.get(e, {}).items()]}
              for i, e in enumerate(ids)]
    page = page_data(fm["ids"], tmap.coords, fm["records"], list(FIELDS), ref_idx, ref_dist, "l1", placed)
    atomic_write_text(out / "map.html", render_page(page, f"encmap: map with {model} placed"))
    from .downstream.prediction import read_heldout_errors

    return {"ids": ids, "coords": coords, "neighbours": nbrs, "out_dir": str(out), "predicted": predicted,
            "intervals": intervals,
            "same_as": dict(zip(ids, twin_ids)), "predictor": read_h5(root / REGRESSORS, [])[1]
            .get("predictor", "qre") if predicted else None,
            "heldout": read_heldout_errors(root / REGRESSORS) if predicted else {}}


def _predicted_scores(regressors: Path, ids: list[str], F_new: np.ndarray, attrs: dict[str, Any],
                      out: Path, spectral: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Predicted scores ``{encoder: {task: {regressor: score}}}`` and ridge's conformal intervals
    ``{encoder: {task: {"low", "high", "level", "extrapolating"}}}``
    (:func:`encmap.downstream.prediction.placed_intervals`), and ``scores.csv``: each score with the
    out-of-fold MAE and RMSE of its regressor on that task, model held out (what it is expected to
    miss by), and for ridge its interval and, where it extrapolates, why; ({}, {}) without regressors."""
    from .downstream.prediction import placed_intervals, predict_scores, read_heldout_errors

    if not regressors.is_file():
        return {}, {}
    pred = predict_scores(regressors, F_new, attrs, spectral)
    errors = read_heldout_errors(regressors)
    bounds = placed_intervals(regressors, F_new, spectral, pred)
    table = {e: {t: {reg: float(v[i]) for reg, v in by_reg.items()} for t, by_reg in pred.items()}
             for i, e in enumerate(ids)}
    intervals = {e: {t: {"low": float(b["low"][i]), "high": float(b["high"][i]), "level": b["level"],
                         "extrapolating": b["extrapolating"][i]} for t, b in bounds.items()} for i, e in enumerate(ids)}
    rows = [{"encoder": e, "task": t, "regressor": reg, "predicted": v}
            | {f"heldout_{k}": errors.get(t, {}).get(reg, {}).get(k) for k in ("mae", "rmse")}
            | ({k: intervals[e][t][k] for k in ("low", "high", "level", "extrapolating")}
               if reg == "ridge" and t in intervals.get(e, {}) else {})
            for e, by_t in table.items() for t, by_reg in by_t.items() for reg, v in by_reg.items()]
    atomic_write_text(out / "scores.csv", csv_table(rows, ["encoder", "task", "regressor", "predicted", "heldout_mae",
                                                           "heldout_rmse", "low", "high", "level", "extrapolating"]))
    return table, intervals
