"""Similarity steps: all-pairs QRE and linear CKA, RBF CKA and stitches on a subset, agreement.

Each pair step stores one fingerprint per encoder and a code/params key beside its results
(:mod:`.paircache`), so a rerun recomputes only the pairs that involve a changed encoder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..io import atomic_write_json, atomic_write_text, read_h5, write_h5
from ..validation import EncmapError
from .common import encoder_file, read_feature_matrix, rounded
from .paircache import code_key, fingerprints, previous_matrices, reuse_index, reuse_pairs
from .spectra import load_spectrum

#: Modules whose code computes each pair stage's numbers (part of the reuse key). The pairwise
#: step only loads spectra and hands them to encmap.pairs; the stitch step samples sentences and
#: stacks targets itself, so its own module is part of its key.
PAIR_CODE = ("encmap.pairs", "encmap.qre", "encmap.similarity", "encmap.spectrum", "encmap.pipeline.spectra")
STITCH_CODE = ("encmap.similarity", "encmap.stitch", "encmap.selection", "encmap.pipeline.similarity")


def _stale(path: str, what: str, e: str) -> EncmapError:
    return EncmapError(f"{path}: encoder {e!r}: {what} made from another sentence set than the map's "
                       "(sha256 differs); rerun the stale stages")


def pairwise_step(features: str, pip_files: list[str], out_qre: str, out_cka: str, timing: str, *, eps: float,
                  device: str = "cpu", block_columns: int = 4096, threads: int | None = None,
                  memory_bytes: float | None = None) -> None:
    """Exact S(ρ_i‖ρ_j) and linear CKA between every two encoders on the map, from their stored PIPs.

    Writes ``out_qre`` (``qre`` (m, m), row i column j = S(ρ_i,ε‖ρ_j,ε)), ``out_cka`` (``cka``,
    ``cka_debiased`` (m, m)), both with ``encoder_ids`` and the PIP files' ``fingerprints``, and
    ``timing`` (JSON: seconds, pairs computed and reused, FLOP), kept apart so the matrices
    reproduce byte for byte. Pairs of unchanged encoders are taken from the previous outputs.
    ``device``: "auto" / "cuda[:k]" run the block GEMMs on a GPU when there is one (torch,
    float64); otherwise NumPy/BLAS on ``threads`` cores (MPS has no float64).
    ``memory_bytes``: when the U's to hold (n r_i x 8 bytes each) exceed this (default: half the
    machine's memory), each U is derived once into a memory-mapped scratch file beside
    ``out_qre`` (removed afterwards) and the blocks read from there: at 1,101 encoders the U's
    are ~33 GB.
    """
    from threadpoolctl import threadpool_limits

    from ..pairs import MEASURES, pair_flop, pair_measures

    dev = "cpu"
    if device != "cpu":
        from ..device import resolve_device

        dev = resolve_device(device)

    fm = read_feature_matrix(features)
    sha, ids = fm["attrs"]["sentences_sha256"], fm["ids"]
    by_id = {Path(f).stem: f for f in pip_files}
    missing = [e for e in ids if e not in by_id]
    if missing:
        raise EncmapError(f"{features}: encoder {missing[0]!r} is on the map but has no PIP among the inputs; "
                          "rerun the pip stage")
    for e in ids:
        if read_h5(by_id[e], [])[1]["sentences_sha256"] != sha:
            raise _stale(by_id[e], "PIP", e)
    fps = fingerprints([by_id[e] for e in ids])
    key = code_key(PAIR_CODE, {"eps": eps})
    stored = None
    prev_q = previous_matrices(out_qre, ["qre"], key)
    prev_c = previous_matrices(out_cka, ["cka", "cka_debiased"], key)
    if prev_q and prev_c and prev_q[:2] == prev_c[:2]:
        stored = prev_q[2] | prev_c[2]
    idx = reuse_index(*(prev_q[:2] if stored else ([], [])), ids, fps)
    m = len(ids)
    todo, filled = reuse_pairs(idx, np.ones((m, m), bool), stored)
    # U is derived from the embeddings on read (an SVD or a GEMM each): only for encoders with a
    # pair to compute; the others enter only through their rank (a zero-stride stand-in for U).
    need = set(np.flatnonzero(todo.any(axis=0) | todo.any(axis=1)).tolist())
    specs = [_rank_only(by_id[e]) for e in ids]
    ranks = [s.rank for s in specs]
    u_bytes = sum(s.U.size * 8 for i, s in enumerate(specs) if i in need)
    if memory_bytes is None:
        memory_bytes = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    spill = Path(out_qre).parent / f".{Path(out_qre).name}.u.tmp" if u_bytes > memory_bytes else None
    try:
        for i in sorted(need):
            specs[i] = load_spectrum(by_id[ids[i]])[0]
            if spill is not None:
                specs[i] = _spilled(specs[i], spill / f"{i}.npy")
        t0 = time.perf_counter()
        with threadpool_limits(threads):
            res = pair_measures(specs, eps=eps, todo=todo, block_columns=block_columns,
                                device=dev if dev.startswith("cuda") else None)
        seconds = time.perf_counter() - t0
    finally:
        del specs[:]
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
    for k in MEASURES:
        if k in filled:
            res[k] = np.where(np.isnan(res[k]), filled[k], res[k])
    n = int(fm["F"].shape[1])
    flop = pair_flop(ranks, n, todo)
    common = {"encoder_ids": np.array(ids, dtype=object), "fingerprints": np.array(fps, dtype=object)}
    attrs_out = {"eps": eps, "sentences_sha256": sha, "m": m, "n": n, "key": key,
                 "encmap_version": __version__}
    write_h5(out_qre, {"qre": res["qre"]} | common, attrs_out | {
        "note": "qre[i, j] = S(rho_i,eps || rho_j,eps), exact (factored), natural log"})
    write_h5(out_cka, {"cka": res["cka"], "cka_debiased": res["cka_debiased"]} | common, attrs_out | {
        "note": "linear CKA of the embeddings (the PIPs' kernel): biased HSIC and Song et al.'s unbiased HSIC"})
    computed = int(todo.sum())
    atomic_write_json(timing, {"pairwise_seconds": round(seconds, 3), "pairs": m * (m - 1) // 2,
                               "pairs_computed": computed, "pairs_reused": m * (m - 1) // 2 - computed,
                               "gflop": round(flop / 1e9, 3), "device": dev if dev.startswith("cuda") else "cpu",
                               "u_spilled_to_disk": spill is not None,
                               "block_columns": block_columns,
                               "gflop_per_s": round(flop / 1e9 / max(seconds, 1e-9), 2) if computed else None})


def _spilled(spec, path: Path):
    """``spec`` with U moved to a memory-mapped .npy file (read-only), its RAM freed."""
    from ..spectrum import Spectrum

    path.parent.mkdir(parents=True, exist_ok=True)
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=spec.U.shape)
    mm[...] = spec.U
    mm.flush()
    del mm
    return Spectrum(U=np.load(path, mmap_mode="r"), lam=spec.lam, trace=spec.trace)


def _rank_only(pip_file: str):
    """A :class:`~encmap.spectrum.Spectrum` with the stored λ and a zero-stride U (no memory, no SVD)."""
    from ..spectrum import Spectrum

    data, attrs = read_h5(pip_file, ["lam"])
    return Spectrum(U=np.broadcast_to(0.0, (int(attrs["n"]), data["lam"].shape[0])), lam=data["lam"],
                    trace=float(attrs["trace"]))


def _load_embeddings(emb_dirs: list[str], ids: list[str], records: dict[str, dict], sha: str,
                     n: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Embeddings (float64) and their files' fingerprints, checked against the map's sentence set."""
    dirs = {Path(d).name: d for d in emb_dirs}
    out, files = {}, []
    for e in ids:
        model = records[e]["model"]
        if model not in dirs:
            raise EncmapError(f"encoder {e!r}: no embeddings directory of model {model!r} among the inputs")
        f = encoder_file(dirs[model], e, "embeddings")
        data, attrs = read_h5(f, ["embeddings"])
        if attrs["sentences_sha256"] != sha:
            raise _stale(str(f), "embeddings", e)
        if data["embeddings"].shape[0] != n:
            raise EncmapError(f"{f}: {data['embeddings'].shape[0]} rows for encoder {e!r}, the map has n = {n}")
        out[e] = np.asarray(data["embeddings"], dtype=np.float64)
        files.append(str(f))
    return out, fingerprints(files)


