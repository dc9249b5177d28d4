"""Transformer encoders (backends ``sentence-transformers`` and ``transformers``), one pass each.

Every requested hidden state is pooled every requested way, and for sentence-transformers the
model's own output comes from its own module stack (Transformer -> Pooling -> Normalize ...),
fed by its own tokenizer settings (padding side, an EOS its tokenizer appends): exactly what
``SentenceTransformer.encode`` computes. Encoder-only models (BERT, XLM-R, ModernBERT), the
encoder of encoder-decoder models (T5) and decoders (Llama, Mistral, Qwen) share the route.

The model runs in its params ``dtype`` (float16 / bfloat16 halve the weights' memory on a GPU);
pooling and stored embeddings are float32. On CUDA out-of-memory the batch is halved and the
same batch retried, down to :data:`MIN_BATCH`; the batch size used is logged and recorded.
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ...validation import EncmapError, check_host_memory
from ..checkpoints import hub_provenance, model_id, resolve_source, weights_sha256
from ..result import EmbeddingResult, length_order, output_arrays, token_batches
from ..variants import model_variants

log = logging.getLogger("encmap")

#: The smallest batch tried after out-of-memory errors; one sentence that does not fit is an error.
MIN_BATCH = 1
#: Batches tokenised ahead, in a thread, while the device runs the current one. Tokenisation is
#: host work of every pass (1.2-1.8 s of 10,000 sentences, measured on an H200), and the device
#: would otherwise wait for it between batches. 0 tokenises each batch in turn.
READ_AHEAD = 2
#: Device types whose passes check the variants as their rows leave the device
#: (:class:`encmap.encoders.running_checks.RunningChecks`), so the host need not read them all
#: again after the pass. Not the CPU, where the statistics would be the same host work moved
#: into the pass, nor MPS, which has no float64. Empty: every variant checked on the host.
CHECKS_ON_DEVICE = ("cuda",)

#: ``batch_tokens: auto`` on a CUDA card: this share of the card's free memory (after the model is
#: loaded) goes to one batch's activations; the rest is the allocator's slack (fragmentation,
#: cached blocks of other sizes) and what the estimate leaves out (the tokenizer's tensors, cuBLAS's
#: workspace). Out of memory, the budget is halved as any budget is.
AUTO_MEMORY_SHARE = 0.5
#: The largest budget ``auto`` picks: beyond a few thousand tokens a batch's GEMMs already fill an
#: H200 (8,192 beat sentence batches in every run, docs/results.md); larger batches only grow the
#: pinned host buffer and delay the first copy.
AUTO_MAX_TOKENS = 32_768
#: The smallest: the schema's minimum for ``batch_tokens``.
AUTO_MIN_TOKENS = 16

_IMPORT_LOCK = threading.Lock()


def _import_libraries(sentence_transformers: bool = False) -> None:
    """Resolve transformers' lazily imported names once, under a lock, and sentence-transformers'
    too when the model needs it. Jobs that run side by side in Snakemake's threads (one per GPU)
    would otherwise race in transformers' lazy module: seen as "ImportError: cannot import name
    'AutoConfig' from 'transformers'" in one of two jobs. Only the model that loads through
    sentence-transformers imports it (:func:`_load_sentence_transformer`): a process that embeds
    plain transformers models alone spends ~1.3 s of CPU less (its import pulls in scikit-learn's
    metrics and its own modules; measured in docs/results.md)."""
    with _IMPORT_LOCK:
        import transformers

        for name in ("AutoConfig", "AutoModel", "AutoTokenizer", "MODEL_MAPPING", "PreTrainedModel"):
            getattr(transformers, name)
        if sentence_transformers:
            import sentence_transformers as st

            st.SentenceTransformer  # noqa: B018 (its lazy imports too)


def torch_dtype(name: str):
    """The torch dtype of a params ``dtype`` name (float32, float16, bfloat16)."""
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def model_class(config, trust_remote_code: bool = False):
    """The class that loads ``config``'s network: ``AutoModel``, or for an encoder-decoder
    configuration (T5, mT5) its encoder-only class, as sentence encoders built on it use
    (sentence-t5, gtr: ``T5EncoderModel``)."""
    import transformers
    from transformers import AutoModel

    named = (getattr(config, "architectures", None) or [""])[0]
    if named.endswith("EncoderModel") and hasattr(transformers, named):
        return getattr(transformers, named)  # an encoder stack saved alone (sentence-t5, gtr)
    if not getattr(config, "is_encoder_decoder", False):
        return AutoModel
    full = transformers.MODEL_MAPPING.get(type(config)) if not trust_remote_code else None
    enc = getattr(transformers, full.__name__.removesuffix("Model") + "EncoderModel", None) if full else None
    if enc is None:
        raise EncmapError(f"{type(config).__name__}: an encoder-decoder model without an encoder-only class in "
                          "transformers; encmap embeds with encoders and decoders, not both")
    return enc


def fresh_model(config, seed: int, trust_remote_code: bool = False):
    """The architecture of ``config`` with freshly initialised weights (seeded): a control."""
    import torch

    torch.manual_seed(seed)
    cls = model_class(config, trust_remote_code)
    if hasattr(cls, "from_config"):
        return cls.from_config(config, trust_remote_code=trust_remote_code)
    return cls(config)


def weight_bytes(model: str, spec: dict) -> int | None:
    """Bytes the model's weights take in its params ``dtype``, counted on torch's meta device
    (nothing allocated, no weights read: only its configuration); None when the configuration
    cannot be read without loading the model (the load then names the problem itself)."""
    import torch

    _import_libraries()
    from transformers import AutoConfig

    try:
        ref, _ = resolve_source(spec["source"], model, hash_weights=False)
        config = AutoConfig.from_pretrained(ref, revision=spec["revision"],
                                            trust_remote_code=spec.get("trust_remote_code", False))
        cls = model_class(config, spec.get("trust_remote_code", False))
        with torch.device("meta"):  # unseeded: the process's random state is left alone
            net = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    except Exception as e:  # noqa: BLE001 (an estimate only)
        log.debug("model %r: no weight estimate before loading (%s)", model, e)
        return None
    size = torch.empty((), dtype=torch_dtype(spec["dtype"])).element_size()
    return int(sum(p.numel() for p in net.parameters())) * size


def hidden_width(config) -> int:
    """The width of ``config``'s hidden states (``hidden_size``; T5's ``d_model``)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model"))


