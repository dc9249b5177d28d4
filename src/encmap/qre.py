"""Quantum relative entropy (QRE) features and exact pairwise QRE (pure maths, no I/O).

Notation (``docs/method.md`` derives every formula): ρ = U diag(λ) Uᵀ is an encoder's density
matrix over n sentences, ρ_ε = (1-ε)ρ + ε I/n its smoothed form with eigenvalues
μ_k = (1-ε)λ_k + ε/n on the columns of U and μ_0 = ε/n on their complement, and σ = I/n is the
unit base encoder. All logs are natural; 0 ln 0 = 0.

The fast paths cost O(n d min(n, d)) per encoder (features) and O(n r r') per pair (pairwise
QRE) and never form an n x n matrix; the dense functions here are the slow references.
"""

from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import scipy.linalg
from scipy.special import xlogy

from .spectrum import DEFAULT_TOL, Spectrum, factor_pip
from .validation import EncmapError, check_density, check_eps

ArrayOrSpectrum = Union[np.ndarray, Spectrum]


def as_spectrum(E: ArrayOrSpectrum, *, tol: float = DEFAULT_TOL, name: str = "embeddings") -> Spectrum:
    """Return ``E`` if it is a :class:`Spectrum`, else factor it (E has shape (n, d))."""
    if isinstance(E, Spectrum):
        return E
    return factor_pip(E, tol=tol, name=name)


def smoothed_eigenvalues(spec: Spectrum, eps: float) -> tuple[np.ndarray, float]:
    """Eigenvalues of ρ_ε: μ (r,) on the columns of U and μ_0 on their complement."""
    n = spec.n
    return (1.0 - eps) * spec.lam + eps / n, eps / n


def qre_features(
    E: ArrayOrSpectrum,
    *,
    direction: str = "forward",
    eps: float = 1e-6,
    tol: float = DEFAULT_TOL,
) -> np.ndarray:
    """Per-sentence QRE features of one encoder w.r.t. the unit base encoder.

    Parameters
    ----------
    E : ndarray, shape (n, d), or Spectrum
        Embeddings (one row per sentence) or their factored PIP.
    direction : {"forward", "reverse"}
        ``"forward"``: f_j = [ρ_ε ln(n ρ_ε)]_jj, summing to S(ρ_ε ‖ I/n).
        ``"reverse"``: g_j = -(1/n) [ln(n ρ_ε)]_jj, summing to S(I/n ‖ ρ_ε); needs ε > 0.
    eps : float
        Smoothing weight in [0, 1).
    tol : float
        Relative eigenvalue tolerance used when factoring ``E``.

    Returns
    -------
    ndarray, shape (n,), float64
    """
    eps = check_eps(eps, direction)
    spec = as_spectrum(E, tol=tol)
    n = spec.n
    mu, mu0 = smoothed_eigenvalues(spec, eps)
    W = spec.U * spec.U  # (n, r): W_jk = U_jk², the weight of eigenvector k on sentence j
    if direction == "forward":
        a = xlogy(mu, n * mu)
        a0 = float(xlogy(mu0, n * mu0))
        # a0 + Σ_k W_jk (a_k - a0) equals Σ_k W_jk a_k + (1 - Σ_k W_jk) a0 without the
        # cancellation in 1 - Σ_k W_jk.
        return W @ (a - a0) + a0
    b = np.log(n * mu)
    b0 = float(np.log(n * mu0))
    return -(W @ (b - b0) + b0) / n


def qre_to_base(E: ArrayOrSpectrum, *, direction: str = "forward", eps: float = 1e-6,
                tol: float = DEFAULT_TOL) -> float:
    """S(ρ_ε ‖ I/n) (forward) or S(I/n ‖ ρ_ε) (reverse) from the spectrum alone, O(r)."""
    eps = check_eps(eps, direction)
    spec = as_spectrum(E, tol=tol)
    n, r = spec.n, spec.rank
    mu, mu0 = smoothed_eigenvalues(spec, eps)
    if direction == "forward":
        return float(xlogy(mu, n * mu).sum() + (n - r) * xlogy(mu0, n * mu0))
    return float(-(np.log(n * mu).sum() + (n - r) * np.log(n * mu0)) / n)