def _sample(n: int, size: int, seed: int) -> np.ndarray:
    """A seeded subsample of sentence rows (sorted), or all rows when size >= n."""
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 0]).choice(n, size=size, replace=False))


def stitch_step(features: str, emb_dirs: list[str], out: dict[str, str], *, params: dict[str, Any],
                threads: int | None = None) -> None:
    """RBF CKA and stitches between the configured subset of encoders.

    ``out`` names ``rbf`` (HDF5: ``cka_rbf``, ``cka_rbf_debiased`` (k, k) over the subset, NaN
    for pairs not compared), ``stitches`` (JSON: one record per source, target, method and
    MLP depth, with the encoders' fingerprints), ``csv`` (the same table) and ``timing``.
    ``params``: the ``similarity`` section of params.yaml. Everything is computed before the
    first file is written.
    """
    from ..map import feature_distances, nearest_neighbours
    from ..selection import select_pairs

    fm = read_feature_matrix(features)
    sub = params["subset"]
    nn = None
    if sub["neighbours"] > 0:
        nn, _ = nearest_neighbours(feature_distances(fm["F"], "manhattan"), sub["neighbours"])
    ids, pairs = select_pairs(fm["records"], sub["groups"], sub["encoders"], nn)
    n = int(fm["F"].shape[1])
    X, fps = _load_embeddings(emb_dirs, ids, {r["id"]: r for r in fm["records"]}, fm["attrs"]["sentences_sha256"], n)
    t0 = time.perf_counter()
    rbf, rbf_attrs, rbf_computed = _rbf_pairs(X, ids, fps, pairs, params["rbf"], out["rbf"], threads)
    t1 = time.perf_counter()
    table, info = _stitch_pairs(X, ids, fps, pairs, fm["records"], params["stitch"], out["stitches"], threads)
    t2 = time.perf_counter()

    common = {"encoder_ids": np.array(ids, dtype=object), "fingerprints": np.array(fps, dtype=object)}
    write_h5(out["rbf"], rbf | common, rbf_attrs | {
        "sentences_sha256": fm["attrs"]["sentences_sha256"], "encmap_version": __version__,
        "note": "RBF CKA (bandwidth = threshold x median distance) on a seeded sample of sentences"})
    atomic_write_json(out["stitches"], {k: info[k] for k in ("key", "params", "sentences", "split")} | {"rows": table})
    atomic_write_text(out["csv"], stitch_csv(table))
    atomic_write_json(out["timing"], {"rbf_seconds": round(t1 - t0, 3), "rbf_pairs_computed": rbf_computed,
                                      "stitch_seconds": round(t2 - t1, 3), "stitch_pairs": len(pairs)}
                      | {k: info[k] for k in ("stitch_pairs_computed", "device", "fits", "fit_seconds")})


