"""The variants' checks, proven on the device batch by batch (pure maths on torch tensors).

After a pass, :func:`encmap.validation.check_embeddings` and
:func:`encmap.validation.degenerate_reason` read every variant's whole (n, d) matrix on the
host: for a BERT-base model's 39 variants, 1.2 GB of float32 in several NumPy passes, about
1.7 s of a 5 s pass on an H200's host. :class:`RunningChecks` instead keeps two numbers per
variant on the device, updated as each batch's rows leave it, from which the host's verdict
*sound* (finite, not all zero, not constant, rank >= 2) follows by proof. A variant they do not
prove sound is checked on the host exactly as before, so every verdict and every message is the
host's own: the device only spares the host the work where the answer is certain.

The proof. Let ``a`` be one row (the longest of the first rows seen) and ``b`` any row, the lines
they span at angle ψ ∈ [0, π/2]. For any line r, sin²∠(a, r) + sin²∠(b, r) ≥ 1 − cos ψ (the
sum is least with r halfway between them), so the residual of projecting every row onto r is

    Σ_i |x_i|² sin²∠(x_i, r)  ≥  q(b) = min(|a|², |b|²) (1 − cos ψ).

``degenerate_reason`` calls a matrix rank <= 1 when that residual, for r its longest row, is at
most rtol² Σ_i |x_i|². So ``max_b q(b) > MARGIN rtol² Σ_i |x_i|²`` proves it is not, whichever
row the host picks; q > 0 also needs two rows that are not parallel, so the matrix is neither all
zero nor constant. A finite float64 sum of squares of float32 values (which cannot overflow)
proves every value finite. The float64 rounding of q and of the sum (~1e-13 relative) is far
inside :data:`MARGIN`.

The bound sees two rows, so it proves only a matrix whose least residual is above roughly
n MARGIN rtol² of its sum of squares (1e-4 at n = 10,000). Of all-MiniLM-L6-v2's 24 variants
on the 10,000 curated sentences (least residual over the sum of squares, by SVD) the device
proves 18: its mean and max poolings lie at 0.07-0.94, far above. The CLS states of layers 1-3
lie at 1.5e-6-1.1e-5 (nearly the same vector for every sentence, yet rank >= 2 to the host):
those, and the output's three truncations (made on the host), the host checks as before.
"""

from __future__ import annotations

import torch

from ..validation import DEGENERATE_RTOL

#: How far above degenerate_reason's threshold the bound must lie for the device's proof to
#: stand; below it the host decides, as it always did.
MARGIN = 100.0
#: Rows per float64 temporary: a decoder's 66 variants of 4,096 make 2.2 MB a row.
CHUNK = 64


class RunningChecks:
    """Per variant, a reference row ``a`` (the longest of the first rows seen), the sum of squares
    and the largest q so far.

    Parameters
    ----------
    widths : dict of str to int
        Each variant's width, in the column order of the rows given to :meth:`add`.
    device : torch.device or str
        Where the rows are (the statistics stay there until :meth:`proven`).
    """

    def __init__(self, widths: dict[str, int], device) -> None:
        self.keys = list(widths)
        # Consecutive variants of one width form a group, reshaped to (b, k, w) for per-variant sums:
        # the layered variants share the hidden width, so a model has one or two groups.
        self.groups: list[tuple[int, int, int]] = []  # (first column, variants, width)
        lo = 0
        for w in widths.values():
            if self.groups and self.groups[-1][2] == w:  # the groups are consecutive: this one ends at lo
                first, k, _ = self.groups[-1]
                self.groups[-1] = (first, k + 1, w)
            else:
                self.groups.append((lo, 1, w))
            lo += w
        self.width = lo
        v = len(self.keys)
        self.ref: torch.Tensor | None = None  # (D,) float64: each variant's row a, side by side
        self.ref_sq: torch.Tensor | None = None  # (V,) |a|²
        self.total = torch.zeros(v, dtype=torch.float64, device=device)  # (V,) Σ |x_i|²
        self.q = torch.zeros(v, dtype=torch.float64, device=device)  # (V,) max q(b)

    def _per_variant(self, x: torch.Tensor) -> torch.Tensor:
        """(b, D) -> (b, V): each variant's columns summed."""
        b = x.shape[0]
        return torch.cat([x[:, lo:lo + k * w].reshape(b, k, w).sum(-1) for lo, k, w in self.groups], dim=1)

    def add(self, rows: torch.Tensor) -> None:
        """Take one batch's rows, shape (b, D), float32, every variant side by side, :data:`CHUNK`
        rows at a time (float64 temporaries of CHUNK x D, whatever the batch). Nothing is kept
        unless the whole update succeeds (an out-of-memory error leaves the state as it was)."""
        if rows.shape[1] != self.width:
            raise ValueError(f"rows of width {rows.shape[1]}, expected {self.width}")
        ref, ref_sq, total, qmax = self.ref, self.ref_sq, self.total, self.q
        for lo in range(0, rows.shape[0], CHUNK):
            x = rows[lo:lo + CHUNK].to(torch.float64)
            sq = self._per_variant(x * x)  # (c, V)
            if ref is None:
                pick = sq.argmax(0)  # per variant, the longest of the first rows seen
                parts, j = [], 0
                for first, k, w in self.groups:
                    g = x[:, first:first + k * w].reshape(-1, k, w)
                    parts.append(g[pick[j:j + k], torch.arange(k, device=x.device)].reshape(-1))
                    j += k
                ref = torch.cat(parts)
                ref_sq = sq.gather(0, pick[None]).reshape(-1)
            dot = self._per_variant(x * ref).abs()
            cos = dot / torch.sqrt(sq * ref_sq).clamp_min(torch.finfo(torch.float64).tiny)
            q = torch.minimum(sq, ref_sq) * (1.0 - cos).clamp_min(0.0)  # a zero row gives 0
            total, qmax = total + sq.sum(0), torch.maximum(qmax, q.amax(0))
        self.ref, self.ref_sq, self.total, self.q = ref, ref_sq, total, qmax

    def proven(self, rtol: float = DEGENERATE_RTOL) -> dict[str, bool]:
        """Per variant key: True where the rows seen prove it sound (see the module's proof); one
        transfer from the device."""
        total, q = self.total.cpu().tolist(), self.q.cpu().tolist()
        bar = MARGIN * rtol * rtol
        # NaN compares False: a non-finite value anywhere leaves its variant to the host.
        return {key: bool(t < float("inf") and qm > bar * t) for key, t, qm in zip(self.keys, total, q)}
