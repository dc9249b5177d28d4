"""CKA against independent references (the textbook HSIC formulas with explicit n x n matrices)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import ortho_group

from encmap import cka, linear_cka  # the public API
from encmap.similarity.cka import gram_cka, linear_cka_matrix, rbf_gram
from encmap.validation import EncmapError


def spaces(n: int = 60, d: int = 8, e: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two related spaces: Y is a noisy nonlinear function of X."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * np.linspace(3, 0.5, d)
    Y = np.tanh(X @ rng.normal(size=(d, e))) + 0.3 * rng.normal(size=(n, e))
    return X, Y


def hsic_biased(K: np.ndarray, L: np.ndarray) -> float:
    """tr(K H L H) / (n - 1)², H = I - 11ᵀ/n (Gretton et al. 2005)."""
    n = len(K)
    H = np.eye(n) - np.ones((n, n)) / n
    return float(np.trace(K @ H @ L @ H)) / (n - 1) ** 2


def hsic_unbiased(K: np.ndarray, L: np.ndarray) -> float:
    """Song et al. (2012), eq. 5, written out with zero-diagonal Grams."""
    n = len(K)
    Kt, Lt = K - np.diag(np.diag(K)), L - np.diag(np.diag(L))
    one = np.ones(n)
    return float(np.trace(Kt @ Lt) + (one @ Kt @ one) * (one @ Lt @ one) / ((n - 1) * (n - 2))
                 - 2.0 / (n - 2) * (one @ Kt @ Lt @ one)) / (n * (n - 3))


def reference_cka(K: np.ndarray, L: np.ndarray, debiased: bool) -> float:
    h = hsic_unbiased if debiased else hsic_biased
    return h(K, L) / np.sqrt(h(K, K) * h(L, L))


@pytest.mark.parametrize("debiased", [False, True])
def test_linear_cka_matches_the_textbook_formula_and_the_gram_route(debiased):
    X, Y = spaces()
    ref = reference_cka(X @ X.T, Y @ Y.T, debiased)
    assert linear_cka(X, Y, debiased=debiased) == pytest.approx(ref, rel=1e-10, abs=1e-12)
    assert gram_cka(X @ X.T, Y @ Y.T, debiased=debiased) == pytest.approx(ref, rel=1e-10, abs=1e-12)


@pytest.mark.parametrize("debiased", [False, True])
def test_rbf_cka_matches_the_textbook_formula(debiased):
    X, Y = spaces(seed=1)

    def gram(Z, t):  # independent: scipy distances; the median over the whole n x n matrix, as gram_rbf
        from scipy.spatial.distance import pdist, squareform

        d2 = squareform(pdist(Z, "sqeuclidean"))
        return np.exp(-d2 / (2 * t ** 2 * np.median(d2)))

    for t in (0.5, 1.0, 2.0):
        ref = reference_cka(gram(X, t), gram(Y, t), debiased)
        assert cka(X, Y, kernel="rbf", threshold=t, debiased=debiased) == pytest.approx(ref, rel=1e-9)
    assert np.allclose(rbf_gram(X, 1.0), gram(X, 1.0), atol=1e-12)


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
@pytest.mark.parametrize("debiased", [False, True])
def test_invariances_and_hand_values(kernel, debiased):
    X, Y = spaces(seed=2)
    base = cka(X, Y, kernel=kernel, debiased=debiased)
    Q = ortho_group.rvs(X.shape[1], random_state=3)
    # Orthogonal maps and isotropic scaling change nothing; so does a shift of every row.
    assert cka(X @ Q * 7.5 + 2.0, Y, kernel=kernel, debiased=debiased) == pytest.approx(base, rel=1e-9)
    assert cka(Y, X, kernel=kernel, debiased=debiased) == pytest.approx(base, rel=1e-12)  # symmetric
    assert cka(X, X, kernel=kernel, debiased=debiased) == pytest.approx(1.0, rel=1e-12)
    assert cka(X, X @ Q * 0.1, kernel=kernel, debiased=debiased) == pytest.approx(1.0, rel=1e-9)
    # A general invertible linear map is not an invariance.
    A = np.random.default_rng(4).normal(size=(X.shape[1], X.shape[1])) + np.diag(np.linspace(0, 8, X.shape[1]))
    assert abs(cka(X @ A, Y, kernel=kernel, debiased=debiased) - base) > 1e-3
    if not debiased:
        for seed in range(5):
            U, V = spaces(seed=10 + seed)
            assert 0.0 <= cka(U, V, kernel=kernel) <= 1.0


def test_hand_value_of_linear_cka():
    # One dimension: CKA = corr². x = 1..4 centred (-1.5, -.5, .5, 1.5); y = x² centred
    # (-6.5, -3.5, 1.5, 8.5): xᵀy = 25, xᵀx = 5, yᵀy = 129, so CKA = 25² / (5 · 129) = 625/645.
    x = np.array([[1.0], [2.0], [3.0], [4.0]])
    assert linear_cka(x, x ** 2) == pytest.approx(625 / 645, rel=1e-12)


def test_bad_input():
    X, Y = spaces()
    with pytest.raises(EncmapError, match=r"CKA needs the same sentences in both spaces: n = 60 \(X\) vs n = 59 \(Y\)"):
        cka(X, Y[:-1])
    with pytest.raises(EncmapError, match="kernel 'poly'"):
        cka(X, Y, kernel="poly")
    with pytest.raises(EncmapError, match="zero variance"):
        linear_cka(np.ones((10, 3)), Y[:10])
    with pytest.raises(EncmapError, match="non-finite"):
        linear_cka(np.full((10, 3), np.nan), Y[:10])


def test_all_pairs_matrix_equals_pairwise_calls():
    rng = np.random.default_rng(5)
    Es = [rng.normal(size=(40, d)) @ rng.normal(size=(d, d)) for d in (3, 6, 9, 4)]
    B, U = linear_cka_matrix(Es)
    for i in range(4):
        for j in range(4):
            assert B[i, j] == pytest.approx(reference_cka(Es[i] @ Es[i].T, Es[j] @ Es[j].T, False), rel=1e-10)
            assert U[i, j] == pytest.approx(reference_cka(Es[i] @ Es[i].T, Es[j] @ Es[j].T, True), rel=1e-9)


def test_cka_equals_the_values_published_with_the_reference_implementation():
    """Kornblith et al.'s Demo.ipynb (google-research/representation_similarity) prints, for this
    input: linear CKA 0.55761, RBF CKA (threshold 0.5) 0.65483, debiased linear CKA 0.51346.
    Old: RBF 0.65401 (a median over the pairs i < j, not over the whole matrix)."""
    np.random.seed(1337)  # the reference's own input, drawn the same way
    X = np.random.randn(100, 10)
    Y = np.random.randn(100, 10) + X
    assert round(linear_cka(X, Y), 5) == 0.55761
    assert round(linear_cka(X, Y, debiased=True), 5) == 0.51346
    assert round(cka(X, Y, kernel="rbf", threshold=0.5), 5) == 0.65483
