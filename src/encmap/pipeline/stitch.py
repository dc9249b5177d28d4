"""Step of rule ``stitch``: stitches (maps from one embedding space to another) between the encoders
of ``similarity.subset``, judged on held-out sentences.

Each stitch row stores both encoders' fingerprints and the file a code/params key, so a rerun
refits only pairs that involve a changed encoder.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..artifacts.embeddings import read_embeddings
from ..artifacts.features import left_off, read_feature_matrix
from ..artifacts.paircache import code_key
from ..artifacts.stitches import stitch_label
from ..device import job_device
from ..io import atomic_write_json, atomic_write_text, csv_table
from ..sampling import sample_rows
from ..similarity.stitch import COLUMNWISE, fit_predict, judged, split_rows
from ..similarity.subset import select_group, subset_on_map, subset_pairs
from ..validation import EncmapError


def stitch_step(features: str, emb_dirs: list[str], out: dict[str, str], *, subset: dict[str, Any],
                stitch: dict[str, Any], threads: int | None = None, code: str) -> None:
    """Stitches between every two encoders of the configured subset, both ways.

    ``out`` names ``stitches`` (JSON: one record per source, target, method and MLP depth, with
    the encoders' fingerprints), ``csv`` (the same table) and ``timing``. ``subset``, ``stitch``:
    those parts of params.yaml's ``similarity``. Everything is computed before the first file is written.

    ``code``: the hash of the stage's code digest (its rule passes it), part of the key under
    which stored pairs are reused.
    """
    fm = read_feature_matrix(features)
    subset, notes = subset_on_map(subset, fm["ids"], left_off(fm["attrs"]))
    print("".join(f"warning: {note}\n" for note in notes), end="", file=sys.stderr)
    ids, pairs = subset_pairs(fm["records"], fm["F"], subset)
    n = int(fm["F"].shape[1])
    X, fps = read_embeddings(emb_dirs, ids, {r["id"]: r for r in fm["records"]}, fm["attrs"]["sentences_sha256"], n)
    t0 = time.perf_counter()
    # MLP stitches train on a GPU of their own on a CUDA machine; linear ones are NumPy on the CPU,
    # so a job with only linear stitches resolves no device (which would import torch: ~1.3 s of CPU).
    on = job_device(stitch["device"], gpu=True, what="stitch") if stitch["mlp_depths"] else nullcontext("cpu")
    with on as dev:
        table, info = _stitch_pairs(X, ids, fps, pairs, fm["records"], stitch, out["stitches"], threads, code, dev)
    seconds = time.perf_counter() - t0
    atomic_write_json(out["stitches"], {k: info[k] for k in ("key", "params", "sentences", "split")}
                      | {"rows": table, "checksum": rows_checksum(table, info["key"])})
    atomic_write_text(out["csv"], stitch_csv(table))
    atomic_write_json(out["timing"], {"stitch_seconds": round(seconds, 3), "stitch_pairs": len(pairs)}
                      | {k: info[k] for k in ("stitch_pairs_computed", "device", "fits", "fit_seconds")})


def _previous_stitches(path: str, key: str) -> dict[tuple[str, str], list[dict]]:
    """Stored stitch rows by (source, target), if computed by the same code and params."""
    if not Path(path).exists():
        return {}
    try:
        prev = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        print(f"not reusing {path}: not valid JSON ({e})", file=sys.stderr)
        return {}
    if prev.get("key") != key:
        print(f"not reusing {path}: computed by other code or params", file=sys.stderr)
        return {}
    if prev.get("checksum") != rows_checksum(prev.get("rows"), key):
        print(f"not reusing {path}: its rows do not match their checksum (edited after it was written?); "
              "refitting every stitch", file=sys.stderr)
        return {}
    old: dict[tuple[str, str], list[dict]] = {}
    for r in prev["rows"]:
        old.setdefault((r["source"], r["target"]), []).append(r)
    return old


def rows_checksum(rows: list[dict] | None, key: str) -> str:
    """sha256 of the stitch rows (as JSON) and the reuse key: an edited row is never reused."""
    import hashlib

    return hashlib.sha256((key + "\0" + json.dumps(rows, sort_keys=True)).encode()).hexdigest()


def _stitch_pairs(X: dict[str, np.ndarray], ids: list[str], fps: list[str], pairs: list[tuple[str, str]],
                  records: list[dict], st: dict, stored: str, threads: int | None, code: str,
                  dev: str) -> tuple[list[dict], dict]:
    """Every stitch of every ordered pair (reusing stored rows of unchanged pairs), in pair order.

    Returns the table rows and ``info`` (key, params, sample and split sizes, pairs computed,
    device, fits and seconds per method).
    """
    key = code_key(code, st | {"device_kind": dev.split(":")[0]})
    fp = dict(zip(ids, fps))
    old = _previous_stitches(stored, key)
    srows = sample_rows(X[ids[0]].shape[0], st["sample"], np.random.default_rng([st["seed"], 0]))
    split = split_rows(len(srows), val=st["val"], test=st["test"], random_state=st["seed"])
    mlp_ok = {e for g in st["mlp_groups"] for e in select_group(records, g)} if st["mlp_depths"] else set()
    results: dict[tuple[str, str], list[dict]] = {}
    todo_pairs = []
    for a, b in pairs:
        prev_rows = old.get((a, b), [])
        if prev_rows and all(r["source_sha256"] == fp[a] and r["target_sha256"] == fp[b] for r in prev_rows):
            results[(a, b)] = prev_rows
        else:
            todo_pairs.append((a, b))
    fits: dict[str, int] = {}
    seconds: dict[str, float] = {}

    def fit(a: str, targets: list[str], method: str, depth: int | None = None) -> None:
        """One fit from a to the targets stacked (COLUMNWISE methods) or to one target."""
        t = time.perf_counter()
        Y = np.hstack([X[b][srows] for b in targets])
        with threadpool_limits(threads):
            try:
                P, extra = fit_predict(X[a][srows], Y, method, split, depth=depth or 0, alphas=st["ridge_alphas"],
                                       random_state=st["seed"], device=dev, mlp=st["mlp"])
            except EncmapError as e:
                raise EncmapError(f"stitch {a} -> {', '.join(targets)} ({stitch_label(method, depth)}): {e}") from None
            cut = np.cumsum([0] + [X[b].shape[1] for b in targets])
            for b, lo, hi in zip(targets, cut[:-1], cut[1:]):
                part = {"coef": extra["coef"][:, lo:hi]} if method == "affine" else {}
                if "alpha" in extra:
                    part["alpha"] = extra["alpha"][lo:hi]
                res = judged(Y[split.test, lo:hi], P[:, lo:hi], part, k=st["knn_k"])
                results.setdefault((a, b), []).append(_stitch_row(a, b, method, depth, res, fp))
        label = stitch_label(method, depth)
        fits[label] = fits.get(label, 0) + 1
        seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - t

    for a in ids:
        targets = [b for s, b in todo_pairs if s == a]
        for method in st["methods"] if targets else ():
            if method in COLUMNWISE:  # one factorisation of the source serves every target
                fit(a, targets, method)
            else:
                for b in targets:
                    fit(a, [b], method)
        for b in targets:
            for depth in st["mlp_depths"] if a in mlp_ok and b in mlp_ok else ():
                fit(a, [b], "mlp", depth)
    order = {lab: i for i, lab in enumerate([*st["methods"], *(f"mlp{d}" for d in st["mlp_depths"])])}
    table = [r for p in pairs for r in sorted(results[p], key=lambda r: order[stitch_label(r["method"], r["depth"])])]
    info = {"key": key, "params": st, "sentences": len(srows),
            "split": {"train": len(split.train), "val": len(split.val), "test": len(split.test)},
            "stitch_pairs_computed": len(todo_pairs), "device": dev, "fits": fits,
            "fit_seconds": {k: round(v, 3) for k, v in seconds.items()}}
    return table, info


#: Columns of the stitch table, in order.
STITCH_COLUMNS = ("source", "target", "method", "depth", "r2", "r2_weighted", "mse", "mae", "cosine",
                  "knn_overlap", "constant_dims", "alpha", "sigma_max", "sigma_min", "effective_rank")


def _stitch_row(a: str, b: str, method: str, depth: int | None, res: dict, fp: dict[str, str]) -> dict:
    sv = np.asarray(res.get("singular_values", []), dtype=np.float64)
    knn = next(v for key, v in res.items() if key.startswith("knn"))
    row = {"source": a, "target": b, "method": method, "depth": depth,
           "r2": res["r2"], "r2_weighted": res["r2_weighted"], "mse": res["mse"], "mae": res["mae"],
           "cosine": res["cosine"], "knn_overlap": knn, "constant_dims": res["constant_dims"],
           "alpha": res.get("alpha")}
    if sv.size:
        p = sv ** 2 / (sv ** 2).sum()
        row |= {"sigma_max": float(sv[0]), "sigma_min": float(sv[-1]),
                "effective_rank": float(np.exp(-(p[p > 0] * np.log(p[p > 0])).sum()))}
    else:
        row |= {"sigma_max": None, "sigma_min": None, "effective_rank": None}
    # Every singular value of the affine map (descending) goes to the JSON; the CSV keeps the summary.
    row["singular_values"] = sv.tolist() if sv.size else None
    return row | {"source_sha256": fp[a], "target_sha256": fp[b]}


def stitch_csv(rows: list[dict]) -> str:
    """The stitch table as CSV (floats in shortest round-trip form, empty where not applicable)."""
    return csv_table(rows, list(STITCH_COLUMNS))
