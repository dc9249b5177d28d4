"""Score regression: recovery, the leakage gap, baselines on the same folds, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support.fresh import array_digest, fresh_digests
from support.svg import check_regression_figures

from encmap.downstream.regression import cross_predict, outer_splits, regression_table
from encmap.io import write_h5
from encmap.validation import EncmapError

PARAMS = {"seed": 0, "max_loo_groups": 20, "folds": 5, "inner_folds": 3, "pca_dims": [2, 4, 8],
          "elasticnet_alphas": [1e-3, 1e-2, 1e-1], "l1_ratios": [0.5], "ridge_alphas": [1e-2, 1.0, 100.0],
          "max_iter": 10000, "score_tables": [], "predictor": "qre",
          "mteb": {"results": None, "benchmark": "MTEB(eng, v1)", "tasks": [], "split": None, "bare_only": False}}


def records(m: int, groups) -> list[dict]:
    return [{"id": f"e{i}", "model": str(groups[i]), "layer": i % 4 if i % 3 else None, "pooling": "mean",
             "dim": None, "d": 8 * (1 + i % 3), "meta": {"parameters": None if i % 5 == 0 else 1000 * i}}
            for i in range(m)]


def table(rows, **where) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def synthetic_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """10 models x 5 variants. Features: a 3-d latent state per encoder, seen through 300 noisy
    dimensions, plus a per-model offset. Target ``linear`` is a linear function of the latent
    state (varies within and across models); ``group`` depends only on the model. F (50, 300),
    Y (50, 2), groups (50,)."""
    rng = np.random.default_rng(0)
    groups = np.repeat([f"m{g}" for g in range(10)], 5)
    Z = rng.standard_normal((50, 3))
    offset = rng.standard_normal((10, 300))[np.repeat(np.arange(10), 5)]
    F = 3 * Z @ rng.standard_normal((3, 300)) + offset + 0.05 * rng.standard_normal((50, 300))
    Y = np.c_[Z @ np.array([1.0, -2.0, 0.5]), rng.standard_normal(10)[np.repeat(np.arange(10), 5)]]
    return F, Y, groups


@pytest.fixture(scope="module")
def synthetic():
    F, Y, groups = synthetic_data()
    rows, preds = regression_table(F, Y, ["linear", "group"], groups, records(50, groups), PARAMS, 0)
    return {"F": F, "Y": Y, "groups": groups, "rows": rows, "preds": preds}


def test_linear_target_is_recovered_under_grouped_cv(synthetic):
    for reg in ("elasticnet", "ridge"):
        r = table(synthetic["rows"], task="linear", protocol="grouped", features="qre", regressor=reg)[0]
        assert r["spearman"] > 0.95 and r["pearson"] > 0.95 and r["folds"] == 10, r
    # Random features of the same shape predict nothing.
    r = table(synthetic["rows"], task="linear", protocol="grouped", features="random", regressor="ridge")[0]
    assert abs(r["spearman"]) < 0.4, r


def test_group_only_target_leaks_under_random_cv_only(synthetic):
    """A score that only depends on the model is predictable when a model's siblings sit in the
    training folds (random K-fold), not when whole models are held out: the leakage gap."""
    grouped = table(synthetic["rows"], task="group", protocol="grouped", features="qre", regressor="ridge")[0]
    random = table(synthetic["rows"], task="group", protocol="random", features="qre", regressor="ridge")[0]
    assert random["spearman"] > 0.9 and grouped["spearman"] < 0.3, (random, grouped)


def test_baselines_use_the_same_folds(synthetic):
    g, y = synthetic["groups"], synthetic["Y"][:, 0]
    rows = table(synthetic["rows"], task="linear")
    assert {r["features"] for r in rows} == {"qre", "tasks", "qre+tasks", "random", "dim", "layer", "parameters",
                                             "mean"}
    for prot, folds in (("grouped", 10), ("random", 5)):
        assert {r["folds"] for r in table(rows, protocol=prot)} == {folds}
        # The mean baseline, recomputed by hand on the protocol's folds: each held-out model's
        # prediction is the mean of the other models' scores.
        expect = np.empty(50)
        for train, test in outer_splits(g, prot, PARAMS, 0):
            expect[test] = y[train].mean()
        got = [p["predicted"] for p in synthetic["preds"] if p["task"] == "linear" and p["protocol"] == prot
               and p["features"] == "mean"]
        np.testing.assert_allclose(got, expect, rtol=1e-12)
    loo = outer_splits(g, "grouped", PARAMS, 0)
    assert all(len(set(g[test])) == 1 and g[test][0] not in set(g[train]) for train, test in loo)


_SAME_SEED = """
from test_regress import PARAMS, synthetic_data
from encmap.downstream.regression import cross_predict, outer_splits
from support.fresh import array_digest
F, Y, g = synthetic_data()
print(array_digest(cross_predict("elasticnet", F, Y[:, 0], g, outer_splits(g, "random", PARAMS, 0), "random", PARAMS, 0)))
"""


def test_same_seed_same_predictions(synthetic):
    """Bit-identical out-of-fold predictions here and in two fresh interpreters with other hash seeds."""
    F, y, g = synthetic["F"], synthetic["Y"][:, 0], synthetic["groups"]
    splits = outer_splits(g, "random", PARAMS, 0)
    a = cross_predict("elasticnet", F, y, g, splits, "random", PARAMS, 0)
    assert fresh_digests(_SAME_SEED) == [array_digest(a)] * 2


def test_a_value_missing_only_in_the_held_out_model_is_imputed():
    """Baselines: the one model whose parameter count is unknown is held out in its fold, so the
    training rows have no missing value but the predicted rows do."""
    rng = np.random.default_rng(3)
    groups = np.repeat(["a", "b", "c", "d"], 3)
    recs = records(12, groups)
    for i, r in enumerate(recs):
        r["meta"]["parameters"] = None if groups[i] == "a" else 1000 * (1 + i)
    y = rng.standard_normal(12)
    rows, _ = regression_table(rng.standard_normal((12, 20)), y[:, None], ["t"], groups, recs,
                               PARAMS | {"inner_folds": 2}, 0)
    r = table(rows, protocol="grouped", features="parameters")[0]
    assert r["folds"] == 4 and np.isfinite(r["mae"])


def test_a_family_only_target_leaks_across_models_not_across_families():
    """12 models in 4 families of 3, 2 variants each; the features carry a per-family offset and
    a score that depends only on the family is predictable while a held-out model's family-mates
    train the regressor (grouped by model), not when the whole family is held out (``family``),
    whose folds are whole families; the mean baseline on them is the other families' mean."""
    rng = np.random.default_rng(5)
    models = np.repeat([f"m{i}" for i in range(12)], 2)
    fams = np.array([f"f{int(m[1:]) // 3}" for m in models])
    fam_index = np.array([int(f[1:]) for f in fams])
    F = 3 * rng.standard_normal((4, 200))[fam_index] + 0.1 * rng.standard_normal((24, 200))
    y = rng.standard_normal(4)[fam_index] + 0.01 * rng.standard_normal(24)
    rows, preds = regression_table(F, y[:, None], ["fam"], models, records(24, models), PARAMS, 0, families=fams)
    by_model = table(rows, protocol="grouped", features="qre", regressor="ridge")[0]
    by_family = table(rows, protocol="family", features="qre", regressor="ridge")[0]
    assert by_model["spearman"] > 0.9 and by_family["spearman"] < 0.5, (by_model, by_family)
    assert by_family["folds"] == 4 and by_model["folds"] == 12
    splits = outer_splits(fams, "family", PARAMS, 0)
    assert all(set(fams[test]).isdisjoint(fams[train]) and len(set(fams[test])) == 1 for train, test in splits)
    got = np.array([p["predicted"] for p in preds if p["protocol"] == "family" and p["features"] == "mean"])
    expect = np.array([y[fams != fams[i]].mean() for i in range(24)])
    np.testing.assert_allclose(got, expect, rtol=1e-12)


