"""Transformer encoders (backends ``sentence-transformers`` and ``transformers``), one pass each.

Every requested hidden state is pooled every requested way, and for sentence-transformers the
model's own output comes from its own module stack (Transformer -> Pooling -> Normalize ...),
fed by its own tokenizer settings: exactly what ``SentenceTransformer.encode`` computes.
"""

from __future__ import annotations

import sys

import numpy as np

from ...validation import EncmapError
from ..checkpoints import hub_provenance, model_id, resolve_source
from ..result import EmbeddingResult, length_order, output_arrays
from ..variants import model_variants


def fresh_model(config, seed: int, trust_remote_code: bool = False):
    """The architecture of ``config`` with freshly initialised weights (seeded): a control."""
    import torch
    from transformers import AutoModel

    torch.manual_seed(seed)
    return AutoModel.from_config(config, trust_remote_code=trust_remote_code)


def _to_numpy(x) -> np.ndarray:
    # A copy of just these rows: a view such as hidden[:, 0] would otherwise keep the whole
    # (batch x tokens x width) hidden-state tensor alive for as long as the chunk lives.
    import torch

    return x.detach().to("cpu", torch.float32, copy=True).numpy()


def _load_sentence_transformer(spec: dict, ref: str, device: str):
    import torch
    from sentence_transformers import SentenceTransformer

    # A checkpoint's own Python code runs only when its params entry says so explicitly.
    st = SentenceTransformer(ref, revision=spec["revision"], device=device,
                             trust_remote_code=spec.get("trust_remote_code", False))
    st.max_seq_length = spec["max_seq_length"]
    net = st[0].auto_model
    if spec["init"] == "random":
        # Control with the model's own tail modules: fresh transformer weights (the same as the
        # `transformers` backend's control for this seed), and fresh weights in any tail module
        # that has parameters (Dense); Pooling and Normalize have none.
        net.load_state_dict(fresh_model(net.config, spec["seed"], spec.get("trust_remote_code", False)).state_dict())
        torch.manual_seed(spec["seed"])
        for module in list(st)[1:]:
            for sub in module.modules():
                if hasattr(sub, "reset_parameters"):
                    sub.reset_parameters()
    # The Transformer module then also returns every hidden state ("all_layer_embeddings").
    net.config.output_hidden_states = True
    st.eval()
    return st, net


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from ..pooling import pool

    if threads:
        torch.set_num_threads(threads)  # the job's share of cores, not every core on the node
    ref, prov = resolve_source(spec["source"], model)
    rev = spec["revision"]
    st = None
    if spec["backend"] == "sentence-transformers":
        st, net = _load_sentence_transformer(spec, ref, device)
    else:
        remote = spec.get("trust_remote_code", False)
        tok = AutoTokenizer.from_pretrained(ref, revision=rev, trust_remote_code=remote)
        if spec["init"] == "random":
            net = fresh_model(AutoConfig.from_pretrained(ref, revision=rev, trust_remote_code=remote), spec["seed"],
                              remote)
        else:
            net = AutoModel.from_pretrained(ref, revision=rev, trust_remote_code=remote)
        net = net.to(device).eval()
    prov |= hub_provenance(spec["source"], rev, model)
    n_layers = int(net.config.num_hidden_layers)
    if spec["layers"] == "all" and spec["num_layers"] != n_layers:
        raise EncmapError(f"model {model!r}: params say num_layers: {spec['num_layers']} but the checkpoint "
                          f"{ref} has {n_layers} layers; write num_layers: {n_layers}")
    variants = model_variants(model, spec)
    bad = [v.layer for v in variants if v.layer is not None and v.layer > n_layers]
    if bad:
        raise EncmapError(f"model {model!r}: layer {bad[0]} requested but the model has hidden states 0..{n_layers}")
    layered = [v for v in variants if v.pooling != "output"]
    want_output = any(v.pooling == "output" for v in variants)
    inputs = [spec["prompt"] + t for t in texts]
    order = length_order(inputs)
    bs = spec["batch_size"]
    # One (n, d) array per encoder, filled in place in the sentences' own order: memory is the
    # result itself, with no per-batch chunks to stack (and no heap they would fragment).
    arrays: dict[str, np.ndarray] = {}

    def put(key: str, idx: np.ndarray, x) -> None:
        rows = _to_numpy(x)
        if key not in arrays:
            arrays[key] = np.empty((len(inputs), rows.shape[1]), dtype=np.float32)
        arrays[key][idx] = rows

    with torch.inference_mode():
        for start in tqdm(range(0, len(inputs), bs), desc=f"embed {model}", file=sys.stderr, mininterval=5):
            idx = order[start:start + bs]
            batch = [inputs[i] for i in idx]
            if st is not None:
                from sentence_transformers.util import batch_to_device

                feats = st(batch_to_device(st.preprocess(batch), device))
                hs, mask = feats["all_layer_embeddings"], feats["attention_mask"]
                if want_output:
                    put("output", idx, feats["sentence_embedding"])
                del feats  # hs and mask keep what is still needed, until the end of this batch
            else:
                enc = tok(batch, padding=True, truncation=True, max_length=spec["max_seq_length"],
                          return_tensors="pt").to(device)
                hs, mask = net(**enc, output_hidden_states=True).hidden_states, enc["attention_mask"]
            if len(hs) != n_layers + 1:
                raise EncmapError(f"model {model!r}: expected {n_layers + 1} hidden states, got {len(hs)}")
            for v in layered:
                put(v.id, idx, pool(hs[v.layer], mask, v.pooling))
            del hs, mask
    if want_output:
        arrays |= output_arrays(model, spec, arrays.pop("output"), variants)
    prov.update({"model_id": model_id(spec["source"]), "revision": rev, "num_hidden_layers": n_layers,
                 "max_seq_length": spec["max_seq_length"]})
    return EmbeddingResult(variants, arrays, prov)
