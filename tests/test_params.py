"""params.yaml: the schema (one file, a description on every key), errors that name the key, and
no value that changes a result left to a default."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from encmap.encoders.variants import expand_encoders
from encmap.params import load_params, validate_params
from encmap.validation import EncmapError

REPO = Path(__file__).resolve().parents[1]


def test_default_params_valid_and_count_encoders():
    p = load_params(REPO / "params.yaml")
    enc = expand_encoders(p["models"])
    from encmap.validation import SAFE_ID

    # minilm-l6: `layers: all` with num_layers 6 -> 7 hidden states x 3 poolings, less CLS of the
    # input embeddings (constant), + 4 output variants.
    assert sum(v.model == "minilm-l6" for v in enc.values()) == 7 * 3 - 1 + 4
    assert all(SAFE_ID.match(e) for e in enc) and len(enc) == 70
    assert not [e for e in enc if e.endswith("__l00-cls")]


def test_params_errors_name_the_key(tmp_path):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["qre"]["eps"] = 1.5
    with pytest.raises(EncmapError, match=r"key qre.eps: 1.5 is greater than or equal"):
        validate_params(p)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["sentences"]["min_words"] = 50
    with pytest.raises(EncmapError, match="min_words"):
        validate_params(p)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    del p["models"]["tfidf-svd"]["dims"]
    with pytest.raises(EncmapError, match="key models.tfidf-svd: 'dims' is a required property"):
        validate_params(p)
    f = tmp_path / "params.yaml"
    f.write_text("a: 1\na: 2\n")
    with pytest.raises(EncmapError, match=r"duplicate key 'a' at line 2"):
        load_params(f)


@pytest.mark.parametrize("path", [
    "embed.degenerate", "pip.center", "pip.normalize_rows", "sentences.sources.0.weight", "sentences.sources.1.path",
    "models.minilm-l6.output", "models.minilm-l6.dims", "models.minilm-l6.renormalize_truncated",
    "models.e5-small.mode", "models.tfidf-svd.tfidf", "models.tfidf-svd.svd", "models.tfidf-svd.tfidf.sublinear_tf",
    "models.tfidf-svd.svd.algorithm", "models.glove-6b-50d.lowercase", "models.random-gaussian.dims",
])
def test_check_fails_when_a_value_that_changes_results_is_left_out(tmp_path, capsys, path):
    """Every value that changes a result is written in params.yaml: none may be left to a default."""
    from encmap import cli

    p = yaml.safe_load((REPO / "params.yaml").read_text())
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    del node[last]
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p))
    assert cli.main(["--params", str(f), "check"]) == 2
    assert f"'{last}' is a required property" in capsys.readouterr().err


@pytest.mark.parametrize("kind,extra,missing", [
    ("file", {"path": "x.txt", "weight": 1.0}, "text_field"),
    ("hf-dataset", {"path": None, "weight": 1.0, "dataset": "d", "text_field": "t", "revision": None}, "split"),
])
def test_source_kinds_need_their_fields(kind, extra, missing):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["sentences"]["sources"].append({"name": "extra", "kind": kind, **extra})
    with pytest.raises(EncmapError, match=f"'{missing}' is a required property"):
        validate_params(p)


def test_one_schema_file_with_a_description_on_every_key():
    """The schema lives in the package (what `encmap check` and the Snakefile read), once."""
    import json

    schema_file = REPO / "src/encmap/params.schema.json"
    assert schema_file.is_file() and not schema_file.is_symlink()
    assert not (REPO / "schemas").exists()
    assert len(list(REPO.rglob("params.schema.json"))) - len(list(REPO.glob(".venv/**/params.schema.json"))) == 1
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, sub in node.get("properties", {}).items():
                if isinstance(sub, dict) and not sub.get("description", "").strip():
                    missing.append(f"{path}{key}")
                walk(sub, f"{path}{key}.")
            if isinstance(node.get("items"), dict):
                walk(node["items"], f"{path[:-1]}[].")

    schema = json.loads(schema_file.read_text())
    walk(schema, "")
    for name, node in schema["$defs"].items():
        walk(node, "models.<id>." if name == "model" else "models.<id>.meta.")
    assert missing == []


def test_parameters_page_is_generated_from_the_schema():
    from encmap.params import parameters_markdown

    page = parameters_markdown()
    assert (REPO / "docs/parameters.md").read_text() == page, "run: encmap params-doc > docs/parameters.md"
    # Every key of the default params.yaml is on the page.
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, node in params.items():
        keys = [f"{section}.{k}" for k in node] if section != "models" else [
            f"models.<id>.{k}" for spec in node.values() for k in spec]
        for key in keys:
            assert f"| `{key}` |" in page, key


@pytest.mark.parametrize("model,key,value", [
    ("random-gaussian", "method", "tfidf-svd"),           # old: Gaussian rows recorded as method tfidf-svd
    ("random-gaussian", "tfidf", {"lowercase": True}),
    ("tfidf-svd", "renormalize_truncated", True),
    ("e5-small", "layers", [1]),
    ("minilm-l6", "mode", "query"),
    ("paraphrase-minilm-l3", "init", "random"),
])
def test_a_key_that_does_not_apply_to_the_backend_is_refused(model, key, value):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"][model][key] = value
    if key == "method":
        match = rf"key models\.{model}\.method: 'tfidf-svd' is not one of \['gaussian'\]"
    else:
        match = rf"key models\.{model}\.{key}: does not apply to model '{model}' \(backend"
    with pytest.raises(EncmapError, match=match):
        validate_params(p)


@pytest.mark.parametrize("path", ["sentences.sources.0.weight", "sentences.min_alpha", "pip.tol", "qre.eps",
                                  "similarity.rbf.threshold", "similarity.stitch.val", "similarity.stitch.ridge_alphas.0",
                                  "regress.elasticnet_alphas.1", "models.minilm-l6.meta.parameters", "map.perplexity"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused_everywhere(tmp_path, path, value):
    """Old: a source weight of .inf or .nan passed `encmap check` and curation never ended."""
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p))  # written as YAML's .nan / .inf, read back by the loader
    with pytest.raises(EncmapError, match=rf"key {path}: -?(nan|inf) is not a finite number"):
        load_params(f)


@pytest.mark.parametrize("edit,match", [
    # Old: each of these passed `encmap check` and failed minutes later in its stage, after
    # Snakemake had deleted that stage's previous outputs.
    (lambda p: p["map"].update(neighbours=70), r"key map\.neighbours = 70: .* below the m = 70 encoders"),
    (lambda p: p["map"].update(trustworthiness_k=35), r"key map\.trustworthiness_k = 35 must be below m/2 = 35\.0"),
    (lambda p: (p["map"].update(metric="exact-qre"), p["qre"].update(eps=0.0)), r"key map\.metric: exact-qre needs qre\.eps > 0"),
    (lambda p: (p["qre"].update(direction="reverse", eps=0.0)), r"key qre\.eps: reverse QRE needs eps > 0"),
    (lambda p: p["similarity"]["subset"].update(neighbours=70), r"key similarity\.subset\.neighbours = 70"),
    (lambda p: p["sentences"].update(n=5), r"key similarity\.stitch\.sample: n = 5 sentences are too few"),
    (lambda p: p["similarity"]["stitch"].update(knn_k=500), r"key similarity\.stitch\.knn_k = 500 must be below the 400 test"),
    (lambda p: p["sentences"].update(n=3), r"key similarity\.rbf\.sample: CKA needs at least 4 sentences"),
])
def test_values_that_can_only_fail_are_refused_before_any_job(edit, match):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    edit(p)
    with pytest.raises(EncmapError, match=match):
        validate_params(p)


def test_many_models_report_every_problem_at_once_each_naming_its_model():
    """500 generated models with three broken ones: one error lists all three (before: the first)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    gauss = {"backend": "control", "method": "gaussian", "dim": 64, "rank": None, "dims": [],
             "renormalize_truncated": True, "meta": params["models"]["random-gaussian"]["meta"]}
    params["models"] = {f"g{i:04d}": dict(gauss, seed=i) for i in range(500)}
    params["models"]["g0003"]["dim"] = "16"
    params["models"]["g0250"]["colour"] = "red"
    params["models"]["g0499"]["dims"] = [64]
    with pytest.raises(EncmapError) as e:
        validate_params(params, "p.yaml")
    lines = str(e.value).splitlines()
    assert lines[0] == "p.yaml: 3 problems:"
    assert any("models.g0003.dim" in x for x in lines) and any("models.g0250" in x and "colour" in x for x in lines)
    assert any("model 'g0499': dims [64] must all be below" in x for x in lines)


