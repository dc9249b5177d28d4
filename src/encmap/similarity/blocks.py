"""All-pairs measures between encoders from their factored PIPs: each U_iᵀ U_j once, in blocks.

Pure maths: spectra in, m x m matrices out; no I/O.

Exact QRE in both directions (S(ρ_i‖ρ_j) and S(ρ_j‖ρ_i)) and linear CKA (biased and debiased)
all need only C = U_iᵀ U_j (r_i x r_j) plus per-encoder quantities: linear CKA is a functional
of the PIP itself (the linear kernel E Eᵀ), so no second pass over the embeddings is needed.

The O(n r_i r_j) products dominate. They are computed a block of encoders at a time: with
W_a = [U_i for i in block a] (n x R_a, R_a ≤ ``block_columns``), one GEMM G = W_aᵀ W_b
(R_a x R_b) holds every C of the block pair, which keeps BLAS (or a GPU) at its peak rate where
one small product per pair would not. The per-pair reductions of G are segment sums, done for
the whole block with a few thin products (indicator-weighted matrices S, T below), so nothing
per pair runs in Python when ε > 0:

    forward cross  X = T_aᵀ (G∘G) D_b,   T_a[:, i] = (μ_i - μ_0,i) on i's rows, D_b[:, j] = D_j on j's rows
    reverse cross  Y = D_aᵀ (G∘G) T_b
    CKA            Z = Λ_aᵀ (M∘M) Λ_b,   M = G - A_a A_bᵀ / n,  Λ_a[:, i] = λ_i on i's rows

(Z[i, j] = ‖(HX_i)ᵀ(HX_j)‖²_F, since (HX_i)ᵀ(HX_j) = diag(√λ_i) M_ij diag(√λ_j).)
(``qre.PreparedSpectrum`` and ``similarity.CKAFactor`` define μ, D, a, s.) With ``device`` a
CUDA device the block products and reductions run in torch, float64 throughout; given
``sources``, each U is also derived there (one GEMM, or a QR and a small SVD), from the
embeddings as read, so that the host only reads while the device computes.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ..qre.pairwise import PreparedSpectrum, qre_both
from ..qre.spectrum import Spectrum
from ..validation import EncmapError, check_eps
from .cka import CKAFactor, cka_from_product, debiased_hsic

#: The matrices :func:`pair_measures` returns, with their diagonals.
MEASURES = {"qre": 0.0, "cka": 1.0, "cka_debiased": 1.0}
#: Default columns of U per block: G (R x R) stays small while the GEMMs run at BLAS's peak rate.
BLOCK_COLUMNS = 4096


class USource(Protocol):
    """What an encoder's U (n, r) is derived from (e.g. :class:`encmap.artifacts.pip.PipSource`).

    ``U`` itself; else ``A`` (n, d) and ``V`` (d, r): U = A V diag(σ)⁻¹, σ² = λ tr M; else ``A``
    alone: U is A's leading r left singular vectors, whose squared singular values (all of them,
    descending) ``check_spectrum`` must accept.
    """

    lam: np.ndarray
    trace: float
    A: np.ndarray | None
    V: np.ndarray | None
    U: np.ndarray | None

    def check_spectrum(self, s2: np.ndarray) -> None: ...


def pair_flop(ranks: Sequence[int], n: int, todo: np.ndarray) -> float:
    """FLOP of the U_iᵀ U_j products for the pairs in ``todo`` (bool, (m, m), upper triangle)."""
    r = np.asarray(ranks, dtype=np.float64)
    i, j = np.nonzero(np.triu(todo, 1))
    return float(2.0 * n * (r[i] * r[j]).sum())


def blocks(ranks: Sequence[int], block_columns: int) -> list[np.ndarray]:
    """Consecutive groups of encoder indices whose ranks sum to at most ``block_columns`` (an
    encoder wider than that is a block of its own)."""
    out, cur, width = [], [], 0
    for i, r in enumerate(ranks):
        if cur and width + r > block_columns:
            out.append(np.array(cur))
            cur, width = [], 0
        cur.append(i)
        width += int(r)
    if cur:
        out.append(np.array(cur))
    return out


class _Backend:
    """numpy on the CPU, or torch on ``device`` (float64): the few array operations the blocks need.

    On a GPU each encoder's U is uploaded once and kept there while it fits (``cache_bytes``):
    re-sending a block per block pair would cost more PCIe time than its GEMM.
    """

    def __init__(self, device: str | None, cache_bytes: float = 0.0,
                 sources: Mapping[int, Callable[[], USource]] | None = None):
        self.device = device
        self.torch = None
        self.cache: dict[object, object] = {}
        self.cache_bytes = cache_bytes
        self.sources = sources or {}
        if device is not None:
            import torch

            self.torch = torch

    def asarray(self, x: np.ndarray):
        x = np.ascontiguousarray(x, dtype=np.float64)
        if self.torch is None:
            return x
        t = self.torch.from_numpy(x)
        if x.nbytes > 1 << 20 and self.device.startswith("cuda"):
            t = t.pin_memory()  # a DMA from page-locked memory runs several times faster than from pageable
        return t.to(self.device)

    def numpy(self, x) -> np.ndarray:
        return x if self.torch is None else x.cpu().numpy()

    def stack(self, idx: Sequence[int], specs: Sequence[Spectrum]):
        """The columns of U_i for i in ``idx``, side by side: one n x R block on the device.

        NumPy: a block recurs in every block pair of its row and column, so whole blocks are
        kept while they fit ``cache_bytes`` (else rebuilt per pair: a copy, ~1/R of its GEMM).
        """
        if self.torch is None:
            key = tuple(int(i) for i in idx)
            W = self.cache.get(key)
            if W is None:
                W = np.concatenate([specs[i].U for i in idx], axis=1)
                if self.cache_bytes >= W.nbytes:
                    self.cache[key] = W
                    self.cache_bytes -= W.nbytes
            return W
        return self.torch.cat([self.device_u(i, specs[i].U) for i in idx], dim=1)

    def device_u(self, i: int, U: np.ndarray):
        """Encoder i's U on the device, uploaded (or derived there) once while the cache has room."""
        t = self.cache.get(i)
        if t is None:
            t = self.derive_u(self.sources[i]()) if i in self.sources else self.asarray(U)
            if self.cache_bytes >= t.numel() * 8:
                self.cache[i] = t
                self.cache_bytes -= t.numel() * 8
        return t

    def derive_u(self, src: USource):
        """U (n, r) on the device from what it is derived from: the embeddings cross the bus
        (n d, not n r, values) and the GEMM or SVD runs there."""
        if src.U is not None:
            return self.asarray(src.U)
        A = self.asarray(src.A)
        if src.V is not None:
            return A @ self.asarray(src.V / np.sqrt(np.asarray(src.lam, dtype=np.float64) * src.trace))
        # A's thin SVD as a QR, then the SVD of the small d x d factor: backward stable, and
        # A's leading left singular vectors are Q times R's.
        Q, R = self.torch.linalg.qr(A)
        W, s, _ = self.torch.linalg.svd(R)
        src.check_spectrum(self.numpy(s * s))
        return Q @ W[:, :src.lam.shape[0]]

    def cka_factor(self, i: int, spec: Spectrum) -> CKAFactor:
        """:class:`CKAFactor` of encoder i; its O(n r) column sums and row norms on the GPU when there is one."""
        if self.torch is None:
            return CKAFactor(spec.U, spec.lam)
        U = self.device_u(i, spec.U)
        a = U.sum(dim=0)
        Xc = (U - a / spec.n) * self.asarray(np.sqrt(spec.lam))
        return CKAFactor(spec.U, spec.lam, a=a.cpu().numpy(), rows=(Xc * Xc).sum(dim=1).cpu().numpy())

    def subtract_outer_and_square(self, G, A, B) -> None:
        """G <- (G - A Bᵀ)∘(G - A Bᵀ), in place (two passes over G)."""
        if self.torch is None:
            from scipy.linalg.blas import dger

            Gt = dger(-1.0, B, A, a=G.T, overwrite_a=True)  # Gᵀ - B Aᵀ: in place when G is C-ordered
            if not np.shares_memory(Gt, G):
                G[...] = Gt.T
        else:
            G.addr_(A, B, alpha=-1.0)
        G *= G


