"""Model2Vec distillations made by the pipeline (backend ``model2vec-distill``).

``source`` is the teacher (a sentence-transformers checkpoint: ``package:``, ``path:`` or
``hub:``); ``model2vec.distill`` passes every vocabulary token through it, reduces the token
vectors with PCA to ``distill.pca_dims`` and weights them by Zipf/SIF, giving a static model
whose lineage is known by construction (``meta.derived_from``). The distilled model is made
once per teacher and settings and kept in the encmap cache (:func:`~encmap.encoders.checkpoints.made_model`),
so ``embed`` and ``evaluate`` use the very same weights; it is then encoded exactly as the
``model2vec`` backend encodes a published Model2Vec model.

The teacher's pass over its vocabulary is most of a distillation's cost and does not depend on
the output size: it is kept too (kind "model2vec-teacher", keyed by the teacher's files, the token
ids and the pooling), so distillations of one teacher at several sizes pass it once.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

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
        with threadpool_limits(limits=1, user_api="blas"), _teacher_pass_kept(key, model):
            m = distill(ref, device="cpu", pca_dims=d["pca_dims"], sif_coefficient=d["sif_coefficient"],
                        quantize_to=d["quantize_to"], pooling=d["pooling"])
        m.save_pretrained(str(out))

    path, sha = made_model("model2vec-distill", key, build, model)
    m = StaticModel.from_pretrained(str(path), max_length=spec["max_seq_length"], force_download=False)
    prov |= {"model_id": model_id(spec["source"]), "teacher_sha256": teacher_sha, "distilled_sha256": sha}
    return encode_static(model, spec, m, texts, prov)


_kept = threading.local()  # the teacher key of the distillation this thread is making
_install = threading.Lock()


@contextmanager
def _teacher_pass_kept(key: dict, model: str):
    """Within this block (this thread), model2vec's teacher pass is made once per teacher and tokens.

    ``model2vec.distill`` calls ``create_embeddings`` (every token id list through the teacher,
    (V, d) float32) and then reduces it; the distillation itself stays model2vec's own code: its
    module-level ``create_embeddings`` is wrapped once, and the wrapper keeps the pass in the
    cache only for the thread that set a key here (in-process embed jobs run side by side as
    threads), passing every other call through untouched.
    """
    from model2vec.distill import distillation

    with _install:
        if not getattr(distillation.create_embeddings, "_encmap_kept", False):
            distillation.create_embeddings = _keeping(distillation.create_embeddings)
    # Not the output size, PCA or SIF settings: the pass comes before them (the token ids and the
    # pooling join the key where model2vec hands them over).
    _kept.key, _kept.model = {k: key[k] for k in ("teacher", "versions")}, model
    try:
        yield
    finally:
        _kept.key = None


def _keeping(create_embeddings):
    def kept(model, tokenized, device, pad_token_id, pooling="mean"):
        key = getattr(_kept, "key", None)
        if key is None:
            return create_embeddings(model, tokenized, device, pad_token_id, pooling)
        ids = hashlib.sha256(json.dumps([list(map(int, t)) for t in tokenized]).encode()).hexdigest()
        key = key | {"token_ids_sha256": ids, "pad_token_id": int(pad_token_id), "pooling": str(getattr(pooling, "value", pooling))}

        def build(out: Path) -> None:
            np.save(out / "token_embeddings.npy", create_embeddings(model, tokenized, device, pad_token_id, pooling))

        path, _ = made_model("model2vec-teacher", key, build, _kept.model)
        return np.load(path / "token_embeddings.npy")

    kept._encmap_kept = True
    return kept
