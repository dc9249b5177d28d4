"""Where the GPU box's time goes, part by part: the probe behind bench_gpu.py's ratios.

bench_gpu.py says how far each path is from its baseline; this says why, on the same card:

- **embed**: a cProfile of :func:`encmap.encoders.embed.embed_model` (every variant of one pass,
  and the output alone) for all-MiniLM-L6-v2 and the BERT-base-sized model, the functions that
  take the most time listed; and each pass under each determinism setting (torch's
  ``use_deterministic_algorithms``, and its ``fill_uninitialized_memory``), side by side.
- **derive**: the device route of the pairwise step derives each U from the embeddings (a QR and
  an SVD of the small factor when V is not stored): each part timed at n = 10,000 for d = 512 and
  768, cuSOLVER's SVD drivers against each other and against LAPACK on the host, beside the
  block GEMM the products are made of.

    python benchmarks/gpu_probe.py --sentences data/sentences.txt --minilm models/minilm-l6 [--parts embed,derive]  # in .gpu
    python benchmarks/gpu/gpu_probe.py --small      # a CPU smoke run

Prints what it measures; ``--out`` writes it as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import ROOT, bert_base, fresh, minilm_path, sync, timed  # noqa: E402


def profiled(fn, top: int = 14) -> tuple[float, list[str]]:
    """(seconds, the ``top`` functions by own time then by cumulative time) of ``fn()``."""
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    fn()
    prof.disable()
    s = time.perf_counter() - t
    lines = []
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        lines += [f"[{key}]"] + [ln for ln in buf.getvalue().splitlines() if ln.strip()][-top - 1:]
    return s, lines


def embed_probe(texts: list[str], dev: str, work: Path, small: bool, minilm: Path, out: dict, *,
                models_wanted: tuple[str, ...] = ("minilm-l6", "bert-base-random"),
                keys: tuple[str, ...] = ("all_variants", "output_only"), determinism: bool = True,
                top: int = 14) -> None:
    import torch
    import yaml

    from encmap.encoders.embed import FORWARD_DEFAULTS, embed_model
    from encmap.encoders.variants import science_spec

    base = science_spec(yaml.safe_load((ROOT / "params.yaml").read_text())["models"]["minilm-l6"])
    bb = bert_base(work / "bertbase", small, minilm)
    models = {"minilm-l6": base | {"source": f"path:{minilm}"},
              "bert-base-random": base | {"source": f"path:{bb}", "num_layers": 2 if small else 12, "dims": []}}
    for name, spec in models.items():
        if name not in models_wanted:
            continue
        spec = spec | {"batch_size": 64, "dtype": "float32"}
        only = spec | {"layers": [], "pooling": [], "dims": []}
        embed_model(name, only, texts[:64], dev, forward=FORWARD_DEFAULTS)  # warm-up
        r = out[name] = {}
        for key, s in (("all_variants", spec), ("output_only", only)):
            if key not in keys:
                continue
            fresh(dev)
            sec, lines = profiled(lambda: embed_model(name, s, texts, dev, forward=FORWARD_DEFAULTS), top)
            r[f"profile_{key}"] = {"seconds": sec, "top": lines}
            print(name, key, f"{sec:.2f} s", *lines, sep="\n", flush=True)
        for key, s in (("all_variants", spec), ("output_only", only)):
            for det, fill in ((True, True), (True, False), (False, True)) if determinism and key in keys else ():
                torch.utils.deterministic.fill_uninitialized_memory = fill
                fresh(dev)
                _, sec = timed(dev, lambda: embed_model(name, s, texts, dev,
                                                        forward=FORWARD_DEFAULTS | {"deterministic": det}))
                r[f"{key}_deterministic_{det}_fill_{fill}"] = sec
                print(name, f"{key}, deterministic={det}, fill_uninitialized_memory={fill}: {sec:.2f} s", flush=True)
        torch.utils.deterministic.fill_uninitialized_memory = True


def derive_probe(n: int, dev: str, out: dict, widths=(512, 768), block: int = 4096) -> None:
    """Each part of deriving U on the device, and the block GEMM, best of 3."""
    import torch

    def best(fn, k: int = 3) -> float:
        fn()  # warm-up: kernels chosen, workspaces grown
        return min(timed(dev, fn)[1] for _ in range(k))

    g = torch.Generator(device="cpu").manual_seed(0)
    for d in widths:
        A = torch.randn(n, d, generator=g, dtype=torch.float64).to(dev)
        Q, R = torch.linalg.qr(A)
        r = out[f"d{d}"] = {"qr": best(lambda: torch.linalg.qr(A)),
                            "q_times_w": best(lambda: Q @ R)}
        for driver in ((None, "gesvd", "gesvdj", "gesvda") if dev.startswith("cuda") else (None,)):
            kw = {"driver": driver} if driver else {}
            r[f"svd_R_{driver or 'default'}"] = best(lambda: torch.linalg.svd(R, **kw))
        Rh = R.cpu().numpy()
        r["svd_R_numpy_host"] = best(lambda: np.linalg.svd(Rh))
        r["svd_R_via_host_and_back"] = best(lambda: [torch.from_numpy(x).to(dev) for x in np.linalg.svd(R.cpu().numpy())])
        r["eigh_RtR"] = best(lambda: torch.linalg.eigh(R.T @ R))
        if dev.startswith("cuda"):  # as the step's upload does: pinned, then over the bus
            Ah = A.cpu().numpy()
            r["upload_A"] = best(lambda: torch.from_numpy(Ah).pin_memory().to(dev))
        print(f"derive d={d}", json.dumps({k: round(v, 4) for k, v in r.items()}), flush=True)
    W = torch.randn(n, block, generator=g, dtype=torch.float64).to(dev)
    s = best(lambda: W.T @ W)
    out["block_gemm"] = {"seconds": s, "gflop_per_s": 2 * n * block * block / s / 1e9}
    print("block GEMM", json.dumps(out["block_gemm"]), flush=True)
    sync(dev)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="n = 200, tiny models: a CPU smoke run")
    ap.add_argument("--sentences", default=str(ROOT / "data/sentences/default.txt"))
    ap.add_argument("--minilm", default=None)
    ap.add_argument("--parts", default="embed,derive")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", default="minilm-l6,bert-base-random")
    ap.add_argument("--keys", default="all_variants,output_only", help="which passes to profile")
    ap.add_argument("--no-determinism", action="store_true", help="skip the determinism settings' timings")
    ap.add_argument("--top", type=int, default=14, help="functions listed per profile and order")
    a = ap.parse_args(argv)
    import torch

    from encmap.io import read_sentences

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    n = 200 if a.small else 10_000
    res: dict = {"card": torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "cpu", "n": n,
                 "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    minilm = Path(a.minilm) if a.minilm else minilm_path()
    with tempfile.TemporaryDirectory(prefix="gpu-probe-") as tmp:
        if "derive" in a.parts:
            derive_probe(n, dev, res.setdefault("derive", {}), widths=(64, 96) if a.small else (512, 768),
                         block=256 if a.small else 4096)
        if "embed" in a.parts:
            embed_probe(read_sentences(Path(a.sentences))[:n], dev, Path(tmp), a.small, minilm,
                        res.setdefault("embed", {}), models_wanted=tuple(a.models.split(",")),
                        keys=tuple(a.keys.split(",")), determinism=not a.no_determinism, top=a.top)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