def test_the_family_protocol_needs_three_families():
    rng = np.random.default_rng(6)
    models = np.repeat(["a", "b", "c", "d"], 3)
    F, y = rng.standard_normal((12, 20)), rng.standard_normal((12, 1))
    for fams, expect in ((["x", "x", "y", "y"], set()), (["x", "y", "z", "z"], {"family"}), (None, set())):
        f = None if fams is None else np.repeat(fams, 3)
        rows, _ = regression_table(F, y, ["t"], models, records(12, models), PARAMS | {"inner_folds": 2}, 0,
                                   families=f)
        assert {r["protocol"] for r in rows} - {"grouped", "random"} == expect, fams
    with pytest.raises(EncmapError, match="family cross-validation needs at least 3 groups .families., got 2"):
        outer_splits(np.array(["x", "x", "y", "y"]), "family", PARAMS, 0)


def test_a_map_of_one_or_two_models_is_regressed_by_random_folds_only():
    """The map's page reads the regression: a map of one model must not fail the pipeline there."""
    rng = np.random.default_rng(7)
    for models in (np.repeat(["a"], 12), np.repeat(["a", "b"], 6)):
        rows, _ = regression_table(rng.standard_normal((12, 20)), rng.standard_normal((12, 1)), ["t"], models,
                                   records(12, models), PARAMS | {"inner_folds": 2}, 0, families=models)
        assert rows and {r["protocol"] for r in rows} == {"random"}


def test_fewer_than_three_groups_is_an_error():
    with pytest.raises(EncmapError, match="at least 3 groups .* got 2"):
        outer_splits(np.array(["a", "a", "b", "b"]), "grouped", PARAMS, 0)
    assert len(outer_splits(np.array(["a"] * 10), "random", PARAMS, 0)) == PARAMS["folds"]


def fake_run(root: Path, m: int = 12) -> tuple[str, list[str]]:
    """A feature matrix of m encoders of 4 models and their evaluate outputs."""
    rng = np.random.default_rng(1)
    groups = [f"m{i % 4}" for i in range(m)]
    recs = records(m, groups)
    F = rng.standard_normal((m, 40))
    write_h5(root / "qre.h5", {"features": F, "encoder_ids": np.array([r["id"] for r in recs], dtype=object),
                               "encoders": np.array([json.dumps(r) for r in recs], dtype=object)},
             {"sentences_sha256": "x", "eps": 1e-6, "direction": "forward", "m": m})
    dirs = []
    for g in sorted(set(groups)):
        d = root / "eval" / g
        d.mkdir(parents=True)
        for i, r in enumerate(recs):
            if r["model"] == g:
                (d / f"{r['id']}.json").write_text(json.dumps({"encoder_id": r["id"], "model": g, "sentences_sha256": "x", "tasks": {
                    "lee": {"main_score": float(F[i, 0])}, "polarity": {"main_score": float(F[i, 1])}}}))
        dirs.append(str(d))
    return str(root / "qre.h5"), dirs


OUTS = ("metrics", "table", "predictions", "scores", "regressors", "figure_png", "figure_svg", "failures",
        "mteb_scores", "mteb_sources", "baselines_png", "baselines_svg")


def test_regress_step_and_bad_score_tables(tmp_path):
    from encmap.artifacts.features import read_feature_matrix
    from encmap.downstream.prediction import predict_scores
    from encmap.pipeline.regress import regress_step

    features, dirs = fake_run(tmp_path)
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    bad = tmp_path / "bad.csv"
    for text, match in (("encoder,task,score\ne0,mine,1\nnope,mine,2\n", "line 3: unknown encoder 'nope'"),
                        ("encoder,task,score\ne0,other,1\n", "line 2: unknown task 'other'"),
                        ("encoder,task,score\ne0,mine,x\n", "score 'x' is not a number"),
                        ("encoder,score\ne0,1\n", "needs columns encoder,task,score")):
        bad.write_text(text)
        with pytest.raises(EncmapError, match=match):
            regress_step(features, dirs, out, regress=PARAMS | {"score_tables": [{"path": str(bad), "tasks": ["mine"]}]})
        assert not (tmp_path / "out").exists()
    # Scores made against another sentence set than the features: refused, nothing written.
    stale = Path(dirs[0]) / "e0.json"
    good_text = stale.read_text()
    stale.write_text(good_text.replace('"sentences_sha256": "x"', '"sentences_sha256": "other"'))
    with pytest.raises(EncmapError, match="e0.json: scored against another sentence set"):
        regress_step(features, dirs, out, regress=PARAMS)
    assert not (tmp_path / "out").exists()
    stale.write_text(good_text)
    # A user table adds a target; every output is written.
    good = tmp_path / "good.csv"
    good.write_text("encoder,task,score\n" + "".join(f"e{i},mine,{i % 3}\n" for i in range(12)))
    regress_step(features, dirs, out, regress=PARAMS | {"score_tables": [{"path": str(good), "tasks": ["mine"]}]})
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["tasks"] == 3 and metrics["models"] == 4 and set(metrics["qre"]) == {"elasticnet", "ridge"}
    lines = Path(out["table"]).read_text().splitlines()
    # tasks x protocols x (2 qre + 2 tasks + 2 qre+tasks + 2 random + 3 one-column + mean); no spectral
    # summaries in this matrix; no meta.family: each model its own family
    assert len(lines) == 1 + 3 * 3 * 12
    assert set(metrics["qre"]["ridge"]) == {"grouped", "family", "random"}
    fm = read_feature_matrix(features)
    pred = predict_scores(out["regressors"], fm["F"][:2], fm["attrs"])
    assert set(pred) == {"lee", "polarity", "mine"} and pred["lee"]["ridge"].shape == (2,)
    with pytest.raises(EncmapError, match="trained on features of n = 40"):
        predict_scores(out["regressors"], fm["F"][:2, :10], fm["attrs"])


