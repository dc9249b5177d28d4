"""How much of the map comes from the spectra alone: exact pairwise QRE and linear CKA against
nulls that keep each encoder's spectrum (or only its width) and randomise the rest.

On a finished run: every encoder's factored PIP (``results/pip``) gives its spectrum. The
**random-eigenvector null** keeps each encoder's eigenvalues and replaces its eigenvectors by
seeded Haar-random orthonormal ones (``encmap.qre.spectral.random_eigenvectors``), then
recomputes exact pairwise QRE; reported: the rank correlation (Spearman) of the symmetrised
null QRE with the real one, and the nearest-neighbour purities (model, family) of both. For
CKA: linear CKA of the real embeddings against two nulls: the same random-eigenvector one
(the CKA of two spectra with unrelated eigenvectors) and a **width-matched** one (isotropic
Gaussian embeddings of each encoder's width), the Spearman of the real CKA with each, and of
real CKA with the widths' log ratio.

    python benchmarks/bench_spectral_null.py RUN_DIR --seeds 3 --json null.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from scipy.stats import spearmanr

    from encmap.artifacts.features import read_feature_matrix
    from encmap.artifacts.pip import load_spectrum
    from encmap.workflow.layout import LAYOUT
    from encmap.maps.distances import symmetrised_qre
    from encmap.maps.faithfulness import neighbour_purity
    from encmap.maps.fields import field_values
    from encmap.io import read_h5
    from encmap.qre.pairwise import pairwise_qre_matrix
    from encmap.qre.spectral import random_eigenvectors
    from encmap.similarity.cka import linear_cka_matrix

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run")
    ap.add_argument("--seeds", type=int, default=3, help="null draws (each a full pairwise QRE)")
    ap.add_argument("--json")
    args = ap.parse_args()
    root = args.run
    fm = read_feature_matrix(root / "results/features/qre.h5")
    eps = float(fm["attrs"]["eps"])
    specs = [load_spectrum(root / LAYOUT["pip"].format(model=r["model"], encoder=r["id"]))[0] for r in fm["records"]]
    vals = [field_values(r) for r in fm["records"]]
    model, family = [v["model"] for v in vals], [v["family"] for v in vals]
    pretrained = np.array([v["kind"] == "pretrained" for v in vals])
    real_q = symmetrised_qre(read_h5(root / "results/similarity/qre_pairwise.h5", ["qre"])[0]["qre"])
    real_c = read_h5(root / "results/similarity/cka.h5", ["cka"])[0]["cka"]
    iu = np.triu_indices(len(specs), 1)
    widths = np.array([int(r["d"]) for r in fm["records"]], dtype=float)
    log_ratio = np.abs(np.log(widths[:, None] / widths[None, :]))

    def purity(D) -> dict:
        return {"model": neighbour_purity(D, model)["purity"], "family": neighbour_purity(D, family)["purity"],
                "model_pretrained": neighbour_purity(D, model, among=pretrained)["purity"]}

    out = {"encoders": len(specs), "eps": eps, "real": {"qre_purity": purity(real_q),
           "cka_vs_width_log_ratio_spearman": float(spearmanr(real_c[iu], -log_ratio[iu]).statistic)}}
    draws = []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        null = [random_eigenvectors(s, 1000 * seed + i) for i, s in enumerate(specs)]
        q = symmetrised_qre(pairwise_qre_matrix(null, eps=eps))
        # Null CKA: embeddings U diag(sqrt(λ)) of the null spectra (CKA depends on E only through
        # its centred PIP; the spectra here are of the stored, uncentred PIP).
        c_null = linear_cka_matrix([s.U * np.sqrt(s.lam) for s in null])[0]
        rng = np.random.default_rng(seed)
        c_width = linear_cka_matrix([rng.standard_normal((s.n, int(w))) for s, w in zip(specs, widths)])[0]
        draws.append({"seed": seed, "seconds": round(time.perf_counter() - t0, 1),
                      "qre_spearman_with_real": float(spearmanr(q[iu], real_q[iu]).statistic),
                      "qre_purity": purity(q),
                      "cka_spectrum_null_spearman_with_real": float(spearmanr(c_null[iu], real_c[iu]).statistic),
                      "cka_width_null_spearman_with_real": float(spearmanr(c_width[iu], real_c[iu]).statistic),
                      "cka_real_mean": float(real_c[iu].mean()), "cka_spectrum_null_mean": float(c_null[iu].mean()),
                      "cka_width_null_mean": float(c_width[iu].mean())})
        print(json.dumps(draws[-1]))
    out["null"] = draws
    print(json.dumps(out["real"]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
