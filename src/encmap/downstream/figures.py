"""The regression's figure: predicted vs actual scores (matplotlib); reproducible bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..io import save_figure
from .regression import PROTOCOLS


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
    plt.rcParams["text.parse_math"] = False  # data are text, never mathtext
    protocols = [p for p in PROTOCOLS if any(r["protocol"] == p for r in rows)]  # family: where there are 3
    regressors = sorted({r["regressor"] for r in rows if r["features"] == features})
    colours = dict(zip(regressors, ("tab:blue", "tab:orange", "tab:green")))
    fig, axes = plt.subplots(len(tasks), len(protocols), figsize=(3.5 * len(protocols), 2.6 * len(tasks)),
                             squeeze=False)
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
            else:  # a task scored on encoders of fewer than 3 families
                ax.text(0.5, 0.5, f"no {prot} CV:\nfewer than 3 groups", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8, color="grey")
                ax.set_xticks([])
                ax.set_yticks([])
    save_figure(fig, png, svg)


def draw_baselines(rows: Sequence[dict], tasks: Sequence[str], png: str | Path, svg: str | Path,
                   regressor: str = "ridge") -> None:
    """Out-of-fold Spearman of every feature set, per task (rows) and CV protocol (columns).

    ``rows`` are the regression table's rows; one regressor's (ridge: every feature set has
    it; the training mean has none) bars per panel, the QRE features in blue, the spectral
    baselines in orange, the leave-task-out ones in green, the rest in grey; each bar with its
    bootstrap interval over the held-out groups (``spearman_low``, ``spearman_high``) where the
    table has one.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .regression import FEATURE_SETS, NEEDS

    SPECTRAL_SETS = tuple(NEEDS)
    plt.rcParams["svg.hashsalt"] = "encmap"
    plt.rcParams["text.parse_math"] = False
    protocols = [p for p in PROTOCOLS if any(r["protocol"] == p for r in rows)]
    sets = [fs for fs in FEATURE_SETS if any(r["features"] == fs and r["regressor"] == regressor for r in rows)]
    colour = {fs: ("tab:blue" if fs == "qre" else "tab:orange" if fs in SPECTRAL_SETS
                   else "tab:green" if "tasks" in fs else "0.6") for fs in sets}
    fig, axes = plt.subplots(len(tasks), len(protocols), figsize=(3.6 * len(protocols), 0.26 * len(sets) * len(tasks) + 1),
                             squeeze=False)
    for i, task in enumerate(tasks):
        for j, prot in enumerate(protocols):
            ax = axes[i, j]
            got = {r["features"]: r for r in rows
                   if r["task"] == task and r["protocol"] == prot and r["regressor"] == regressor}
            vals = [got[fs]["spearman"] if fs in got else np.nan for fs in sets]
            lo = np.array([float(got[fs].get("spearman_low", np.nan)) if fs in got else np.nan for fs in sets])
            hi = np.array([float(got[fs].get("spearman_high", np.nan)) if fs in got else np.nan for fs in sets])
            y = np.arange(len(sets))[::-1]
            ax.barh(y, np.nan_to_num(vals), color=[colour[fs] for fs in sets])
            ok = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(vals)
            if ok.any():  # the interval, drawn from its ends (a bootstrap interval need not hold the estimate)
                ax.hlines(y[ok], lo[ok], hi[ok], color="black", lw=0.8)
            for yy, v in zip(y, vals):
                ax.text(0.0 if not np.isfinite(v) or v >= 0 else v, yy, " n/a" if not np.isfinite(v) else f" {v:.2f}",
                        va="center", fontsize=6)
            ax.set_yticks(y, sets, fontsize=6)
            ax.set_xlim(-1, 1)
            ax.axvline(0, color="black", lw=0.6)
            ax.set_title(f"{task}: {prot} CV ({regressor})", fontsize=8)
            ax.tick_params(axis="x", labelsize=6)
            if i == len(tasks) - 1:
                ax.set_xlabel("Spearman, out of fold", fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, svg)
