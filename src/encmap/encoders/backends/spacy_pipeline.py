"""spaCy pipelines: ``Doc.vector`` of a trained English pipeline (backend ``spacy``).

``package:en-core-web-sm`` is en_core_web_sm 3.8.0 (a CNN ``tok2vec`` trained jointly with the
tagger, parser and NER on OntoNotes; no static vectors): its ``Doc.vector`` is the mean of the
96-d contextual token tensors. Only the ``tok2vec`` component runs (the tagger, parser and NER
read its output but do not change ``Doc.tensor``), which is 2x faster and gives the same
vectors. A pipeline with static vectors (``md``, ``lg``) averages those instead, as spaCy does.
"""

from __future__ import annotations

import numpy as np

from ...validation import EncmapError
from ..checkpoints import model_id, resolve_source
from ..result import EmbeddingResult, output_only


def load(path: str, model: str):
    """The pipeline at ``path`` with only what ``Doc.vector`` needs (tok2vec; static vectors)."""
    from pathlib import Path

    import spacy

    try:
        names = spacy.util.load_config(Path(path) / "config.cfg")["nlp"]["pipeline"]
        return spacy.load(path, exclude=[p for p in names if p != "tok2vec"])
    except (OSError, ValueError) as e:
        raise EncmapError(f"model {model!r}: spaCy could not load the pipeline at {path}: {e}") from e


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import spacy
    except ImportError:
        raise EncmapError(f"model {model!r}: backend spacy needs spaCy (pip install spacy)") from None
    ref, prov = resolve_source(spec["source"], model)
    nlp = load(ref, model)
    full = np.stack([d.vector for d in nlp.pipe(texts, batch_size=spec["batch_size"])]).astype(np.float32)
    prov |= {"model_id": model_id(spec["source"]), "spacy": spacy.__version__,
             "pipeline": f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}-{nlp.meta.get('version')}",
             "static_vectors": int(nlp.vocab.vectors.shape[0])}
    return output_only(model, spec, full, prov)
