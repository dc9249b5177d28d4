"""Static figures (matplotlib): the map per metadata field, heatmaps of pair measures; reproducible bytes.

PNG and SVG carry no timestamps (``metadata`` without dates, a fixed ``svg.hashsalt``), so
the same map gives byte-identical files and DVC sees no change on a rerun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .maptable import NUMERIC_FIELDS, field_values, layer_paths

#: At most this many categories get their own legend entry; the rest are drawn as "other".
MAX_LEGEND = 20


def _categories(values: list[Any]) -> tuple[list[str], dict[str, int]]:
    """Category labels in legend order (most frequent first, ties by name), "other" past MAX_LEGEND."""
    labels = ["n/a" if v is None else str(v) for v in values]
    uniq, counts = np.unique(labels, return_counts=True)
    order = [u for _, u in sorted(zip(-counts, uniq))]
    if all(isinstance(v, (int, float)) or v is None for v in values):
        order = sorted(order, key=lambda s: (s == "n/a", float(s) if s != "n/a" else 0.0))
    keep = order if len(order) <= MAX_LEGEND else order[:MAX_LEGEND - 1] + ["other"]
    pos = {c: i for i, c in enumerate(keep)}
    return keep, {lab: pos.get(lab, pos.get("other", 0)) for lab in labels}


def draw_map(coords: np.ndarray, records: Sequence[dict], field: str, png: str | Path, svg: str | Path,
             title: str = "") -> None:
    """Scatter of the map coloured by ``field``; layers of one model joined in layer order.

    Parameters
    ----------
    coords : ndarray, shape (m, 2)
    records : m encoder records (see :mod:`encmap.maptable`)
    field : a metadata field
    png, svg : output paths (written atomically)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors as mcolors

    coords = np.asarray(coords, dtype=np.float64)
    values = [field_values(r)[field] for r in records]
    plt.rcParams["svg.hashsalt"] = "encmap"  # stable SVG element ids
    fig, ax = plt.subplots(figsize=(9.5, 6.5), dpi=150)
    for path in layer_paths(records):
        ax.plot(coords[path, 0], coords[path, 1], color="0.6", lw=0.6, zorder=1)
    numbers = [v for v in values if v is not None]
    continuous = field in NUMERIC_FIELDS and len(set(numbers)) > 12
    if continuous:
        arr = np.array([np.nan if v is None else float(v) for v in values])
        log = field == "parameters" and np.nanmin(arr) > 0
        norm = mcolors.LogNorm() if log else mcolors.Normalize()
        na = np.isnan(arr)
        ax.scatter(coords[na, 0], coords[na, 1], s=26, c="0.75", edgecolors="0.3", linewidths=0.4, zorder=2)
        sc = ax.scatter(coords[~na, 0], coords[~na, 1], s=26, c=arr[~na], cmap="viridis", norm=norm,
                        edgecolors="0.2", linewidths=0.4, zorder=3)
        fig.colorbar(sc, ax=ax, label=field)
    else:
        keep, which = _categories(values)
        cmap = plt.get_cmap("tab20" if len(keep) > 10 else "tab10")
        labels = ["n/a" if v is None else str(v) for v in values]
        idx = np.array([which[lab] for lab in labels])
        for k, name in enumerate(keep):
            sel = idx == k
            colour = "0.7" if name in ("other", "n/a") else cmap(k % cmap.N)
            ax.scatter(coords[sel, 0], coords[sel, 1], s=26, color=colour, edgecolors="0.2", linewidths=0.4,
                       zorder=3, label=f"{name} ({int(sel.sum())})")
        ax.legend(title=field, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title_fontsize=9,
                  frameon=False, ncol=1 if len(keep) <= 14 else 2)
    ax.set_title(title or f"map of {len(records)} encoders, coloured by {field}", fontsize=11)
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")
    ax.set_aspect("equal", adjustable="datalim")
    ax.tick_params(labelsize=8)
    _save(fig, png, svg)


def _save(fig, png: str | Path, svg: str | Path) -> None:
    """Write PNG and SVG without timestamps, atomically, and close the figure."""
    import matplotlib.pyplot as plt

    from .io import atomic_path

    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    with atomic_path(svg) as tmp:
        fig.savefig(tmp, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def draw_heatmap(M: np.ndarray, rows: Sequence[str], cols: Sequence[str], png: str | Path, svg: str | Path, *,
                 title: str, label: str, vmin: float | None = None, vmax: float | None = None) -> None:
    """A labelled heatmap of a matrix (e.g. CKA between encoders); NaN cells are left grey.

    Parameters
    ----------
    M : ndarray, shape (len(rows), len(cols))
    rows, cols : tick labels (encoder ids)
    png, svg : output paths (written atomically)
    title, label : figure title and colour-bar label
    vmin, vmax : colour scale limits (default: the finite values' range)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    M = np.asarray(M, dtype=np.float64)
    plt.rcParams["svg.hashsalt"] = "encmap"
    side = min(4.0 + 0.16 * max(len(rows), len(cols)), 30.0)
    fig, ax = plt.subplots(figsize=(side + 1.5, side), dpi=150)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    im = ax.imshow(np.ma.masked_invalid(M), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    font = max(3.0, min(8.0, 400.0 / max(len(rows), len(cols), 1)))
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=font)
    ax.set_yticks(range(len(rows)), rows, fontsize=font)
    fig.colorbar(im, ax=ax, label=label, shrink=0.8)
    ax.set_title(title, fontsize=11)
    _save(fig, png, svg)


def draw_predictions(rows: Sequence[dict], tasks: Sequence[str], png: str | Path, svg: str | Path,
                     features: str = "qre") -> None:
    """Predicted vs actual score per task (rows) and CV protocol (columns), both regressors.

    ``rows`` are out-of-fold predictions (task, protocol, features, regressor, model, actual,
    predicted); only those of ``features`` are drawn, each point coloured by its regressor.
    A dashed line marks predicted = actual.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy.stats import spearmanr

    plt.rcParams["svg.hashsalt"] = "encmap"
    protocols = ("grouped", "random")
    regressors = sorted({r["regressor"] for r in rows if r["features"] == features})
    colours = dict(zip(regressors, ("tab:blue", "tab:orange", "tab:green")))
    fig, axes = plt.subplots(len(tasks), 2, figsize=(7.0, 2.6 * len(tasks)), squeeze=False)
    for i, task in enumerate(tasks):
        for j, prot in enumerate(protocols):
            ax = axes[i, j]
            sel = [r for r in rows if r["task"] == task and r["protocol"] == prot and r["features"] == features]
            vals = [v for r in sel for v in (r["actual"], r["predicted"])]
            for reg in regressors:
                pts = [r for r in sel if r["regressor"] == reg]
                a, p = np.array([r["actual"] for r in pts]), np.array([r["predicted"] for r in pts])
                rho = spearmanr(a, p).statistic if len(pts) > 2 and np.ptp(a) > 0 and np.ptp(p) > 0 else np.nan
                ax.scatter(a, p, s=12, alpha=0.75, color=colours[reg], label=f"{reg} (Spearman {rho:.2f})")
            if vals:
                lo, hi = min(vals), max(vals)
                ax.plot([lo, hi], [lo, hi], ls="--", lw=0.8, color="grey")
            ax.set_title(f"{task}: {prot} CV, {features} features", fontsize=9)
            ax.set_xlabel("actual", fontsize=8)
            ax.set_ylabel("predicted", fontsize=8)
            ax.tick_params(labelsize=7)
            if sel:
                ax.legend(fontsize=6, loc="best")
    _save(fig, png, svg)