def cli_regress_inputs(tmp_path: Path, values: list[float]) -> tuple[Path, str, Path]:
    """The repository's params.yaml, fake_run's matrix, and a score table of task 't' (e{i}: values[i])."""
    features, _ = fake_run(tmp_path)
    scores = tmp_path / "s.csv"
    scores.write_text("encoder,task,score\n" + "".join(f"e{i},t,{v}\n" for i, v in enumerate(values)))
    params = tmp_path / "params.yaml"
    params.write_text((Path(__file__).parents[1] / "params.yaml").read_text())
    return params, features, scores


def test_cli_regress(tmp_path, capsys):
    from encmap.cli import main

    params, features, scores = cli_regress_inputs(tmp_path, [i * 0.1 for i in range(12)])
    assert main(["--params", str(params), "regress", "--features", features, "--scores", str(scores)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("task,protocol,features,regressor,n,folds,units,spearman,spearman_low,spearman_high,p_value,"
                      "pearson,mae,bias,coverage,width,note") and len(out) == 1 + 3 * 8  # 4 models: no frontier split
    assert out[1].startswith("t,grouped,qre,elasticnet,12,4,")  # 4 models: leave-one-model-out
    assert out[9].startswith("t,family,qre,elasticnet,12,4,")  # no meta.family: each model its own family
    groups = tmp_path / "g.csv"
    groups.write_text("encoder,group\n" + "".join(f"e{i},{i % 2}\n" for i in range(12)))
    assert main(["--params", str(params), "regress", "--features", features, "--scores", str(scores),
                 "--groups", str(groups)]) == 2
    assert "at least 3 groups (models), got 2" in capsys.readouterr().err


def test_cli_regress_on_a_users_own_matrix(tmp_path, capsys):
    """Old: a matrix with only `features` and `encoder_ids` ended in KeyError: 'layer'."""
    from encmap.cli import main

    rng = np.random.default_rng(0)
    F = rng.normal(size=(12, 30))
    mine = tmp_path / "mine.h5"
    write_h5(mine, {"features": F, "encoder_ids": np.array([f"e{i}" for i in range(12)], dtype=object)}, {})
    scores = tmp_path / "s.csv"
    scores.write_text("encoder,task,score\n" + "".join(f"e{i},t,{F[i, 0] + 0.1 * i}\n" for i in range(12)))
    params = tmp_path / "params.yaml"
    params.write_text((Path(__file__).parents[1] / "params.yaml").read_text())
    cmd = ["--params", str(params), "regress", "--features", str(mine), "--scores", str(scores)]
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "mine.h5: no encoder records (dataset 'encoders')" in err and "give --groups" in err
    groups = tmp_path / "g.csv"
    groups.write_text("encoder,group\n" + "".join(f"e{i},g{i % 4}\n" for i in range(12)))
    assert main(cmd + ["--groups", str(groups)]) == 0
    out, err = capsys.readouterr()
    assert "width, layer and parameters baselines are left out" in err
    rows = out.splitlines()
    assert {r.split(",")[2] for r in rows[1:]} == {"qre", "random", "mean"} and len(rows) == 1 + 2 * 5
    write_h5(mine, {"features": F[:5], "encoder_ids": np.array([f"e{i}" for i in range(12)], dtype=object)}, {})
    assert main(cmd + ["--groups", str(groups)]) == 2
    assert "features of shape (5, 30) for 12 encoder_ids" in capsys.readouterr().err


def test_worker_processes_do_not_change_the_table(synthetic, monkeypatch):
    """The units run side by side in worker processes give the bytes of the serial run."""
    from encmap import parallel
    from encmap.downstream.regression import fit_final

    monkeypatch.setattr(parallel, "POOL_MIN_SECONDS", 0)  # every unit to the workers, however small
    F, Y, g = synthetic["F"], synthetic["Y"], synthetic["groups"]
    rows, preds = regression_table(F, Y, ["linear", "group"], g, records(50, g), PARAMS, 0, n_jobs=2)
    np.testing.assert_equal(rows, synthetic["rows"])  # NaN == NaN here
    np.testing.assert_equal(preds, synthetic["preds"])
    one, two = fit_final(F, Y, ["linear"], g, PARAMS, 0), fit_final(F, Y, ["linear"], g, PARAMS, 0, n_jobs=2)
    np.testing.assert_equal(one, two)


def test_final_regressors_are_their_pipelines_as_linear_maps(synthetic):
    """``F @ w + b`` is what scikit-learn's fitted pipeline predicts (the reference: its own
    ``predict``), on the training rows and on rows far outside them."""
    from encmap.downstream.regression import _final_fit, fit_final, fit_regressor, linear_form

    F, Y, g = synthetic["F"], synthetic["Y"], synthetic["groups"]
    far = np.random.default_rng(5).normal(scale=10.0, size=(7, F.shape[1]))
    final = fit_final(F, Y, ["linear", "group"], g, PARAMS, 0)
    assert final["weights"].shape == (2, 2, 300) and final["intercepts"].shape == (2, 2)
    for r, reg in enumerate(("elasticnet", "ridge")):
        est = fit_regressor(reg, F, Y[:, 0], g, "grouped", PARAMS, 0)
        pipe = getattr(est, "regressor_", est)  # elasticnet: the pipeline fitted on standardised scores
        search = pipe.named_steps["search"]
        pipe.steps[-1] = ("model", getattr(search, "best_estimator_", search))  # RidgeCV: its own model
        for X in (F, far):
            ref = est.predict(X)
            np.testing.assert_allclose(X @ final["weights"][0, r] + final["intercepts"][0, r], ref,
                                       rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    assert set(final["chosen"]["linear"]["ridge"]) == {"alpha"}
    assert set(final["chosen"]["linear"]["elasticnet"]) == {"alpha", "l1_ratio", "pca_components"}
    assert final["chosen"]["linear"]["elasticnet"]["pca_components"] in PARAMS["pca_dims"]
    w, b, _ = _final_fit(("ridge", F, Y[:, 0], g, None), PARAMS, 0)
    np.testing.assert_array_equal(w, final["weights"][0, 1])
    # A step that is not affine is refused by name, not folded wrongly.
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import QuantileTransformer

    bent = Pipeline([("q", QuantileTransformer(n_quantiles=10)), ("model", pipe.steps[-1][1])]).fit(F, Y[:, 0])
    with pytest.raises(EncmapError, match="QuantileTransformer"):
        linear_form(bent, F.shape[1])


def test_regress_step_writes_the_same_bytes_on_one_and_two_workers(tmp_path):
    """A 1-core SLURM job and a 2-core local run must agree byte for byte (DVC compares hashes)."""
    from encmap.pipeline.regress import regress_step

    features, dirs = fake_run(tmp_path)
    outs = {}
    for jobs in (1, 2):
        out = {k: str(tmp_path / f"out{jobs}" / f"{k}.x") for k in OUTS}
        regress_step(features, dirs, out, regress=PARAMS, jobs=jobs)
        outs[jobs] = {k: Path(v).read_bytes() for k, v in out.items() if k not in ("figure_png", "figure_svg")}
    for k in outs[1]:
        assert outs[1][k] == outs[2][k], k


@pytest.mark.parametrize("text,match", [
    ("encoder,task,score\ne0,mine\n", r"line 2: no value for 'score'"),          # old: TypeError
    ("encoder,task,score\ne0,,0.5\n", r"line 2: no value for 'task'"),           # old: AttributeError / accepted
    ("encoder,task\ne0,mine\n", r"needs columns encoder,task,score"),
])
def test_score_table_rows_with_a_missing_field_are_named(tmp_path, text, match):
    from encmap.downstream.score_tables import read_score_table

    f = tmp_path / "s.csv"
    f.write_text(text)
    with pytest.raises(EncmapError, match=match):
        read_score_table(f, ["e0"], ["mine"])


def test_score_table_from_excel_with_a_byte_order_mark(tmp_path):
    """Old: Excel's UTF-8 CSV starts with a BOM and its header 'encoder' was not found."""
    from encmap.downstream.score_tables import read_score_table

    f = tmp_path / "s.csv"
    f.write_bytes("encoder,task,score\r\ne0,mine,0.5\r\n".encode("utf-8-sig"))
    assert read_score_table(f, ["e0"], ["mine"]) == {"e0": {"mine": 0.5}}
    f.write_bytes(b"encoder,task,score\ne0,caf\xe9,0.5\n")
    with pytest.raises(EncmapError, match=r"s\.csv: not UTF-8"):
        read_score_table(f, ["e0"])


def test_mteb_scores_refuse_short_model_lines_and_results_with_no_score(tmp_path, capsys):
    """A short models line was a traceback; results that give no score at all are an error naming
    where to look (a NaN file among good ones is left out: tests/test_mteb_results.py)."""
    from encmap.cli import main

    d = tmp_path / "results/org__m/rev"
    d.mkdir(parents=True)
    (d / "STS12.json").write_text("{")
    models = tmp_path / "models.csv"
    models.write_text("encoder,mteb_model\nmy-encoder,org/m\n")
    assert main(["mteb-scores", str(tmp_path), "--models", str(models), "--tasks", "STS12"]) == 2
    assert "no score for any of 1 models (--sources FILE says why)" in capsys.readouterr().err
    assert main(["mteb-scores", str(tmp_path), "--models", str(models), "--tasks", "STS12",
                 "--sources", str(tmp_path / "s.json")]) == 2
    assert f"(why: {tmp_path / 's.json'})" in capsys.readouterr().err
    (m,) = json.loads((tmp_path / "s.json").read_text())["models"]
    assert m["missing"]["STS12"].startswith("every file left out: rev: malformed JSON")
    models.write_text("encoder,mteb_model\nmy-encoder\n")
    assert main(["mteb-scores", str(tmp_path), "--models", str(models)]) == 2
    assert "models.csv line 2: no value for 'mteb_model'" in capsys.readouterr().err


def test_place_refuses_layers_that_are_not_numbers(capsys):
    from encmap.cli import main

    assert main(["place", "path:/nowhere", "--layers", "a,b"]) == 2  # old: a ValueError traceback
    assert "--layers 'a,b': expected hidden-state numbers" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- what the features capture


def _synthetic_encoders(kind: str, m_models: int = 10, per: int = 4, n: int = 200, r: int = 24, seed: int = 0):
    """Encoders of known structure, as QRE features and spectral summaries, with a target.

    ``spectrum``: random eigenvectors, spectra decaying as k^-α with α varying; target α.
    ``alignment``: one spectrum for all (k^-2.5); the top eigenvector leans on a labelled set of
    40 sentences with weight c (the rest random); target c."""
    from encmap.qre.features import qre_features
    from encmap.qre.spectral import spectral_profile, von_neumann_entropy
    from encmap.qre.spectrum import spectrum_from_arrays

    rng = np.random.default_rng(seed)
    m = m_models * per
    v = np.zeros(n)
    v[:40] = 1 / np.sqrt(40)
    F, profiles, entropy, y = [], [], [], []
    for i in range(m):
        G = rng.standard_normal((n, r))
        if kind == "spectrum":
            alpha = rng.uniform(0.5, 2.5)
            lam = np.arange(1, r + 1, dtype=float) ** -alpha
            target = alpha
        else:
            lam = np.arange(1, r + 1, dtype=float) ** -2.5
            c = rng.uniform(0.0, 0.95)
            w = G[:, 0] - v * (v @ G[:, 0])
            G[:, 0] = c * v + np.sqrt(1 - c * c) * w / np.linalg.norm(w)
            target = c
        U = np.linalg.qr(G)[0] * np.sign(np.diag(np.linalg.qr(G)[1]))
        spec = spectrum_from_arrays(U, lam / lam.sum())
        F.append(qre_features(spec, eps=1e-3))
        profiles.append(spectral_profile(spec, eps=1e-3))
        entropy.append(von_neumann_entropy(spec, eps=1e-3))
        y.append(target)
    groups = np.repeat([f"m{g}" for g in range(m_models)], per)
    return (np.array(F), {"profile": np.array(profiles), "entropy": np.array(entropy)}, np.array(y)[:, None],
            groups)


def test_a_target_of_the_spectrum_alone_is_predicted_by_the_spectral_baselines():
    F, spectral, Y, groups = _synthetic_encoders("spectrum")
    rows, _ = regression_table(F, Y, ["alpha"], groups, records(len(F), groups), PARAMS, 0, spectral=spectral)
    for fs in ("profile", "entropy"):
        r = table(rows, protocol="grouped", features=fs, regressor="ridge")[0]
        assert r["spearman"] > 0.9, r


def test_a_target_of_the_eigenvectors_alone_escapes_the_spectral_baselines_not_the_features():
    """Every spectrum the same: the spectral baselines are constant and predict nothing; the
    per-sentence features see which sentences the top eigenvector weighs."""
    F, spectral, Y, groups = _synthetic_encoders("alignment")
    assert np.ptp(spectral["profile"], axis=0).max() < 1e-9 and np.ptp(spectral["entropy"]) < 1e-9
    rows, _ = regression_table(F, Y, ["c"], groups, records(len(F), groups), PARAMS, 0, spectral=spectral)
    for fs in ("profile", "entropy"):
        r = table(rows, protocol="grouped", features=fs, regressor="ridge")[0]
        assert not r["spearman"] > 0.3, r  # NaN: constant predictions
    for fs in ("qre", "qre+profile"):  # measured: 0.82 (ridge), 0.88 (ElasticNet)
        for reg in ("ridge", "elasticnet"):
            r = table(rows, protocol="grouped", features=fs, regressor=reg)[0]
            assert r["spearman"] > 0.7, r


def test_leave_task_out_predicts_a_task_from_the_others():
    """Two tasks that measure one latent skill: each is predicted from the other (tasks), and
    adding features to them does not hide it (qre+tasks); features alone are noise here."""
    rng = np.random.default_rng(9)
    groups = np.repeat([f"m{g}" for g in range(12)], 3)
    skill = rng.standard_normal(36)
    Y = np.c_[skill + 0.1 * rng.standard_normal(36), skill + 0.1 * rng.standard_normal(36)]
    Y[4, 1] = np.nan  # a missing score among the predictors: imputed
    F = rng.standard_normal((36, 50))
    rows, _ = regression_table(F, Y, ["a", "b"], groups, records(36, groups), PARAMS, 0)
    for task in ("a", "b"):
        assert table(rows, task=task, protocol="grouped", features="tasks", regressor="ridge")[0]["spearman"] > 0.9
        assert table(rows, task=task, protocol="grouped", features="qre+tasks", regressor="ridge")[0]["spearman"] > 0.8
        assert abs(table(rows, task=task, protocol="grouped", features="qre", regressor="ridge")[0]["spearman"]) < 0.5
    one, _ = regression_table(F, Y[:, :1], ["a"], groups, records(36, groups), PARAMS, 0)
    assert not {r["features"] for r in one} & {"tasks", "qre+tasks"}  # one task: no other to predict from


def test_a_joined_predictor_is_one_linear_map_over_its_blocks(synthetic):
    """The fitted regressors of qre+profile act on [F, profile] side by side: the stored weights
    reproduce scikit-learn's own predictions, block weighting included."""
    from encmap.downstream.regression import fit_final, fit_regressor, join_blocks

    F, Y, g = synthetic["F"], synthetic["Y"], synthetic["groups"]
    profile = np.random.default_rng(2).standard_normal((len(F), 16))
    X, w = join_blocks([F, profile])
    np.testing.assert_allclose(w, np.r_[np.ones(300), np.full(16, np.sqrt(300 / 16))])
    final = fit_final(F, Y[:, :1], ["linear"], g, PARAMS, 0, blocks=[F, profile])
    assert final["weights"].shape == (1, 2, 316)
    for r, reg in enumerate(("elasticnet", "ridge")):
        est = fit_regressor(reg, X, Y[:, 0], g, "grouped", PARAMS, 0, weights=w)
        pipe = getattr(est, "regressor_", est)  # elasticnet: the pipeline fitted on standardised scores
        search = pipe.named_steps["search"]
        pipe.steps[-1] = ("model", getattr(search, "best_estimator_", search))  # RidgeCV: its own model
        ref = est.predict(X)
        np.testing.assert_allclose(X @ final["weights"][0, r] + final["intercepts"][0, r], ref,
                                   rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_the_predictor_is_selectable_and_place_uses_it(tmp_path):
    """regress.predictor qre+profile: the table compares every set either way; the stored
    regressors act on [features, profile] and need the new encoders' profile; the metrics and
    the stored file say which predictor they are."""
    from encmap.downstream.prediction import predict_scores
    from encmap.pipeline.regress import regress_step

    features, dirs = fake_run(tmp_path)
    import h5py

    rng = np.random.default_rng(4)
    with h5py.File(features, "r+") as f:  # the spectral summaries gather writes beside the features
        f["profile"] = rng.standard_normal((12, 16))
        f["entropy"] = rng.standard_normal(12)
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    regress_step(features, dirs, out, regress=PARAMS | {"predictor": "qre+profile"})
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["predictor"] == "qre+profile" and {"entropy", "profile", "qre+profile", "tasks"} <= set(metrics)
    check_regression_figures(out["table"], out["predictions"], out["figure_svg"], out["baselines_svg"], "qre+profile")
    from encmap.artifacts.features import read_feature_matrix

    fm = read_feature_matrix(features)
    spectral = {k: v[:3] for k, v in fm["spectral"].items()}
    pred = predict_scores(out["regressors"], fm["F"][:3], fm["attrs"], spectral)
    with h5py.File(out["regressors"], "r") as f:
        W, b = f["weights"][()], f["intercepts"][()]
        assert f.attrs["predictor"] == "qre+profile" and W.shape[-1] == 40 + 16
    np.testing.assert_allclose(pred["lee"]["ridge"], np.hstack([fm["F"][:3], spectral["profile"]]) @ W[0, 1] + b[0, 1])
    # What a placed encoder's prediction is expected to miss by: the predictor's out-of-fold MAE
    # with the model held out, as the table reports it (issue 65).
    from encmap.downstream.prediction import read_heldout_errors

    import csv
    table = {(r["task"], r["regressor"]): float(r["mae"]) for r in csv.DictReader(open(out["table"]))
             if r["protocol"] == "grouped" and r["features"] == "qre+profile"}
    held = read_heldout_errors(out["regressors"])
    assert set(held) == {"lee", "polarity"}
    for (t, reg), mae in table.items():
        assert held[t][reg]["mae"] == pytest.approx(mae, rel=1e-9) and held[t][reg]["rmse"] >= held[t][reg]["mae"]
    with pytest.raises(EncmapError, match="needs the encoders' spectral summary 'profile'"):
        predict_scores(out["regressors"], fm["F"][:3], fm["attrs"])
    with pytest.raises(EncmapError, match="regress.predictor 'nope'"):
        regress_step(features, dirs, out, regress=PARAMS | {"predictor": "nope"})


def _head_target_encoders(m_models: int = 15, per: int = 3, n: int = 2000, r: int = 64, seed: int = 3):
    """Spectra whose target moves mass between ranks 4 and 6 (1-based) only: ranks the 16-point
    profile of n = 2,000 does not sample, so the profile is blind to it and the head is not.
    A random decay exponent per encoder is the nuisance both see."""
    from encmap.qre.spectral import profile_ranks, spectral_head, spectral_profile, von_neumann_entropy
    from encmap.qre.spectrum import Spectrum

    assert not {4, 6} & set(profile_ranks(n).tolist())
    rng = np.random.default_rng(seed)
    spectral = {"head": [], "profile": [], "entropy": [], "log_rank": []}
    y = []
    for _ in range(m_models * per):
        lam = np.arange(1, r + 1, dtype=float) ** -rng.uniform(0.8, 1.4)
        lam /= lam.sum()
        u = rng.uniform(-1, 1)
        t = 0.9 * u * min(lam[5] - lam[6], lam[3] - lam[4])  # keeps the order of the eigenvalues
        plain = spectral_profile(Spectrum(U=np.broadcast_to(0.0, (n, r)), lam=lam.copy(), trace=1.0), eps=1e-6)
        lam[3] += t
        lam[5] -= t  # the sum stays 1: every sampled rank is unchanged
        spec = Spectrum(U=np.broadcast_to(0.0, (n, r)), lam=lam, trace=1.0)  # summaries need λ only
        assert np.array_equal(spectral_profile(spec, eps=1e-6), plain)  # the profile cannot see u
        spectral["head"].append(spectral_head(spec, eps=1e-6))
        spectral["profile"].append(spectral_profile(spec, eps=1e-6))
        spectral["entropy"].append(von_neumann_entropy(spec, eps=1e-6))
        spectral["log_rank"].append(np.log(r))
        y.append(u)
    groups = np.repeat([f"m{g}" for g in range(m_models)], per)
    return {k: np.array(v) for k, v in spectral.items()}, np.array(y)[:, None], groups


def test_a_target_of_the_top_eigenvalues_is_predicted_by_the_head_not_the_profile():
    spectral, Y, groups = _head_target_encoders()
    F = np.random.default_rng(0).standard_normal((len(Y), 30))
    rows, _ = regression_table(F, Y, ["top"], groups, records(len(Y), groups), PARAMS, 0, spectral=spectral,
                               feature_sets=("head", "profile", "qre+head"))
    for reg in ("ridge", "elasticnet"):
        head = table(rows, protocol="grouped", features="head", regressor=reg)[0]["spearman"]
        profile = table(rows, protocol="grouped", features="profile", regressor=reg)[0]["spearman"]
        assert head > 0.9 and not abs(profile) > 0.5, (reg, head, profile)  # measured: 0.99 vs |0.31| at most
    assert table(rows, protocol="grouped", features="qre+head", regressor="ridge")[0]["spearman"] > 0.7


def test_the_head_is_the_dense_density_matrix_top_eigenvalues_and_pads_narrow_encoders_exactly():
    """Against the eigenvalues of the dense n x n ρ_ε (numpy eigvalsh, an independent route): an
    encoder of rank 5 < 32 has the floor ε/n at ranks 6-32, exactly."""
    from encmap.qre.spectral import spectral_head
    from encmap.qre.spectrum import factor_pip

    rng = np.random.default_rng(1)
    n, eps = 50, 1e-3
    E = rng.standard_normal((n, 5)) @ rng.standard_normal((5, 9))  # rank 5, width 9
    spec = factor_pip(E)
    assert spec.rank == 5
    rho = (1 - eps) * (E @ E.T) / np.trace(E @ E.T) + eps * np.eye(n) / n
    dense = np.sort(np.linalg.eigvalsh(rho))[::-1][:32]
    head = spectral_head(spec, eps=eps)
    assert head.shape == (32,)
    np.testing.assert_allclose(np.exp(head), dense, rtol=1e-12, atol=1e-15)  # eigvalsh: ~1e-16 absolute
    assert np.all(head[5:] == np.log(eps / n))  # the padding is the floor itself, bit for bit
    assert spectral_head(spec, eps=eps, points=3).tolist() == head[:3].tolist()
    with pytest.raises(EncmapError, match="at least 1 point"):
        spectral_head(spec, eps=eps, points=0)


@pytest.mark.parametrize("case", ["ridge", "elasticnet", "tie", "nan", "one-candidate", "warm-start"])
def test_the_inner_search_makes_gridsearchcvs_choice_and_fit(case):
    """InnerSearch (the regression's fast inner CV) against scikit-learn's GridSearchCV itself:
    the same score of every candidate on every fold, the same best parameters and the same fitted
    coefficients, bit for bit, on grouped inner folds; including a tie (two candidates that fit
    alike: the first wins), a fold whose predictions are NaN (that candidate counts as the worst)
    and an estimator that warm-starts (InnerSearch refits one clone only where fit starts afresh)."""
    from sklearn import config_context
    from sklearn.base import BaseEstimator, RegressorMixin
    from sklearn.linear_model import ElasticNet, Ridge
    from sklearn.model_selection import GridSearchCV, GroupKFold
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer

    from encmap.downstream.regression import leading_columns
    from encmap.downstream.search import InnerSearch

    class NanAbove(BaseEstimator, RegressorMixin):  # Ridge whose predictions are NaN above an alpha
        def __init__(self, alpha=1.0, limit=5.0):
            self.alpha, self.limit = alpha, limit

        def fit(self, X, y):
            self.ridge_ = Ridge(alpha=self.alpha).fit(X, y)
            return self

        def predict(self, X):
            p = self.ridge_.predict(X)
            return p * np.nan if self.alpha > self.limit else p

    rng = np.random.default_rng(3)
    X, groups = rng.standard_normal((24, 10)), np.repeat(np.arange(6), 4)
    y = X[:, :3] @ np.array([1.0, -1.0, 0.5]) + 0.3 * rng.standard_normal(24)
    cv = list(GroupKFold(n_splits=3).split(X, groups=groups))
    est, grid = {
        "ridge": (Ridge(), {"alpha": [0.01, 1.0, 100.0]}),
        # "auto" is "cholesky" on dense rows: equal scores, the first in ParameterGrid order wins.
        "tie": (Ridge(), {"alpha": [100.0, 3.0], "solver": ["cholesky", "auto"]}),
        "nan": (NanAbove(), {"alpha": [10.0, 100.0, 0.1, 1.0]}),
        "one-candidate": (Ridge(), {"alpha": [7.0]}),
        "warm-start": (Pipeline([("model", ElasticNet(warm_start=True, tol=1e-2, max_iter=3))]),
                       {"model__alpha": [1e-3, 1e-2, 1e-1]}),
        "elasticnet": (Pipeline([("components", FunctionTransformer(leading_columns)),
                                 ("model", ElasticNet(max_iter=10000, random_state=0))]),
                       {"components__kw_args": [{"k": 2}, {"k": 6}], "model__alpha": [1e-3, 1e-1],
                        "model__l1_ratio": [0.2, 0.8]}),
    }["elasticnet" if case == "elasticnet" else case]
    with config_context(assume_finite=True):  # as encmap.parallel runs every fit: a NaN score is scored
        ref = GridSearchCV(est, grid, cv=cv, scoring="neg_mean_squared_error", error_score="raise").fit(X, y)
        ours = InnerSearch(est, grid, cv).fit(X, y)
    if case != "one-candidate":
        split = np.column_stack([ref.cv_results_[f"split{j}_test_score"] for j in range(len(cv))])
        np.testing.assert_array_equal(ours.scores_, split)
    assert ours.best_params_ == ref.best_params_
    if case == "tie":
        assert ours.best_params_ == {"alpha": 3.0, "solver": "cholesky"}
    if case == "nan":
        assert ours.best_params_["alpha"] <= 5.0
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))
    X_new = rng.standard_normal((5, 10))
    np.testing.assert_array_equal(ours.predict(X_new), ref.predict(X_new))


def test_the_inner_searchs_error_is_mean_squared_error_bit_for_bit():
    """``squared_error`` against scikit-learn's ``mean_squared_error``: equal bits on fold sizes
    below and above NumPy's pairwise-summation block, a NaN prediction, lists."""
    from sklearn.metrics import mean_squared_error

    from encmap.downstream.search import squared_error

    rng = np.random.default_rng(5)
    for n in (1, 3, 7, 8, 9, 127, 128, 129, 1000, 4099):
        y, p = rng.standard_normal(n) * 10 ** rng.uniform(-3, 3), rng.standard_normal(n)
        assert squared_error(y, p) == mean_squared_error(y, p), n
    assert np.isnan(squared_error([1.0, 2.0], [np.nan, 2.0]))
    assert squared_error([1, 2, 4], [1.0, 2.0, 2.0]) == mean_squared_error([1, 2, 4], [1.0, 2.0, 2.0]) == 4 / 3


def test_repeated_encoder_ids_in_a_matrix_or_a_groups_table_are_refused(tmp_path, capsys):
    """Old (issue 64.9): a matrix naming one encoder twice paired one encoder's features with the
    other's score and exited 0; a groups table naming an encoder twice kept the last group."""
    from encmap.cli import main

    rng = np.random.default_rng(0)
    F = rng.normal(size=(12, 30))
    ids = [f"e{i}" for i in range(12)]
    mine = tmp_path / "mine.h5"
    scores = tmp_path / "s.csv"
    scores.write_text("encoder,task,score\n" + "".join(f"e{i},t,{F[i, 0]}\n" for i in range(12) if i != 5))
    groups = tmp_path / "g.csv"
    groups.write_text("encoder,group\n" + "".join(f"e{i},g{i % 4}\n" for i in range(12)))
    params = tmp_path / "params.yaml"
    params.write_text((Path(__file__).parents[1] / "params.yaml").read_text())
    cmd = ["--params", str(params), "regress", "--features", str(mine), "--scores", str(scores),
           "--groups", str(groups)]
    write_h5(mine, {"features": F, "encoder_ids": np.array(ids[:5] + ["e3"] + ids[6:], dtype=object)}, {})
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "mine.h5" in err and "encoder 'e3' appears twice" in err, err
    write_h5(mine, {"features": F, "encoder_ids": np.array(ids, dtype=object)}, {})
    scores.write_text(scores.read_text() + f"e5,t,{F[5, 0]}\n")
    groups.write_text(groups.read_text() + "e5,g0\n")
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "g.csv line 14: encoder 'e5' appears twice" in err, err


@pytest.mark.parametrize("big", [1.7e308, -1.7e308, 1e200])
def test_scores_whose_spread_overflows_are_refused_by_name(tmp_path, capsys, big):
    """Old (issue 64.11): scores of ±1.7e308 ended in scikit-learn's raw ValueError traceback.
    Finite scores whose squared deviations overflow double are refused naming file, encoder, task."""
    from encmap.cli import main

    params, features, scores = cli_regress_inputs(tmp_path, [big if i == 7 else i * 0.1 for i in range(12)])
    assert main(["--params", str(params), "regress", "--features", features, "--scores", str(scores)]) == 2
    err = capsys.readouterr().err
    assert "s.csv" in err and "encoder 'e7'" in err and "task 't'" in err and "Traceback" not in err, err


@pytest.mark.parametrize("width", [40, 300])
def test_ridge_alpha_by_leave_one_out_is_scikit_learns_ridgecv_and_its_permutation_null_refits_each_shuffle(width):
    """The ridge rows (``ridge_alpha_cv: loo``) are StandardScaler -> RidgeCV on each outer fold;
    the permutation p-value refits every shuffle at once (alpha per target; on a matrix wider than
    its training rows, in their span), the same as fitting scikit-learn's pipeline on each
    shuffled score vector one by one (issue 65)."""
    from scipy.stats import spearmanr
    from sklearn.linear_model import RidgeCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from encmap.downstream.regression import permutation_p_value

    F, Y, g = synthetic_data()
    X, y = F[:, :width], Y[:, 0] + 2.0 * np.random.default_rng(5).standard_normal(50)  # a weak signal
    params = PARAMS | {"ridge_alpha_cv": "loo"}
    splits = outer_splits(g, "grouped", params, 0)

    def reference(target):
        pred = np.empty(50)
        for train, test in splits:
            pred[test] = make_pipeline(StandardScaler(), RidgeCV(alphas=params["ridge_alphas"])).fit(
                X[train], target[train]).predict(X[test])
        return pred

    got = cross_predict("ridge", X, y, g, splits, "grouped", params, 0)
    np.testing.assert_allclose(got, reference(y), rtol=1e-10, atol=1e-12)
    observed = spearmanr(y, got).statistic
    rng = np.random.default_rng(3)
    null = [spearmanr(t, reference(t)).statistic for t in (y[rng.permutation(50)] for _ in range(9))]
    expect = (1 + sum(v >= observed for v in null)) / 10
    assert permutation_p_value("ridge", X, y, g, splits, "grouped", params, 3, observed, 9) == expect
    assert np.isnan(permutation_p_value("elasticnet", X, y, g, splits, "grouped", params, 3, observed, 19))


def test_the_bootstrap_interval_resamples_whole_models():
    """Against a slow reference: scipy's Spearman on each resample of whole models, numpy's percentiles."""
    from scipy.stats import spearmanr

    from encmap.downstream.regression import bootstrap_interval

    rng = np.random.default_rng(0)
    g = np.repeat([f"m{k}" for k in range(8)], 3)[:-1]  # unequal models (the last has 2 encoders)
    y = np.round(rng.standard_normal(len(g)), 1)  # ties, as scores have
    pred = y + rng.standard_normal(len(g))
    labels = np.unique(g)
    stats = []
    for draw in np.random.default_rng(11).integers(0, 8, (300, 8)):
        idx = np.concatenate([np.flatnonzero(g == labels[k]) for k in draw])
        stats.append(spearmanr(y[idx], pred[idx]).statistic)
    low, high = bootstrap_interval(y, pred, g, 300, 0.9, 11)
    np.testing.assert_allclose([low, high], np.nanpercentile(stats, [5, 95]), rtol=1e-12)
    assert low < spearmanr(y, pred).statistic < high


def test_the_default_predictor_is_the_plain_ridgecv_protocol():
    """Issue 65: with params.yaml's regress section, the default predictor's ridge rows are what a
    user gets from scikit-learn alone: StandardScaler -> RidgeCV over np.logspace(-3, 5, 17) on
    [ln head, entropy, ln rank, exp(entropy)], one model held out at a time (issue 71: 25 models;
    old: GroupKFold(5) past 20 models), Spearman of the pooled out-of-fold predictions. Older: a
    34-column head and alpha by inner grouped CV over 8 alphas."""
    import yaml
    from scipy.stats import spearmanr
    from sklearn.linear_model import RidgeCV
    from sklearn.model_selection import LeaveOneGroupOut
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    params = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())["regress"]
    assert params["predictor"] == "head"
    spectral, Y, groups = _head_target_encoders(m_models=25, per=2)
    y = Y[:, 0] + 0.02 * np.random.default_rng(1).standard_normal(len(Y))
    X = np.c_[spectral["head"], spectral["entropy"], spectral["log_rank"], np.exp(spectral["entropy"])]
    pred = np.empty(len(y))
    for train, test in LeaveOneGroupOut().split(X, groups=groups):
        pred[test] = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-3, 5, 17))).fit(
            X[train], y[train]).predict(X[test])
    rows, _ = regression_table(np.zeros((len(y), 3)), y[:, None], ["top"], groups, None, params, params["seed"],
                               spectral=spectral, feature_sets=("head",))
    r = table(rows, protocol="grouped", features="head", regressor="ridge")[0]
    assert r["spearman"] == pytest.approx(spearmanr(y, pred).statistic, abs=1e-12) and r["folds"] == 25
    assert r["spearman_low"] < r["spearman"] < r["spearman_high"] and r["p_value"] == pytest.approx(1 / 200)