def von_neumann_entropy(rho: np.ndarray) -> float:
    """S_vN(ρ) = -Tr ρ ln ρ of a dense density matrix (natural log), via ``eigh``.

    Parameters
    ----------
    rho : ndarray, shape (n, n)
    """
    R = check_density(rho, "rho")
    w = np.clip(scipy.linalg.eigvalsh(R), 0.0, None)
    return float(-xlogy(w, w).sum())


def quantum_relative_entropy(rho: np.ndarray, sigma: np.ndarray, *, tol: float = 1e-12) -> float:
    """Dense reference S(ρ ‖ σ) = Tr ρ ln ρ - Tr ρ ln σ, via ``eigh`` (natural log).

    Parameters
    ----------
    rho, sigma : ndarray, shape (n, n)
        Density matrices (symmetric PSD, unit trace).
    tol : float
        Eigenvalues of σ below ``tol * max`` are its null space; if ρ puts more than ``tol``
        weight there, supp ρ ⊄ supp σ and the result is ``+inf``.

    Returns
    -------
    float
    """
    R = check_density(rho, "rho")
    S = check_density(sigma, "sigma")
    w = np.clip(scipy.linalg.eigvalsh(R), 0.0, None)
    s, V = scipy.linalg.eigh(S)
    s = np.clip(s, 0.0, None)
    # p_l = v_lᵀ ρ v_l: the weight ρ puts on σ's eigenvector l.
    p = np.einsum("il,ij,jl->l", V, R, V)
    null = s <= tol * s.max()
    if p[null].sum() > tol:
        return float("inf")
    return float(xlogy(w, w).sum() - (p[~null] * np.log(s[~null])).sum())


class PreparedSpectrum:
    """Per-encoder quantities reused by every pair that involves it (for :func:`qre_both`)."""

    __slots__ = ("spec", "mu", "mu0", "neg_entropy", "D", "sumD")

    def __init__(self, spec: Spectrum, eps: float):
        n, r = spec.n, spec.rank
        self.spec = spec
        self.mu, self.mu0 = smoothed_eigenvalues(spec, eps)
        # Tr ρ_ε ln ρ_ε
        self.neg_entropy = float(xlogy(self.mu, self.mu).sum() + (n - r) * xlogy(self.mu0, self.mu0))
        if eps > 0:
            self.D = np.log(self.mu) - np.log(self.mu0)  # D_l = ln μ_l - ln μ_0
            self.sumD = float(self.D.sum())
        else:
            self.D, self.sumD = np.log(self.mu), 0.0


def _cross(a: PreparedSpectrum, b: PreparedSpectrum, C2: np.ndarray, eps: float, support_tol: float) -> float:
    """Tr ρ_ε ln ρ'_ε for ρ = a, ρ' = b, given C2 = (Uᵀ U')∘(Uᵀ U') of shape (r, r'); -inf if unbounded."""
    if eps > 0:
        return float(np.log(b.mu0) + (a.mu - a.mu0) @ (C2 @ b.D) + a.mu0 * b.sumD)
    # Unsmoothed: finite only if every eigenvector of ρ lies in the range of ρ'.
    if np.any(1.0 - C2.sum(axis=1) > support_tol):
        return float("-inf")
    return float(a.mu @ (C2 @ b.D))


def qre_both(a: PreparedSpectrum, b: PreparedSpectrum, eps: float, support_tol: float,
             C: np.ndarray | None = None) -> tuple[float, float]:
    """(S(ρ_a‖ρ_b), S(ρ_b‖ρ_a)) from one product C = U_aᵀ U_b (r, r'): the O(n r r') part is shared.

    ``C``: the product if the caller already has it (other pair measures use it too).
    """
    C2 = a.spec.U.T @ b.spec.U if C is None else C * C
    if C is None:
        C2 *= C2  # (r, r'): C_kl² = (u_kᵀ u'_l)²
    return (a.neg_entropy - _cross(a, b, C2, eps, support_tol),
            b.neg_entropy - _cross(b, a, C2.T, eps, support_tol))


