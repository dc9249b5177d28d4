"""Heatmaps of pair measures between encoders (matplotlib); reproducible bytes (:func:`encmap.io.save_figure`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..io import save_figure


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
    plt.rcParams["text.parse_math"] = False  # data are text, never mathtext
    side = min(4.0 + 0.16 * max(len(rows), len(cols)), 30.0)
    fig, ax = plt.subplots(figsize=(side + 1.5, side), dpi=150)
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    im = ax.imshow(np.ma.masked_invalid(M), cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    font = max(3.0, min(8.0, 400.0 / max(len(rows), len(cols), 1)))
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=font)
    ax.set_yticks(range(len(rows)), rows, fontsize=font)
    fig.colorbar(im, ax=ax, label=label, shrink=0.8)
    ax.set_title(title, fontsize=11)
    save_figure(fig, png, svg)
