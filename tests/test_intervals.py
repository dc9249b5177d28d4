"""Issue 71: the answer per encoder. The spectrum's scale, the frontier protocol, the map's
neighbours as a baseline, conformal intervals over held-out models (checked against MAPIE called
directly and against a case whose coverage is known) and the extrapolation flag."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from test_regress import OUTS, PARAMS, fake_run, records, table

from encmap.downstream.intervals import (DistanceScore, coverage, extrapolation, heldout_intervals, reach,
                                         standardiser)
from encmap.downstream.regression import frontier_split, outer_splits, regression_table

#: PARAMS with what issue 71 added (params.yaml's values, a short k grid).
P71 = PARAMS | {"frontier": {"top": 0.2}, "neighbours_k": [1, 2, 3],
                "intervals": {"level": 0.9, "folds": 0, "score": "absolute", "floor": 0.1, "features": ["qre"]},
                "ridge_alpha_cv": "loo"}


def test_the_scale_is_the_mean_squared_norm_and_head_scale_the_pip_matrixs_own_eigenvalues():
    """log_scale = ln(||E||_F^2 / n), from the embeddings directly; the head+scale block's first 32
    columns are ln of the largest eigenvalues of E E^T / n (dense numpy, ε's smoothing aside)."""
    from encmap.downstream.regression import predictor_blocks
    from encmap.qre.features import encoder_features
    from encmap.qre.spectrum import as_spectrum

    E = np.random.default_rng(0).standard_normal((300, 40)) * 3.0
    f = encoder_features(as_spectrum(E), direction="forward", eps=1e-9)
    assert f["log_scale"] == pytest.approx(np.log((E ** 2).sum() / 300), rel=1e-12)
    spectral = {k: np.array([f[k]]) for k in ("head", "entropy", "log_rank", "log_scale")}
    block = predictor_blocks("head+scale", np.zeros((1, 5)), spectral)[0][0]
    dense = np.sort(np.linalg.eigvalsh(E @ E.T / 300))[::-1][:32]
    np.testing.assert_allclose(block[:32], np.log(dense), rtol=1e-6)
    # The rest of the block is the plain head's: the entropy, the log rank, the effective rank.
    np.testing.assert_array_equal(block[32:], predictor_blocks("head", np.zeros((1, 5)), spectral)[0][0][32:])


def test_the_frontier_holds_out_every_model_with_an_encoder_in_the_top_fifth():
    y = np.array([0.1, 0.9, 0.2, 0.3, 0.5, 0.4, 0.6, 0.35, 0.7, 0.15])
    g = np.array(["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"])
    # 80th percentile (linear) of y: 0.62; a's 0.9 and e's 0.7 reach it, d's 0.6 does not.
    train, test = frontier_split(y, g, 0.2)
    assert test.tolist() == [0, 1, 8, 9] and train.tolist() == [2, 3, 4, 5, 6, 7]
    assert outer_splits(g, "frontier", P71, 0, y)[0][1].tolist() == [0, 1, 8, 9]
    # Fewer than 3 models left to train on: no frontier split (the protocol is left out).
    assert outer_splits(g, "frontier", P71 | {"frontier": {"top": 0.6}}, 0, y) == []


def test_the_neighbours_baseline_is_the_nearest_other_models_score():
    """With k = 1 the neighbours row predicts each encoder by the score of its nearest encoder of
    another model (a hand-made distance matrix), on the same folds as the other rows."""
    rng = np.random.default_rng(2)
    m, groups = 24, np.repeat([f"m{i}" for i in range(8)], 3)
    P = rng.standard_normal((m, 2))
    D = np.sqrt(((P[:, None] - P[None]) ** 2).sum(-1))
    y = P[:, 0] + 0.1 * rng.standard_normal(m)
    rows, preds = regression_table(rng.standard_normal((m, 4)), y[:, None], ["t"], groups, None,
                                   P71 | {"neighbours_k": [1]}, 0, distances=D, feature_sets=("neighbours", "mean"))
    other = np.where(groups[:, None] == groups[None], np.inf, D)
    expect = y[np.argmin(other, axis=1)]
    got = {p["encoder"]: p["predicted"] for p in preds if p["protocol"] == "grouped" and p["features"] == "neighbours"}
    np.testing.assert_allclose([got[i] for i in range(m)], expect, rtol=0, atol=1e-12)
    r = table(rows, protocol="grouped", features="neighbours")[0]
    assert r["regressor"] == "knn" and r["spearman"] > 0.8 and np.isnan(r["p_value"])
    assert table(rows, protocol="frontier", features="neighbours")  # and on the frontier's split


def _linear_groups(n_models: int, per: int, seed: int):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_models * per, 5))
    y = X @ np.array([1.0, -0.5, 0.3, 0.0, 0.0]) + 0.3 * rng.standard_normal(len(X))
    return X, y, np.repeat([f"m{i:02d}" for i in range(n_models)], per)