def _rbf_pairs(X: dict[str, np.ndarray], ids: list[str], fps: list[str], pairs: list[tuple[str, str]], rb: dict,
               stored: str, threads: int | None) -> tuple[dict[str, np.ndarray], dict, int]:
    """RBF CKA (biased, debiased) over the unordered pairs among ``pairs``; (k, k) matrices over ``ids``.

    Pairs of unchanged encoders come from ``stored`` (the previous output). Returns the
    matrices, the attributes to store with them and how many pairs were computed.
    """
    from threadpoolctl import threadpool_limits

    from ..similarity import gram_cka_matrix, rbf_gram

    key = code_key(STITCH_CODE, rb)
    k = len(ids)
    pos = {e: i for i, e in enumerate(ids)}
    wanted = np.zeros((k, k), bool)
    for a, b in pairs:
        wanted[pos[a], pos[b]] = wanted[pos[b], pos[a]] = True
    prev = previous_matrices(stored, ["cka_rbf", "cka_rbf_debiased"], key)
    idx = reuse_index(*(prev[:2] if prev else ([], [])), ids, fps)
    todo, filled = reuse_pairs(idx, wanted, prev[2] if prev else None)
    rows = _sample(X[ids[0]].shape[0], rb["sample"], rb["seed"])
    need = set(np.flatnonzero(todo.any(axis=0) | todo.any(axis=1)).tolist())
    with threadpool_limits(threads):
        grams = [rbf_gram(X[e][rows], rb["threshold"]) if i in need else None for i, e in enumerate(ids)]
        rbf = {name: gram_cka_matrix(grams, debiased=deb, todo=todo)
               for name, deb in (("cka_rbf", False), ("cka_rbf_debiased", True))}
    for name in rbf:
        if name in filled:
            rbf[name] = np.where(np.isnan(rbf[name]), filled[name], rbf[name])
    attrs = {"threshold": rb["threshold"], "sample": len(rows), "seed": rb["seed"], "key": key}
    return rbf, attrs, int(todo.sum())


