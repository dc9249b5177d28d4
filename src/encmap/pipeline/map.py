"""Step of rule ``map``: the map of the encoders, its figures, page and faithfulness metrics."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..artifacts.features import left_off, read_feature_matrix, read_pairwise_qre
from ..downstream.score_tables import held_out_scores
from ..io import atomic_write_json, atomic_write_text, read_h5, rounded, write_h5
from ..maps.distances import feature_distances, groups_of, identical_groups, nearest_neighbours, symmetrised_qre
from ..maps.faithfulness import adjacent_layer_share, l1_vs_exact_qre, neighbour_purity, separation, trustworthiness
from ..maps.fields import check_fields, coords_csv, field_values, neighbours_csv
from ..maps.figures import draw_map
from ..maps.page import page_data, render_page
from ..maps.tsne import fit_map
from ..validation import EncmapError, check_perplexity, few, fit_to_mapped


def _fit_to_mapped(params: dict[str, Any], m: int, off: list[str]) -> dict[str, Any]:
    """``params`` with the values the m mapped encoders bound lowered where the run left encoders off
    (:func:`~encmap.validation.fit_to_mapped`), each change a warning in the job's log."""
    params = dict(params)
    for key in ("perplexity", "neighbours", "trustworthiness_k"):
        params[key], note = fit_to_mapped(f"map.{key}", params[key], m, off)
        if note:
            print(f"warning: {note}", file=sys.stderr)
    return params