def test_params_are_parsed_with_libyaml_and_still_refuse_duplicate_keys():
    import yaml as pyyaml

    from encmap.params import UniqueKeyLoader, parse_yaml

    assert issubclass(UniqueKeyLoader, pyyaml.CSafeLoader)
    with pytest.raises(EncmapError, match=r"p.yaml: duplicate key 'a' at line 3 \(first at line 1\)"):
        parse_yaml("a: 1\nb: 2\na: 3\n", "p.yaml")
    with pytest.raises(EncmapError, match=r"p.yaml: not valid YAML at line \d+, column \d+: while parsing a flow node"):
        parse_yaml("a: 1\nb: [\n", "p.yaml")


def test_snakemake_reads_params_as_json_rendered_once_per_content(tmp_path, monkeypatch):
    import json

    from encmap.params import snakemake_configfile

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    first = snakemake_configfile("params.yaml")
    assert first.endswith(".json") and json.loads(Path(first).read_text()) == load_params("params.yaml")
    mtime = Path(first).stat().st_mtime_ns
    assert snakemake_configfile("params.yaml") == first and Path(first).stat().st_mtime_ns == mtime
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("seed: 0", "seed: 1", 1))
    second = snakemake_configfile("params.yaml")
    assert second != first and not Path(first).exists()  # one rendering: of the current content