def token_budget(free_bytes: float, *, hidden: int, layers: int, intermediate: int, heads: int, max_seq_length: int,
                 dtype_bytes: int, pooled_width: int) -> int:
    """The token budget of ``batch_tokens: auto``: the most padded tokens per batch whose
    activations fit :data:`AUTO_MEMORY_SHARE` of ``free_bytes``, rounded down to a power of two
    and kept within [:data:`AUTO_MIN_TOKENS`, :data:`AUTO_MAX_TOKENS`].

    Bytes per padded token, an upper bound for one forward pass of an encmap batch:

    - ``(layers + 1) * hidden * dtype_bytes``: every hidden state, kept to the end of the pass
      (``output_hidden_states``: every layer may be pooled);
    - ``(4 * hidden + 2 * intermediate) * dtype_bytes``: one layer's working set (q, k, v and the
      attention's output; the MLP's up and gate projections);
    - ``heads * max_seq_length * dtype_bytes``: attention scores if the kernel materialises them
      (eager attention; flash and memory-efficient kernels need none: an upper bound);
    - ``8 * pooled_width``: every pooled variant side by side in float32 on the device (and the
      float32 copy of a state pooled), counted as if every token were a sentence of its own.

    The power of two keeps the budget, hence the batches and the floats' last bits, the same when
    the free memory moves by less than half from run to run.

    Parameters
    ----------
    free_bytes : float
        The card's free memory once the model is on it (``torch.cuda.mem_get_info``).
    hidden, layers, intermediate, heads : int
        The model's width, depth, MLP width and attention heads (its configuration).
    max_seq_length : int
        The longest input in tokens (params).
    dtype_bytes : int
        Bytes per element of the model's dtype (2 for float16 / bfloat16, 4 for float32).
    pooled_width : int
        Total width of the variants pooled from one pass (the output's width included).

    Returns
    -------
    int
    """
    per_token = (dtype_bytes * ((layers + 1) * hidden + 4 * hidden + 2 * intermediate + heads * max_seq_length)
                 + 8 * pooled_width)
    fit = int(AUTO_MEMORY_SHARE * max(0.0, free_bytes) // per_token)
    if fit < AUTO_MIN_TOKENS:
        return AUTO_MIN_TOKENS
    return min(AUTO_MAX_TOKENS, 1 << (fit.bit_length() - 1))


def auto_batch_tokens(config, spec: dict, device: str, pooled_width: int) -> int | None:
    """What ``batch_tokens: auto`` means for a model of ``config`` on ``device``: on a CUDA card,
    :func:`token_budget` of its free memory now (the model loaded); elsewhere (the CPU, MPS)
    None, sentence batches of ``batch_size``: on the CPU they are measured to be as fast, and the
    embeddings stay exactly those of ``batch_tokens: null``."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = hidden_width(cfg)
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return token_budget(free, hidden=hidden, layers=int(cfg.num_hidden_layers),
                        intermediate=int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "d_ff", None)
                                         or 4 * hidden),
                        heads=int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "num_heads", 1)),
                        max_seq_length=int(spec["max_seq_length"]),
                        dtype_bytes=torch.empty((), dtype=torch_dtype(spec["dtype"])).element_size(),
                        pooled_width=pooled_width)


class _HostRows:
    """Each batch's pooled rows, (b, w) float32, copied to the host into one buffer reused for
    every batch: pinned (page-locked) on CUDA, so the copy is one DMA rather than a staged copy of
    pageable memory, and no batch allocates (under deterministic algorithms torch would also fill
    each new host tensor before the copy overwrites it). It grows when a batch has more rows (token
    batches of short sentences do)."""

    def __init__(self, device: str):
        self.pin = device.startswith("cuda")
        self.buf = None

    def __call__(self, rows) -> np.ndarray:
        """A NumPy view of ``rows`` on the host, valid until the next call."""
        import torch

        b, w = rows.shape
        if self.buf is None or self.buf.shape[0] < b or self.buf.shape[1] != w:
            grown = b if self.buf is None else max(b, 2 * self.buf.shape[0])
            self.buf = torch.empty((grown, w), dtype=torch.float32, pin_memory=self.pin)
        out = self.buf[:b]
        out.copy_(rows)
        return out.numpy()


def _load_sentence_transformer(spec: dict, ref: str, device: str):
    import torch

    _import_libraries(sentence_transformers=True)
    from sentence_transformers import SentenceTransformer

    dtype = torch_dtype(spec["dtype"])
    # A checkpoint's own Python code runs only when its params entry says so explicitly. The
    # weights load in their dtype directly (an 8 B model is never materialised in float32).
    st = SentenceTransformer(ref, revision=spec["revision"], device=device,
                             trust_remote_code=spec.get("trust_remote_code", False),
                             model_kwargs={"dtype": dtype})
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
    st.to(dtype)  # tail modules (Dense) too, so their inputs and weights agree
    # The Transformer module then also returns every hidden state ("all_layer_embeddings").
    net.config.output_hidden_states = True
    st.eval()
    return st, net


def _load_transformer(spec: dict, ref: str, device: str):
    from transformers import AutoConfig, AutoTokenizer

    rev, remote = spec["revision"], spec.get("trust_remote_code", False)
    tok = AutoTokenizer.from_pretrained(ref, revision=rev, trust_remote_code=remote)
    if tok.pad_token is None:
        # Decoder tokenizers often have none; padded positions are masked out, so any id will do.
        tok.pad_token = tok.eos_token or tok.unk_token
    config = AutoConfig.from_pretrained(ref, revision=rev, trust_remote_code=remote)
    dtype = torch_dtype(spec["dtype"])
    if spec["init"] == "random":
        net = fresh_model(config, spec["seed"], remote).to(dtype)
    else:
        net = model_class(config, remote).from_pretrained(ref, revision=rev, trust_remote_code=remote, dtype=dtype)
    return tok, net.to(device).eval()


def is_causal(net, ids, device: str) -> bool:
    """Whether ``net`` attends causally: its first position ignores every later token.

    Decided by the model itself rather than by a list of architectures: two inputs that differ
    only in their last token give the same first-position state in every layer only if attention
    is causal. ``ids`` are token ids of one short tokenised text (at least 2). A model whose last
    position ignores the first token too does not read its input at all (weights all zero, say):
    no verdict on its attention, so that the check of its embeddings names the real problem
    (constant encoders) rather than a pooling.
    """
    import torch

    x = torch.as_tensor([ids, ids, ids], device=device)  # the three inputs in one batch: one pass, not three
    x[1, -1] = ids[0] if ids[-1] != ids[0] else ids[1]
    x[2, 0] = ids[-1] if ids[-1] != ids[0] else ids[1]
    with torch.inference_mode():
        ha, hb, hc = net(input_ids=x, output_hidden_states=True).hidden_states[-1].float().unbind(0)
    if not all(torch.isfinite(h).all() for h in (ha, hb, hc)):
        return False  # broken weights: the embeddings' own check names the encoder and the NaN

    def same(x, y) -> bool:
        return bool(torch.allclose(x, y, rtol=1e-3, atol=1e-5 * float(x.abs().max().clamp(min=1.0))))

    if same(ha[-1], hc[-1]):
        return False  # no state reads the text: the embeddings' own check names the constant encoders
    return same(ha[0], hb[0])


def _tokenize(st, tok, batch: list[str], spec: dict):
    """The model's inputs for ``batch``, on the host: sentence-transformers' own preprocessing
    (its tokenizer settings, a prompt its modules add), else the tokenizer padded to the longest."""
    if st is not None:
        return st.preprocess(batch)
    return tok(batch, padding=True, truncation=True, max_length=spec["max_seq_length"], return_tensors="pt")


def _forward(st, tok, net, batch: list[str], spec: dict, device: str, want_output: bool, encoded):
    """Hidden states (every layer, (b, t, h) each), attention mask (b, t), model output (b, d) or None.

    ``encoded``: the texts ``batch`` as :func:`_tokenize` made them (in the read-ahead thread);
    the texts themselves are passed along so that a wrapper sees which sentences run."""
    if st is not None:
        from sentence_transformers.util import batch_to_device

        feats = st(batch_to_device(encoded, device))
        return feats["all_layer_embeddings"], feats["attention_mask"], (
            feats["sentence_embedding"] if want_output else None)
    enc = encoded.to(device)
    return net(**enc, output_hidden_states=True).hidden_states, enc["attention_mask"], None


@contextmanager
def _shut_down(pool: ThreadPoolExecutor):
    """Leave with ``pool``'s queued work cancelled, not done: on an error or Ctrl-C nothing waits
    for batches that will not be used."""
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None,
          batch_tokens: int | str | None = None) -> EmbeddingResult:
    """Every variant of one model in one pass, in batches of ``spec["batch_size"]`` sentences
    (longest in characters first) or, with ``batch_tokens``, of as many sentences (longest in
    tokens first) as fit that many padded tokens; ``"auto"``: a budget from the card's free
    memory on a CUDA device, sentence batches elsewhere (:func:`auto_batch_tokens`). Out of device
    memory, the batch (or the token budget) is halved and the batch retried."""
    import torch

    _import_libraries()
    if threads:
        torch.set_num_threads(threads)  # the job's share of cores, not every core on the node
    ref, prov = resolve_source(spec["source"], model, hash_weights=False)
    # The model files' hash (provenance) is read in a thread of its own while the model loads
    # and runs, not before: seconds for a large model, a job's whole overhead for a small one.
    with _shut_down(ThreadPoolExecutor(max_workers=1)) as hashing:
        return _embed(model, spec, texts, device, batch_tokens, ref, prov, hashing)


def _embed(model: str, spec: dict, texts: list[str], device: str, batch_tokens: int | str | None, ref: str, prov: dict,
           hashing: ThreadPoolExecutor) -> EmbeddingResult:
    """:func:`embed` once its source is resolved (``ref``, ``prov`` without the files' hash);
    the hashes are computed in ``hashing`` and joined into the provenance at the end."""
    import torch
    from tqdm import tqdm

    from ..pooling import pool
    from ..running_checks import RunningChecks

    rev = spec["revision"]
    local = None if "weights_sha256" in prov or spec["source"].startswith("hub:") else \
        hashing.submit(weights_sha256, Path(ref))
    tok = st = None
    if spec["backend"] == "sentence-transformers":
        st, net = _load_sentence_transformer(spec, ref, device)
        tok = st.tokenizer
    else:
        tok, net = _load_transformer(spec, ref, device)
    hub = hashing.submit(hub_provenance, spec["source"], rev, model)
    n_layers = int(net.config.num_hidden_layers)
    if spec["layers"] == "all" and spec["num_layers"] != n_layers:
        raise EncmapError(f"model {model!r}: params say num_layers: {spec['num_layers']} but the checkpoint "
                          f"{ref} has {n_layers} layers; write num_layers: {n_layers}")
    variants = model_variants(model, spec)
    bad = [v.layer for v in variants if v.layer is not None and v.layer > n_layers]
    if bad:
        raise EncmapError(f"model {model!r}: layer {bad[0]} requested but the model has hidden states 0..{n_layers}")
    layered = [v for v in variants if v.pooling != "output"]
    probe = tok("the city by the river", add_special_tokens=False)["input_ids"]
    causal = is_causal(net, probe, device)
    if causal and any(v.pooling == "cls" for v in layered):
        raise EncmapError(f"model {model!r}: pooling 'cls' on a causal (decoder) model: its first position sees only "
                          "the first token (with a BOS token, the same vector for every sentence); use 'last', the "
                          "last real token, which has seen the whole sentence")
    want_output = any(v.pooling == "output" for v in variants)
    width = hidden_width(net.config)
    out_dim = getattr(st, "get_embedding_dimension", None) or getattr(st, "get_sentence_embedding_dimension", None)
    out_width = (out_dim() or width) if st is not None and want_output else 0
    widths = [width] * len(layered) + [out_width] * want_output
    check_host_memory(model, len(texts), widths + [d for d in spec.get("dims") or [] if want_output], device)
    if batch_tokens == "auto":
        batch_tokens = auto_batch_tokens(net.config, spec, device, sum(widths))
    inputs = [spec["prompt"] + t for t in texts]
    bs = budget = spec["batch_size"]
    if batch_tokens:
        # Lengths as the model sees them (special tokens, truncation): a fast tokenizer, ~0.1 s for 10,000.
        lengths = np.array([len(x) for x in tok(inputs, truncation=True, max_length=spec["max_seq_length"])["input_ids"]])
        budget = batch_tokens

    def plan(rest: np.ndarray) -> list[np.ndarray]:
        """The batches of the sentences ``rest`` (in the pass's order) under the current size or budget."""
        if batch_tokens:
            return [rest[b] for b in token_batches(lengths[rest], budget)]
        return [rest[i:i + bs] for i in range(0, len(rest), bs)]

    queue = plan(np.argsort(-lengths, kind="stable") if batch_tokens else length_order(inputs))
    # One (n, d) array per encoder, filled in place in the sentences' own order: memory is the
    # result itself, with no per-batch chunks to stack (and no heap they would fragment).
    arrays: dict[str, np.ndarray] = {}
    host = _HostRows(device)
    on_device = torch.device(device).type in CHECKS_ON_DEVICE
    checks: list[RunningChecks] = []  # one, from the first batch, where the device checks

    def put(idx: np.ndarray, pooled: dict) -> None:
        # Every variant of the batch side by side on the device, then one copy to the host: one
        # synchronising transfer per batch instead of one per variant (21-36 of them per model).
        side = torch.cat([x.float() for x in pooled.values()], dim=1)
        rows = host(side)
        lo = 0
        for key, x in pooled.items():
            hi = lo + x.shape[1]
            if key not in arrays:
                arrays[key] = np.empty((len(inputs), x.shape[1]), dtype=np.float32)
            arrays[key][idx] = rows[:, lo:hi]
            lo = hi
        if on_device:
            if not checks:
                checks.append(RunningChecks({key: x.shape[1] for key, x in pooled.items()}, side.device))
            checks[0].add(side)  # after the rows are stored: a batch retried out of memory counts once

    # One thread, so the tokenizer is never used by two at once (the main thread leaves it alone
    # during the pass); it runs while the main thread waits for the device.
    tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tokenize-{model}")
    ahead: dict[int, Future] = {}

    def tokenized(k: int):
        """Batch ``k``'s inputs, once batches k+1 .. k+READ_AHEAD are queued for the thread."""
        for j in range(k, min(k + 1 + READ_AHEAD, len(queue))):
            if j not in ahead:
                ahead[j] = tokenizing.submit(_tokenize, st, tok, [inputs[i] for i in queue[j]], spec)
        return ahead.pop(k).result()

    k = 0
    with torch.inference_mode(), tqdm(total=len(inputs), desc=f"embed {model}", file=sys.stderr,
                                      mininterval=5) as bar, _shut_down(tokenizing):
        while k < len(queue):
            idx = queue[k]
            try:
                hs, mask, out = _forward(st, tok, net, [inputs[i] for i in idx], spec, device, want_output,
                                         tokenized(k))
                if len(hs) != n_layers + 1:
                    raise EncmapError(f"model {model!r}: expected {n_layers + 1} hidden states, got {len(hs)}")
                pooled = {"output": out} if out is not None else {}
                for v in layered:  # pooled in float32 whatever the model's dtype: sums of half floats overflow
                    pooled[v.id] = pool(hs[v.layer].float(), mask, v.pooling)
                put(idx, pooled)
                del hs, mask, out, pooled
            except torch.OutOfMemoryError:
                if len(idx) <= MIN_BATCH:
                    raise EncmapError(f"model {model!r}: out of {device} memory with a batch of {len(idx)} "
                                      f"sentence(s) of up to {max(len(inputs[i]) for i in idx)} characters in "
                                      f"{spec['dtype']}; it needs a larger device, a lower dtype or a lower "
                                      "max_seq_length") from None
                if batch_tokens:
                    budget = max(1, budget // 2)
                else:
                    bs = max(MIN_BATCH, bs // 2)
                log.warning("model %r: out of %s memory; retrying with %s %d", model, device,
                            "a token budget of" if batch_tokens else "batch size", budget if batch_tokens else bs)
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                queue = queue[:k] + plan(np.concatenate(queue[k:]))
                for f in ahead.values():  # batches of the old plan
                    f.cancel()
                ahead.clear()
                continue
            k += 1
            bar.update(len(idx))
    if bs != spec["batch_size"] or (batch_tokens and budget != batch_tokens):
        log.warning("model %r: embedded with %s after out-of-memory errors", model,
                    f"a token budget of {budget} (params: {batch_tokens})" if batch_tokens else
                    f"batch size {bs} (params: {spec['batch_size']})")
    proven = {key for key, ok in checks[0].proven().items() if ok} if checks else set()
    if want_output:
        arrays |= output_arrays(model, spec, arrays.pop("output"), variants)
        if "output" in proven:  # the full output; its truncations are checked on the host
            proven = (proven - {"output"}) | {v.id for v in variants if v.pooling == "output" and v.dim is None}
    prov |= ({"weights_sha256": local.result()} if local is not None else {}) | hub.result()
    prov.update({"model_id": model_id(spec["source"]), "revision": rev, "num_hidden_layers": n_layers,
                 "max_seq_length": spec["max_seq_length"], "dtype": spec["dtype"], "batch_size_used": bs,
                 "batch_tokens_used": budget if batch_tokens else None, "batches": len(queue),
                 "causal": causal, "padding_side": str(getattr(tok, "padding_side", "right"))})
    return EmbeddingResult(variants, arrays, prov, proven=frozenset(proven))