def _segments(idx: Sequence[int], ranks: Sequence[int], values: list[np.ndarray]) -> np.ndarray:
    """(R, len(idx)) matrix whose column c holds ``values[c]`` on the rows of encoder idx[c], zero elsewhere."""
    R = sum(int(ranks[i]) for i in idx)
    S = np.zeros((R, len(idx)))
    o = 0
    for c, i in enumerate(idx):
        S[o:o + ranks[i], c] = values[c]
        o += ranks[i]
    return S


def pair_measures(specs: Sequence[Spectrum], *, eps: float, todo: np.ndarray | None = None,
                  support_tol: float = 1e-8, block_columns: int = BLOCK_COLUMNS,
                  device: str | None = None,
                  sources: Mapping[int, Callable[[], USource]] | None = None) -> dict[str, np.ndarray]:
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
    block_columns : int
        Columns of U per block (R): the GEMMs are R x n by n x R; memory 2 n R x 8 bytes.
    device : str, optional
        None: NumPy (BLAS). A torch device ("cuda", "cuda:1", also "cpu"): torch on it, float64.
    sources : mapping of int to callable, optional
        With a torch ``device``: encoder i's U is derived on the device from ``sources[i]()``
        (a :class:`USource`; the call may wait for a read under way), and ``specs[i]`` needs only
        λ and n (its U may be a zero-stride stand-in). Called in the order of ``todo``'s
        encoders, once each while the device has room for every U.

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
    out = {k: np.full((m, m), np.nan) for k in MEASURES}
    for k, diag in MEASURES.items():
        np.fill_diagonal(out[k], diag)
    need = np.flatnonzero(todo.any(axis=0) | todo.any(axis=1))
    if not need.size:
        return out
    n = specs[0].n
    prep = {i: PreparedSpectrum(specs[i], eps) for i in need}
    ranks = [s.rank for s in specs]
    if sources and device is None:
        raise EncmapError("pair_measures: U is derived from sources only on a torch device")
    xb = _Backend(device, _cache_budget(device, [specs[i] for i in need]), sources)
    fac = {i: xb.cka_factor(i, specs[i]) for i in need}
    for a_pos, a in enumerate(blocks(ranks, block_columns)):
        for b in blocks(ranks, block_columns)[a_pos:]:
            sub = todo[np.ix_(a, b)]
            rows, cols = a[sub.any(axis=1)], b[sub.any(axis=0)]  # only encoders with a pair here
            if not rows.size:
                continue
            Wa = xb.stack(rows, specs)
            Wb = Wa if np.array_equal(rows, cols) else xb.stack(cols, specs)
            G = Wa.T @ Wb  # every C = U_iᵀ U_j of the block pair: the one O(n R_a R_b) GEMM
            _reduce(G, rows, cols, todo, ranks, prep, fac, n, eps, support_tol, xb, out)
    return out