def _previous_stitches(path: str, key: str) -> dict[tuple[str, str], list[dict]]:
    """Stored stitch rows by (source, target), if computed by the same code and params."""
    if not Path(path).exists():
        return {}
    prev = json.loads(Path(path).read_text())
    if prev.get("key") != key:
        print(f"not reusing {path}: computed by other code or params", file=sys.stderr)
        return {}
    old: dict[tuple[str, str], list[dict]] = {}
    for r in prev["rows"]:
        old.setdefault((r["source"], r["target"]), []).append(r)
    return old


def _stitch_pairs(X: dict[str, np.ndarray], ids: list[str], fps: list[str], pairs: list[tuple[str, str]],
                  records: list[dict], st: dict, stored: str, threads: int | None) -> tuple[list[dict], dict]:
    """Every stitch of every ordered pair (reusing stored rows of unchanged pairs), in pair order.

    Returns the table rows and ``info`` (key, params, sample and split sizes, pairs computed,
    device, fits and seconds per method).
    """
    from threadpoolctl import threadpool_limits

    from ..device import resolve_device
    from ..selection import select_group
    from ..stitch import COLUMNWISE, fit_predict, judged, split_rows

    dev = resolve_device(st["device"])
    key = code_key(STITCH_CODE, st | {"device_kind": dev.split(":")[0]})
    fp = dict(zip(ids, fps))
    old = _previous_stitches(stored, key)
    srows = _sample(X[ids[0]].shape[0], st["sample"], st["seed"])
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
            P, extra = fit_predict(X[a][srows], Y, method, split, depth=depth or 0, alphas=st["ridge_alphas"],
                                   random_state=st["seed"], device=dev, mlp=st["mlp"])
            cut = np.cumsum([0] + [X[b].shape[1] for b in targets])
            for b, lo, hi in zip(targets, cut[:-1], cut[1:]):
                part = {"coef": extra["coef"][:, lo:hi]} if method == "affine" else {}
                if "alpha" in extra:
                    part["alpha"] = extra["alpha"][lo:hi]
                res = judged(Y[split.test, lo:hi], P[:, lo:hi], part, k=st["knn_k"])
                results.setdefault((a, b), []).append(_stitch_row(a, b, method, depth, res, fp))
        label = _stitch_label(method, depth)
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
    table = [r for p in pairs for r in sorted(results[p], key=lambda r: order[_stitch_label(r["method"], r["depth"])])]
    info = {"key": key, "params": st, "sentences": len(srows),
            "split": {"train": len(split.train), "val": len(split.val), "test": len(split.test)},
            "stitch_pairs_computed": len(todo_pairs), "device": dev, "fits": fits,
            "fit_seconds": {k: round(v, 3) for k, v in seconds.items()}}
    return table, info


#: Columns of the stitch table, in order.
STITCH_COLUMNS = ("source", "target", "method", "depth", "r2", "r2_weighted", "mse", "mae", "cosine",
                  "knn_agreement", "constant_dims", "alpha", "sigma_max", "sigma_min", "effective_rank")


