"""Step of rule ``agreement``: how the pair measures agree with each other and with the map, and
heatmaps of linear CKA, RBF CKA and stitch R²."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts.features import read_feature_matrix
from ..artifacts.stitches import stitch_label, stitch_matrix
from ..io import atomic_write_json, atomic_write_text, read_h5, rounded
from ..maps.distances import feature_distances, symmetrised_qre
from ..similarity.agreement import agreement_table
from ..similarity.figures import draw_heatmap
from ..validation import EncmapError


def agreement_step(features: str, pairwise: str, cka: str, rbf: str, stitches: str, out: dict[str, str]) -> None:
    """How the notions of similarity agree, and heatmaps of them.

    Over unordered encoder pairs: ℓ1 distance of QRE features, symmetrised exact QRE, 1 - linear
    CKA (debiased and biased), 1 - RBF CKA (debiased) and, per stitch, 1 - the mean R² of the
    two directions. Writes ``agreement`` (CSV: Spearman between every two measures and the
    number of pairs), ``metrics`` (JSON for DVC) and heatmaps ``png_<name>`` / ``svg_<name>``
    for each of :data:`encmap.workflow.layout.HEATMAPS`.
    """
    fm = read_feature_matrix(features)
    ids = fm["ids"]
    m = len(ids)
    pw, _ = read_h5(pairwise, ["qre", "encoder_ids"])
    ck, _ = read_h5(cka, ["cka", "cka_debiased", "encoder_ids"])
    for path, d in ((pairwise, pw), (cka, ck)):
        if [str(x) for x in d["encoder_ids"]] != ids:
            raise EncmapError(f"{path} and {features} list different encoders; rerun the pairwise stage")
    rb, _ = read_h5(rbf, ["cka_rbf_debiased", "encoder_ids"])
    st = json.loads(Path(stitches).read_text())
    sub = [str(x) for x in rb["encoder_ids"]]
    unknown = [e for e in sub if e not in ids]
    if unknown:
        raise EncmapError(f"{rbf}: encoder {unknown[0]!r} is not on the map of {features}; rerun the cka_rbf stage")
    pos = [ids.index(e) for e in sub]

    def on_map(S: np.ndarray) -> np.ndarray:  # a subset matrix placed in the map's m x m frame
        M = np.full((m, m), np.nan)
        M[np.ix_(pos, pos)] = S
        return M

    iu = np.triu_indices(m, 1)
    full = {"l1": feature_distances(fm["F"], "manhattan"), "exact_qre": symmetrised_qre(pw["qre"]),
            "1-cka": 1.0 - ck["cka_debiased"], "1-cka_biased": 1.0 - ck["cka"],
            "1-rbf_cka": on_map(1.0 - rb["cka_rbf_debiased"])}
    labels = sorted({stitch_label(r["method"], r["depth"]) for r in st["rows"]} - {"mean", "random-source"})
    r2 = {lab: stitch_matrix(st["rows"], sub, lab) for lab in labels}
    for lab, S in r2.items():
        full[f"1-stitch_{lab}"] = on_map(1.0 - 0.5 * (S + S.T))  # NaN unless fitted both ways
    table = agreement_table({k: M[iu] for k, M in full.items()})

    lines = ["a,b,spearman,pairs"] + [f"{r['a']},{r['b']},{'' if np.isnan(r['spearman']) else repr(r['spearman'])},"
                                      f"{r['pairs']}" for r in table]
    metrics: dict[str, Any] = {"encoders": m, "subset": len(sub),
                               "agreement": {f"{r['a']}~{r['b']}": r["spearman"] for r in table},
                               "cka_debiased_mean": float(ck["cka_debiased"][iu].mean()),
                               "stitch_r2_median": {}}
    for lab in sorted({stitch_label(r["method"], r["depth"]) for r in st["rows"]}):
        # The median: one badly scaled pair (Procrustes cannot rescale) would swamp a mean.
        vals = [r["r2"] for r in st["rows"] if stitch_label(r["method"], r["depth"]) == lab]
        metrics["stitch_r2_median"][lab] = float(np.median(vals))
    draw_heatmap(ck["cka_debiased"], ids, ids, out["png_cka_linear"], out["svg_cka_linear"],
                 title=f"linear CKA (debiased) between {m} encoders", label="CKA", vmin=0.0, vmax=1.0)
    draw_heatmap(rb["cka_rbf_debiased"], sub, sub, out["png_cka_rbf"], out["svg_cka_rbf"],
                 title=f"RBF CKA (debiased) between {len(sub)} encoders", label="CKA", vmin=0.0, vmax=1.0)
    lab = "ridge" if "ridge" in r2 else (labels[0] if labels else None)
    S = r2[lab] if lab else np.full((len(sub), len(sub)), np.nan)
    draw_heatmap(S, sub, sub, out["png_stitch_r2"], out["svg_stitch_r2"],
                 title=f"stitch R² ({lab}): row = source, column = target", label="R² (held-out)",
                 vmin=0.0, vmax=1.0)
    atomic_write_text(out["agreement"], "\n".join(lines) + "\n")
    atomic_write_json(out["metrics"], rounded(metrics))