def _cache_budget(device: str | None, specs: Sequence[Spectrum]) -> float:
    """Bytes that may hold cached U's or blocks: on a GPU half of what is free (blocks and G need
    the rest); with NumPy every block (one more copy of the U's) up to 4 GiB."""
    if device is None:
        total = sum(s.U.nbytes for s in specs)
        return float(total) if total <= 4 * 2**30 else 0.0
    if not device.startswith("cuda"):
        return float("inf")
    import torch

    return 0.5 * torch.cuda.mem_get_info(torch.device(device))[0]


def _reduce(G, rows: np.ndarray, cols: np.ndarray, todo: np.ndarray, ranks: list[int], prep: dict, fac: dict,
            n: int, eps: float, support_tol: float, xb: _Backend, out: dict[str, np.ndarray]) -> None:
    """Fill ``out`` for the pairs (i in rows, j in cols, todo[i, j]) from G (R_rows x R_cols)."""
    want = todo[np.ix_(rows, cols)]
    if eps == 0:  # unsmoothed QRE needs a support test per pair: slice G pair by pair
        ro = np.concatenate([[0], np.cumsum([ranks[i] for i in rows])])
        co = np.concatenate([[0], np.cumsum([ranks[j] for j in cols])])
        Gn = xb.numpy(G)
        for p, q in zip(*np.nonzero(want)):
            i, j = rows[p], cols[q]
            C = Gn[ro[p]:ro[p + 1], co[q]:co[q + 1]]
            out["qre"][i, j], out["qre"][j, i] = qre_both(prep[i], prep[j], eps, support_tol, C)
            b_, u_ = cka_from_product(C, fac[i], fac[j])
            out["cka"][i, j] = out["cka"][j, i] = b_
            out["cka_debiased"][i, j] = out["cka_debiased"][j, i] = u_
        return
    seg = lambda idx, f: xb.asarray(_segments(idx, ranks, [f(i) for i in idx]))  # noqa: E731
    C2 = G * G
    X = xb.numpy(seg(rows, lambda i: prep[i].mu - prep[i].mu0).T @ (C2 @ seg(cols, lambda j: prep[j].D)))
    Y = xb.numpy(seg(rows, lambda i: prep[i].D).T @ (C2 @ seg(cols, lambda j: prep[j].mu - prep[j].mu0)))
    del C2
    # Σ over i's and j's segments of M∘M, M = (G - A Bᵀ/n)∘(s_a s_bᵀ): the s² weights go into
    # the segment matrices, (G - A Bᵀ/n)² is formed in G's own memory (G is no longer needed).
    A = xb.asarray(np.concatenate([fac[i].a for i in rows]) / n)
    B = xb.asarray(np.concatenate([fac[j].a for j in cols]))
    xb.subtract_outer_and_square(G, A, B)
    Z = xb.numpy(seg(rows, lambda i: fac[i].s ** 2).T @ (G @ seg(cols, lambda j: fac[j].s ** 2)))
    for p, q in zip(*np.nonzero(want)):
        i, j = rows[p], cols[q]
        a, b = prep[i], prep[j]
        out["qre"][i, j] = a.neg_entropy - (np.log(b.mu0) + X[p, q] + a.mu0 * b.sumD)
        out["qre"][j, i] = b.neg_entropy - (np.log(a.mu0) + Y[p, q] + b.mu0 * a.sumD)
        f, g = fac[i], fac[j]
        xty = float(Z[p, q])
        out["cka"][i, j] = out["cka"][j, i] = xty / np.sqrt(f.self_b * g.self_b)
        out["cka_debiased"][i, j] = out["cka_debiased"][j, i] = (
            debiased_hsic(xty, f.rows, g.rows, f.n) / np.sqrt(f.self_u * g.self_u))
