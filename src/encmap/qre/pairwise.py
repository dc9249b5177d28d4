"""Exact QRE between two encoders, S(ρ_ε ‖ ρ'_ε), from their factored PIPs (pure maths, no I/O).

Tr ρ_ε ln ρ'_ε = ln μ'_0 + Σ_kl (μ_k - μ_0) C_kl² D'_l + μ_0 Σ_l D'_l with C = Uᵀ U' and
D'_l = ln μ'_l - ln μ'_0: O(n r r') per pair, each product serving both directions; no n x n
matrix. Every pair of a map at once, in blocks: :mod:`encmap.similarity.blocks`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.special import xlogy

from ..validation import EncmapError, check_eps
from .spectrum import DEFAULT_TOL, ArrayOrSpectrum, Spectrum, as_spectrum, smoothed_eigenvalues


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
    if not specs:
        raise EncmapError("pairwise QRE matrix: no encoder given (a sequence of m >= 1 embedding matrices or "
                          "Spectrum objects)")
    if len({s.n for s in specs}) > 1:
        raise EncmapError(f"pairwise QRE needs the same sentences: n = {sorted({s.n for s in specs})}")
    prep = [PreparedSpectrum(s, eps) for s in specs]
    m = len(prep)
    out = np.zeros((m, m))
    for i in range(m):
        for j in range(i + 1, m):
            out[i, j], out[j, i] = qre_both(prep[i], prep[j], eps, support_tol)
    return out
