"""The regression's inner cross-validation: GridSearchCV's choice without its per-fit machinery."""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin


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
    """

    def __init__(self, estimator, grid: dict[str, list], cv: list[tuple]):
        self.estimator, self.grid, self.cv = estimator, grid, cv

    def fit(self, X: np.ndarray, y: np.ndarray) -> InnerSearch:
        from sklearn.base import clone
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.metrics import mean_squared_error
        from sklearn.model_selection import ParameterGrid

        candidates = list(ParameterGrid(self.grid))
        best = 0
        # A tiny inner fold rarely converges to ``tol``: the search judges each fit by its score.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            if len(candidates) > 1:
                scores = np.empty((len(candidates), len(self.cv)))
                for i, cand in enumerate(candidates):
                    for j, (train, test) in enumerate(self.cv):
                        est = clone(self.estimator).set_params(**cand).fit(X[train], y[train])
                        scores[i, j] = -mean_squared_error(y[test], est.predict(X[test]))
                means = np.average(scores, axis=1)
                if not np.isnan(means).all():
                    best = int(np.argmax(np.where(np.isnan(means), np.nanmin(means) - 1, means)))
            self.best_params_ = candidates[best]
            self.best_estimator_ = clone(self.estimator).set_params(**self.best_params_).fit(X, y)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.best_estimator_.predict(X)