def map_step(features: str, pairwise: str, out: dict[str, str], *, params: dict[str, Any],
             predictions: str | None = None, predictor: str = "qre") -> None:
    """Fit the map and write every map output: coords, neighbours, figures, page, model, metrics.

    The page also carries the second layout (exact QRE beside the ℓ1 map, or ℓ1 beside an
    exact-QRE map) with the faithfulness figures of each, and, from ``predictions`` (the
    regression's predictions.csv), each encoder's measured and predicted scores (those of the
    regression's ``predictor`` feature set, ridge, its model held out). ``out`` names the files (keys ``coords``, ``neighbours``, ``html``, ``model``, ``metrics``,
    ``timing``, and ``png_<field>`` / ``svg_<field>``). Everything is validated and computed
    before the first file is written.
    """
    fields = check_fields(params["fields"])
    fm = read_feature_matrix(features)
    F, ids, records = fm["F"], fm["ids"], fm["records"]
    m = len(ids)
    off = left_off(fm["attrs"])
    if m < 4 and off:
        raise EncmapError(f"{features}: a map needs at least 4 encoders and {m} are left: the run left off {len(off)} "
                          f"({few(off)}: failed models or degenerate encoders, listed in "
                          "results/features/failures.json and the gather log)")
    given, params = params, _fit_to_mapped(params, m, off)
    check_perplexity(params["perplexity"], m)
    Q = read_pairwise_qre(pairwise, fm)
    table = [field_values(r) for r in records]  # raises naming an encoder whose meta lacks a field
    t0 = time.perf_counter()
    L = feature_distances(F, "manhattan")
    S = symmetrised_qre(Q)
    # Encoders that are one encoder (features equal to rounding) are drawn as one, in both layouts.
    rep = identical_groups(F, L)
    same = [ids[r] if r != i else None for i, r in enumerate(rep)]
    groups = groups_of(rep)
    for g in groups:
        print(f"identical encoders, drawn as one: {', '.join(ids[i] for i in g)}", file=sys.stderr)
    metric = params["metric"]
    X = S if metric == "exact-qre" else F
    tmap = fit_map(X, metric=metric, perplexity=params["perplexity"], pca_dims=params["pca_dims"],
                   n_iter=params["n_iter"], early_exaggeration_iter=params["early_exaggeration_iter"],
                   init=params["init"], random_state=params["seed"], same=rep)
    fit_seconds = time.perf_counter() - t0
    if tmap.perplexity != float(params["perplexity"]):
        print(f"warning: map.perplexity {params['perplexity']} is too large for the {tmap.distinct.size} distinct "
              f"encoders of this map; t-SNE ran at {tmap.perplexity:.4g}", file=sys.stderr)
    other = "manhattan" if metric == "exact-qre" else "exact-qre"
    tmap2 = fit_map(F if other == "manhattan" else S, metric=other, perplexity=params["perplexity"],
                    pca_dims=params["pca_dims"], n_iter=params["n_iter"],
                    early_exaggeration_iter=params["early_exaggeration_iter"], init=params["init"],
                    random_state=params["seed"], same=rep)
    nn_idx, nn_dist = nearest_neighbours(L, params["neighbours"])

    col = {f: [t[f] for t in table] for f in ("model", "family", "pooling", "kind", "layer")}
    pretrained = np.array([k == "pretrained" for k in col["kind"]])
    metrics: dict[str, Any] = {"encoders": m, "metric": metric, "perplexity": given["perplexity"],
                               "perplexity_used": tmap.perplexity, "distinct_encoders": int(tmap.distinct.size),
                               # encoders drawn on an identical one (coords.csv's same_as names it)
                               "identical_encoders": m - int(tmap.distinct.size),
                               # left off by gather: their models failed (embed.on_error: skip)
                               "failed_encoders": len(json.loads(fm["attrs"].get("failed", "{}")))}
    k = params["trustworthiness_k"]
    for name, D in (("l1", L), ("exact_qre", S)):
        purity = {f: neighbour_purity(D, col[f]) for f in ("model", "family", "pooling", "kind")}
        block: dict[str, Any] = {f"purity_{f}": p["purity"] for f, p in purity.items()}
        pp = neighbour_purity(D, col["model"], among=pretrained)
        block |= {"purity_model_pretrained": pp["purity"], "purity_model_pretrained_count": pp["count"],
                  "purity_model_chance": purity["model"]["chance"],
                  "adjacent_layer_share": adjacent_layer_share(D, col["model"], col["pooling"], col["layer"])["share"],
                  "trustworthiness": trustworthiness(D, tmap.coords, k)}
        sep = separation(D, col["kind"], col["model"])
        block |= {"control_separation_ratio": sep["ratio"], "silhouette_kind": sep["silhouette_kind"]}
        metrics[name] = block
    metrics["l1_vs_exact_qre"] = l1_vs_exact_qre(L, Q)
    # Each layout's faithfulness, for the page: how well its neighbours keep those of the
    # distance it was fitted on, and that distance's purity figures.
    layouts = {metric: tmap.coords, other: tmap2.coords}
    metrics["layouts"] = {name: {"trustworthiness_l1": trustworthiness(L, xy, k),
                                 "trustworthiness_exact_qre": trustworthiness(S, xy, k)}
                          for name, xy in layouts.items()}
    faith = {}
    for name in layouts:
        block = metrics["exact_qre" if name == "exact-qre" else "l1"]
        dist = "exact QRE" if name == "exact-qre" else "l1"
        faith[name] = {f"trustworthiness (k={k}, vs {dist})":
                       metrics["layouts"][name]["trustworthiness_exact_qre" if name == "exact-qre" else "trustworthiness_l1"]}
        faith[name] |= {f"{key} ({dist})": block[key] for key in (
            "purity_model_pretrained", "purity_family", "adjacent_layer_share", "control_separation_ratio")}
    metrics["trustworthiness_k"] = k

    write_h5(out["model"], {"coords": tmap.coords, "space": tmap.space, "pca_mean": tmap.pca_mean,
                            "pca_components": tmap.pca_components, "representative": tmap.representative,
                            "encoder_ids": np.array(ids, dtype=object)}, {
        "metric": metric, "perplexity": tmap.perplexity, "seed": tmap.seed, "eps": fm["attrs"]["eps"],
        "direction": fm["attrs"]["direction"], "sentences_sha256": fm["attrs"]["sentences_sha256"],
        "neighbours": params["neighbours"], "encmap_version": __version__,
        "note": "reference map for `encmap place`: coords (m, 2), the rows t-SNE ran on (space, of the rows "
                "whose representative is themselves; identical encoders share their representative's point)",
    })
    atomic_write_text(out["coords"], coords_csv(ids, tmap.coords, records, same))
    atomic_write_text(out["neighbours"], neighbours_csv(ids, nn_idx, nn_dist, "l1"))
    for f in fields:
        draw_map(tmap.coords, records, f, out[f"png_{f}"], out[f"svg_{f}"])
    # The figures folder persists between runs (DVC): a field taken out of map.fields leaves no figure.
    figures = {Path(out[f"{ext}_{f}"]).resolve() for f in fields for ext in ("png", "svg")}
    for folder in {Path(out[f"png_{f}"]).parent for f in fields}:
        for old in folder.glob("map_*.*"):
            if old.suffix in (".png", ".svg") and old.resolve() not in figures:
                old.unlink()
    page = page_data(ids, tmap.coords, records, fields, nn_idx, nn_dist, "l1", layout=metric,
                     others={other: tmap2.coords}, faithfulness=faith,
                     scores=held_out_scores(predictions, features=predictor) if predictions else None, same=same,
                     predictor=predictor)
    atomic_write_text(out["html"], render_page(page))
    atomic_write_json(out["metrics"], rounded(metrics))
    atomic_write_json(out["timing"], {"map_fit_seconds": round(fit_seconds, 3)})
