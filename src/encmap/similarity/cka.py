"""Centred kernel alignment (CKA) between two embedding spaces of the same sentences.

Pure maths: arrays in, a number out; no I/O.

CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) for Gram matrices K, L (n x n) of the two
spaces (Kornblith et al. 2019). Biased HSIC uses the centred Grams H K H; the debiased form is
Song et al.'s (2012) unbiased U-statistic. For the linear kernel the Grams are never formed:
with centred X (n x d) and Y (n x d'), tr(K H L H) = ||Xᵀ Y||_F², O(n d d'), and the debiased
statistic needs only the row norms besides (Nguyen et al. 2021's feature-space identity). The
RBF kernel needs the n x n Grams; :func:`cka` forms them only then.
"""

from __future__ import annotations

import numpy as np

from ..validation import EncmapError, check_embeddings, check_real, check_same_sentences, in_safe_range


def _features(X):
    """Embeddings, or for a :class:`~encmap.qre.spectrum.Spectrum` (a factored PIP) the features
    U diag(√λ) (n, r) of the same kernel up to scale (E Eᵀ = tr M · U diag(λ) Uᵀ), which CKA ignores."""
    from ..qre.spectrum import Spectrum

    return X.U * np.sqrt(X.lam) if isinstance(X, Spectrum) else X


def debiased_hsic(xty: float, rows_x: np.ndarray, rows_y: np.ndarray, n: int) -> float:
    """Unbiased HSIC (times n(n-3)) of two linear kernels from ||XᵀY||_F² and the row norms²."""
    return float(xty - n / (n - 2.0) * rows_x @ rows_y + rows_x.sum() * rows_y.sum() / ((n - 1.0) * (n - 2.0)))


def linear_cka(X: np.ndarray, Y: np.ndarray, *, debiased: bool = False) -> float:
    """Linear CKA in feature space, O(n d d'); no n x n matrix.

    Parameters
    ----------
    X, Y : ndarray, shapes (n, d) and (n, d'), rows = the same sentences
    debiased : bool
        Song et al.'s unbiased HSIC estimator (less biased towards 1 when d is large
        relative to n; can be slightly negative).

    Returns
    -------
    float
        In [0, 1] for the biased form; 1 when Y = X Q c (Q orthogonal, c > 0).
    """
    X, Y = check_same_sentences(_features(X), _features(Y), "CKA", min_rows=4)
    X, Y = in_safe_range(X), in_safe_range(Y)  # CKA ignores scale: no square over- or underflows
    X = X - X.mean(axis=0)
    Y = Y - Y.mean(axis=0)
    n = X.shape[0]
    xty = float(np.linalg.norm(X.T @ Y) ** 2)
    xtx = float(np.linalg.norm(X.T @ X) ** 2)
    yty = float(np.linalg.norm(Y.T @ Y) ** 2)
    if not debiased:
        if xtx == 0 or yty == 0:
            raise EncmapError("CKA of a constant embedding (zero variance) is undefined")
        return xty / np.sqrt(xtx * yty)
    rx, ry = np.einsum("ij,ij->i", X, X), np.einsum("ij,ij->i", Y, Y)
    num = debiased_hsic(xty, rx, ry, n)
    den = debiased_hsic(xtx, rx, rx, n) * debiased_hsic(yty, ry, ry, n)
    if den <= 0:
        raise EncmapError("debiased CKA is undefined here (a space with no variance left after debiasing)")
    return num / np.sqrt(den)


def rbf_gram(X: np.ndarray, threshold: float = 1.0) -> np.ndarray:
    """RBF Gram matrix exp(-||x_i - x_j||² / (2 σ²)), σ² = threshold² x median squared distance.

    The median is over the whole n x n matrix of squared distances, its zero diagonal included:
    the bandwidth of Kornblith et al.'s reference ``gram_rbf``, which the literature's RBF CKA
    values come from (a median over the pairs i < j differs in the 4th digit of CKA).

    Parameters
    ----------
    X : ndarray, shape (n, d)
    threshold : float > 0

    Returns
    -------
    ndarray, shape (n, n)
    """
    threshold = check_real(threshold, "RBF threshold", positive=True)
    X = check_embeddings(X, "X")
    sq = np.einsum("ij,ij->i", X, X)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (X @ X.T), 0.0)
    np.fill_diagonal(D2, 0.0)
    med = np.median(D2)
    if med == 0:
        raise EncmapError("RBF bandwidth is zero: most sentences share one embedding")
    return np.exp(-D2 / (2.0 * threshold ** 2 * med))