def _stitch_row(a: str, b: str, method: str, depth: int | None, res: dict, fp: dict[str, str]) -> dict:
    sv = np.asarray(res.get("singular_values", []), dtype=np.float64)
    knn = next(v for key, v in res.items() if key.startswith("knn"))
    row = {"source": a, "target": b, "method": method, "depth": depth,
           "r2": res["r2"], "r2_weighted": res["r2_weighted"], "mse": res["mse"], "mae": res["mae"],
           "cosine": res["cosine"], "knn_agreement": knn, "constant_dims": res["constant_dims"],
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
    from ..io import csv_table

    return csv_table(rows, list(STITCH_COLUMNS))


def _stitch_label(method: str, depth: int | None) -> str:
    return f"mlp{depth}" if method == "mlp" else method


def stitch_matrix(rows: list[dict], ids: list[str], label: str, value: str = "r2") -> np.ndarray:
    """One stitch score as a (k, k) matrix, row = source, column = target; NaN where not fitted."""
    pos = {e: i for i, e in enumerate(ids)}
    M = np.full((len(ids), len(ids)), np.nan)
    for r in rows:
        if _stitch_label(r["method"], r["depth"]) == label and r["source"] in pos and r["target"] in pos:
            M[pos[r["source"]], pos[r["target"]]] = r[value]
    return M


def compare_step(features: str, pairwise: str, cka: str, rbf: str, stitches: str, out: dict[str, str]) -> None:
    """How the notions of similarity agree, and heatmaps of them.

    Over unordered encoder pairs: ℓ1 distance of QRE features, symmetrised exact QRE, 1 - linear
    CKA (debiased and biased), 1 - RBF CKA (debiased) and, per stitch, 1 - the mean R² of the
    two directions. Writes ``agreement`` (CSV: Spearman between every two measures and the
    number of pairs), ``metrics`` (JSON for DVC) and heatmaps ``png_<name>`` / ``svg_<name>``
    for each of :data:`encmap.config.HEATMAPS`.
    """
    from ..faithfulness import agreement_table
    from ..figures import draw_heatmap
    from ..map import feature_distances, symmetrised_qre

    fm = read_feature_matrix(features)
    ids = fm["ids"]
    m = len(ids)
    pw, _ = read_h5(pairwise, ["qre", "encoder_ids"])
    ck, _ = read_h5(cka, ["cka", "cka_debiased", "encoder_ids"])
    for path, d in ((pairwise, pw), (cka, ck)):
        if [str(x) for x in d["encoder_ids"]] != ids:
            raise EncmapError(f"{path} and {features} list different encoders; rerun the pairwise stage")
    rb, _ = read_h5(rbf, ["cka_rbf_debiased", "encoder_ids"])
    st = json.loads(Path(stitches).read_text())
    sub = [str(x) for x in rb["encoder_ids"]]
    unknown = [e for e in sub if e not in ids]
    if unknown:
        raise EncmapError(f"{rbf}: encoder {unknown[0]!r} is not on the map of {features}; rerun the stitch stage")
    pos = [ids.index(e) for e in sub]

    def on_map(S: np.ndarray) -> np.ndarray:  # a subset matrix placed in the map's m x m frame
        M = np.full((m, m), np.nan)
        M[np.ix_(pos, pos)] = S
        return M

    iu = np.triu_indices(m, 1)
    full = {"l1": feature_distances(fm["F"], "manhattan"), "exact_qre": symmetrised_qre(pw["qre"]),
            "1-cka": 1.0 - ck["cka_debiased"], "1-cka_biased": 1.0 - ck["cka"],
            "1-rbf_cka": on_map(1.0 - rb["cka_rbf_debiased"])}
    labels = sorted({_stitch_label(r["method"], r["depth"]) for r in st["rows"]} - {"mean", "random-source"})
    r2 = {lab: stitch_matrix(st["rows"], sub, lab) for lab in labels}
    for lab, S in r2.items():
        full[f"1-stitch_{lab}"] = on_map(1.0 - 0.5 * (S + S.T))  # NaN unless fitted both ways
    table = agreement_table({k: M[iu] for k, M in full.items()})

    lines = ["a,b,spearman,pairs"] + [f"{r['a']},{r['b']},{'' if np.isnan(r['spearman']) else repr(r['spearman'])},"
                                      f"{r['pairs']}" for r in table]
    metrics: dict[str, Any] = {"encoders": m, "subset": len(sub),
                               "agreement": {f"{r['a']}~{r['b']}": r["spearman"] for r in table},
                               "cka_debiased_mean": float(ck["cka_debiased"][iu].mean()),
                               "stitch_r2_median": {}}
    for lab in sorted({_stitch_label(r["method"], r["depth"]) for r in st["rows"]}):
        # The median: one badly scaled pair (Procrustes cannot rescale) would swamp a mean.
        vals = [r["r2"] for r in st["rows"] if _stitch_label(r["method"], r["depth"]) == lab]
        metrics["stitch_r2_median"][lab] = float(np.median(vals))
    draw_heatmap(ck["cka_debiased"], ids, ids, out["png_cka_linear"], out["svg_cka_linear"],
                 title=f"linear CKA (debiased) between {m} encoders", label="CKA", vmin=0.0, vmax=1.0)
    draw_heatmap(rb["cka_rbf_debiased"], sub, sub, out["png_cka_rbf"], out["svg_cka_rbf"],
                 title=f"RBF CKA (debiased) between {len(sub)} encoders", label="CKA", vmin=0.0, vmax=1.0)
    lab = "ridge" if "ridge" in r2 else (labels[0] if labels else None)
    S = r2[lab] if lab else np.full((len(sub), len(sub)), np.nan)
    draw_heatmap(S, sub, sub, out["png_stitch_r2"], out["svg_stitch_r2"],
                 title=f"stitch R² ({lab}): row = source, column = target", label="R² (held-out)",
                 vmin=0.0, vmax=1.0)
    atomic_write_text(out["agreement"], "\n".join(lines) + "\n")
    atomic_write_json(out["metrics"], rounded(metrics))
