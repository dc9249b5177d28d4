"""How far to trust one predicted score: conformal intervals over held-out models, and whether a
new encoder lies outside what the predictor was fitted on (pure maths).

The intervals are MAPIE's cross-conformal ones (CV+, Barber et al. 2021) with the cross-validation
grouped by model: each training encoder's conformity score is its error when its whole model was
held out, so an interval is as wide as the errors on *unseen models* are, not on unseen variants
of a seen model. The CV is GroupKFold(``intervals.folds``) over models (CV+), or with
``intervals.folds: 0`` leave-one-model-out up to ``max_loo_groups`` models (jackknife+ over models;
its cost grows with the square of the models in the held-out measurement). The conformity score
is ``intervals.score``:

- ``absolute``: |y - ŷ|. CV+ still widens an interval where the fold models disagree, which they
  do away from the training encoders;
- ``distance``: |y - ŷ| / σ(x), σ the distance in the predictor's standardised space to the
  nearest training encoder of another model (floored at the ``floor`` quantile of the training
  encoders' own such distances): an interval grows with how far the encoder lies from the rest.

Which one covers better, on the map and at its frontier, is measured (docs/downstream.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mapie.conformity_scores import BaseRegressionScore

from ..validation import EncmapError

#: The protocols whose held-out predictions get intervals: those that hold out whole models.
INTERVAL_PROTOCOLS = ("grouped", "frontier")
#: The conformity scores offered (``regress.intervals.score``).
SCORES = ("absolute", "distance")


def with_intervals(reg: str, features: str, protocol: str, params: dict[str, Any]) -> bool:
    """Whether the held-out predictions of (``reg``, ``features``, ``protocol``) get conformal
    intervals: ridge with its alpha by leave-one-out (refitted per fold without an inner grouped
    CV, which MAPIE cannot pass groups to), on ``intervals.features`` or the predictor, model held
    out."""
    iv = params.get("intervals")
    return (iv is not None and reg == "ridge" and params.get("ridge_alpha_cv", "loo") == "loo"
            and protocol in INTERVAL_PROTOCOLS and features in {*iv["features"], params.get("predictor")})


def standardiser(X: np.ndarray, weights: np.ndarray | None = None):
    """The predictor's space as ridge sees it (the ``scale`` and ``blocks`` steps of
    :func:`encmap.downstream.regression.make_regressor`): scikit-learn's StandardScaler fitted on
    the rows ``X`` (n, p), then the block weights. Returns a function (k, p) -> (k, p)."""
    from sklearn.preprocessing import StandardScaler

    from .regression import scale_columns

    scaler = StandardScaler().fit(np.asarray(X, dtype=np.float64))
    return lambda A: scale_columns(scaler.transform(np.asarray(A, dtype=np.float64)), weights)


def nearest_distances(Z: np.ndarray, to: np.ndarray, same: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Euclidean distance (k,) from each row of ``Z`` (k, p) to its nearest row of ``to`` (m, p), and
    that row's index (k,); ``same`` (k, m) bool: pairs left out (an encoder's own model). Memory
    k x m (scipy's cdist), not k x m x p: the ``qre`` predictor has 10,000 columns."""
    from scipy.spatial.distance import cdist

    D = cdist(np.asarray(Z, dtype=np.float64), np.asarray(to, dtype=np.float64))
    if same is not None:
        D = np.where(same, np.inf, D)
    j = np.argmin(D, axis=1)
    return D[np.arange(len(D)), j], j


