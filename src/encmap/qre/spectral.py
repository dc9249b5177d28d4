"""What an encoder's spectrum says without its eigenvectors: the field's cheap summaries of the
density matrix the QRE features are computed from, and a null that keeps the spectrum and
randomises the eigenvectors (pure maths, no I/O; notation as in :mod:`encmap.qre.features`).

- :func:`von_neumann_entropy` S(ρ_ε) = −Σ μ ln μ: the one-number summary. Its exponential is the
  effective rank (Roy & Vetterli 2007; RankMe, Garrido et al. 2023, uses the same entropy of the
  normalised singular values). The forward QRE features sum to S(ρ_ε ‖ I/n) = ln n − S(ρ_ε), so
  this number is already inside the features; as a baseline it asks whether the rest of them,
  their distribution over sentences, predicts anything it does not.
- :func:`spectral_profile`: the spectrum of ρ_ε as a fixed-length vector, ln μ at
  :data:`PROFILE_POINTS` ranks spaced evenly in log rank from 1 to n. Encoder spectra decay
  roughly as power laws (α-ReQ, Agrawal et al. 2022, fits that exponent), i.e. as lines in log μ
  against log rank, which even log-rank sampling describes with equal care at every scale; it
  includes the ε floor past the rank, as the features do, and does not depend on the width.
  16 points: one per factor ~1.85 in rank at n = 10,000; neighbouring points of a smooth decay
  add little beyond that.
- :func:`spectral_head`: the head of that spectrum, ln μ of the :data:`HEAD_POINTS` largest
  eigenvalues of ρ_ε (the first directions: anisotropy, how much of the variance they hold,
  what RankMe- and α-ReQ-style summaries look at), an encoder narrower than that padded with the
  floor ε/n, which is its true eigenvalue there. A profile spread evenly over n log-ranks puts
  about 5 of its 16 points in the first 32 ranks; the head spends all of its points there.
- :func:`random_eigenvectors`: the same eigenvalues on seeded random orthonormal eigenvectors,
  the null in which every encoder keeps its spectrum and nothing else.
"""

from __future__ import annotations

import numpy as np
from scipy.special import xlogy

from ..validation import EncmapError, check_eps
from .spectrum import Spectrum, smoothed_eigenvalues

#: Length of the spectral profile (log-spaced ranks 1..n).
PROFILE_POINTS = 16
#: Length of the spectral head (the largest eigenvalues). 32: the default map's narrowest
#: encoders are 64 wide, so no default encoder is padded, and of 8, 16, 32 and 64 leading
#: eigenvalues alone 32 predicted the default run's scores best (docs/results.md).
HEAD_POINTS = 32


def von_neumann_entropy(spec: Spectrum, eps: float = 1e-6) -> float:
    """S(ρ_ε) = −Σ_k μ_k ln μ_k over all n eigenvalues of ρ_ε (nats; ln n at most).

    Parameters
    ----------
    spec : Spectrum of one encoder (n sentences, rank r)
    eps : float, the smoothing the features use
    """
    eps = check_eps(eps, "forward")
    mu, mu0 = smoothed_eigenvalues(spec, eps)
    return float(-(xlogy(mu, mu).sum() + (spec.n - spec.rank) * xlogy(mu0, mu0)))


def profile_ranks(n: int, points: int = PROFILE_POINTS) -> np.ndarray:
    """The 1-based ranks a profile samples: ``points`` values evenly spaced in log rank, 1..n."""
    if n < 2:
        raise EncmapError(f"a spectral profile needs n >= 2 sentences, got n = {n}")
    return np.rint(np.exp(np.linspace(0.0, np.log(n), points))).astype(np.int64)


def spectral_profile(spec: Spectrum, eps: float = 1e-6, points: int = PROFILE_POINTS) -> np.ndarray:
    """ln μ_(k) at the ranks of :func:`profile_ranks` (eigenvalues of ρ_ε, descending).

    Returns
    -------
    ndarray, shape (points,), non-increasing
    """
    eps = check_eps(eps, "forward")
    mu, mu0 = smoothed_eigenvalues(spec, eps)
    ranks = profile_ranks(spec.n, points)
    full = np.concatenate([np.sort(mu)[::-1], [mu0]])  # rank k > r: the floor ε/n
    # With ε = 0 the floor is 0: the smallest positive double stands for it (ln: -708).
    return np.log(np.maximum(full[np.minimum(ranks, spec.rank + 1) - 1], np.finfo(np.float64).tiny))


def spectral_head(spec: Spectrum, eps: float = 1e-6, points: int = HEAD_POINTS) -> np.ndarray:
    """ln μ_(1), ..., ln μ_(points): the largest eigenvalues of ρ_ε, descending.

    Past the rank r every eigenvalue of ρ_ε is the floor μ_0 = ε/n, so an encoder with r <
    ``points`` is padded with ln μ_0 exactly (with ε = 0, the smallest positive double: ln = -708).

    Returns
    -------
    ndarray, shape (points,), non-increasing
    """
    eps = check_eps(eps, "forward")
    if int(points) < 1:
        raise EncmapError(f"a spectral head needs at least 1 point, got {points!r}")
    mu, mu0 = smoothed_eigenvalues(spec, eps)
    head = np.full(int(points), mu0, dtype=np.float64)
    top = np.sort(mu)[::-1][:int(points)]
    head[:top.size] = top
    return np.log(np.maximum(head, np.finfo(np.float64).tiny))


def random_eigenvectors(spec: Spectrum, random_state: int) -> Spectrum:
    """``spec``'s eigenvalues on random orthonormal eigenvectors (Haar-distributed, seeded).

    Parameters
    ----------
    spec : Spectrum (U: n x r)
    random_state : int

    Returns
    -------
    Spectrum with the same ``lam`` and ``trace`` and U = Q, Q (n x r) the orthonormal factor of
    a Gaussian matrix (signs fixed so that Q is Haar-distributed); no right vectors.
    """
    rng = np.random.default_rng(random_state)
    Q, R = np.linalg.qr(rng.standard_normal((spec.n, spec.rank)))
    Q = Q * np.sign(np.diag(R))  # Haar: without the sign fix QR's convention biases Q
    return Spectrum(Q, spec.lam.copy(), spec.trace)
