"""Distances between encoders: ℓ1 (or another metric) between QRE feature vectors, the
symmetrised exact QRE, and each encoder's nearest neighbours (pure maths, no I/O)."""

from __future__ import annotations

import numpy as np

from ..validation import EncmapError

#: Two encoders are *the same encoder* when their QRE feature vectors differ in ℓ1 by at most this
#: share of the larger vector's ℓ1 norm. Features are float64 arithmetic on float32 embeddings
#: (unit roundoff 6e-8): one encoder reached by two routes (a model's normalised output and its
#: last layer's pooled state, normalised by the pip stage) differs by ~1e-7 of the norm, while
#: the closest distinct encoders measured (two CLS layers of a 2-layer test model) differ by
#: 8e-6, the default map's closest by far more (docs/map.md, "Identical encoders").
SAME_RTOL = 1e-6

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


def nearest_neighbours(D: np.ndarray, k: int, key: str = "map.neighbours") -> tuple[np.ndarray, np.ndarray]:
    """The k nearest other points of every row of a square distance matrix.

    Ties are broken by index (stable sort), so the result is deterministic.

    Parameters
    ----------
    D : ndarray, shape (m, m)
    k : int, 1 <= k < m
    key : str
        The param ``k`` comes from (for the message).

    Returns
    -------
    idx : ndarray, shape (m, k), int
    dist : ndarray, shape (m, k), float64
    """
    D = np.array(D, dtype=np.float64)
    m = D.shape[0]
    if not 1 <= k < m:
        raise EncmapError(f"{key} = {k} must be in [1, m - 1] = [1, {m - 1}]")
    np.fill_diagonal(D, np.inf)
    idx = np.argsort(D, axis=1, kind="stable")[:, :k]
    return idx, np.take_along_axis(D, idx, axis=1)


def same_encoder(L: np.ndarray, norms: np.ndarray, ref_norms: np.ndarray | None = None,
                 rtol: float = SAME_RTOL) -> np.ndarray:
    """Which pairs of encoders are the same encoder: ℓ1 distance <= ``rtol`` x the larger ℓ1 norm.

    Parameters
    ----------
    L : ndarray, shape (k, m)
        ℓ1 distances between feature vectors (rows: encoders a, columns: encoders b).
    norms : ndarray, shape (k,)
        ℓ1 norms of the rows' feature vectors.
    ref_norms : ndarray, shape (m,), optional
        ℓ1 norms of the columns' feature vectors; default ``norms`` (L square).

    Returns
    -------
    ndarray, shape (k, m), bool
    """
    L = np.asarray(L, dtype=np.float64)
    norms = np.asarray(norms, dtype=np.float64)
    ref_norms = norms if ref_norms is None else np.asarray(ref_norms, dtype=np.float64)
    return L <= rtol * np.maximum(norms[:, None], ref_norms[None, :])


def identical_groups(F: np.ndarray, L: np.ndarray | None = None, rtol: float = SAME_RTOL) -> np.ndarray:
    """Each encoder's representative: the first (lowest row) encoder it is the same as.

    Sameness (:func:`same_encoder`) is closed transitively (connected components), so a group
    has one representative whatever the order of comparison.

    Parameters
    ----------
    F : ndarray, shape (m, n)
        QRE feature vectors.
    L : ndarray, shape (m, m), optional
        Their ℓ1 distances, when already computed.

    Returns
    -------
    ndarray, shape (m,), int
        ``rep[i] == i`` for an encoder that is its group's representative (or alone).
    """
    from scipy.sparse.csgraph import connected_components

    F = np.asarray(F, dtype=np.float64)
    if L is None:
        L = feature_distances(F, "manhattan")
    same = same_encoder(L, np.abs(F).sum(axis=1), rtol=rtol)
    _, label = connected_components(same, directed=False)
    first = {}
    for i, g in enumerate(label):
        first.setdefault(int(g), i)
    return np.array([first[int(g)] for g in label], dtype=np.int64)


def groups_of(rep: np.ndarray) -> list[list[int]]:
    """The groups of two or more encoders that share a representative, each in row order."""
    out: dict[int, list[int]] = {}
    for i, r in enumerate(np.asarray(rep)):
        out.setdefault(int(r), []).append(i)
    return [g for g in out.values() if len(g) > 1]
