"""All-pairs measures between encoders from their factored PIPs, one U_iᵀ U_j per pair.

Pure maths: spectra in, m x m matrices out; no I/O.

Exact QRE in both directions (S(ρ_i‖ρ_j) and S(ρ_j‖ρ_i)) and linear CKA (biased and debiased)
all need only C = U_iᵀ U_j (r_i x r_j) plus per-encoder quantities: linear CKA is a functional
of the PIP itself (the linear kernel E Eᵀ), so no second pass over the embeddings is needed.
The O(n r_i r_j) product dominates; everything else is O(r_i r_j).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .qre import PreparedSpectrum, qre_both
from .similarity import CKAFactor, cka_from_product
from .spectrum import Spectrum
from .validation import EncmapError, check_eps

#: The matrices :func:`pair_measures` returns, with their diagonals.
MEASURES = {"qre": 0.0, "cka": 1.0, "cka_debiased": 1.0}


def pair_flop(ranks: Sequence[int], n: int, todo: np.ndarray) -> float:
    """FLOP of the U_iᵀ U_j products for the pairs in ``todo`` (bool, (m, m), upper triangle)."""
    r = np.asarray(ranks, dtype=np.float64)
    i, j = np.nonzero(np.triu(todo, 1))
    return float(2.0 * n * (r[i] * r[j]).sum())


def pair_measures(specs: Sequence[Spectrum], *, eps: float, todo: np.ndarray | None = None,
                  support_tol: float = 1e-8) -> dict[str, np.ndarray]:
    """Exact pairwise QRE and linear CKA between m encoders on the same n sentences.

    Parameters
    ----------
    specs : m factored PIPs (U (n, r_i), λ (r_i,))
    eps : float
        QRE smoothing weight in [0, 1).
    todo : bool ndarray (m, m), optional
        Pairs to compute (read from the upper triangle, i < j); default every pair. The
        others are NaN in the result, for the caller to fill from a cache.
    support_tol : float
        With ε = 0: how much of an eigenvector may lie outside the other's range.

    Returns
    -------
    dict of ndarray, each (m, m)
        ``qre``: [i, j] = S(ρ_i,ε ‖ ρ_j,ε), zero diagonal, not symmetric;
        ``cka``, ``cka_debiased``: linear CKA of the embeddings the PIPs came from (before any
        ``pip.normalize_rows``), symmetric, unit diagonal.
    """
    eps = check_eps(eps)
    if len({s.n for s in specs}) > 1:
        raise EncmapError(f"pair measures need the same sentences: n = {sorted({s.n for s in specs})}")
    m = len(specs)
    todo = np.triu(np.ones((m, m), bool) if todo is None else np.asarray(todo, bool), 1)
    need = set(np.flatnonzero(todo.any(axis=0) | todo.any(axis=1)).tolist())
    prep = {i: PreparedSpectrum(specs[i], eps) for i in need}
    fac = {i: CKAFactor(specs[i].U, specs[i].lam) for i in need}
    out = {k: np.full((m, m), np.nan) for k in MEASURES}
    for k, diag in MEASURES.items():
        np.fill_diagonal(out[k], diag)
    for i in range(m):
        js = np.flatnonzero(todo[i])
        for j in js:
            C = specs[i].U.T @ specs[j].U  # the one O(n r_i r_j) product of this pair
            out["qre"][i, j], out["qre"][j, i] = qre_both(prep[i], prep[j], eps, support_tol, C)
            b, u = cka_from_product(C, fac[i], fac[j])
            out["cka"][i, j] = out["cka"][j, i] = b
            out["cka_debiased"][i, j] = out["cka_debiased"][j, i] = u
    return out