def center_gram(K: np.ndarray, *, unbiased: bool = False) -> np.ndarray:
    """H K H (biased), or the U-centred Gram whose inner products give unbiased HSIC."""
    K = np.array(K, dtype=np.float64)
    n = K.shape[0]
    if not unbiased:
        K -= K.mean(axis=0, keepdims=True)
        K -= K.mean(axis=1, keepdims=True)
        return K
    np.fill_diagonal(K, 0.0)
    means = K.sum(axis=0) / (n - 2.0)
    means -= means.sum() / (2.0 * (n - 1.0))
    K -= means[:, None]
    K -= means[None, :]
    np.fill_diagonal(K, 0.0)
    return K


def gram_cka(K: np.ndarray, L: np.ndarray, *, debiased: bool = False) -> float:
    """CKA from two n x n Gram matrices (any kernel)."""
    Kc, Lc = center_gram(K, unbiased=debiased), center_gram(L, unbiased=debiased)
    num = float(Kc.ravel() @ Lc.ravel())
    den = float(np.linalg.norm(Kc) * np.linalg.norm(Lc))
    if den <= 0:
        raise EncmapError("CKA of a constant kernel is undefined")
    return num / den


def cka(X: np.ndarray, Y: np.ndarray, *, kernel: str = "linear", debiased: bool = False,
        threshold: float = 1.0) -> float:
    """CKA between two embedding spaces of the same n sentences.

    Parameters
    ----------
    X, Y : ndarray, shapes (n, d), (n, d')
    kernel : {"linear", "rbf"}
        Linear runs in feature space (O(n d d')); RBF forms the two n x n Grams.
    debiased : bool
        Unbiased HSIC (Song et al. 2012) instead of the biased estimator.
    threshold : float
        RBF bandwidth: σ² = threshold² x the median squared distance (:func:`rbf_gram`).

    Returns
    -------
    float
    """
    if kernel == "linear":
        return linear_cka(X, Y, debiased=debiased)
    if kernel == "rbf":
        threshold = check_real(threshold, "RBF threshold", positive=True)
        X, Y = check_same_sentences(_features(X), _features(Y), "CKA", min_rows=4)
        X, Y = in_safe_range(X), in_safe_range(Y)
        return gram_cka(rbf_gram(X, threshold), rbf_gram(Y, threshold), debiased=debiased)
    raise EncmapError(f"CKA kernel {kernel!r}: choose linear or rbf")


