"""Agreement between pair measures: how alike two notions of "these encoders are similar" rank
the encoder pairs (Spearman over the pairs both measures have). Pure maths, no I/O.

In encmap "agreement" means only this: ℓ1 feature distance, exact QRE, CKA and stitch R²
compared with each other over encoder pairs (the ``agreement`` stage).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import spearmanr

from ..validation import EncmapError


def agreement_table(measures: dict[str, np.ndarray]) -> list[dict]:
    """Spearman rank correlation between every two pair measures, over the pairs both have.

    Parameters
    ----------
    measures : name -> ndarray (p,), one value per unordered encoder pair (the same pairs, in
        the same order, for every measure); NaN where a measure was not computed for a pair.

    Returns
    -------
    list of dict
        One row per two measures (in the order given): ``a``, ``b``, ``spearman`` (NaN with
        fewer than 3 common pairs or a constant measure) and ``pairs`` (how many were used).
    """
    names = list(measures)
    vals = {k: np.asarray(v, dtype=np.float64) for k, v in measures.items()}
    if len({v.shape for v in vals.values()}) > 1:
        raise EncmapError(f"agreement table: measures cover different pairs {[v.shape for v in vals.values()]}")
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ok = np.isfinite(vals[a]) & np.isfinite(vals[b])
            x, y = vals[a][ok], vals[b][ok]
            rho = float("nan")
            if ok.sum() >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0:
                rho = float(spearmanr(x, y).statistic)
            rows.append({"a": a, "b": b, "spearman": rho, "pairs": int(ok.sum())})
    return rows
