"""The regression's inner cross-validation: GridSearchCV's choice without its per-fit machinery."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin


def squared_error(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """``sklearn.metrics.mean_squared_error(y_true, y_pred)`` for one output, bit for bit (the same
    two averages over the (n, 1) squared errors), without its per-call checks of both arrays.

    y_true, y_pred : ndarray, shape (n,)
    """
    d = (np.asarray(y_true, dtype=float).reshape(-1, 1) - np.asarray(y_pred, dtype=float).reshape(-1, 1)) ** 2
    return float(np.average(np.average(d, axis=0)))


class InnerSearch(RegressorMixin, BaseEstimator):
    """The inner CV's choice, as ``GridSearchCV(estimator, grid, cv=cv, scoring="neg_mean_squared_error",
    error_score="raise")`` makes it, without its per-fit machinery.

    The regression runs thousands of searches over a few dozen rows, where GridSearchCV's own
    work (a scorer object, a joblib call, result tables and a clone per fit) cost more than the
    fits (tiny test pipeline: 26 of 41 s). The choice is the same: candidates in
    ``ParameterGrid`` order, each fitted on every inner training fold and scored by minus the
    mean squared error on its test fold, the mean over folds ranked (a NaN mean counts as the
    worst, ties go to the first candidate), the best refitted on all rows. A grid of one
    candidate needs no inner fits. ``tests/test_regress.py`` checks it against GridSearchCV.

    Parameters
    ----------
    estimator : scikit-learn estimator (unfitted, cloned per fit)
    grid : dict
        Parameter name -> list of values (``set_params`` names).
    cv : list of (train, test) index arrays

    Attributes (after ``fit``)
    --------------------------
    best_params_ : dict
    best_estimator_ : the estimator with ``best_params_``, fitted on all rows
    scores_ : ndarray, shape (candidates, folds)
        Minus the mean squared error of each candidate on each inner test fold (GridSearchCV's
        ``split<j>_test_score``); absent for a grid of one candidate.
    """

    def __init__(self, estimator, grid: dict[str, list], cv: list[tuple]):
        self.estimator, self.grid, self.cv = estimator, grid, cv

    def fit(self, X: np.ndarray, y: np.ndarray) -> InnerSearch:
        from sklearn.base import clone
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.model_selection import ParameterGrid

        candidates = list(ParameterGrid(self.grid))
        best = 0
        # One clone, given each candidate's parameters once and refitted on each fold (fit() starts
        # afresh unless the estimator warm-starts), and the error computed directly: a clone and
        # set_params per fit (get_params inspects signatures) and mean_squared_error's checks were
        # a third of the fits' CPU (benchmarks/bench_regress.py).
        # A tiny inner fold rarely converges to ``tol``: the search judges each fit by its score.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if len(candidates) > 1:
                scores = np.empty((len(candidates), len(self.cv)))
                # warm_start anywhere in the estimator (a pipeline's step, a wrapped model), as
                # get_params names it: then a clone per fit, as GridSearchCV makes.
                afresh = not any(k.rsplit("__", 1)[-1] == "warm_start" and v
                                 for k, v in self.estimator.get_params(deep=True).items())
                est = clone(self.estimator) if afresh else None
                for i, cand in enumerate(candidates):
                    if afresh:
                        est.set_params(**cand)
                    for j, (train, test) in enumerate(self.cv):
                        fitted = (est if afresh else clone(self.estimator).set_params(**cand)).fit(X[train], y[train])
                        scores[i, j] = -squared_error(y[test], fitted.predict(X[test]))
                self.scores_ = scores
                means = np.average(scores, axis=1)
                if not np.isnan(means).all():
                    best = int(np.argmax(np.where(np.isnan(means), np.nanmin(means) - 1, means)))
            self.best_params_ = candidates[best]
            self.best_estimator_ = clone(self.estimator).set_params(**self.best_params_).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.best_estimator_.predict(X)