def linear_cka_matrix(encoders: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Biased and debiased linear CKA between every two of m encoders, one XᵢᵀXⱼ per pair.

    Parameters
    ----------
    encoders : m arrays of shape (n, d_i), rows = the same sentences

    Returns
    -------
    biased, debiased : ndarrays, shape (m, m), symmetric, unit diagonal
        Cost n Σ_{i<j} 2 d_i d_j FLOP for the pairs plus each encoder's own Xᵢᵀ Xᵢ once.
    """
    Xs = [check_same_sentences(E, encoders[0], "CKA", min_rows=4)[0] for E in encoders]
    Xs = [X - X.mean(axis=0) for X in Xs]
    n, m = Xs[0].shape[0], len(Xs)
    rows = [np.einsum("ij,ij->i", X, X) for X in Xs]
    self_b = np.array([np.linalg.norm(X.T @ X) ** 2 for X in Xs])
    self_u = np.array([debiased_hsic(s, r, r, n) for s, r in zip(self_b, rows)])
    if np.any(self_b == 0) or np.any(self_u <= 0):
        bad = int(np.flatnonzero((self_b == 0) | (self_u <= 0))[0])
        raise EncmapError(f"CKA is undefined for encoder {bad}: no variance")
    B, U = np.eye(m), np.eye(m)
    for i in range(m):
        for j in range(i + 1, m):
            xty = float(np.linalg.norm(Xs[i].T @ Xs[j]) ** 2)
            B[i, j] = B[j, i] = xty / np.sqrt(self_b[i] * self_b[j])
            U[i, j] = U[j, i] = debiased_hsic(xty, rows[i], rows[j], n) / np.sqrt(self_u[i] * self_u[j])
    return B, U


class CKAFactor:
    """Per-encoder quantities for linear CKA from a factored PIP ρ = U diag(λ) Uᵀ.

    The linear kernel of the embeddings is their PIP, E Eᵀ = tr(M) ρ, and CKA ignores the scale,
    so X = U diag(√λ) (n x r) is a feature map of the same kernel. With a = Uᵀ 1 (r,), the
    centred features are H X = (U - 1 aᵀ / n) diag(√λ) and every pair term needs only
    U_iᵀ U_j: (H X_i)ᵀ (H X_j) = diag(√λ_i) (U_iᵀ U_j - a_i a_jᵀ / n) diag(√λ_j).
    """

    __slots__ = ("n", "s", "a", "rows", "self_b", "self_u")

    def __init__(self, U: np.ndarray, lam: np.ndarray, a: np.ndarray | None = None, rows: np.ndarray | None = None):
        """``a`` (r,) and ``rows`` (n,), if given, are Uᵀ1 and the centred features' squared row
        norms computed elsewhere (on a GPU, say); else they are computed here."""
        n = U.shape[0]
        self.n = n
        self.s = np.sqrt(lam)
        self.a = U.sum(axis=0) if a is None else a
        if rows is None:
            Xc = (U - self.a / n) * self.s  # (n, r), centred features
            rows = np.einsum("ij,ij->i", Xc, Xc)
        self.rows = rows
        # Xcᵀ Xc = S (UᵀU - a aᵀ/n) S with UᵀU = I (U has orthonormal columns): O(r²), not the
        # O(n r²) product, which would cost as much as one more pair per encoder.
        K = np.outer(-self.a * self.s, self.a * self.s) / n
        K[np.diag_indices_from(K)] += lam
        self.self_b = float(np.sum(K * K))
        self.self_u = debiased_hsic(self.self_b, self.rows, self.rows, n)
        if self.self_b <= 0 or self.self_u <= 0:
            raise EncmapError("CKA is undefined for an encoder with no variance across sentences")


def cka_from_product(C: np.ndarray, f: CKAFactor, g: CKAFactor) -> tuple[float, float]:
    """Biased and debiased linear CKA of two encoders from C = U_fᵀ U_g, shape (r_f, r_g); O(r_f r_g).

    Equals :func:`linear_cka` on the embeddings the two PIPs were factored from.
    """
    Mc = (C - np.outer(f.a, g.a) / f.n) * f.s[:, None] * g.s[None, :]
    xty = float(np.einsum("ij,ij->", Mc, Mc))
    biased = xty / np.sqrt(f.self_b * g.self_b)
    debiased = debiased_hsic(xty, f.rows, g.rows, f.n) / np.sqrt(f.self_u * g.self_u)
    return biased, debiased


def gram_cka_matrix(grams: list[np.ndarray | None], *, debiased: bool = False,
                    todo: np.ndarray | None = None) -> np.ndarray:
    """CKA between every two of m kernels (each n x n), centring each Gram once.

    Parameters
    ----------
    grams : m Gram matrices of shape (n, n); None for a kernel no pair in ``todo`` needs
    todo : bool ndarray (m, m), optional
        Pairs (i < j) to compute; default all. Others are NaN in the result.

    Returns
    -------
    ndarray, shape (m, m), symmetric, unit diagonal
    """
    m = len(grams)
    todo = np.triu(np.ones((m, m), bool) if todo is None else np.asarray(todo, bool), 1)
    need = np.flatnonzero(todo.any(axis=0) | todo.any(axis=1))
    C = {i: center_gram(grams[i], unbiased=debiased) for i in need}
    norms = {i: float(np.linalg.norm(K)) for i, K in C.items()}
    for i, v in norms.items():
        if v <= 0:
            raise EncmapError(f"CKA is undefined for kernel {i}: constant")
    out = np.full((m, m), np.nan)
    np.fill_diagonal(out, 1.0)
    for i, j in zip(*np.nonzero(todo)):
        out[i, j] = out[j, i] = float(C[i].ravel() @ C[j].ravel()) / (norms[i] * norms[j])
    return out
