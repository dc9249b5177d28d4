"""What a matplotlib SVG says: its text, for tests that read a figure as a person would."""

from __future__ import annotations

import re
from pathlib import Path


def svg_texts(path: str | Path) -> list[str]:
    """Every text of a matplotlib SVG (titles, labels, legend entries, annotations), in drawing order.

    matplotlib draws text as glyph paths and writes each string before them in a comment."""
    return re.findall(r"<!-- (.*?) -->", Path(path).read_text(encoding="utf-8"), re.S)


def check_regression_figures(table_csv: str | Path, predictions_csv: str | Path, predicted_svg: str | Path,
                             baselines_svg: str | Path, predictor: str) -> None:
    """The regression's figures say what its tables say: a predicted-vs-actual panel per task and
    protocol whose legend gives each regressor's Spearman, recomputed here from predictions.csv
    (scipy, on the written values); a bar label per feature set and panel for every ridge
    Spearman in table.csv."""
    import csv
    from collections import Counter

    import numpy as np
    from scipy.stats import spearmanr

    preds = [r for r in csv.DictReader(Path(predictions_csv).open()) if r["features"] == predictor]
    table = [r for r in csv.DictReader(Path(table_csv).open()) if r["regressor"] == "ridge"]
    assert preds and table
    texts = svg_texts(predicted_svg)
    panels: dict[tuple, dict[str, list]] = {}
    for r in preds:
        panels.setdefault((r["task"], r["protocol"]), {}).setdefault(r["regressor"], []).append(
            (float(r["actual"]), float(r["predicted"])))
    for (task, protocol), by_reg in panels.items():
        assert f"{task}: {protocol} CV, {predictor} features" in texts, (task, protocol)
        for reg, pts in by_reg.items():
            a, p = np.array(pts).T
            rho = spearmanr(a, p).statistic if len(pts) > 2 and np.ptp(a) > 0 and np.ptp(p) > 0 else np.nan
            assert f"{reg} (Spearman {rho:.2f})" in texts, (task, protocol, reg, rho)
    texts = svg_texts(baselines_svg)
    for task, protocol in {(r["task"], r["protocol"]) for r in table}:
        assert f"{task}: {protocol} CV (ridge)" in texts, (task, protocol)
    numbers = Counter(" n/a" if r["spearman"] in ("", "nan") else f" {float(r['spearman']):.2f}" for r in table)
    drawn = Counter(t for t in texts if re.fullmatch(r" (-?\d+\.\d\d|n/a)", t))
    assert not numbers - drawn, numbers - drawn  # every Spearman of the table is drawn