def test_a_lineage_cycle_is_refused_by_the_check():
    """Old: a derived_from cycle passed `encmap check`; the whole pipeline ran, then the map stage
    failed (and deleted the previous map)."""
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"]["minilm-l6"]["meta"]["derived_from"] = {"model": "random-minilm-l6", "relation": "re-initialised"}
    with pytest.raises(EncmapError, match=r"models\.minilm-l6\.meta\.derived_from: the lineage forms a cycle: "
                                          r"minilm-l6 -> random-minilm-l6 -> minilm-l6"):
        validate_params(p)


def test_a_model_id_whose_encoder_ids_grow_too_long_says_so():
    """Old: a 128-character model id passed as a model id and was then refused as "use 1-128
    characters" (its encoder ids, with their suffixes, are longer)."""
    from encmap.encoders.variants import model_variants

    p = yaml.safe_load((REPO / "params.yaml").read_text())
    spec = p["models"]["minilm-l6"]
    with pytest.raises(EncmapError, match=r"model id 'a{128}' \(128 characters\): its encoder id 'a{128}__l00-mean' "
                                          r"has 138 characters, over the 128 an id may have; shorten the model id to at "
                                          r"most 118 characters"):
        model_variants("a" * 128, spec)
    assert model_variants("a" * 118, spec)  # its longest suffixes (__l00-mean, __out-d128) fit
    with pytest.raises(EncmapError, match="at most 118"):
        model_variants("a" * 119, spec)


def _integer_keys(node: dict, path: str = "") -> list[tuple[str, dict]]:
    """Every integer-typed node of the schema, with its dotted path."""
    found = []
    t = node.get("type")
    if t == "integer" or (isinstance(t, list) and "integer" in t):
        found.append((path, node))
    for k, v in node.items():
        for sub in (v if isinstance(v, list) else [v]):
            if isinstance(sub, dict):
                found += _integer_keys(sub, f"{path}.{k}" if path else k)
    return found