def pairwise_qre(
    E_a: ArrayOrSpectrum,
    E_b: ArrayOrSpectrum,
    *,
    eps: float = 1e-6,
    tol: float = DEFAULT_TOL,
    support_tol: float = 1e-8,
) -> float:
    """Exact S(ρ_ε ‖ ρ'_ε) between two encoders on the same sentences, in O(n r r').

    Uses Tr ρ_ε ln ρ'_ε = ln μ'_0 + Σ_kl (μ_k - μ_0) C_kl² D'_l + μ_0 Σ_l D'_l with
    C = Uᵀ U' and D'_l = ln μ'_l - ln μ'_0; no n x n matrix is formed.

    Parameters
    ----------
    E_a, E_b : ndarray, shapes (n, d) and (n, d'), or Spectrum
    eps : float
        Smoothing weight in [0, 1), applied to both. With ε = 0 the result is ``+inf`` when
        supp ρ ⊄ supp ρ'.
    tol : float
        Eigenvalue tolerance used when factoring arrays.
    support_tol : float
        With ε = 0: how much of an eigenvector of ρ may lie outside the range of ρ'.

    Returns
    -------
    float
    """
    eps = check_eps(eps)
    a = as_spectrum(E_a, tol=tol, name="E_a")
    b = as_spectrum(E_b, tol=tol, name="E_b")
    if a.n != b.n:
        raise EncmapError(f"pairwise QRE needs the same sentences: n = {a.n} vs n = {b.n}")
    return qre_both(PreparedSpectrum(a, eps), PreparedSpectrum(b, eps), eps, support_tol)[0]


def pairwise_qre_matrix(
    encoders: Sequence[ArrayOrSpectrum],
    *,
    eps: float = 1e-6,
    tol: float = DEFAULT_TOL,
    support_tol: float = 1e-8,
) -> np.ndarray:
    """Exact pairwise QRE over many encoders.

    Parameters
    ----------
    encoders : sequence of m arrays of shape (n, d_i), or Spectrum objects
    eps, tol, support_tol : see :func:`pairwise_qre`

    Returns
    -------
    ndarray, shape (m, m)
        Entry [i, j] = S(ρ_i,ε ‖ ρ_j,ε); zero diagonal; not symmetric. Each U_iᵀ U_j is
        computed once and serves both directions, so the cost is n Σ_{i<j} 2 r_i r_j FLOP.
    """
    eps = check_eps(eps)
    specs = [as_spectrum(E, tol=tol, name=f"encoder {i}") for i, E in enumerate(encoders)]
    if len({s.n for s in specs}) > 1:
        raise EncmapError(f"pairwise QRE needs the same sentences: n = {sorted({s.n for s in specs})}")
    prep = [PreparedSpectrum(s, eps) for s in specs]
    m = len(prep)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            out[i, j], out[j, i] = qre_both(prep[i], prep[j], eps, support_tol)
    return out


def _dense_eig(E: np.ndarray, eps: float, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Full eigendecomposition of the dense ρ_ε: eigenvalues (n,) and eigenvectors (n, n)."""
    A = np.asarray(E, dtype=np.float64)
    n = A.shape[0]
    M = A @ A.T
    w, V = scipy.linalg.eigh(M / np.trace(M))
    w = np.where(w > tol * w.max(), w, 0.0)  # the same null-space rule as the factored route
    # Smoothing the eigenvalues (not the matrix) keeps ln μ_0 exact for tiny ε.
    return (1 - eps) * w + eps / n, V


def dense_pairwise_qre(E_a: np.ndarray, E_b: np.ndarray, *, eps: float = 1e-6,
                       tol: float = DEFAULT_TOL) -> float:
    """Slow reference for :func:`pairwise_qre` from full n x n eigendecompositions (ε > 0).

    Parameters
    ----------
    E_a, E_b : ndarray, shapes (n, d) and (n, d')
    """
    eps = check_eps(eps, "reverse")
    mu_a, Va = _dense_eig(E_a, eps, tol)
    mu_b, Vb = _dense_eig(E_b, eps, tol)
    C2 = (Va.T @ Vb) ** 2
    return float(xlogy(mu_a, mu_a).sum() - mu_a @ C2 @ np.log(mu_b))


def dense_qre_features(E: np.ndarray, *, direction: str = "forward", eps: float = 1e-6,
                       tol: float = DEFAULT_TOL) -> np.ndarray:
    """Slow reference: features from ``eigh`` of the dense n x n PIP matrix. O(n³), n² memory.

    Parameters
    ----------
    E : ndarray, shape (n, d)

    Returns
    -------
    ndarray, shape (n,)
    """
    eps = check_eps(eps, direction)
    mu, V = _dense_eig(E, eps, tol)
    n = mu.shape[0]
    if direction == "forward":
        return (V * V) @ xlogy(mu, n * mu)
    return -((V * V) @ np.log(n * mu)) / n
