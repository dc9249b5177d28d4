"""How far half precision moves a model's encoders, QRE features and pairwise QRE from float32.

    python benchmarks/bench_precision.py --n 1000 [--model minilm-l6] [--device auto]

Embeds the same n curated-style sentences with one model of params.yaml (every layer x pooling,
its output and truncations) in float32, bfloat16 and float16, and reports, per dtype, relative
to float32: the embeddings' relative Frobenius deviation, the QRE features' relative L2
deviation (median and max over encoders), and the pairwise QRE matrix's relative deviation and
Spearman rank correlation over its off-diagonal entries (what the map is made of).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import spearmanr

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    from bench_multivariant import sentences

    from encmap.device import resolve_device
    from encmap.encoders.embed import embed_model
    from encmap.qre.features import qre_features
    from encmap.qre.pairwise import pairwise_qre_matrix

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    spec = yaml.safe_load((REPO / "params.yaml").read_text())["models"][args.model]
    eps = 1e-6
    texts = sentences(args.n)
    device = resolve_device(args.device)
    runs = {}
    for dtype in ("float32", "bfloat16", "float16"):
        t = time.perf_counter()
        res = embed_model(args.model, spec | {"dtype": dtype}, texts, device)
        arrays = {e: np.asarray(a, dtype=np.float64) for e, a in sorted(res.arrays.items())}
        feats = {e: qre_features(a, eps=eps) for e, a in arrays.items()}
        pw = pairwise_qre_matrix(list(arrays.values()), eps=eps)
        runs[dtype] = {"arrays": arrays, "features": feats, "pairwise": pw, "seconds": time.perf_counter() - t}
    ref = runs["float32"]
    off = ~np.eye(len(ref["arrays"]), dtype=bool)
    report = {"model": args.model, "n": args.n, "encoders": len(ref["arrays"]), "device": device}
    for dtype in ("bfloat16", "float16"):
        r = runs[dtype]
        emb = [np.linalg.norm(r["arrays"][e] - a) / np.linalg.norm(a) for e, a in ref["arrays"].items()]
        fea = [np.linalg.norm(r["features"][e] - f) / np.linalg.norm(f) for e, f in ref["features"].items()]
        p, q = ref["pairwise"][off], r["pairwise"][off]
        report[dtype] = {
            "embeddings_rel_dev_median": float(np.median(emb)), "embeddings_rel_dev_max": float(np.max(emb)),
            "features_rel_dev_median": float(np.median(fea)), "features_rel_dev_max": float(np.max(fea)),
            "pairwise_rel_dev_median": float(np.median(np.abs(q - p) / np.abs(p))),
            "pairwise_rel_dev_max": float(np.max(np.abs(q - p) / np.abs(p))),
            "pairwise_spearman": float(spearmanr(p, q).statistic),
            "seconds_vs_float32": r["seconds"] / ref["seconds"],
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