SEEDS = ["sentences.seed", "map.seed", "similarity.rbf.seed", "similarity.stitch.seed", "evaluate.seed",
         "regress.seed", "regress.uncertainty.seed", "models.minilm-l6.seed"]


@pytest.mark.parametrize("path", SEEDS + ["regress.max_iter", "map.n_iter", "models.minilm-l6.max_seq_length"])
@pytest.mark.parametrize("value", [2**64, 2**32, 10**400])
def test_an_integer_no_library_takes_is_refused_by_the_check(path, value):
    """Old: `map.seed: 2**64` (or 2**32) passed `encmap check` and died in scikit-learn at the map
    stage ('Seed must be between 0 and 2**32 - 1'); `regress.max_iter: 2**32` in ElasticNet's
    compiled loop (OverflowError). Every integer key now stops at 2^32 - 1, named."""
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    shown = str(value) if value < 10**24 else r"100000000000…0000 \(401 digits\)"
    with pytest.raises(EncmapError, match=rf"key {path}: {shown} is above 4,294,967,295 \(2\^32 - 1\)"):
        validate_params(p)
    node[last] = 2**32 - 1  # the bound itself is valid
    validate_params(p)


def test_every_integer_key_has_the_bound_the_libraries_take_and_the_bound_works():
    """The schema's every integer stops at 2^32 - 1, the largest seed NumPy's RandomState (so
    scikit-learn, openTSNE, gensim) takes; the bound itself runs in each of them."""
    import json

    from gensim.models import Word2Vec
    from sklearn.model_selection import KFold

    from encmap.maps.tsne import fit_map
    from encmap.params import MAX_INT

    schema = json.loads((REPO / "src/encmap/params.schema.json").read_text())
    keys = _integer_keys(schema)
    assert len(keys) > 60 and all(node.get("maximum", MAX_INT + 1) <= MAX_INT for _, node in keys), \
        [k for k, node in keys if node.get("maximum", MAX_INT + 1) > MAX_INT]
    X = np.random.default_rng(0).normal(size=(12, 5))
    fit_map(X, perplexity=2, n_iter=20, early_exaggeration_iter=10, random_state=MAX_INT)
    list(KFold(3, shuffle=True, random_state=MAX_INT).split(X))
    Word2Vec([["a", "b", "c"]] * 3, vector_size=4, min_count=1, seed=MAX_INT, workers=1, epochs=1)
    with pytest.raises(ValueError, match="2\\*\\*32 - 1"):  # and one past it is what the check now refuses
        list(KFold(3, shuffle=True, random_state=MAX_INT + 1).split(X))


@pytest.mark.parametrize("path", ["similarity.rbf.threshold", "similarity.stitch.ridge_alphas.0", "map.perplexity"])
def test_a_number_key_given_an_integer_no_float_holds_is_refused(path):
    """Old: `similarity.rbf.threshold: 1` followed by 400 zeros passed the check (a YAML integer) and
    float() of it raised a raw OverflowError in the stage."""
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = 10**400
    with pytest.raises(EncmapError, match=rf"key {path}: 100000000000…0000 \(401 digits\) is not a finite number"):
        validate_params(p)


def test_an_integer_of_thousands_of_digits_in_the_file_is_a_yaml_error_at_its_line(tmp_path):
    """Old: Python's raw 'Exceeds the limit (4300 digits) for integer string conversion' ValueError."""
    text = (REPO / "params.yaml").read_text()
    i = text.index("\nmap:")
    j = text.index("  seed:", i)
    line = text[:j].count("\n") + 1
    f = tmp_path / "params.yaml"
    f.write_text(text[:j] + "  seed: " + "7" * 5000 + text[text.index("\n", j):])
    with pytest.raises(EncmapError, match=rf"params.yaml: not valid YAML at line {line}, column 9: an integer of "
                                          "5,000 characters"):
        load_params(f)
