"""How far a prompt moves an encoder on the map: the same model with another prompt, against the
distances between the map's encoders.

For each (model, prompt variant) it embeds the run's sentence set with the variant's spec (the
model's params entry with its prompt or mode changed), factors it and computes its QRE features
with the run's own settings (as ``encmap place`` does), and reports the ℓ1 feature distance and
the symmetrised exact QRE to the model's encoder on the map, with the rank of that distance among
the encoder's distances to every other map encoder (1 = nearer than every other encoder).

    python benchmarks/bench_prompts.py RUN_DIR --json prompts.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml

#: (model on the map, its encoder, what changes in the spec, a name for the variant)
VARIANTS = [
    ("e5-small", "e5-small__out", {"mode": "query"}, "E5 with 'query: ' (the map: 'passage: ')"),
    ("minilm-l6", "minilm-l6__out", {"prompt": "query: "}, "all-MiniLM-L6-v2 with 'query: ' (the map: bare)"),
    ("minilm-l6", "minilm-l6__out", {"prompt": "passage: "}, "all-MiniLM-L6-v2 with 'passage: '"),
    ("mpnet-base", "mpnet-base__out", {"prompt": "Represent this sentence for searching relevant passages: "},
     "all-mpnet-base-v2 with a BGE-style instruction"),
]


def main() -> None:
    from threadpoolctl import threadpool_limits

    from encmap.artifacts.features import read_feature_matrix
    from encmap.artifacts.pip import as_stored, load_spectrum
    from encmap.encoders.embed import embed_model
    from encmap.io import read_curated, read_h5
    from encmap.workflow.layout import LAYOUT
    from encmap.maps.distances import feature_distances, symmetrised_qre
    from encmap.qre.features import qre_features
    from encmap.qre.pairwise import pairwise_qre_matrix
    from encmap.qre.spectrum import factor_pip, prepare_embeddings

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run of the default params")
    ap.add_argument("--json")
    args = ap.parse_args()
    root = args.run
    params = yaml.safe_load((root / "params.yaml").read_text())  # the run's own params, as it ran
    fm = read_feature_matrix(root / "results/features/qre.h5")
    texts, _ = read_curated(root / f"data/sentences/{params['sentences']['set']}.txt", params["sentences"]["n"])
    eps, direction = float(fm["attrs"]["eps"]), str(fm["attrs"]["direction"])
    spectra = {r["id"]: load_spectrum(root / LAYOUT["pip"].format(model=r["model"], encoder=r["id"]))[0]
               for r in fm["records"]}
    L = feature_distances(fm["F"])
    ids = fm["ids"]
    S = symmetrised_qre(read_h5(root / "results/similarity/qre_pairwise.h5", ["qre"])[0]["qre"])
    rows = []
    for model, enc, change, name in VARIANTS:
        spec = params["models"][model] | change
        first = fm["records"][ids.index(enc)]
        _, pattrs = read_h5(root / LAYOUT["pip"].format(model=model, encoder=enc), [])
        res = embed_model(model, spec, texts, "cpu", threads=2, degenerate="error")
        with threadpool_limits(1, user_api="blas"):
            E = prepare_embeddings(res.arrays[enc], center=bool(pattrs["center"]),
                                   normalize_rows=bool(pattrs["normalize_rows"]), name=enc)
            s = as_stored(factor_pip(E, tol=float(pattrs["tol"]), name=enc), E)
            f = qre_features(s, direction=direction, eps=eps)
        i = ids.index(enc)
        l1 = float(np.abs(f - fm["F"][i]).sum())
        q = float(symmetrised_qre(pairwise_qre_matrix([s, spectra[enc]], eps=eps))[0, 1])
        others_l1 = np.delete(L[i], i)
        others_q = np.delete(S[i], i)
        rows.append({"variant": name, "encoder": enc, "model_kind": first["meta"]["kind"],
                     "l1": l1, "l1_rank": int(1 + (others_l1 < l1).sum()), "l1_nearest_other": float(others_l1.min()),
                     "l1_median_other": float(np.median(others_l1)),
                     "exact_qre": q, "exact_qre_rank": int(1 + (others_q < q).sum()),
                     "exact_qre_nearest_other": float(others_q.min()), "exact_qre_median_other": float(np.median(others_q))})
        print(json.dumps(rows[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
