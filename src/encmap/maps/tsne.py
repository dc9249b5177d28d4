"""The 2-D map of encoders: t-SNE (openTSNE) fitted once, new encoders placed without refitting.

Pure maths: arrays in, arrays out, explicit ``random_state``; no I/O.

A map is fitted either on the m x n QRE feature matrix with a feature metric (ℓ1 by default:
the method's claim is that ℓ1 between feature vectors approximates QRE), optionally after PCA,
or on a precomputed m x m distance matrix (``exact-qre``: the symmetrised exact pairwise QRE).
:class:`TSNEMap` keeps what is needed to place new encoders later without refitting
(openTSNE's ``transform``): the reference coordinates and the space t-SNE ran in. It is stored
as plain arrays, never pickled (a shared map must not execute code when it is opened).

Identical encoders are drawn as one. t-SNE calibrates each point's neighbourhood to its
perplexity whatever the distances' scale, so k encoders that are one encoder reached by
different routes (features equal to rounding) form a clique it spreads as far apart as distinct
encoders, in an order decided by rounding noise; a new encoder identical to them then lands
between them. The map is therefore fitted on one representative per group of identical
encoders (:func:`encmap.maps.distances.identical_groups`); the others take its coordinates, and
an encoder placed later that is identical to one on the map takes that one's coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import EncmapError, check_perplexity, max_perplexity
from .distances import FEATURE_METRICS, METRICS, PRECOMPUTED_METRICS, identical_groups


@dataclass
class TSNEMap:
    """A fitted map and what placing new points on it needs.

    Attributes
    ----------
    coords : ndarray, shape (m, 2)
    space : ndarray, shape (m, p) or (m, m)
        Rows t-SNE ran on: features (after PCA, when ``pca_dims`` > 0) for a feature metric;
        the distance matrix for a precomputed one.
    pca_mean, pca_components : ndarray, shapes (n,), (p, n); empty when no PCA
    metric, perplexity, seed : the fitting parameters (``perplexity``: the one t-SNE used)
    representative : ndarray, shape (m,), int
        Row of the encoder each one is identical to (itself when it is distinct); t-SNE ran on
        the rows with ``representative[i] == i`` and the others share their coordinates.
    """

    coords: np.ndarray
    space: np.ndarray
    pca_mean: np.ndarray
    pca_components: np.ndarray
    metric: str
    perplexity: float
    seed: int
    representative: np.ndarray | None = None

    def __post_init__(self) -> None:
        m = self.coords.shape[0]
        rep = np.arange(m) if self.representative is None else np.asarray(self.representative, dtype=np.int64)
        if rep.shape != (m,) or np.any(rep[rep] != rep) or np.any(rep > np.arange(m)):
            raise EncmapError(f"a map's representatives must name, for each of its m = {m} encoders, the first "
                              "encoder of its group")
        self.representative = rep

    @property
    def precomputed(self) -> bool:
        return self.metric in PRECOMPUTED_METRICS

    @property
    def distinct(self) -> np.ndarray:
        """Rows t-SNE ran on: one per group of identical encoders, shape (u,)."""
        return np.flatnonzero(self.representative == np.arange(self.representative.size))

    def reference_space(self) -> np.ndarray:
        """The rows t-SNE ran on, (u, p), or (u, u) distances for a precomputed metric."""
        u = self.distinct
        return self.space[np.ix_(u, u)] if self.precomputed else self.space[u]

    def project(self, F_new: np.ndarray) -> np.ndarray:
        """New feature rows (k, n) into the space t-SNE ran on (k, p)."""
        F_new = np.asarray(F_new, dtype=np.float64)
        if self.pca_components.size == 0:
            return F_new
        return (F_new - self.pca_mean) @ self.pca_components.T


#: Smallest learning rate of an optimisation phase, in openTSNE's units. openTSNE's "auto" rate is
#: m / exaggeration (Belkina et al. 2019): 0.6 for a map of 7 encoders, too small to move the
#: points out of PCA's 1e-4-scale initialisation before early exaggeration has pulled them onto
#: one point (every coordinate of such a map came out below 1e-21). scikit-learn floors its
#: "auto" rate at 50 with a gradient 4x openTSNE's, i.e. 200 here, bhtsne's classic default.
MIN_LEARNING_RATE = 200.0

#: A fitted map whose points span less than this (t-SNE units; a sound map spans ~10-100) has
#: collapsed: an error, never a quiet result.
MIN_EXTENT = 1e-3


def learning_rate(m: int, exaggeration: float) -> float:
    """The learning rate of a t-SNE phase for m points: max(m / exaggeration, 200) (openTSNE units)."""
    return max(m / exaggeration, MIN_LEARNING_RATE)


def _affinities(space: np.ndarray, metric: str, perplexity: float, seed: int):
    from openTSNE.affinity import PerplexityBasedNN

    # Exact neighbours: deterministic, and cheap at the method's scale (m ~ 1,100).
    name = "precomputed" if metric in PRECOMPUTED_METRICS else FEATURE_METRICS[metric]
    name = "manhattan" if name == "cityblock" else name
    return PerplexityBasedNN(space, perplexity=perplexity, method="exact", metric=name, n_jobs=1,
                             random_state=seed)


def fit_map(
    X: np.ndarray,
    *,
    metric: str = "manhattan",
    perplexity: float = 10.0,
    pca_dims: int = 0,
    n_iter: int = 750,
    early_exaggeration_iter: int = 250,
    init: str = "auto",
    random_state: int = 0,
    same: np.ndarray | None = None,
) -> TSNEMap:
    """Fit a 2-D t-SNE map (openTSNE, exact neighbours, Barnes-Hut gradients, one thread).

    Parameters
    ----------
    X : ndarray, shape (m, n) features, or (m, m) distances when ``metric`` is precomputed
    metric : one of :data:`METRICS`
    perplexity : float, checked against m (:func:`check_perplexity`)
    pca_dims : int
        Reduce features to this many principal components first (0 = none; feature metrics only).
    n_iter, early_exaggeration_iter : int
        Iterations of the normal and the early-exaggeration phase.
    init : {"auto", "pca", "spectral", "random"}
        ``auto`` = PCA of the features for a feature metric, spectral (of the affinity graph)
        for a precomputed one, where there are no coordinates to take components of.
    random_state : int
    same : ndarray, shape (m,), int, optional
        Each row's representative (:func:`~encmap.maps.distances.identical_groups`). Default:
        found from ``X`` for a feature metric; every row distinct for a precomputed one (pass
        the groups found from the features). t-SNE (and PCA) run on the representatives; the
        others are drawn on them. Where fewer distinct rows remain than ``perplexity`` needs,
        t-SNE runs at the largest perplexity they allow (``TSNEMap.perplexity`` says which).

    Returns
    -------
    TSNEMap
        Same inputs and parameters give bit-identical coordinates; adding an encoder identical
        to one on the map changes no coordinate.
    """
    from openTSNE import TSNEEmbedding, initialization

    if metric not in METRICS:
        raise EncmapError(f"map.metric {metric!r}: choose one of {list(METRICS)}")
    X = np.asarray(X, dtype=np.float64)
    m = X.shape[0]
    check_perplexity(perplexity, m)
    if not np.all(np.isfinite(X)):
        raise EncmapError("map input has NaN or infinite entries")
    empty = np.zeros((0,))
    mean, comps = empty, np.zeros((0, X.shape[1]))
    if same is None:
        same = np.arange(m) if metric in PRECOMPUTED_METRICS else identical_groups(X)
    rep = np.asarray(same, dtype=np.int64)
    if rep.shape != (m,):
        raise EncmapError(f"same: one representative per encoder needed, got shape {rep.shape} for m = {m}")
    u = np.flatnonzero(rep == np.arange(m))
    if u.size < 4:
        raise EncmapError(f"a map needs at least 4 distinct encoders; these m = {m} are {u.size} distinct ones "
                          "(identical feature vectors)")
    perplexity = min(float(perplexity), max_perplexity(u.size))
    if metric in PRECOMPUTED_METRICS:
        if X.shape != (m, m) or not np.allclose(X, X.T, rtol=0, atol=1e-12 * max(1.0, np.abs(X).max())) \
                or np.any(X < 0):
            raise EncmapError(f"metric {metric!r} needs a symmetric, non-negative (m, m) distance matrix, "
                              f"got shape {X.shape}")
        if pca_dims:
            raise EncmapError(f"map.pca_dims = {pca_dims}: PCA needs feature vectors, not metric {metric!r}; set 0")
        if init == "pca":
            raise EncmapError(f"map.init 'pca' needs feature vectors, not metric {metric!r}; use spectral or auto")
        space = X
    else:
        space = X
        if pca_dims:
            k = min(pca_dims, u.size, X.shape[1])
            mean = X[u].mean(axis=0)
            # Full SVD of the centred rows: deterministic (no randomised solver), m x n is small.
            _, _, Vt = np.linalg.svd(X[u] - mean, full_matrices=False)
            comps = Vt[:k]
            # Fix each component's sign (largest |loading| positive) so reruns agree exactly.
            signs = np.sign(comps[np.arange(k), np.argmax(np.abs(comps), axis=1)])
            comps = comps * np.where(signs == 0, 1.0, signs)[:, None]
            space = (X - mean) @ comps.T
    ref = space[np.ix_(u, u)] if metric in PRECOMPUTED_METRICS else space[u]
    m_u = u.size
    aff = _affinities(ref, metric, perplexity, random_state)
    method = "spectral" if init == "auto" and metric in PRECOMPUTED_METRICS else ("pca" if init == "auto" else init)
    if method == "pca":
        Y0 = initialization.pca(ref, random_state=random_state)
    elif method == "spectral":
        Y0 = initialization.spectral(aff.P, random_state=random_state)
    elif method == "random":
        Y0 = initialization.random(ref, random_state=random_state)
    else:
        raise EncmapError(f"map.init {init!r}: choose auto, pca, spectral or random")
    emb = TSNEEmbedding(Y0, aff, negative_gradient_method="bh", random_state=random_state, n_jobs=1)
    # openTSNE's standard schedule: early exaggeration 12 at momentum 0.5, then 1 at 0.8, with
    # the learning rate floored for small maps (MIN_LEARNING_RATE).
    emb = emb.optimize(n_iter=early_exaggeration_iter, exaggeration=12, momentum=0.5,
                       learning_rate=learning_rate(m_u, 12))
    emb = emb.optimize(n_iter=n_iter, exaggeration=1, momentum=0.8, learning_rate=learning_rate(m_u, 1))
    drawn = np.array(emb)
    check_layout(drawn, perplexity)
    # Each encoder at its representative's point: u[k] is the k-th representative's row.
    at = np.searchsorted(u, rep)
    return TSNEMap(drawn[at], space, mean, comps, metric, float(perplexity), int(random_state), rep)


def check_layout(coords: np.ndarray, perplexity: float) -> None:
    """Refuse a degenerate map: non-finite coordinates, or every point on (nearly) one spot.

    Parameters
    ----------
    coords : ndarray, shape (m, 2)
    """
    m = coords.shape[0]
    if not np.all(np.isfinite(coords)):
        raise EncmapError(f"the map of m = {m} encoders has non-finite coordinates (t-SNE diverged)")
    extent = float(np.ptp(coords, axis=0).max())
    if extent < MIN_EXTENT:
        raise EncmapError(f"the map of m = {m} encoders collapsed to a point (extent {extent:.3g}): t-SNE did not "
                          f"separate them; lower map.perplexity (now {perplexity}) or raise map.n_iter")


def place_on_map(tmap: TSNEMap, X_new: np.ndarray, *, n_iter: int = 250, random_state: int = 0,
                 same_as: np.ndarray | None = None) -> np.ndarray:
    """Place new points on a fitted map without moving the reference points.

    Parameters
    ----------
    tmap : TSNEMap
    X_new : ndarray
        Shape (k, n) feature rows for a feature metric (projected like the reference rows), or
        (k, m) distances to the m reference encoders for a precomputed metric.
    n_iter : int
        Optimisation iterations of the new points (openTSNE's ``transform``).
    same_as : ndarray, shape (k,), int, optional
        For each new point, the map encoder it is identical to (-1: none; see
        :func:`~encmap.maps.distances.same_encoder`). Such a point takes that encoder's
        coordinates exactly; the others are placed by t-SNE.

    Returns
    -------
    ndarray, shape (k, 2)
        New points ignore each other; each is placed against the reference map alone.
    """
    from openTSNE import TSNEEmbedding

    X_new = np.atleast_2d(np.asarray(X_new, dtype=np.float64))
    k, m = X_new.shape[0], tmap.coords.shape[0]
    same_as = np.full(k, -1) if same_as is None else np.asarray(same_as, dtype=np.int64)
    if same_as.shape != (k,) or np.any(same_as >= m):
        raise EncmapError(f"same_as: one map row (or -1) per new point needed, got {same_as.tolist()} for k = {k}")
    if tmap.precomputed and X_new.shape[1] != m:
        raise EncmapError(f"placing on a {tmap.metric!r} map needs distances to its m = {m} encoders, "
                          f"got shape {X_new.shape}")
    out = np.zeros((k, 2))
    twin = same_as >= 0
    out[twin] = tmap.coords[same_as[twin]]
    if twin.all():
        return out
    u = tmap.distinct
    rows = X_new[~twin]
    query = rows[:, u] if tmap.precomputed else tmap.project(rows)
    aff = _affinities(tmap.reference_space(), tmap.metric, tmap.perplexity, tmap.seed)
    # transform re-centres the reference embedding in place: hand it a copy.
    drawn = tmap.coords[u]
    ref = TSNEEmbedding(drawn.copy(), aff, negative_gradient_method="bh", random_state=random_state, n_jobs=1)
    perplexity = min(tmap.perplexity, max_perplexity(u.size + 1))
    placed = ref.transform(query, perplexity=perplexity, n_iter=n_iter)
    # Undo the re-centring so the new point lives in the stored map's coordinates.
    out[~twin] = np.asarray(placed) + (drawn.mean(axis=0) - np.asarray(ref).mean(axis=0))
    return out