def reach(X: np.ndarray, groups: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Each training encoder's distance (n,) to the nearest encoder of *another* model in the
    predictor's space (:func:`standardiser` of X (n, p)): how far a held-out model lay from the
    models it was predicted from."""
    Z = standardiser(X, weights)(X)
    g = np.asarray(groups).astype(str)
    return nearest_distances(Z, Z, g[:, None] == g[None, :])[0]


class DistanceScore(BaseRegressionScore):
    """|y - ŷ| / σ(x) (MAPIE's conformity-score interface), σ(x) the distance from x to the nearest
    training encoder of another model in the predictor's space, floored at the ``floor`` quantile
    of the training encoders' own such distances (:func:`reach`).

    MAPIE hands the score the rows it scores: the training rows when it computes the conformity
    scores (each training encoder's σ is then its distance to the other models, exactly the
    training set of the fold that held its model out) and the new rows when it predicts.
    """

    def __init__(self, X: np.ndarray, groups: np.ndarray, weights: np.ndarray | None = None, floor: float = 0.1):
        super().__init__(sym=True, consistency_check=False)
        self.X = np.asarray(X, dtype=np.float64)
        self.space = standardiser(self.X, weights)
        self.Z = self.space(self.X)
        self.own = reach(self.X, groups, weights)
        self.floor = float(np.quantile(self.own, floor))

    def sigma(self, X: np.ndarray) -> np.ndarray:
        """σ (k,) of rows X (k, p)."""
        X = np.asarray(X, dtype=np.float64)
        s = self.own if X.shape == self.X.shape and np.array_equal(X, self.X) else \
            nearest_distances(self.space(X), self.Z)[0]
        return np.maximum(s, max(self.floor, np.finfo(np.float64).tiny))

    def get_signed_conformity_scores(self, y: np.ndarray, y_pred: np.ndarray, X: np.ndarray = None, **kwargs):
        return (np.asarray(y, dtype=np.float64) - np.asarray(y_pred, dtype=np.float64)) / self.sigma(X)

    def get_estimation_distribution(self, y_pred: np.ndarray, conformity_scores: np.ndarray, X: np.ndarray = None,
                                    **kwargs):
        s = self.sigma(X).reshape(-1, *([1] * (np.ndim(y_pred) - 1)))
        return np.asarray(y_pred) + np.asarray(conformity_scores) * s


def conformal_regressor(X: np.ndarray, groups: np.ndarray, params: dict[str, Any], random_state: int,
                        weights: np.ndarray | None = None):
    """An unfitted ``mapie.regression.CrossConformalRegressor`` around the regression's ridge for
    training rows X (n, p) of models ``groups`` (n,): CV+ over models (GroupKFold(``intervals.folds``),
    at most one fold a model; ``intervals.folds: 0``: leave-one-model-out up to ``max_loo_groups``,
    GroupKFold(``folds``) beyond), at ``intervals.level``, with ``intervals.score``."""
    from mapie.regression import CrossConformalRegressor
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut

    from .regression import make_regressor

    iv = params["intervals"]
    n_groups = len(np.unique(groups))
    if n_groups < 2:
        raise EncmapError(f"conformal intervals need at least 2 models to hold out, got {n_groups}")
    if iv["folds"]:
        cv = GroupKFold(n_splits=min(int(iv["folds"]), n_groups))
    else:
        cv = LeaveOneGroupOut() if n_groups <= params["max_loo_groups"] else GroupKFold(n_splits=params["folds"])
    if iv["score"] not in SCORES:
        raise EncmapError(f"regress.intervals.score {iv['score']!r}: choose one of {list(SCORES)}")
    score = "absolute" if iv["score"] == "absolute" else DistanceScore(X, groups, weights, iv["floor"])
    return CrossConformalRegressor(make_regressor("ridge", X, [], params, random_state, weights=weights),
                                   confidence_level=float(iv["level"]), conformity_score=score, method="plus", cv=cv)


def fitted_intervals(X: np.ndarray, y: np.ndarray, groups: np.ndarray, params: dict[str, Any], random_state: int,
                     weights: np.ndarray | None = None):
    """:func:`conformal_regressor` fitted and conformalised on (X (n, p), y (n,)), grouped by model."""
    g = np.asarray(groups).astype(str)
    return conformal_regressor(X, g, params, random_state, weights).fit_conformalize(X, y, groups=g)


def too_few(n: int, level: float) -> bool:
    """Whether n conformity scores are too few for an interval at ``level``: a CV+ quantile needs
    more than 1 / (1 - level) of them (and 1 / level), or its end is infinite (MAPIE refuses)."""
    return n <= max(1.0 / float(level), 1.0 / (1.0 - float(level)))


def predict_intervals(fitted, X: np.ndarray) -> np.ndarray:
    """The intervals (k, 2) [low, high] of a fitted conformal regressor at rows X (k, p)."""
    _, iv = fitted.predict_interval(np.asarray(X, dtype=np.float64))
    return np.asarray(iv[:, :, 0], dtype=np.float64)


def heldout_intervals(X: np.ndarray, y: np.ndarray, groups: np.ndarray, splits: list[tuple],
                      params: dict[str, Any], random_state: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Each held-out row's interval (n, 2) from the training rows of its outer split alone (NaN for
    rows no split tests, and for a split with :func:`too_few` training rows): the interval a new
    model would have got, so that its coverage is measured on models the intervals never saw."""
    out = np.full((len(y), 2), np.nan)
    for train, test in splits:
        if too_few(len(train), params["intervals"]["level"]):
            continue
        out[test] = predict_intervals(fitted_intervals(X[train], y[train], groups[train], params, random_state,
                                                       weights), X[test])
    return out


def coverage(y: np.ndarray, bounds: np.ndarray) -> tuple[float, float]:
    """The fraction of ``y`` (n,) inside its interval (``bounds`` (n, 2), ends included) and the
    intervals' mean width, over the rows that have one (NaN, NaN when none has)."""
    y, b = np.asarray(y, dtype=np.float64), np.asarray(bounds, dtype=np.float64)
    has = np.isfinite(b).all(axis=1)
    if not has.any():
        return np.nan, np.nan
    y, b = y[has], b[has]
    return float(np.mean((y >= b[:, 0]) & (y <= b[:, 1]))), float(np.mean(b[:, 1] - b[:, 0]))


def extrapolation(Z_new: np.ndarray, Z_train: np.ndarray, ids: list[str], reach_max: float,
                  predicted: float, train_scores: np.ndarray) -> str:
    """Why a new encoder's prediction extrapolates ("" when it does not): its nearest training
    encoder lies farther than any held-out model lay from the rest (``reach_max``), or the
    prediction lies outside every training score. Z_new (p,), Z_train (m, p): the predictor's
    space (:func:`standardiser`); ``ids``: the m training encoders; ``train_scores``: the task's."""
    d, j = nearest_distances(np.asarray(Z_new, dtype=np.float64)[None, :], Z_train)
    why = []
    if d[0] > reach_max:
        why.append(f"its nearest training encoder ({ids[j[0]]}) is {d[0]:.3g} away in the predictor's space, farther "
                   f"than any held-out model lay from the rest ({reach_max:.3g})")
    s = np.asarray(train_scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size and predicted > s.max():
        why.append(f"the prediction {predicted:.3g} is above every training score (best {s.max():.3g})")
    elif s.size and predicted < s.min():
        why.append(f"the prediction {predicted:.3g} is below every training score (worst {s.min():.3g})")
    return "; ".join(why)
