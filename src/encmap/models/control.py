"""Control encoders: the null models of the map."""

from __future__ import annotations

import numpy as np

from .common import EmbeddingResult, output_only


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    # gaussian: i.i.d. N(0, 1) rows, independent of the sentences.
    rng = np.random.default_rng(spec["seed"])
    full = rng.standard_normal((len(texts), spec["dim"])).astype(np.float32)
    return output_only(model, spec, full, {"source": "control:gaussian"})
