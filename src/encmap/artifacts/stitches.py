"""The stitch table ``results/similarity/stitches.json``: rows by source, target, method and depth."""

from __future__ import annotations

import numpy as np


def stitch_label(method: str, depth: int | None) -> str:
    """A stitch's name in tables and metrics: the method, or ``mlp<depth>`` for an MLP."""
    return f"mlp{depth}" if method == "mlp" else method


def stitch_matrix(rows: list[dict], ids: list[str], label: str, value: str = "r2") -> np.ndarray:
    """One stitch score as a (k, k) matrix, row = source, column = target; NaN where not fitted."""
    pos = {e: i for i, e in enumerate(ids)}
    M = np.full((len(ids), len(ids)), np.nan)
    for r in rows:
        if stitch_label(r["method"], r["depth"]) == label and r["source"] in pos and r["target"] in pos:
            M[pos[r["source"]], pos[r["target"]]] = r[value]
    return M
