"""Distances between encoders: ℓ1 (or another metric) between QRE feature vectors, the
symmetrised exact QRE, and each encoder's nearest neighbours (pure maths, no I/O)."""

from __future__ import annotations

import numpy as np

from ..validation import EncmapError

#: Feature-space metrics (our name -> scipy/openTSNE name) and the precomputed one.
FEATURE_METRICS = {"manhattan": "cityblock", "euclidean": "euclidean", "cosine": "cosine"}
PRECOMPUTED_METRICS = ("exact-qre",)
METRICS = (*FEATURE_METRICS, *PRECOMPUTED_METRICS)


def feature_distances(F: np.ndarray, metric: str = "manhattan", G: np.ndarray | None = None) -> np.ndarray:
    """Pairwise distances between feature vectors.

    Parameters
    ----------
    F : ndarray, shape (m, n)
    metric : {"manhattan", "euclidean", "cosine"}
    G : ndarray, shape (k, n), optional
        Second set of rows; default ``F``.

    Returns
    -------
    ndarray, shape (m, m) or (m, k), float64
    """
    from scipy.spatial.distance import cdist

    if metric not in FEATURE_METRICS:
        raise EncmapError(f"map.metric {metric!r} is not a feature-space metric; choose one of {sorted(FEATURE_METRICS)}")
    F = np.asarray(F, dtype=np.float64)
    return cdist(F, F if G is None else np.asarray(G, dtype=np.float64), FEATURE_METRICS[metric])


def symmetrised_qre(Q: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """½(S(ρ_i‖ρ_j) + S(ρ_j‖ρ_i)) from the directed matrix Q (m, m); finite values required.

    QRE is >= 0; two identical encoders (a model's last layer and its un-normalised output)
    give ±1e-15 from rounding. Values above -rtol · max|Q| are clipped to 0; anything more
    negative is an error, not noise.
    """
    Q = np.asarray(Q, dtype=np.float64)
    if Q.ndim != 2 or Q.shape[0] != Q.shape[1]:
        raise EncmapError(f"pairwise QRE must be a square matrix, got shape {Q.shape}")
    if not np.all(np.isfinite(Q)):
        raise EncmapError("pairwise QRE has infinite entries (qre.eps = 0 and a support mismatch): "
                          "the exact-qre distance needs qre.eps > 0")
    S = 0.5 * (Q + Q.T)
    floor = -rtol * max(1.0, float(np.abs(Q).max()))
    if S.min() < floor:
        i, j = np.unravel_index(np.argmin(S), S.shape)
        raise EncmapError(f"pairwise QRE [{i}, {j}] = {S[i, j]:.3g} is negative beyond rounding")
    return np.maximum(S, 0.0)


def nearest_neighbours(D: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest other points of every row of a square distance matrix.

    Ties are broken by index (stable sort), so the result is deterministic.

    Parameters
    ----------
    D : ndarray, shape (m, m)
    k : int, 1 <= k < m

    Returns
    -------
    idx : ndarray, shape (m, k), int
    dist : ndarray, shape (m, k), float64
    """
    D = np.array(D, dtype=np.float64)
    m = D.shape[0]
    if not 1 <= k < m:
        raise EncmapError(f"map.neighbours = {k} must be in [1, m - 1] = [1, {m - 1}]")
    np.fill_diagonal(D, np.inf)
    idx = np.argsort(D, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(D, idx, axis=1)
