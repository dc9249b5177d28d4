"""Stitches between embedding spaces: exact relations, controls, R² against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group
from sklearn.metrics import r2_score

from encmap.similarity.stitch import fit_affine, knn_overlap, scores, split_rows, stitch
from encmap.validation import EncmapError


def source(n: int = 400, d: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d)) * np.linspace(2, 0.5, 6)[:d]


def test_split_is_seeded_and_disjoint():
    a, b = split_rows(100, random_state=3), split_rows(100, random_state=3)
    assert all(np.array_equal(x, y) for x, y in zip((a.train, a.val, a.test), (b.train, b.val, b.test)))
    assert len(a.test) == 20 and len(a.val) == 10 and len(a.train) == 70
    assert sorted(np.concatenate([a.train, a.val, a.test]).tolist()) == list(range(100))
    assert not np.array_equal(split_rows(100, random_state=4).test, a.test)
    with pytest.raises(EncmapError, match="sum below 1"):
        split_rows(100, val=0.5, test=0.6)


def test_exact_affine_relation_is_recovered_on_held_out_rows():
    X = source()
    rng = np.random.default_rng(1)
    A, b = rng.normal(size=(6, 4)), rng.normal(size=4)
    Y = X @ A + b
    sp = split_rows(len(X))
    s = stitch(X, Y, "affine", sp)
    assert s["r2"] == pytest.approx(1.0, abs=1e-12) and s["mse"] < 1e-20 and s["knn10_overlap"] == 1.0
    assert np.allclose(s["singular_values"], np.linalg.svd(A, compute_uv=False))
    A2, b2 = fit_affine(X[sp.train], Y[sp.train])
    assert np.allclose(A2, A) and np.allclose(b2, b)
    assert stitch(X, Y, "ridge", sp, alphas=[1e-8])["r2"] == pytest.approx(1.0, abs=1e-9)


def test_procrustes_recovers_a_rotation_and_pads_unequal_widths():
    X = source()
    Q = ortho_group.rvs(6, random_state=2)
    sp = split_rows(len(X))
    assert stitch(X, X @ Q + 3.0, "procrustes", sp)["r2"] == pytest.approx(1.0, abs=1e-10)
    # Source narrower than the target: zero-padded, then rotated into the wider space.
    assert stitch(X[:, :4], X[:, :4] @ Q[:4], "procrustes", sp)["r2"] == pytest.approx(1.0, abs=1e-10)
    # Procrustes does not scale: a scaled target is not fitted exactly.
    assert stitch(X, 3.0 * X @ Q, "procrustes", sp)["r2"] < 0.99


def test_controls_give_r2_near_zero_and_use_training_rows_only():
    X = source(n=2000)
    Y = np.tanh(X[:, :3]) + 0.1 * np.random.default_rng(3).normal(size=(2000, 3))
    sp = split_rows(len(X), random_state=0)
    mean = stitch(X, Y, "mean", sp)
    # The training mean on test rows: R² a little below 0 (the test rows' own mean would give exactly 0).
    assert -0.05 < mean["r2"] <= 0.0
    own = ((Y[sp.test] - Y[sp.test].mean(0)) ** 2).sum(0)
    train = ((Y[sp.test] - Y[sp.train].mean(0)) ** 2).sum(0)
    assert mean["r2"] == pytest.approx(np.mean(1 - train / own), rel=1e-12)
    rnd = stitch(X, Y, "random-source", sp)
    assert -0.1 < rnd["r2"] < 0.05
    assert stitch(X, Y, "affine", sp)["r2"] > 0.8


def test_r2_and_other_scores_agree_with_scikit_learn_and_hand_values():
    rng = np.random.default_rng(4)
    Y, P = rng.normal(size=(50, 5)) * [1, 2, 3, 4, 5], rng.normal(size=(50, 5))
    s = scores(Y, P, k=5)
    assert s["r2"] == pytest.approx(r2_score(Y, P), rel=1e-12)
    assert s["r2_weighted"] == pytest.approx(r2_score(Y, P, multioutput="variance_weighted"), rel=1e-12)
    assert s["mse"] == pytest.approx(np.mean((Y - P) ** 2)) and s["mae"] == pytest.approx(np.mean(np.abs(Y - P)))
    # Hand values: identical rows have cosine 1 and full neighbour agreement; opposite rows -1.
    assert scores(Y, Y, k=5)["cosine"] == pytest.approx(1.0) and scores(Y, -Y, k=5)["cosine"] == pytest.approx(-1.0)
    assert knn_overlap(Y, 2.0 * Y, 5) == 1.0 and 0 <= knn_overlap(Y, P, 5) < 0.5


def test_mlp_depth0_equals_the_affine_fit_and_deeper_fits_a_nonlinear_map():
    X = source(n=300)
    rng = np.random.default_rng(5)
    Y = X @ rng.normal(size=(6, 3)) + 0.05 * rng.normal(size=(300, 3))
    sp = split_rows(len(X), random_state=1)
    aff = stitch(X, Y, "affine", sp)
    mlp0 = stitch(X, Y, "mlp", sp, depth=0, random_state=0)
    assert mlp0["r2"] == pytest.approx(aff["r2"], abs=2e-3)
    assert stitch(X, Y, "mlp", sp, depth=0, random_state=0) == mlp0  # seeded: identical
    Z = np.abs(X[:, :1])  # = relu(x) + relu(-x): two hidden units of width max(6, 1) = 6 suffice; no affine fit
    assert stitch(X, Z, "mlp", sp, depth=2)["r2"] > stitch(X, Z, "affine", sp)["r2"] + 0.2


def test_bad_input():
    X = source()
    with pytest.raises(EncmapError, match=r"stitching needs the same sentences in both spaces: n = 400 \(source\) vs n = 399 \(target\)"):
        stitch(X, X[:-1], "affine", split_rows(400))
    with pytest.raises(EncmapError, match="stitch method 'cca'"):
        stitch(X, X, "cca", split_rows(400))
    with pytest.raises(EncmapError, match="MLP depth 7"):
        stitch(X, X, "mlp", split_rows(400), depth=7)


def test_stacked_targets_fit_like_separate_ones():
    """Columnwise stitches fitted to several targets side by side equal the separate fits."""
    from encmap.similarity.stitch import COLUMNWISE, fit_predict

    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 6))
    Ys = [rng.standard_normal((120, 4)), X @ rng.standard_normal((6, 3))]
    split = split_rows(120, val=0.1, test=0.25, random_state=0)
    for method in COLUMNWISE:
        P, extra = fit_predict(X, np.hstack(Ys), method, split)
        parts = [fit_predict(X, Y, method, split) for Y in Ys]
        assert np.allclose(P, np.hstack([p for p, _ in parts]), atol=1e-12, rtol=0)
        if "coef" in extra:
            assert np.allclose(extra["coef"], np.hstack([e["coef"] for _, e in parts]), atol=1e-12, rtol=0)


def test_constant_target_dimensions_are_left_out_of_r2():
    """A dead output dimension (its SST is rounding noise) must not swamp the per-dimension R²."""
    rng = np.random.default_rng(4)
    Y = rng.standard_normal((50, 3))
    P = Y + 0.1 * rng.standard_normal((50, 3))
    dead = np.column_stack([Y, np.full(50, 0.0417) + 1e-19 * rng.standard_normal(50)])
    got = scores(dead, np.column_stack([P, np.full(50, 0.05)]), k=3)
    assert got["constant_dims"] == 1
    assert got["r2"] == pytest.approx(r2_score(Y, P))


def test_an_mlp_that_never_has_a_finite_validation_loss_is_a_clear_error():
    """Every validation loss infinite (embeddings at 1e160: the squared error overflows): an error
    that says training diverged and what to change, not load_state_dict(None)'s traceback."""
    from encmap.similarity.stitch import fit_mlp

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(40, 3)) * 1e160, rng.normal(size=(40, 2)) * 1e160
    with pytest.raises(EncmapError, match=r"validation loss was never finite.*diverged.*mlp\.lr"):
        fit_mlp(X[:30], Y[:30], X[30:], Y[30:], depth=1, max_epochs=3, patience=2)
