"""Why the spectrum's head predicts the scores: which part of it carries the prediction, and
whether the forward QRE features hold the same information (issue 43).

On a finished run (its ``results/features/qre.h5``, ``results/regression/scores.csv`` and the PIP
artifacts' eigenvalues), every candidate predictor goes through the regression's own protocol
(:func:`encmap.downstream.regression.cross_predict`: the same outer folds, inner CV, both
regressors; a one-column set with ridge only), with a model held out (``grouped``) and a family
held out (``family``); the figure is the mean out-of-fold Spearman over the tasks.

- ``qre``, ``profile``, ``head`` (32 log eigenvalues + entropy + log rank: the predictor),
  ``qre+head``: as the regression stage compares them;
- parts of the head: the top 1, 8, 16, 32 and 64 log eigenvalues alone; the decay slope and
  level (a line fitted to ln μ against ln rank over the top 32); the log rank; the log width;
  the entropy;
- overlap: how much of each head summary the features predict linearly (ridge from F, grouped
  out-of-fold R²): what the features' sum (ln n − S) leaves of the head in them.

    python benchmarks/bench_head.py RUN            # RUN: the project root of a finished run
    python benchmarks/bench_head.py RUN --out docs/head.json
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import yaml

from encmap.artifacts.features import read_feature_matrix
from encmap.downstream.prediction import families_of
from encmap.downstream.regression import MIN_GROUPS, cross_predict, join_blocks, outer_splits, prediction_quality
from encmap.io import read_h5
from encmap.qre.spectral import spectral_head, spectral_profile, von_neumann_entropy
from encmap.qre.spectrum import Spectrum
from encmap.workflow.layout import LAYOUT

PROTOCOLS = ("grouped", "family")


def spectra(root: Path, records: list[dict], n: int) -> list[Spectrum]:
    """Each encoder's eigenvalues from its PIP artifact (U is not needed: a zero-stride stand-in)."""
    out = []
    for r in records:
        data, attrs = read_h5(root / LAYOUT["pip"].format(model=r["model"], encoder=r["id"]), ["lam"])
        out.append(Spectrum(U=np.broadcast_to(0.0, (n, data["lam"].shape[0])), lam=data["lam"],
                            trace=float(attrs["trace"])))
    return out


def candidates(F: np.ndarray, specs: list[Spectrum], records: list[dict], eps: float) -> dict[str, list[np.ndarray]]:
    """Every predictor compared, as blocks (m, p)."""
    head64 = np.array([spectral_head(s, eps=eps, points=64) for s in specs])
    entropy = np.array([[von_neumann_entropy(s, eps=eps)] for s in specs])
    log_rank = np.array([[np.log(s.rank)] for s in specs])
    width = np.array([[np.log(float(r["d"]))] for r in records])
    profile = np.array([spectral_profile(s, eps=eps) for s in specs])
    x = np.log(np.arange(1, 33))
    slope, level = np.polyfit(x, head64[:, :32].T, 1)  # ln μ_k ≈ level + slope ln k over the top 32
    head = np.hstack([head64[:, :32], entropy, log_rank])
    return {"qre": [F], "profile": [profile], "head": [head], "qre+head": [F, head],
            "top 1": [head64[:, :1]], "top 8": [head64[:, :8]], "top 16": [head64[:, :16]],
            "top 32": [head64[:, :32]], "top 64": [head64], "slope+level": [np.c_[slope, level]],
            "slope": [slope[:, None]], "log rank": [log_rank], "log width": [width], "entropy": [entropy]}


def scores(path: Path, ids: list[str]) -> tuple[np.ndarray, list[str]]:
    """The regression's score table (encoders in the feature matrix's order)."""
    rows = {r["encoder"]: r for r in csv.DictReader(path.open())}
    tasks = [k for k in next(iter(rows.values())) if k not in ("encoder", "model")]
    Y = np.array([[float(rows[e][t]) if rows[e][t] not in ("", "nan") else np.nan for t in tasks] for e in ids])
    return Y, tasks


