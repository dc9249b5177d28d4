"""ONNX Runtime encoders (a pooled output, e.g. packaged paraphrase-MiniLM-L3-v2)."""

from __future__ import annotations

import numpy as np

from ...validation import EncmapError
from ..checkpoints import model_id, resolve_source
from ..result import EmbeddingResult, length_order, output_only, unsort


def session(path: str, device: str, threads: int | None):
    """An inference session on ``device`` that uses ``threads`` cores (all when None)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if threads:
        # ONNX Runtime's own pool ignores torch's and BLAS's limits: without this, jobs run side
        # by side each start one thread per core.
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    return ort.InferenceSession(path, opts, providers=[p for p in providers if p in ort.get_available_providers()])


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise EncmapError(f"model {model!r}: backend onnx needs onnxruntime (pip install onnxruntime)") from None
    from transformers import AutoTokenizer

    path, prov = resolve_source(spec["source"], model)
    tok_ref, tok_prov = resolve_source(spec["tokenizer"], model)
    tok = AutoTokenizer.from_pretrained(tok_ref)
    sess = session(path, device, threads)
    names = {i.name for i in sess.get_inputs()}
    inputs = [spec["prompt"] + t for t in texts]
    order = length_order(inputs)
    parts = []
    bs = spec["batch_size"]
    for start in range(0, len(inputs), bs):
        idx = order[start:start + bs]
        enc = tok([inputs[i] for i in idx], padding=True, truncation=True, max_length=spec["max_seq_length"],
                  return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
        parts.append(sess.run([spec["output_name"]], feed)[0])
    prov |= {"model_id": model_id(spec["source"]), "tokenizer": spec["tokenizer"],
             "tokenizer_sha256": tok_prov.get("weights_sha256")}
    return output_only(model, spec, unsort(parts, order), prov)
