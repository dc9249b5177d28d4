"""Predicting downstream scores from an encoder's QRE features, honestly (pure maths).

Protocol (per task; every fit a seeded scikit-learn pipeline):

- regressors: ``elasticnet`` = standardise -> PCA -> ElasticNet (the source method), PCA size,
  α and l1_ratio chosen by inner CV; ``ridge`` = standardise -> RidgeCV, α by the exact
  leave-one-out errors of the training rows (``ridge_alpha_cv: loo``; ``grouped``: by inner CV);
- outer CV **grouped by model** (``grouped``): no variant of one model is both trained on and
  predicted, leave-one-model-out up to ``max_loo_groups`` models (each fit trains on all models
  but one, as near as a CV gets to the predictor fitted on all), GroupKFold beyond; the inner
  CV is grouped too; left out of a task scored on fewer than 3 models (a map of one model). Outer CV **grouped by family** (``family``: a whole family held out, e.g.
  every MiniLM, the inner CV grouped by family too): how well the features carry to a kind of
  model the regressor has never seen; left out of a task with fewer than 3 families. Plain
  shuffled K-fold (``random``) beside them: its gap to ``grouped`` is how much a variant's
  siblings leak its score. The **frontier** (``frontier``): per task, the models whose best
  encoder scores in the top ``frontier.top`` of the task's scores are held out together and
  predicted from the rest (one split): does the predictor see a model better than any it was
  fitted on, or call it average (the ``bias`` column: mean predicted minus measured)?
- baselines on the very same folds: the spectrum's own summaries (:mod:`encmap.qre.spectral`):
  its von Neumann entropy (``entropy``, one number, already inside the features: they sum to
  ln n minus it), its profile (``profile``: ln of the eigenvalues at 16 log-spaced ranks,
  both regressors), its head (``head``: ln of the 32 largest eigenvalues, with the entropy,
  ln of the rank and the effective rank), and the features together with the profile (``qre+profile``) or the head
  (``qre+head``), the head in the PIP matrix's own units (``head+scale``: ln of the eigenvalues of
  M / n, the unit-trace head plus ln(tr M / n)); the map's neighbours (``neighbours``: the mean
  score of an encoder's k nearest training encoders by exact symmetrised QRE, k by the inner CV;
  in held-out-model protocols these are encoders of other models); the encoder's
  scores on the *other* tasks (``tasks``: leave-task-out, what a leaderboard already tells), and
  the features together with them (``qre+tasks``: what the features add to it); seeded Gaussian
  features of the features' shape (both regressors), the embedding width alone, the layer index
  alone (plus an "is not a layer" indicator), log10(1 + parameter count) alone (one column each:
  ridge), and the training folds' mean (``mean``). Blocks joined side by side are weighted
  after standardising so that each carries the same total variance (10,000 feature columns
  would otherwise drown 16 profile columns under one ridge penalty);
- out-of-fold predictions of every encoder are compared with the truth: Spearman, Pearson, MAE,
  the mean signed error; for ridge on ``intervals.features``, model held out (``grouped``,
  ``frontier``), each held-out encoder also gets a conformal prediction interval
  (:mod:`encmap.downstream.intervals`) and the rows their coverage.

The regressors ``encmap place`` uses are fitted on one *predictor* (``regress.predictor``): a
feature set computable from an encoder alone (:data:`PREDICTORS`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from ..validation import EncmapError

REGRESSORS = ("elasticnet", "ridge")
PROTOCOLS = ("grouped", "family", "random", "frontier")
#: What the protocols that hold out whole groups group by (the unit a label names).
GROUPED_BY = {"grouped": "models", "family": "families", "frontier": "models"}
#: Fewest groups a held-out-group CV runs on (with 2, each fold holds out half the data).
MIN_GROUPS = 3
#: Feature sets compared: the QRE features, then the baselines.
FEATURE_SETS = ("qre", "entropy", "profile", "qre+profile", "head", "head+scale", "qre+head", "tasks", "qre+tasks",
                "neighbours", "random", "dim", "layer", "parameters", "mean")
#: Feature sets an encoder has on its own (no scores): what the fitted regressors can use.
PREDICTORS = ("qre", "entropy", "profile", "qre+profile", "head", "head+scale", "qre+head")
#: The spectral summaries each spectral predictor needs (:data:`encmap.artifacts.features.SPECTRAL`).
NEEDS = {"entropy": ("entropy",), "profile": ("profile",), "qre+profile": ("profile",),
         "head": ("head", "entropy", "log_rank"), "head+scale": ("head", "entropy", "log_rank", "log_scale"),
         "qre+head": ("head", "entropy", "log_rank")}
#: Feature sets of one column: ridge only (PCA of one column is the column).
ONE_COLUMN = ("entropy", "dim", "layer", "parameters")


def scale_columns(X: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """The first ``len(w)`` columns times ``w``; the rest (an imputer's indicators) as they are.

    A module-level function, so that fitted pipelines pickle (worker processes)."""
    if w is None:
        return X
    X = np.array(X, dtype=np.float64, copy=True)
    X[:, :len(w)] *= w
    return X


def join_blocks(blocks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    """Blocks (m, p_b) side by side, and the column weights that give each block the same total
    variance once every column is standardised: sqrt(p_max / p_b) (None for one block)."""
    blocks = [np.asarray(b, dtype=np.float64).reshape(len(b), -1) for b in blocks]
    X = np.hstack(blocks)
    if len(blocks) == 1:
        return X, None
    widest = max(b.shape[1] for b in blocks)
    return X, np.concatenate([np.full(b.shape[1], np.sqrt(widest / b.shape[1])) for b in blocks])


def predictor_blocks(name: str, F: np.ndarray, spectral: dict[str, np.ndarray] | None) -> list[np.ndarray]:
    """The blocks of predictor ``name`` (:data:`PREDICTORS`) for encoders with features F (m, n)
    and spectral summaries (``entropy`` (m,), ``profile`` (m, 16), ``head`` (m, k), ``log_rank``
    (m,), ``log_scale`` (m,)). The head is one block with the entropy, the log rank and the
    effective rank exp(entropy) (Roy & Vetterli; the one column that is not linear in the others):
    (m, k + 3); ``head+scale`` the same block with the head in the PIP matrix's units, ln of the
    eigenvalues of M / n = ln μ + ln(tr M / n)."""
    if name not in PREDICTORS:
        raise EncmapError(f"regress.predictor {name!r}: choose one of {list(PREDICTORS)}")
    missing = [k for k in NEEDS.get(name, ()) if k not in (spectral or {})]
    if missing:
        raise EncmapError(f"regress.predictor {name!r} needs the encoders' spectral summary {missing[0]!r} (qre.h5 "
                          "made by an older encmap: rerun the features and gather rules)")
    col = lambda k: np.asarray(spectral[k], dtype=np.float64).reshape(len(F), -1)  # noqa: E731
    def head(scale: bool = False) -> np.ndarray:
        top = col("head") + (col("log_scale") if scale else 0.0)
        return np.hstack([top, col("entropy"), col("log_rank"), np.exp(col("entropy"))])

    return {"qre": lambda: [F], "entropy": lambda: [col("entropy")], "profile": lambda: [col("profile")],
            "qre+profile": lambda: [F, col("profile")], "head": lambda: [head()],
            "head+scale": lambda: [head(scale=True)], "qre+head": lambda: [F, head()]}[name]()


def baseline_features(records: list[dict[str, Any]] | None, shape: tuple[int, int],
                      random_state: int) -> dict[str, np.ndarray]:
    """The baselines' feature matrices, each (m, k).

    ``records`` are the feature matrix's encoder records (``d``, ``layer``, ``meta.parameters``).
    Missing values (no layer: a model's output or a classical encoder; unknown parameter count)
    are NaN here and imputed from the training rows by the regressor, with an indicator column.
    """
    rng_only = {"random": np.random.default_rng(random_state).standard_normal(shape)}
    if records is None:  # a matrix without encoder records: no width, layer or size to compare with
        return rng_only
    m = len(records)
    layer = np.array([np.nan if r["layer"] is None else float(r["layer"]) for r in records])
    params = np.array([np.nan if r["meta"].get("parameters") is None else np.log10(1.0 + r["meta"]["parameters"])
                       for r in records])
    rng = np.random.default_rng(random_state)
    return {"random": rng.standard_normal(shape), "dim": np.array([[float(r["d"])] for r in records]),
            "layer": layer.reshape(m, 1), "parameters": params.reshape(m, 1)}


def require_groups(groups, protocol: str, where: str = "") -> None:
    """Refuse held-out-group CV over fewer than :data:`MIN_GROUPS` groups."""
    found = sorted({str(g) for g in groups})
    if len(found) < MIN_GROUPS:
        raise EncmapError(f"{where}{protocol} cross-validation needs at least {MIN_GROUPS} groups ({GROUPED_BY[protocol]}), "
                          f"got {len(found)}: {found}")


def frontier_split(y: np.ndarray, groups: np.ndarray, top: float) -> tuple[np.ndarray, np.ndarray]:
    """The ``frontier`` protocol's one (train, test) split: test = every row of a model whose best
    row scores at or above the ``1 - top`` quantile of ``y`` (numpy's default, linear), train = the
    rest. y, groups : (n,). Returns index arrays (ascending)."""
    cut = np.quantile(np.asarray(y, dtype=np.float64), 1.0 - float(top))
    best = {g: np.max(y[groups == g]) for g in np.unique(groups)}
    held = np.array([best[g] >= cut for g in groups])
    return np.flatnonzero(~held), np.flatnonzero(held)


def loo_limit(params: dict[str, Any], regressor: str | None = None) -> int:
    """The most groups a held-out-group CV of ``regressor`` leaves out one at a time:
    ``elasticnet_max_loo_groups`` for elasticnet (its inner grid search per outer fold was 80% of
    the stage's time: docs/downstream.md), else ``max_loo_groups``."""
    if regressor == "elasticnet" and "elasticnet_max_loo_groups" in params:
        return int(params["elasticnet_max_loo_groups"])
    return int(params["max_loo_groups"])


def outer_splits(groups: np.ndarray, protocol: str, params: dict[str, Any], random_state: int,
                 y: np.ndarray | None = None, regressor: str | None = None) -> list[tuple]:
    """(train, test) index pairs of the outer CV.

    ``grouped`` and ``family`` (``groups``: each row's model or family): leave-one-group-out
    when there are at most :func:`loo_limit` groups, else GroupKFold(``folds``); ``random``:
    KFold(``folds``, shuffled with ``random_state``); ``frontier``: :func:`frontier_split` of the
    scores ``y`` at ``params['frontier']['top']`` (no split, ``[]``, when fewer than
    :data:`MIN_GROUPS` models would be left to train on).
    """
    from sklearn.model_selection import GroupKFold, KFold, LeaveOneGroupOut

    n_groups = len(np.unique(groups))
    if protocol in GROUPED_BY:
        require_groups(groups, protocol)
    X = np.zeros((len(groups), 1))
    if protocol == "frontier":
        train, test = frontier_split(y, groups, params["frontier"]["top"])
        return [(train, test)] if len(np.unique(groups[train])) >= MIN_GROUPS and len(test) else []
    if protocol in GROUPED_BY:
        cv = LeaveOneGroupOut() if n_groups <= loo_limit(params, regressor) else GroupKFold(n_splits=params["folds"])
        return list(cv.split(X, groups=groups))
    if protocol == "random":
        k = min(params["folds"], len(groups))
        return list(KFold(n_splits=k, shuffle=True, random_state=random_state).split(X))
    raise EncmapError(f"unknown protocol {protocol!r} (known: {PROTOCOLS})")


def inner_cv(groups: np.ndarray, protocol: str, params: dict[str, Any], random_state: int) -> list[tuple]:
    """(train, test) index pairs of the inner CV over one outer training fold (grouped like it)."""
    from sklearn.model_selection import GroupKFold, KFold

    X = np.zeros((len(groups), 1))
    if protocol in GROUPED_BY:
        n = len(np.unique(groups))
        if n < 2:
            raise EncmapError("an outer training fold holds a single group: inner grouped CV is impossible")
        return list(GroupKFold(n_splits=min(params["inner_folds"], n)).split(X, groups=groups))
    return list(KFold(n_splits=min(params["inner_folds"], len(groups)), shuffle=True,
                      random_state=random_state).split(X))


def leading_columns(X: np.ndarray, k: int = 1) -> np.ndarray:
    """The first ``k`` columns: PCA(k) is the first k components of PCA(k_max), so the inner CV
    chooses the PCA size by slicing one fit (a module-level function, so fitted models pickle)."""
    return X[:, :k]


def make_regressor(name: str, X: np.ndarray, cv: list[tuple], params: dict[str, Any], random_state: int,
                   impute: bool = False, weights: np.ndarray | None = None):
    """The pipeline of regressor ``name`` for training rows ``X`` (n, p), or the mean for ``mean``.

    Unsupervised steps (impute missing values with an indicator column, standardise, and for
    ``elasticnet`` PCA to the largest size tried) are fitted once on the training rows; the
    supervised choices (α, l1_ratio, how many components) are made by the inner CV (the
    ``search`` step, an :class:`encmap.downstream.search.InnerSearch`). The PCA sizes tried are
    ``params['pca_dims']`` capped at what the smallest inner training fold can hold. ``cv``: the inner (train, test) index pairs.
    ``impute``: the feature matrix has missing values somewhere (decided on all rows, not these:
    a held-out model may be the only one with a missing value). ``weights``: column weights of
    blocks joined side by side (:func:`join_blocks`), applied after standardising.
    """
    from sklearn.decomposition import PCA
    from sklearn.dummy import DummyRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import ElasticNet, Ridge, RidgeCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    from .search import InnerSearch

    if name == "mean":
        return DummyRegressor(strategy="mean")
    if name == "knn":  # X: distances (n, n) between the training rows; k by the inner CV
        from sklearn.model_selection import GridSearchCV
        from sklearn.neighbors import KNeighborsRegressor

        smallest = min(len(tr) for tr, _ in cv)
        ks = sorted({min(int(k), smallest) for k in params["neighbours_k"]})
        # GridSearchCV slices a precomputed matrix's rows and columns alike (sklearn's pairwise tag).
        return GridSearchCV(KNeighborsRegressor(metric="precomputed"), {"n_neighbors": ks}, cv=cv,
                            scoring="neg_mean_squared_error", error_score="raise")
    n, p = X.shape
    head = []
    if impute:  # baselines with missing values (no layer, unknown size); empty columns are kept (as 0)
        head.append(("impute", SimpleImputer(strategy="mean", add_indicator=True, keep_empty_features=True)))
        p += int(np.isnan(X).any(axis=0).sum())
    head.append(("scale", StandardScaler()))
    if weights is not None:
        head.append(("blocks", FunctionTransformer(scale_columns, kw_args={"w": weights})))
    if name == "ridge" and params.get("ridge_alpha_cv", "loo") == "loo":
        # The alphas' exact leave-one-out errors from one SVD (RidgeCV's GCV): no inner fits.
        search = RidgeCV(alphas=list(params["ridge_alphas"]))
    elif name == "ridge":
        search = InnerSearch(Ridge(), {"alpha": list(params["ridge_alphas"])}, cv)
    elif name == "elasticnet":
        smallest = min(len(tr) for tr, _ in cv)
        dims = sorted({min(k, smallest, p) for k in params["pca_dims"]})
        head.append(("pca", PCA(n_components=max(dims), random_state=random_state)))
        inner = Pipeline([("components", FunctionTransformer(leading_columns)),
                          ("model", ElasticNet(max_iter=params["max_iter"], random_state=random_state))])
        search = InnerSearch(inner, {"components__kw_args": [{"k": k} for k in dims],
                                     "model__alpha": list(params["elasticnet_alphas"]),
                                     "model__l1_ratio": list(params["l1_ratios"])}, cv)
    else:
        raise EncmapError(f"unknown regressor {name!r} (known: {REGRESSORS})")
    if name == "elasticnet":
        from sklearn.compose import TransformedTargetRegressor

        # Its alpha grid is absolute, and the L1 penalty meets the scores' units: fitted on
        # standardised scores, its choices (and rows) are the same in any unit (ridge's already are).
        return TransformedTargetRegressor(Pipeline(head + [("search", search)]), transformer=StandardScaler())
    return Pipeline(head + [("search", search)])


def fit_regressor(name: str, X: np.ndarray, y: np.ndarray, groups: np.ndarray, protocol: str,
                  params: dict[str, Any], random_state: int, impute: bool = False,
                  weights: np.ndarray | None = None):
    """One regressor fitted on (X, y) with its hyper-parameters chosen by the inner CV."""
    est = make_regressor(name, X, inner_cv(groups, protocol, params, random_state), params, random_state, impute,
                         weights)
    return est.fit(X, y)  # the search step silences its fits' ConvergenceWarning


def cross_predict(name: str, X: np.ndarray, y: np.ndarray, groups: np.ndarray, splits: list[tuple], protocol: str,
                  params: dict[str, Any], random_state: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold predictions (m,) of regressor ``name`` over the outer ``splits`` (NaN for rows no
    split tests). ``knn``: X is the (m, m) distance matrix, sliced to the training columns."""
    pred = np.full(len(y), np.nan)
    impute = bool(np.isnan(X).any())
    for train, test in splits:
        Xtr, Xte = (X[np.ix_(train, train)], X[np.ix_(test, train)]) if name == "knn" else (X[train], X[test])
        est = fit_regressor(name, Xtr, y[train], groups[train], protocol, params, random_state, impute, weights)
        pred[test] = est.predict(Xte)
    return pred


def expanded_ranks(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Average ranks (as ``scipy.stats.rankdata``) each row of ``values`` (n,) gets in the data
    where row i appears ``counts[b, i]`` times, for every resample b at once: (B, n)."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])  # tie blocks in sorted order
    block = np.cumsum(np.r_[True, v[1:] != v[:-1]]) - 1
    per_block = np.add.reduceat(counts[:, order], starts, axis=1).astype(np.float64)
    avg = np.cumsum(per_block, axis=1) - per_block + (per_block + 1) / 2.0
    ranks = np.empty(counts.shape, dtype=np.float64)
    ranks[:, order] = avg[:, block]
    return ranks


def weighted_correlation(A: np.ndarray, B: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Pearson correlation of rows of A and B (k, n) with row weights W (k, n): (k,), NaN where
    either is constant."""
    s = W.sum(axis=1, keepdims=True)
    a = A - (W * A).sum(axis=1, keepdims=True) / s
    b = B - (W * B).sum(axis=1, keepdims=True) / s
    den = np.sqrt((W * a * a).sum(axis=1) * (W * b * b).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (W * a * b).sum(axis=1) / np.where(den > 0, den, 1.0), np.nan)


def spearman_pairs(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Spearman of each column of A with the same column of B (n, k): (k,), as
    ``scipy.stats.spearmanr`` of each pair (Pearson of average ranks); NaN for a constant column."""
    from scipy.stats import rankdata

    return weighted_correlation(rankdata(A, axis=0).T, rankdata(B, axis=0).T, np.ones(A.shape[::-1]))


def bootstrap_interval(y: np.ndarray, pred: np.ndarray, units: np.ndarray, resamples: int, level: float,
                       random_state: int) -> tuple[float, float]:
    """Percentile interval of the Spearman of (y, pred) over ``resamples`` bootstrap samples of the
    held-out unit (``units``: each row's model or family; a unit's rows go in or out together).

    Each resample draws as many units as there are, with replacement (``rng.integers(0, G, (B,
    G))``); its Spearman is that of the rows of the drawn units, repeated ones repeated (computed
    for all resamples at once from the rows' multiplicities: :func:`expanded_ranks`).

    y, pred, units : (n,). Returns (low, high) at ``level`` (e.g. 0.95); NaN when every
    resample's Spearman is NaN (constant predictions)."""
    labels, inverse = np.unique(units, return_inverse=True)
    draws = np.random.default_rng(random_state).integers(0, len(labels), (resamples, len(labels)))
    per_unit = np.stack([np.bincount(d, minlength=len(labels)) for d in draws])  # (B, G)
    counts = per_unit[:, inverse]  # (B, n): how often each row is in each resample
    stats = weighted_correlation(expanded_ranks(y, counts), expanded_ranks(pred, counts), counts)
    if not np.isfinite(stats).any():
        return np.nan, np.nan
    lo, hi = np.nanpercentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def refits_cheaply(name: str, params: dict[str, Any]) -> bool:
    """Whether regressor ``name`` refits many targets at once (the permutation null): the mean,
    and ridge with its alpha by leave-one-out (RidgeCV's one SVD for every target and alpha)."""
    return name == "mean" or (name == "ridge" and params.get("ridge_alpha_cv", "loo") == "loo")


def permutation_p_value(name: str, X: np.ndarray, y: np.ndarray, groups: np.ndarray, splits: list[tuple],
                        protocol: str, params: dict[str, Any], random_state: int, observed: float,
                        permutations: int, weights: np.ndarray | None = None) -> float:
    """One-sided p-value of the out-of-fold Spearman ``observed`` against refits on shuffled scores.

    The null shuffles the scores across encoders (``permutations`` seeded permutations of y) and
    refits exactly as the protocol fits (same outer folds, same regressor, alpha chosen afresh
    per permutation: RidgeCV with ``alpha_per_target``). p = (1 + #{null >= observed - γ}) /
    (1 + permutations), γ = 100 ε |observed| (ties up to rounding count, as in
    ``scipy.stats.permutation_test``): with 199 permutations the smallest is 0.005. NaN for a regressor that
    cannot refit every permutation at once (:func:`refits_cheaply`) or a NaN ``observed``.
    """
    if not refits_cheaply(name, params) or not np.isfinite(observed) or permutations < 1:
        return np.nan
    rng = np.random.default_rng(random_state)
    Yp = np.stack([y[rng.permutation(len(y))] for _ in range(permutations)], axis=1)  # (n, P)
    pred = np.full(Yp.shape, np.nan)
    impute = bool(np.isnan(X).any())
    for train, test in splits:
        est = make_regressor(name, X[train], inner_cv(groups[train], protocol, params, random_state), params,
                             random_state, impute, weights)
        if name != "ridge":
            pred[test] = est.fit(X[train], Yp[train]).predict(X[test]).reshape(len(test), -1)
            continue
        # Ridge's fit and its leave-one-out errors lie in the span of the (centred) training rows:
        # on a wide matrix (10,000 QRE columns) fit the shuffles on the rows' coordinates in that
        # span, the same predictions without 199 x p coefficients (docs/results.md: 4.1 -> 0.3 s).
        prep = est[:-1].fit(X[train])
        Xtr, Xte = prep.transform(X[train]), prep.transform(X[test])
        if Xtr.shape[1] > Xtr.shape[0]:  # an orthonormal basis V of that span from the (n, n) Gram matrix
            C = Xtr - Xtr.mean(axis=0)
            ev, U = np.linalg.eigh(C @ C.T)
            keep = ev > ev.max() * len(ev) * np.finfo(np.float64).eps  # directions the rows span
            V = C.T @ (U[:, keep] / np.sqrt(ev[keep]))
            Xtr, Xte = Xtr @ V, Xte @ V
        search = est.named_steps["search"].set_params(alpha_per_target=True)
        pred[test] = search.fit(Xtr, Yp[train]).predict(Xte).reshape(len(test), -1)
    tested = tested_rows(splits)  # every row but for the frontier's one split
    null = spearman_pairs(Yp[tested], pred[tested])
    # As scipy.stats.permutation_test: a null equal to the observed value up to rounding counts as
    # reaching it (every shuffle giving the same statistic one ulp below it is p = 1, not 0.005).
    gamma = 100 * np.finfo(np.float64).eps * abs(observed)
    return float((1 + np.sum(np.nan_to_num(null, nan=-np.inf) >= observed - gamma)) / (1 + permutations))


def near_constant(v: np.ndarray) -> bool:
    """Whether ``v`` varies by no more than rounding (its range within 1e-9 of its magnitude): its
    ranks would be noise (a task scored 0.5 ± 1e-12 gave a Spearman of -0.55)."""
    v = np.asarray(v, dtype=np.float64)
    return bool(np.ptp(v) <= 1e-9 * max(1.0, float(np.max(np.abs(v)))))


def prediction_quality(y: np.ndarray, pred: np.ndarray) -> dict[str, float]:
    """Spearman, Pearson, MAE and the mean signed error (``bias``: predicted minus measured) of
    predictions vs truth (correlations NaN for input constant up to rounding: :func:`near_constant`)."""
    from scipy.stats import pearsonr, spearmanr

    constant = near_constant(pred) or near_constant(y)
    return {"spearman": np.nan if constant else float(spearmanr(y, pred).statistic),
            "pearson": np.nan if constant else float(pearsonr(y, pred).statistic),
            "mae": float(np.mean(np.abs(y - pred))), "bias": float(np.mean(pred - y))}


def regressors_for(features: str) -> tuple[str, ...]:
    """Both regressors for feature matrices; ridge for one-column baselines; k nearest neighbours
    for the map's distances; the mean."""
    if features == "mean":
        return ("mean",)
    if features == "neighbours":
        return ("knn",)
    return ("ridge",) if features in ONE_COLUMN else REGRESSORS


#: The uncertainty columns of a row of the table (NaN where ``params`` has no ``uncertainty``).
UNCERTAINTY = ("spearman_low", "spearman_high", "p_value")
#: The prediction-interval columns of a row (NaN where its predictions carry no interval).
COVERAGE = ("coverage", "width")


def tested_rows(splits: list[tuple]) -> np.ndarray:
    """The rows the outer ``splits`` predict, ascending (all rows but for the frontier's split)."""
    return np.unique(np.concatenate([np.asarray(te, dtype=np.intp) for _, te in splits]))


def _out_of_fold(unit: tuple, params: dict[str, Any], random_state: int
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Out-of-fold predictions (n,) of one (regressor, X, y, groups, splits, protocol, weights,
    intervals) unit, their conformal intervals (n, 2) (NaN unless ``intervals``:
    :func:`encmap.downstream.intervals.heldout_intervals`), and the quality of the rows the
    splits predict, with its uncertainty (``params['uncertainty']``: a bootstrap interval of the
    Spearman over the held-out groups, a permutation p-value) and the intervals' coverage."""
    from .intervals import coverage, heldout_intervals

    reg, X, y, g, splits, protocol, weights, intervals = unit
    pred = cross_predict(reg, X, y, g, splits, protocol, params, random_state, weights)
    bounds = (heldout_intervals(X, y, g, splits, params, random_state, weights) if intervals
              else np.full((len(y), 2), np.nan))
    idx = tested_rows(splits)
    yt, pt, gt = y[idx], pred[idx], g[idx]
    q = prediction_quality(yt, pt) | dict(zip(COVERAGE, coverage(yt, bounds[idx]) if intervals else (np.nan,) * 2))
    u = params.get("uncertainty")
    units = len(np.unique(gt))
    missing = int(intervals and (~np.isfinite(bounds[idx]).all(axis=1)).sum())
    no_interval = ""
    if missing:  # a fold with too few training encoders for a quantile at the level
        level = params["intervals"]["level"]
        no_interval = (f"no prediction interval for {missing} of {len(idx)} held-out encoders: their folds had too "
                       f"few training encoders for a {level:.0%} interval (more than "
                       f"{max(1 / level, 1 / (1 - level)):.0f} needed)")
    if u is None:
        return pred, bounds, q | dict.fromkeys(UNCERTAINTY, np.nan) | {"units": units, "note": no_interval}
    if units >= u["min_units"]:
        low, high = bootstrap_interval(yt, pt, gt, u["resamples"], u["level"], u["seed"])
        note = ""
    else:  # a bootstrap over 2 or 3 units is no interval (3 encoders of one model: [-0.5, -0.5])
        low, high = np.nan, np.nan
        note = (f"no interval: {units} held-out {GROUPED_BY.get(protocol, 'models')}, below "
                f"regress.uncertainty.min_units = {u['min_units']}")
    p = permutation_p_value(reg, X, y, g, splits, protocol, params, random_state, q["spearman"],
                            u["permutations"], weights)
    return pred, bounds, q | {"spearman_low": low, "spearman_high": high, "p_value": p, "units": units,
                              "note": "; ".join(filter(None, [note, no_interval]))}


def regression_table(F: np.ndarray, Y: np.ndarray, tasks: list[str], groups: list[str] | np.ndarray,
                     records: list[dict[str, Any]] | None, params: dict[str, Any], random_state: int,
                     n_jobs: int | None = None, families: list[str] | np.ndarray | None = None,
                     spectral: dict[str, np.ndarray] | None = None, feature_sets: tuple[str, ...] = FEATURE_SETS,
                     distances: np.ndarray | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every task x protocol x feature set x regressor: out-of-fold predictions and their quality.

    Parameters
    ----------
    F : ndarray, shape (m, n)
        QRE feature matrix (one row per encoder).
    Y : ndarray, shape (m, T)
        Scores; NaN where an encoder has no score for a task (those rows sit that task out).
    tasks : list of T str
    groups : sequence of m labels
        The model of each encoder: the grouped protocol never splits one.
    records : list of m dict
        Encoder records of the feature matrix (for the baselines); None: the baselines that need
        them (width, layer, parameters) are left out.
    params : dict
        The ``regress`` section of params.yaml.
    n_jobs : int, optional
        Worker processes: the task x protocol x features x regressor units run side by side,
        each on one BLAS thread (:mod:`encmap.parallel`); the result does not depend on it.
    families : sequence of m labels, optional
        The family of each encoder (each model in exactly one): the ``family`` protocol holds
        out whole families. None, or fewer than 3 families among a task's scored encoders: that
        task has no ``family`` rows.
    spectral : dict, optional
        ``entropy`` (m,), ``profile`` (m, 16), ``head`` (m, k), ``log_rank`` (m,): the spectral
        baselines (each left out without its summaries).
        The leave-task-out sets (``tasks``, ``qre+tasks``) need at least 2 tasks.
    feature_sets : the sets to compare (default every one of :data:`FEATURE_SETS` there are
        data for), e.g. ``("tasks", "mean")`` for scores without features.
    distances : ndarray (m, m), optional
        The map's distances between the encoders (symmetrised exact QRE): the ``neighbours``
        baseline (left out without them).

    Returns
    -------
    rows : list of dict
        One per task x protocol x features x regressor: spearman, pearson, mae, bias, n (the
        encoders predicted), coverage and width of the conformal intervals (ridge on
        ``params['intervals']['features']``, model held out; else NaN), and with
        ``params['uncertainty']`` (resamples, permutations, level, seed) the Spearman's
        bootstrap interval over the held-out groups (``spearman_low``, ``spearman_high``) and
        its permutation p-value (``p_value``, :func:`permutation_p_value`; NaN for elasticnet,
        whose inner grid search is too costly to refit per permutation).
    predictions : list of dict
        One per encoder predicted x task x protocol x features x regressor: actual, predicted, and
        the conformal interval ``low``, ``high`` (None where there is none).
    """
    from ..parallel import map_single_threaded

    labels = {p: np.asarray(groups).astype(str) for p in ("grouped", "random", "frontier")}
    if families is not None:
        labels["family"] = np.asarray(families).astype(str)
    base = baseline_features(records, F.shape, random_state)
    sets: dict[str, list[np.ndarray]] = {"qre": [F]} | {k: [v] for k, v in base.items()}
    if spectral:  # the spectral baselines whose summaries the matrix holds
        sets |= {name: predictor_blocks(name, F, spectral) for name, needs in NEEDS.items()
                 if all(k in spectral for k in needs)}
    if distances is not None:
        sets["neighbours"] = [np.asarray(distances, dtype=np.float64)]
    from .intervals import with_intervals
    keys, units = [], []
    for t, task in enumerate(tasks):
        have = np.flatnonzero(np.isfinite(Y[:, t]))
        y = Y[have, t]
        # Leave-task-out: the encoder's scores on every other task (missing ones imputed).
        others = [Y[:, [j for j in range(len(tasks)) if j != t]]] if len(tasks) > 1 else None
        task_sets = sets | ({"tasks": others, "qre+tasks": [F, others[0]]} if others else {})
        for protocol in PROTOCOLS:
            # Held-out groups need 3 of them (a map of one or two models, a task scored on fewer
            # families): that protocol is left out of the task, the others still run.
            if protocol not in labels or (protocol in GROUPED_BY and len(np.unique(labels[protocol][have])) < MIN_GROUPS):
                continue
            if protocol == "frontier" and "frontier" not in params:  # a regress section from before it
                continue
            g = labels[protocol][have]
            by_reg = {reg: outer_splits(g, protocol, params, random_state, y, reg) for reg in ("ridge", "elasticnet")}
            if not by_reg["ridge"]:  # a frontier that would leave fewer than 3 models to train on
                continue
            tested = tested_rows(by_reg["ridge"])
            for fs in (fs for fs in FEATURE_SETS if fs in feature_sets and (fs in task_sets or fs == "mean")):
                if fs == "mean":
                    X, w = np.zeros((len(have), 1)), None
                elif fs == "neighbours":
                    X, w = task_sets[fs][0][np.ix_(have, have)], None
                else:
                    X, w = join_blocks([b[have] for b in task_sets[fs]])
                for reg in regressors_for(fs):
                    splits = by_reg.get(reg, by_reg["ridge"])
                    keys.append((task, protocol, fs, reg, have[tested], y[tested], tested, len(splits)))
                    units.append((reg, X, y, g, splits, protocol, w, with_intervals(reg, fs, protocol, params)))
    predicted = map_single_threaded(partial(_out_of_fold, params=params, random_state=random_state), units, n_jobs)
    rows, preds = [], []
    for (task, protocol, fs, reg, rows_of, y, tested, folds), (p, bounds, quality) in zip(keys, predicted):
        rows.append({"task": task, "protocol": protocol, "features": fs, "regressor": reg,
                     "n": len(rows_of), "folds": folds} | quality)
        preds.extend({"encoder": int(i), "task": task, "protocol": protocol, "features": fs, "regressor": reg,
                      "actual": float(a), "predicted": float(b),
                      # None (an empty cell) where the row has no interval
                      "low": float(lo) if np.isfinite(lo) else None, "high": float(hi) if np.isfinite(hi) else None}
                     for i, a, b, (lo, hi) in zip(rows_of, y, p[tested], bounds[tested]))
    return rows, preds


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean over tasks of Spearman, Pearson, MAE, the mean signed error and the conformal
    intervals' coverage per features x regressor x protocol (DVC metrics)."""
    out: dict[str, Any] = {}
    for r in rows:
        key = out.setdefault(r["features"], {}).setdefault(r["regressor"], {}).setdefault(r["protocol"], [])
        key.append(r)
    return {fs: {reg: {prot: {m: float(np.nanmean([r[m] for r in rs])) if any(np.isfinite(r[m]) for r in rs)
                              else None for m in ("spearman", "pearson", "mae", "bias", "coverage")}
                       for prot, rs in by_prot.items()}
                 for reg, by_prot in by_reg.items()}
            for fs, by_reg in out.items()}


def linear_form(est, p: int) -> tuple[np.ndarray, float]:
    """A fitted final pipeline as the one affine map it is: ``est.predict(X) == X @ w + b``.

    Every step :func:`fit_final` keeps is affine (standardise, PCA, leading columns, a linear
    model), so their composition is too. Folded from the model back to the input: a step
    ``x -> (x - mu) @ T`` turns the weights ``w`` of what follows into ``T @ w`` and adds
    ``-mu @ (T @ w)`` to the intercept. Stored this way the fitted regressors are plain numbers:
    the same bytes whichever process fitted them (a pickle's bytes depend on which objects
    happen to be shared), readable without unpickling someone else's file, and independent of
    the scikit-learn version.

    Parameters
    ----------
    est : sklearn Pipeline
        As :func:`_final_fit` leaves it (no imputer, no search step).
    p : int
        Number of input columns.

    Returns
    -------
    w : ndarray (p,)
    b : float
    """
    from sklearn.decomposition import PCA
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler

    def flat(e):
        return [s for _, x in e.steps for s in flat(x)] if isinstance(e, Pipeline) else [e]

    def weights_of(step) -> np.ndarray | None:  # a block weighting step's column weights
        w = (step.kw_args or {}).get("w")
        return None if w is None else np.asarray(w, dtype=np.float64)

    *head, model = flat(est)
    dims = [p]  # each step's input width, to pad what ``leading_columns`` dropped
    for step in head:
        if isinstance(step, PCA):
            dims.append(step.n_components_)
        elif isinstance(step, FunctionTransformer) and step.func is leading_columns:
            dims.append(step.kw_args["k"])
        else:
            dims.append(dims[-1])
    w, b = np.asarray(model.coef_, dtype=np.float64).ravel(), float(model.intercept_)
    for step, width in zip(reversed(head), reversed(dims[:-1])):
        if isinstance(step, StandardScaler):
            w = w / step.scale_
            b -= float(step.mean_ @ w)
        elif isinstance(step, PCA) and not step.whiten:
            w = step.components_.T @ w
            b -= float(step.mean_ @ w)
        elif isinstance(step, FunctionTransformer) and step.func is leading_columns:
            w = np.concatenate([w, np.zeros(width - len(w))])
        elif isinstance(step, FunctionTransformer) and step.func is scale_columns:
            cw = weights_of(step)
            if cw is not None:  # x -> x * cw on the first len(cw) columns (no imputer here: all of them)
                w = w * np.concatenate([cw, np.ones(len(w) - len(cw))])
        else:
            raise EncmapError(f"cannot write a fitted {type(step).__name__} step as a linear map")
    return w, b


def _final_fit(unit: tuple, params: dict[str, Any], random_state: int) -> tuple[np.ndarray, float, dict[str, Any]]:
    """One regressor fitted on all of (X, y): its linear form (w (p,), b) and the inner CV's choices."""
    reg, X, y, g, weights = unit
    # Inner CV grouped by model, as in the outer folds; a map of one model can only shuffle.
    est = fit_regressor(reg, X, y, g, "grouped" if len(np.unique(g)) >= 2 else "random", params, random_state,
                        weights=weights)
    scale, shift = 1.0, 0.0
    if hasattr(est, "regressor_"):  # fitted on standardised scores: y = pipeline(X) * scale + shift
        scale, shift = float(est.transformer_.scale_[0]), float(est.transformer_.mean_[0])
        est = est.regressor_
    search = est.named_steps["search"]
    if not hasattr(search, "best_estimator_"):  # RidgeCV: alpha by its leave-one-out errors, fitted with it
        est.steps[-1] = ("model", search)
        chosen = {"alpha": float(search.alpha_)}
    else:
        est.steps[-1] = ("model", search.best_estimator_)
        chosen = {k.removeprefix("model__"): v for k, v in search.best_params_.items() if k != "components__kw_args"}
        if "components__kw_args" in search.best_params_:
            chosen["pca_components"] = search.best_params_["components__kw_args"]["k"]
    w, b = linear_form(est, X.shape[1])
    return w * scale, b * scale + shift, chosen


def fit_final(F: np.ndarray, Y: np.ndarray, tasks: list[str], groups: list[str] | np.ndarray,
              params: dict[str, Any], random_state: int, n_jobs: int | None = None,
              blocks: list[np.ndarray] | None = None) -> dict[str, Any]:
    """Each task's regressors fitted on every encoder that has its score (grouped inner CV).

    Parameters
    ----------
    F : ndarray (m, n)
        QRE features of the encoders on the map.
    blocks : list of ndarray, optional
        The predictor's blocks (:func:`predictor_blocks`; default ``[F]``): the regressors act
        on them side by side, (m, p), p their total width.
    Y : ndarray (m, T)
        Scores, NaN where an encoder has none for a task.
    n_jobs : int, optional
        Worker processes, as in :func:`regression_table`.

    Returns
    -------
    dict
        ``weights`` (T, R, p) and ``intercepts`` (T, R): task t's regressor r (in
        :data:`REGRESSORS` order) predicts ``X_new @ weights[t, r] + intercepts[t, r]``, X_new
        the new encoders' blocks side by side; ``chosen``: ``{task: {regressor: the inner CV's
        hyper-parameters}}``.
    """
    from ..parallel import map_single_threaded

    X, weights = join_blocks(blocks if blocks is not None else [F])
    groups = np.asarray(groups).astype(str)
    units = []
    for t in range(len(tasks)):
        have = np.flatnonzero(np.isfinite(Y[:, t]))
        units += [(reg, X[have], Y[have, t], groups[have], weights) for reg in REGRESSORS]
    fitted = map_single_threaded(partial(_final_fit, params=params, random_state=random_state), units, n_jobs)
    shape = (len(tasks), len(REGRESSORS))
    return {"weights": np.stack([w for w, _, _ in fitted]).reshape(*shape, X.shape[1]),
            "intercepts": np.array([b for _, b, _ in fitted]).reshape(shape),
            "chosen": {task: {reg: fitted[t * len(REGRESSORS) + r][2] for r, reg in enumerate(REGRESSORS)}
                       for t, task in enumerate(tasks)}}