def test_an_evaluate_score_whose_spread_overflows_names_its_file(tmp_path):
    """The regress stage names the evaluate output a refused score came from (issue 64.11)."""
    from encmap.pipeline.regress import regress_step

    features, dirs = fake_run(tmp_path)
    f = Path(dirs[1]) / "e1.json"
    r = json.loads(f.read_text())
    r["tasks"]["polarity"]["main_score"] = -1.7e308
    f.write_text(json.dumps(r))
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    with pytest.raises(EncmapError, match=r"m1/e1\.json: encoder 'e1' task 'polarity': score -1\.7e\+308"):
        regress_step(features, dirs, out, regress=PARAMS)
    assert not (tmp_path / "out").exists()


def test_a_p_value_is_not_faked_by_a_floating_point_tie(monkeypatch):
    """Issue 70 item 4. Old: the null's copies one ulp below the observed Spearman were not counted
    (`null >= observed`): a task whose scores are all 0.5 but one 0.9, where every shuffle gives the
    same statistic, got p = 0.005 on its grouped mean row instead of 1. Now ties up to rounding
    count, with scipy.stats.permutation_test's tolerance (100 eps |observed|)."""
    from encmap.downstream import regression

    F, _, groups = synthetic_data()
    y = np.full(50, 0.5)
    y[7] = 0.9
    u = {"resamples": 400, "permutations": 199, "level": 0.95, "seed": 0, "min_units": 5}
    rows, _ = regression_table(F, y[:, None], ["one-high"], groups, None, PARAMS | {"uncertainty": u}, 0,
                               feature_sets=("mean",))
    for r in rows:
        assert r["p_value"] == 1.0 or not np.isfinite(r["spearman"]), r
    # A hand-made tie: every shuffle's Spearman exactly -1.0, the observed one ulp above it (the
    # default map's rows whose Spearman is -1.0 reported p = 0.005).
    monkeypatch.setattr(regression, "spearman_pairs", lambda A, B: np.full(A.shape[1], -1.0))
    splits = outer_splits(groups, "grouped", PARAMS, 0)
    p = regression.permutation_p_value("mean", F, y, groups, splits, "grouped", PARAMS, 0,
                                       np.nextafter(-1.0, 0.0), 199)
    assert p == 1.0