def test_heldout_intervals_are_mapies_cv_plus_over_models_and_cover_as_promised():
    """Each held-out model's interval is what MAPIE's CrossConformalRegressor, called directly on
    the other models with LeaveOneGroupOut, gives; on a linear model with Gaussian noise the
    coverage over held-out models is near the nominal 90% (CV+ guarantees at least 80%)."""
    from mapie.regression import CrossConformalRegressor
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import LeaveOneGroupOut
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y, g = _linear_groups(40, 3, 0)
    splits = outer_splits(g, "grouped", P71 | {"max_loo_groups": 100}, 0)
    b = heldout_intervals(X, y, g, splits, P71 | {"max_loo_groups": 100}, 0)
    train, test = splits[7]
    direct = CrossConformalRegressor(make_pipeline(StandardScaler(), RidgeCV(alphas=PARAMS["ridge_alphas"])),
                                     confidence_level=0.9, method="plus", cv=LeaveOneGroupOut())
    direct.fit_conformalize(X[train], y[train], groups=g[train])
    np.testing.assert_allclose(b[test], direct.predict_interval(X[test])[1][:, :, 0], rtol=1e-12)
    cov, width = coverage(y, b)
    assert 0.85 <= cov <= 0.97, cov  # measured 0.908
    assert width == pytest.approx(np.mean(b[:, 1] - b[:, 0]))
    # The frontier's held-out models get theirs from the other models alone.
    rows, preds = regression_table(X[:45], y[:45, None], ["t"], g[:45], None, P71, 0, feature_sets=("qre",))
    front = [p for p in preds if p["protocol"] == "frontier" and p["regressor"] == "ridge"]
    train, test = frontier_split(y[:45], g[:45], 0.2)
    assert sorted(p["encoder"] for p in front) == test.tolist() and all(p["low"] is not None for p in front)
    assert np.isfinite(table(rows, protocol="frontier", regressor="ridge")[0]["coverage"])
    # Hand-checkable coverage: ends included.
    assert coverage(np.array([0.0, 1.0, 2.0]), np.array([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])) == (2 / 3, 1.0)


def test_the_distance_score_widens_an_interval_with_the_distance_to_the_training_models():
    X, y, g = _linear_groups(20, 3, 1)
    score = DistanceScore(X, g, floor=0.1)
    np.testing.assert_array_equal(score.sigma(X), np.maximum(reach(X, g), score.floor))
    Z = standardiser(X)(X)
    other = np.where(g[:, None] == g[None], np.inf, np.sqrt(((Z[:, None] - Z[None]) ** 2).sum(-1)))
    np.testing.assert_allclose(reach(X, g), other.min(axis=1), rtol=1e-12)  # a slow textbook form
    from encmap.downstream.intervals import fitted_intervals, predict_intervals

    params = P71 | {"intervals": P71["intervals"] | {"score": "distance"}}
    fitted = fitted_intervals(X, y, g, params, 0)
    near, far = X[:1] + 0.01, X[:1] * 8
    w_near, w_far = (np.diff(predict_intervals(fitted, a))[0, 0] for a in (near, far))
    assert w_far > 3 * w_near, (w_near, w_far)
    absolute = fitted_intervals(X, y, g, P71, 0)
    assert np.diff(predict_intervals(absolute, far))[0, 0] < w_far


