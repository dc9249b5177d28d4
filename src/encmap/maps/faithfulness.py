"""How faithful is the map? Neighbour purity, layer order, trustworthiness, separation of
controls, and how well ℓ1 feature distance tracks the exact pairwise QRE.

Pure maths on distance matrices and label arrays; no I/O. Every function takes an (m, m)
distance matrix ``D`` (zero diagonal) and per-encoder labels of length m.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr

from ..validation import EncmapError


def _nearest(D: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """Index of each row's nearest other point (among ``allowed`` columns), ties by index; -1 if none."""
    D = np.array(D, dtype=np.float64)
    np.fill_diagonal(D, np.inf)
    if allowed is not None:
        D[~allowed] = np.inf
    j = np.argmin(D, axis=1)
    return np.where(np.isfinite(D[np.arange(len(D)), j]), j, -1)


def neighbour_purity(D: np.ndarray, labels: Sequence, among: np.ndarray | None = None) -> dict:
    """Share of points whose nearest neighbour has the same label.

    Counted over points whose label occurs at least twice (else no neighbour can match), and,
    when ``among`` (bool, (m,)) is given, only over those points.

    Returns
    -------
    dict
        ``purity`` (float, NaN when no point qualifies), ``count`` (points counted) and
        ``chance``: the expected purity if the neighbour were a uniformly random other point.
    """
    lab = np.asarray([str(x) for x in labels], dtype=object)
    m = len(lab)
    if D.shape != (m, m):
        raise EncmapError(f"distance matrix of shape {D.shape} does not match {m} labels")
    values, counts = np.unique(lab, return_counts=True)
    size = dict(zip(values, counts))
    ok = np.array([size[x] >= 2 for x in lab])
    if among is not None:
        ok &= np.asarray(among, dtype=bool)
    nn = _nearest(D)
    hits = lab[nn] == lab
    count = int(ok.sum())
    chance = float(np.mean([(size[x] - 1) / (m - 1) for x in lab[ok]])) if count else float("nan")
    return {"purity": float(hits[ok].mean()) if count else float("nan"), "count": count, "chance": chance}


def adjacent_layer_share(D: np.ndarray, model: Sequence, pooling: Sequence, layer: Sequence) -> dict:
    """Share of layer encoders whose nearest same-model, same-pooling encoder is an adjacent layer.

    Adjacent means next in that model's own list of layers (e.g. 3 and 6 when it has 0, 3, 6, 9).
    Only encoders with a layer (not the model's output) and at least one same-model,
    same-pooling sibling count.
    """
    model = np.asarray([str(x) for x in model], dtype=object)
    pooling = np.asarray([str(x) for x in pooling], dtype=object)
    has = np.array([x is not None and not (isinstance(x, float) and np.isnan(x)) for x in layer])
    lay = np.array([int(x) if h else -1 for x, h in zip(layer, has)])
    group = np.array([f"{a}\x00{b}" for a, b in zip(model, pooling)], dtype=object)
    same = (group[:, None] == group[None, :]) & has[:, None] & has[None, :]
    nn = _nearest(D, same)
    hits, count = 0, 0
    for i in np.flatnonzero(has & (nn >= 0)):
        order = sorted(set(lay[same[i]]) | {lay[i]})
        count += 1
        hits += abs(order.index(lay[i]) - order.index(lay[nn[i]])) == 1
    return {"share": hits / count if count else float("nan"), "count": count}


def trustworthiness(D: np.ndarray, Y: np.ndarray, k: int = 5) -> float:
    """Trustworthiness (scikit-learn) of a low-dimensional map Y (m, 2) against distances D."""
    from sklearn.manifold import trustworthiness as sk_trust

    m = D.shape[0]
    if not 1 <= k < m / 2:
        raise EncmapError(f"trustworthiness needs 1 <= k < m/2 = {m / 2}, got k = {k}")
    return float(sk_trust(np.asarray(D, dtype=np.float64), np.asarray(Y), n_neighbors=k, metric="precomputed"))


def separation(D: np.ndarray, kind: Sequence, model: Sequence | None = None, group: str = "control",
               reference: str = "pretrained") -> dict:
    """How far ``group`` encoders (controls) sit from ``reference`` encoders (pretrained).

    Returns
    -------
    dict
        ``ratio``: mean distance from a control to its nearest pretrained encoder, over the mean
        distance from a pretrained encoder to its nearest pretrained encoder *of another model*
        (``model`` labels; without them, any other one). > 1: controls lie farther from every
        pretrained encoder than pretrained models lie from each other. Other-model neighbours,
        so a model's near-duplicate variants (its output and a truncation) cannot shrink the
        denominator. ``silhouette_kind``: silhouette of the kind labels under D (scikit-learn,
        precomputed). NaN where a group is missing.
    """
    from sklearn.metrics import silhouette_score

    kind = np.asarray([str(x) for x in kind], dtype=object)
    m = len(kind)
    owner = np.arange(m).astype(str) if model is None else np.asarray([str(x) for x in model], dtype=object)
    g, r = kind == group, kind == reference
    out = {"ratio": float("nan"), "silhouette_kind": float("nan"), group: int(g.sum()), reference: int(r.sum())}
    Dm = np.asarray(D, dtype=np.float64)
    if g.any() and len(set(owner[r])) >= 2:
        to_ref = Dm[np.ix_(g, r)].min(axis=1).mean()
        other = (owner[r][:, None] != owner[r][None, :])
        within = np.where(other, Dm[np.ix_(r, r)], np.inf).min(axis=1).mean()
        out["ratio"] = float(to_ref / within) if within > 0 else float("inf")
    if 2 <= len(set(kind)) <= m - 1:
        out["silhouette_kind"] = float(silhouette_score(Dm, kind, metric="precomputed"))
    return out


def l1_vs_exact_qre(L: np.ndarray, Q: np.ndarray) -> dict:
    """Rank and linear correlation between a symmetric distance L (e.g. ℓ1 of features) and directed QRE Q.

    Over unordered pairs i < j (in the matrices' order): Spearman and Pearson of L_ij against
    S(ρ_i‖ρ_j) (``forward``), S(ρ_j‖ρ_i) (``reverse``), their mean (``symmetrised``); and over
    all ordered pairs (``ordered``, which does not depend on the order of encoders).
    """
    L = np.asarray(L, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    m = L.shape[0]
    if Q.shape != L.shape or m < 3:
        raise EncmapError(f"l1 vs exact QRE needs two (m, m) matrices with m >= 3, got {L.shape} and {Q.shape}")
    iu = np.triu_indices(m, 1)
    off = ~np.eye(m, dtype=bool)
    pairs = {"forward": (L[iu], Q[iu]), "reverse": (L[iu], Q.T[iu]),
             "symmetrised": (L[iu], 0.5 * (Q + Q.T)[iu]), "ordered": (L[off], Q[off])}
    out: dict = {"pairs": int(len(iu[0]))}
    for name, (a, b) in pairs.items():
        fin = np.isfinite(b)
        out[f"spearman_{name}"] = float(spearmanr(a[fin], b[fin]).statistic)
        out[f"pearson_{name}"] = float(pearsonr(a[fin], b[fin]).statistic)
    asym = np.abs(Q - Q.T)[iu] / np.maximum(Q + Q.T, np.finfo(float).tiny)[iu]
    out["median_relative_asymmetry"] = float(np.median(asym))
    return out
