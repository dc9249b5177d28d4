"""Slow textbook references for the QRE maths: dense n x n eigendecompositions (tests, benchmarks).

O(n³) time and n² memory: what the factored routes of :mod:`encmap.qre.features` and
:mod:`encmap.qre.pairwise` avoid, and what they are tested against.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.special import xlogy

from ..validation import check_density, check_eps
from .spectrum import DEFAULT_TOL


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
