"""Control encoders: the null models of the map."""

from __future__ import annotations

import numpy as np

from ..result import EmbeddingResult, output_only


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    """gaussian: i.i.d. N(0, 1) rows (n, dim), independent of the sentences.

    With ``rank: k`` (< dim) the rows are Z W, Z (n, k) and W (k, dim) i.i.d. N(0, 1): a control
    of rank k at width dim (the scale benchmark's spread of ranks).
    """
    rng = np.random.default_rng(spec["seed"])
    rank = spec.get("rank")
    if rank is None:
        full = rng.standard_normal((len(texts), spec["dim"]))
    else:
        full = rng.standard_normal((len(texts), rank)) @ rng.standard_normal((rank, spec["dim"]))
    return output_only(model, spec, full.astype(np.float32), {"source": "control:gaussian"})