def test_rows_below_the_minimum_of_held_out_units_say_so_instead_of_an_interval():
    """Issue 70 item 4. Old: with 3 encoders of one model a "95% interval" was [-0.5, -0.5]; with 6 in
    2 groups the estimate sat on its edge. Below regress.uncertainty.min_units the row has no
    interval, and its note says why; at or above it, the interval is scipy's percentile bootstrap."""
    F, Y, groups = synthetic_data()
    u = {"resamples": 400, "permutations": 0, "level": 0.95, "seed": 0, "min_units": 5}
    rows, _ = regression_table(F[:12], Y[:12], ["linear", "group"], groups[:12], None, PARAMS | {"uncertainty": u}, 0,
                               feature_sets=("qre",))
    for r in table(rows, protocol="random"):  # 12 encoders of 3 models (the grouped protocol: 3 models too)
        assert r["units"] == 3 and np.isnan(r["spearman_low"]) and np.isnan(r["spearman_high"]), r
        assert r["note"] == "no interval: 3 held-out models, below regress.uncertainty.min_units = 5", r
    rows, _ = regression_table(F, Y, ["linear"], groups, None, PARAMS | {"uncertainty": u}, 0, feature_sets=("qre",))
    for r in rows:
        assert r["units"] == 10 and r["note"] == "" and r["spearman_low"] <= r["spearman"] <= r["spearman_high"], r