def evaluate(blocks: list[np.ndarray], Y: np.ndarray, labels: dict[str, np.ndarray], params: dict,
             seed: int) -> dict[str, dict[str, dict[str, float]]]:
    """Out-of-fold Spearman per protocol x regressor x task (both regressors; ridge for one column)."""
    X, w = join_blocks(blocks)
    regs = ("ridge",) if X.shape[1] == 1 else ("ridge", "elasticnet")
    out: dict = {}
    for protocol in PROTOCOLS:
        if len(np.unique(labels[protocol])) < MIN_GROUPS:  # as the regression stage: left out
            continue
        for reg in regs:
            per_task = {}
            for t in range(Y.shape[1]):
                have = np.flatnonzero(np.isfinite(Y[:, t]))
                g = labels[protocol][have]
                splits = outer_splits(g, protocol, params, seed)
                pred = cross_predict(reg, X[have], Y[have, t], g, splits, protocol, params, seed, w)
                per_task[t] = prediction_quality(Y[have, t], pred)["spearman"]
            out.setdefault(protocol, {})[reg] = per_task
    return out


def overlap(F: np.ndarray, targets: dict[str, np.ndarray], groups: np.ndarray, params: dict, seed: int) -> dict:
    """Out-of-fold R² (grouped) of ridge from the features to each head summary."""
    out = {}
    splits = outer_splits(groups, "grouped", params, seed)
    for name, y in targets.items():
        pred = cross_predict("ridge", F, y, groups, splits, "grouped", params, seed)
        out[name] = float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="project root of a finished run")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    root = a.run.resolve()
    reg = yaml.safe_load((root / "params.yaml").read_text())["regress"]  # the run's own protocol settings
    fm = read_feature_matrix(root / "results/features/qre.h5")
    F, ids, records = fm["F"], fm["ids"], fm["records"]
    eps = float(fm["attrs"]["eps"])
    specs = spectra(root, records, F.shape[1])
    Y, tasks = scores(root / "results/regression/scores.csv", ids)
    labels = {"grouped": np.array([r["model"] for r in records]), "family": np.array(families_of(records))}
    sets = candidates(F, specs, records, eps)
    res: dict = {"m": len(ids), "n": int(F.shape[1]), "tasks": tasks, "models": len(set(labels["grouped"])),
                 "families": len(set(labels["family"])), "sets": {}}
    for name, blocks in sets.items():
        r = evaluate(blocks, Y, labels, reg, int(reg["seed"]))
        res["sets"][name] = {p: {g: {"mean": float(np.nanmean(list(v.values()))),
                                     "per_task": {tasks[t]: s for t, s in v.items()}} for g, v in by.items()}
                             for p, by in r.items()}
        line = "  ".join(f"{p} {g} {res['sets'][name][p][g]['mean']:+.3f}" for p in res["sets"][name]
                         for g in res["sets"][name][p])
        print(f"{name:12s} {line}", flush=True)
    head = sets["head"][0]
    slope = sets["slope"][0][:, 0]
    targets = {"ln mu_1": head[:, 0], "ln mu_8": head[:, 7], "ln mu_32": head[:, 31], "slope": slope,
               "entropy": head[:, 32], "log rank": head[:, 33]}
    res["features_predict_head_r2"] = overlap(F, targets, labels["grouped"], reg, int(reg["seed"]))
    print("R² of the features -> head summary (grouped, ridge):",
          json.dumps({k: round(v, 3) for k, v in res["features_predict_head_r2"].items()}), flush=True)
    for t in tasks:
        q = res["sets"]["qre"]["grouped"]["ridge"]["per_task"][t]
        h = res["sets"]["head"]["grouped"]["ridge"]["per_task"][t]
        print(f"  {t:28s} grouped ridge: qre {q:+.3f}  head {h:+.3f}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
