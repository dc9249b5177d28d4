"""Model2Vec distillations made by the pipeline (backend ``model2vec-distill``).

``source`` is the teacher (a sentence-transformers checkpoint: ``package:``, ``path:`` or
``hub:``); ``model2vec.distill`` passes every vocabulary token through it, reduces the token
vectors with PCA to ``distill.pca_dims`` and weights them by Zipf/SIF, giving a static model
whose lineage is known by construction (``meta.derived_from``). The distilled model is made
once per teacher and settings and kept in the encmap cache (:func:`~encmap.encoders.checkpoints.made_model`),
so ``embed`` and ``evaluate`` use the very same weights; it is then encoded exactly as the
``model2vec`` backend encodes a published Model2Vec model.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from ...validation import EncmapError
from ..checkpoints import hub_provenance, made_model, model_id, resolve_source
from ..result import EmbeddingResult
from .model2vec import encode_static


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        from model2vec import StaticModel
        from model2vec.distill import distill
    except ImportError as e:
        raise EncmapError(f"model {model!r}: backend model2vec-distill needs model2vec with its distill extra "
                          f"(pip install 'model2vec[distill]'): {e}") from None
    ref, prov = resolve_source(spec["source"], model)
    if spec["source"].startswith("hub:"):
        from huggingface_hub import snapshot_download

        ref = snapshot_download(ref, revision=spec["revision"])
        prov |= hub_provenance(spec["source"], spec["revision"], model)
    d = spec["distill"]
    teacher_sha = prov["weights_sha256"]  # every file of the teacher: weights, tokenizer, modules
    key = {"teacher": teacher_sha, "distill": d, "blas_threads": 1,
           "versions": {lib: md.version(lib) for lib in ("model2vec", "transformers", "torch")}}

    def build(out: Path) -> None:
        from threadpoolctl import threadpool_limits

        # One BLAS thread, whichever job makes it: the PCA's SVD gives other low bits with two
        # threads (up to 2e-3 in the float16 table), and embed (in Snakemake's process, one BLAS
        # thread) and evaluate (its own process) must not make different models.
        with threadpool_limits(limits=1, user_api="blas"):
            m = distill(ref, device="cpu", pca_dims=d["pca_dims"], sif_coefficient=d["sif_coefficient"],
                        quantize_to=d["quantize_to"], pooling=d["pooling"])
        m.save_pretrained(str(out))

    path, sha = made_model("model2vec-distill", key, build, model)
    m = StaticModel.from_pretrained(str(path), max_length=spec["max_seq_length"], force_download=False)
    prov |= {"model_id": model_id(spec["source"]), "teacher_sha256": teacher_sha, "distilled_sha256": sha}
    return encode_static(model, spec, m, texts, prov)
