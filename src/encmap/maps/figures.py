"""Static figures of the map (matplotlib): the map coloured by each metadata field; reproducible bytes.

PNG and SVG carry no timestamps (``metadata`` without dates, a fixed ``svg.hashsalt``), so
the same map gives byte-identical files and DVC sees no change on a rerun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..io import save_figure
from .fields import NUMERIC_FIELDS, field_column, layer_paths, lineage

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

    ``field`` "lineage" colours by lineage root and draws an arrow from each model to the model
    it was derived from (``meta.derived_from``) where both are on the map.

    Parameters
    ----------
    coords : ndarray, shape (m, 2)
    records : m encoder records (see :mod:`encmap.maps.fields`)
    field : a metadata field
    png, svg : output paths (written atomically)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors as mcolors

    coords = np.asarray(coords, dtype=np.float64)
    values = field_column(records, field)
    plt.rcParams["svg.hashsalt"] = "encmap"  # stable SVG element ids
    plt.rcParams["text.parse_math"] = False  # data are text: "costs $5 to $10" is not maths
    fig, ax = plt.subplots(figsize=(9.5, 6.5), dpi=150)
    for path in layer_paths(records):
        ax.plot(coords[path, 0], coords[path, 1], color="0.6", lw=0.6, zorder=1)
    if field == "lineage":
        for child, parent in lineage(records)[1]:
            ax.annotate("", xy=coords[parent], xytext=coords[child], zorder=2,
                        arrowprops={"arrowstyle": "-|>", "color": "#b22222", "lw": 1.3, "alpha": 0.9,
                                    "shrinkA": 4, "shrinkB": 4})
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
    save_figure(fig, png, svg)