def test_a_prediction_says_why_it_extrapolates():
    Z = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    ids = ["a", "b", "c"]
    assert extrapolation(np.array([0.5, 0.5]), Z, ids, 1.0, 0.5, np.array([0.1, 0.9])) == ""
    why = extrapolation(np.array([3.0, 0.0]), Z, ids, 1.0, 0.95, np.array([0.1, 0.9, np.nan]))
    assert "nearest training encoder (b) is 2 away" in why and "farther than any held-out model lay" in why
    assert "the prediction 0.95 is above every training score (best 0.9)" in why
    assert "below every training score (worst 0.1)" in extrapolation(np.zeros(2), Z, ids, 1.0, 0.0, np.array([0.1, 0.9]))


def test_the_regress_step_writes_intervals_and_place_refits_them_for_a_new_encoder(tmp_path):
    """predictions.csv: ridge's grouped and frontier rows carry [low, high], others none; table and
    metrics give the coverage; the stored training rows give a new encoder the interval its twin
    on the map gets from MAPIE directly, and one far from every model is said to extrapolate."""
    from encmap.artifacts.features import read_feature_matrix
    from encmap.downstream.intervals import fitted_intervals, predict_intervals
    from encmap.downstream.prediction import placed_intervals, predict_scores
    from encmap.pipeline.regress import regress_step

    features, dirs = fake_run(tmp_path, m=18)
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    regress_step(features, dirs, out, regress=P71)
    preds = list(csv.DictReader(open(out["predictions"])))
    with_iv = {(p["protocol"], p["features"], p["regressor"]) for p in preds if p["low"]}
    assert with_iv == {("grouped", "qre", "ridge")}  # 4 models: too few for a frontier split
    rows = list(csv.DictReader(open(out["table"])))
    r = next(r for r in rows if (r["protocol"], r["features"], r["regressor"], r["task"]) == ("grouped", "qre", "ridge", "lee"))
    mine = [p for p in preds if (p["protocol"], p["features"], p["regressor"], p["task"]) == ("grouped", "qre", "ridge", "lee")]
    inside = np.mean([float(p["low"]) <= float(p["actual"]) <= float(p["high"]) for p in mine])
    assert float(r["coverage"]) == pytest.approx(inside) and float(r["bias"]) == pytest.approx(
        np.mean([float(p["predicted"]) - float(p["actual"]) for p in mine]))
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["interval_level"] == 0.9 and metrics["qre"]["ridge"]["grouped"]["coverage"] is not None
    fm = read_feature_matrix(features)
    new = np.vstack([fm["F"][:1], fm["F"][:1] * 50])
    pred = predict_scores(out["regressors"], new, fm["attrs"])
    got = placed_intervals(out["regressors"], new, None, pred)
    direct = predict_intervals(fitted_intervals(fm["F"], fm["F"][:, 0], np.array([r["model"] for r in fm["records"]]),
                                                P71, 0), new)
    np.testing.assert_allclose(np.c_[got["lee"]["low"], got["lee"]["high"]], direct, rtol=1e-12)
    assert got["lee"]["extrapolating"][0] == "" and "farther than any held-out model" in got["lee"]["extrapolating"][1]


def test_a_fold_with_too_few_encoders_for_the_level_gets_no_interval_and_the_row_says_so():
    """Old: MAPIE's ValueError ("Number of samples of the score is too low") stopped the regress
    job of a small map (the tiny pipeline's frontier trains on 9 encoders; 90% needs more than 10)."""
    X, y, g = _linear_groups(8, 2, 4)
    rows, preds = regression_table(X, y[:, None], ["t"], g, None, P71, 0, feature_sets=("qre",))
    r = table(rows, protocol="grouped", regressor="ridge")[0]
    assert np.isfinite(r["coverage"]) and r["note"] == ""  # 14 training encoders a fold: enough
    front = table(rows, protocol="frontier", regressor="ridge")
    if front:  # trains on fewer than 11 encoders here
        assert np.isnan(front[0]["coverage"]) and "no prediction interval for" in front[0]["note"], front[0]
        assert all(p["low"] is None for p in preds if p["protocol"] == "frontier")
