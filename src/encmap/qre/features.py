"""QRE features of one encoder w.r.t. the unit base encoder, one per sentence (pure maths, no I/O).

Notation (``docs/method.md`` derives every formula): ρ = U diag(λ) Uᵀ is an encoder's density
matrix over n sentences, ρ_ε = (1-ε)ρ + ε I/n its smoothed form with eigenvalues
μ_k = (1-ε)λ_k + ε/n on the columns of U and μ_0 = ε/n on their complement, and σ = I/n is the
unit base encoder. All logs are natural; 0 ln 0 = 0. Cost O(n r) from the factored PIP; no
n x n matrix (the dense references are in :mod:`encmap.qre.reference`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import xlogy

from ..validation import check_eps
from .spectrum import DEFAULT_TOL, ArrayOrSpectrum, as_spectrum, smoothed_eigenvalues


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


def encoder_features(spec: ArrayOrSpectrum, *, direction: str, eps: float) -> dict[str, Any]:
    """Everything the ``features`` stage (and ``encmap place``) derives from one encoder's spectrum.

    Returns ``features`` (n,): :func:`qre_features`; ``qre_to_base``: :func:`qre_to_base`;
    ``profile`` (16,), ``head`` (32,), ``entropy`` and ``log_rank`` (ln r): the spectrum's own
    summaries (:mod:`encmap.qre.spectral`, the regression's spectral baselines); ``log_scale``:
    ln(tr M / n), the mean squared norm of the embeddings the PIP matrix M was made of, which the
    unit-trace ρ leaves out (the ``head+scale`` predictor puts it back).
    """
    from .spectral import spectral_head, spectral_profile, von_neumann_entropy

    spec = as_spectrum(spec)
    return {"features": qre_features(spec, direction=direction, eps=eps),
            "qre_to_base": qre_to_base(spec, direction=direction, eps=eps),
            "profile": spectral_profile(spec, eps=eps), "head": spectral_head(spec, eps=eps),
            "entropy": von_neumann_entropy(spec, eps=eps), "log_rank": float(np.log(spec.rank)),
            "log_scale": float(np.log(spec.trace / spec.U.shape[0]))}