@pytest.mark.parametrize("spread", [0.0, 1e-12, 1e-14])
def test_a_task_constant_up_to_rounding_has_no_spearman_and_no_raw_warning(spread, recwarn):
    """Issue 70 item 4. Old: a task constant to 1e-12 printed SciPy's NearConstantInputWarning and a
    Spearman of -0.55 (the ranks of rounding noise)."""
    F, Y, groups = synthetic_data()
    y = 0.5 + spread * np.random.default_rng(1).standard_normal(50)
    rows, _ = regression_table(F, y[:, None], ["flat"], groups, None, PARAMS, 0, feature_sets=("qre", "mean"))
    assert all(np.isnan(r["spearman"]) and np.isnan(r["pearson"]) for r in rows), rows
    assert not [w for w in recwarn if "Constant" in type(w.message).__name__], [str(w.message) for w in recwarn]


def test_elasticnet_rows_do_not_depend_on_the_units_of_the_scores(synthetic):
    """Issue 70 item 7. Old: at scores x 0.001 every ElasticNet row equalled the mean baseline (its
    absolute alpha grid met unscaled scores). Now it fits standardised scores: the same choices, the
    Spearman unchanged, the MAE and the fitted map scaled with the scores."""
    from encmap.downstream.regression import fit_final

    F, Y, groups = synthetic_data()
    base = table(synthetic["rows"], task="linear", features="qre", regressor="elasticnet")
    for factor in (1e-3, 1e3):
        rows, _ = regression_table(F, Y * factor, ["linear", "group"], groups, None, PARAMS, 0, feature_sets=("qre",))
        for r in table(rows, task="linear", regressor="elasticnet"):
            b = table(base, protocol=r["protocol"])[0]
            assert r["spearman"] == pytest.approx(b["spearman"], abs=1e-9), (factor, r, b)
            assert r["mae"] == pytest.approx(b["mae"] * factor, rel=1e-6), (factor, r, b)
    one, big = fit_final(F, Y, ["linear", "group"], groups, PARAMS, 0), fit_final(F, Y * 1e3, ["linear", "group"],
                                                                                   groups, PARAMS, 0)
    assert one["chosen"]["linear"]["elasticnet"] == big["chosen"]["linear"]["elasticnet"]
    np.testing.assert_allclose(big["weights"][:, 0], one["weights"][:, 0] * 1e3, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("resamples, level, ok", [(1, 0.95, False), (399, 0.95, False), (400, 0.95, True),
                                                  (199, 0.9, False), (200, 0.9, True)])
def test_too_few_resamples_for_the_interval_are_refused(resamples, level, ok):
    """Issue 70 item 7. Old: regress.uncertainty.resamples: 1 passed the check, and 71 of 84 "95%"
    intervals excluded their own estimate."""
    import copy

    from encmap.params import load_params, validate_params

    params = copy.deepcopy(load_params(Path(__file__).resolve().parents[1] / "params.yaml"))
    params["regress"]["uncertainty"] |= {"resamples": resamples, "level": level}
    if ok:
        validate_params(params)
    else:
        with pytest.raises(EncmapError, match=r"key regress.uncertainty.resamples = \d+: a 0.9\d* interval needs at "
                                              r"least \d+ resamples"):
            validate_params(params)
