"""What costs encmap's regression accuracy against a plain protocol on the same artifacts (issue 65).

The plain protocol (what a user writes with scikit-learn alone): StandardScaler, then ``RidgeCV``
over 17 alphas 1e-3..1e5 (its efficient leave-one-out choice of alpha, no PCA), on the spectrum's
head (ln of the 32 largest normalised eigenvalues, the entropy, ln rank, the effective rank
exp(entropy)), the regression's own outer folds (model held out: ``grouped``; family held out:
``family``), Spearman of the pooled out-of-fold predictions. Each ablation changes ONE thing of
it towards what encmap did before issue 65 (columns, eigenvalue scale, alpha grid, how alpha is
chosen, a PCA in front), and the last rows are encmap's own regressors as the regress stage runs
them (``encmap.downstream.regression.cross_predict``) under the run's params and under the
params of this branch.

    python benchmarks/bench_predictor.py RUN                  # RUN: project root of a finished run
    python benchmarks/bench_predictor.py RUN --out bench.json

Reads only: RUN/params.yaml, RUN/results/features/qre.h5, RUN/results/eval/<model>/ (the scores, as
the regress stage reads them) and the PIP artifacts' eigenvalues (for the raw-eigenvalue ablation).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml
from bench_head import spectra

from encmap.artifacts.features import read_feature_matrix
from encmap.downstream.prediction import families_of, read_eval_scores, score_matrix
from encmap.downstream.regression import (MIN_GROUPS, cross_predict, join_blocks, outer_splits, prediction_quality,
                                          predictor_blocks)
from encmap.qre.spectral import spectral_head

PROTOCOLS = ("grouped", "family")
PLAIN_ALPHAS = np.logspace(-3, 5, 17)


def plain_predict(X: np.ndarray, y: np.ndarray, splits: list[tuple], alphas=PLAIN_ALPHAS,
                  pca: int | None = None) -> np.ndarray:
    """StandardScaler -> [PCA(pca)] -> RidgeCV(alphas) (efficient LOO) over the outer splits."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    pred = np.full(len(y), np.nan)
    for train, test in splits:
        steps = [StandardScaler()] + ([PCA(n_components=min(pca, len(train), X.shape[1]), random_state=0)]
                                      if pca else []) + [RidgeCV(alphas=alphas)]
        pred[test] = make_pipeline(*steps).fit(X[train], y[train]).predict(X[test])
    return pred


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="project root of a finished run (read only)")
    ap.add_argument("--params", type=Path, default=Path(__file__).parents[1] / "params.yaml",
                    help="this branch's params.yaml (its regress section: the product's rows)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    root = a.run.resolve()
    # The run's regress section as encmap fitted it before issue 65: ridge's alpha by the inner grouped CV.
    run_params = yaml.safe_load((root / "params.yaml").read_text())["regress"] | {"ridge_alpha_cv": "grouped"}
    new_params = yaml.safe_load(a.params.read_text())["regress"]
    seed = int(run_params["seed"])
    fm = read_feature_matrix(root / "results/features/qre.h5")
    F, ids, records, sp = fm["F"], fm["ids"], fm["records"], fm["spectral"]
    eval_dirs = sorted(str(d) for d in (root / "results/eval").iterdir() if d.is_dir())
    by_encoder, tasks = read_eval_scores(eval_dirs, fm["attrs"]["sentences_sha256"])
    Y = score_matrix(ids, by_encoder, tasks)
    specs = spectra(root, records, F.shape[1])
    eps = float(fm["attrs"]["eps"])
    head = np.array([spectral_head(s, eps=eps) for s in specs])  # ln μ of ρ_ε: normalised (sum 1)
    np.testing.assert_allclose(head, sp["head"], rtol=1e-12)  # the matrix's own head
    raw = head + np.log([[s.trace] for s in specs])  # ln of the PIP's own eigenvalues (trace kept)
    ent, lr = sp["entropy"][:, None], sp["log_rank"][:, None]
    cols = {"plain": np.hstack([head, ent, lr, np.exp(ent)]), "product head": np.hstack([head, ent, lr]),
            "raw": np.hstack([raw, ent, lr, np.exp(ent)])}
    cols["branch"], w_branch = join_blocks(predictor_blocks(new_params["predictor"], F, sp))
    labels = {"grouped": np.array([r["model"] for r in records]), "family": np.array(families_of(records))}
    grid17 = {"ridge_alphas": [float(x) for x in PLAIN_ALPHAS]}
    variants = {  # name -> (columns, predict(X, y, g, splits, protocol))
        "plain (head+eff.rank, RidgeCV LOO, 17 alphas)": ("plain", lambda X, y, g, s, p: plain_predict(X, y, s)),
        "- effective-rank column (product's head)": ("product head", lambda X, y, g, s, p: plain_predict(X, y, s)),
        "raw eigenvalues ln(lambda*trace)": ("raw", lambda X, y, g, s, p: plain_predict(X, y, s)),
        "product's 8 alphas 1e-2..1e5": ("plain", lambda X, y, g, s, p: plain_predict(
            X, y, s, alphas=run_params["ridge_alphas"])),
        "alpha by inner grouped 3-fold CV": ("plain", lambda X, y, g, s, p: cross_predict(
            "ridge", X, y, g, s, p, run_params | grid17, seed)),
        "PCA(16) in front": ("plain", lambda X, y, g, s, p: plain_predict(X, y, s, pca=16)),
        "PCA(8) in front": ("plain", lambda X, y, g, s, p: plain_predict(X, y, s, pca=8)),
        "encmap before: head, ridge (run's params)": ("product head", lambda X, y, g, s, p: cross_predict(
            "ridge", X, y, g, s, p, run_params, seed)),
        "encmap before: head, elasticnet (run's params)": ("product head", lambda X, y, g, s, p: cross_predict(
            "elasticnet", X, y, g, s, p, run_params, seed)),
        "encmap now: its predictor, ridge (branch params)": ("branch", lambda X, y, g, s, p: cross_predict(
            "ridge", X, y, g, s, p, new_params, seed, w_branch)),
        "encmap now: its predictor, elasticnet (branch params)": ("branch", lambda X, y, g, s, p: cross_predict(
            "elasticnet", X, y, g, s, p, new_params, seed, w_branch)),
    }
    res: dict = {"m": len(ids), "tasks": tasks, "models": len(set(labels["grouped"])),
                 "families": len(set(labels["family"])), "rows": {}}
    print(f"{len(ids)} encoders, {res['models']} models, {res['families']} families, {len(tasks)} tasks")
    print(f"{'variant':50s} " + " ".join(f"{p:>8s}" for p in PROTOCOLS) + "  per task (grouped)   s")
    for name, (c, predict) in variants.items():
        t0 = time.perf_counter()
        row = {}
        for protocol in PROTOCOLS:
            if len(np.unique(labels[protocol])) < MIN_GROUPS:
                continue
            per = {}
            for t, task in enumerate(tasks):
                have = np.flatnonzero(np.isfinite(Y[:, t]))
                g = labels[protocol][have]
                splits = outer_splits(g, protocol, run_params, seed)
                pred = predict(cols[c][have], Y[have, t], g, splits, protocol)
                per[task] = prediction_quality(Y[have, t], pred)["spearman"]
            row[protocol] = {"mean": float(np.nanmean(list(per.values()))), "per_task": per}
        row["seconds"] = time.perf_counter() - t0
        res["rows"][name] = row
        print(f"{name:50s} " + " ".join(f"{row[p]['mean']:+8.3f}" for p in PROTOCOLS if p in row) + "  "
              + " ".join(f"{v:+.2f}" for v in row["grouped"]["per_task"].values()) + f"  {row['seconds']:.1f}",
              flush=True)
    print("tasks: " + ", ".join(tasks))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
