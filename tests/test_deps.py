"""Each DVC stage depends on exactly the code and params that can change its outputs.

A stage's code is its digest, ``results/code/<stage>.sha256``, which DVC's ``code`` stage writes
from :mod:`encmap.deps`' import analysis; these tests hold dvc.yaml to that scheme, show that the
analysis finds what a weaker one missed (a lazy import in a helper, a dynamic import) and leaves
out what a stage never runs, that a digest changes exactly when a file its stage runs changes,
and that the workflow's names line up: rule, script, step module and DVC stage.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from support.project import with_param

from encmap.deps import (
    BOOKKEEPING,
    CODE_ROOTS,
    CODE_STAGE,
    STAGE_PARAMS,
    check_dvc_yaml,
    param_slices,
    stage_code,
    stage_digest,
    write_dvc_yaml,
    write_slices,
)
from encmap.params import load_params
from encmap.repro import stage_job
from encmap.validation import EncmapError

REPO = Path(__file__).resolve().parents[1]
ALL_STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
STAGES = {k: v for k, v in ALL_STAGES.items() if k not in BOOKKEEPING}


def deps_of(stage: str) -> list[str]:
    """What the stage's job runs (its digest's files)."""
    return stage_code(REPO, stage)


def digests(root: Path) -> dict[str, str]:
    return {s: stage_digest(root, s) for s in STAGES}


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the workflow's code (rules, scripts, package sources, dvc.yaml) to break on purpose."""
    for name in ("rules", "scripts", "src"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (tmp_path / "requirements").mkdir()
    shutil.copy(REPO / "requirements/lock.txt", tmp_path / "requirements/lock.txt")
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    assert check_dvc_yaml(tmp_path) == []
    return tmp_path


def test_dvc_yaml_follows_the_digest_scheme():
    assert check_dvc_yaml(REPO) == []
    code = ALL_STAGES[CODE_STAGE]
    assert code["deps"] == list(CODE_ROOTS) and code["outs"] == [f"results/code/{s}.sha256" for s in STAGES]
    for stage, st in STAGES.items():
        deps = (st.get("do") or st)["deps"]
        assert f"results/code/{stage}.sha256" in deps and not [d for d in deps if d.startswith(("src/", "rules/"))]


def test_each_stage_reads_its_params_from_its_slice_and_a_slice_changes_with_its_values_only(tmp_path):
    """DVC parses a params file once per stage that lists it: per-model stages read a small slice."""
    for stage, st in STAGES.items():
        st = st.get("do") or st
        assert "params" not in st, stage
        assert [d for d in st["deps"] if d.startswith("results/params/")] == (
            [f"results/params/{stage}/${{key}}.json" if "foreach" in ALL_STAGES[stage] and stage in ("embed", "evaluate")
             else f"results/params/{stage}.json"] if stage in STAGE_PARAMS else []), stage
    assert ALL_STAGES["params"]["params"] == [{"params.yaml": None}]
    params = load_params(REPO / "params.yaml")
    before = param_slices(params)
    entry = {k: v for k, v in params["models"]["minilm-l6"].items() if k != "meta"}
    assert json.loads(before["results/params/embed/minilm-l6.json"]) == {
        "models.minilm-l6": entry, "embed": {k: v for k, v in params["embed"].items() if k != "on_error"},
        "sentences.n": params["sentences"]["n"]}
    assert json.loads(before["results/params/gather.json"]) == {
        "models.*.meta": {m: spec["meta"] for m, spec in params["models"].items()}}
    assert len(before) == 10 + 2 * len(params["models"])
    for key, value, changed in (
        ("models.glove-6b-50d.seed", 7, {"results/params/embed/glove-6b-50d.json",
                                         "results/params/evaluate/glove-6b-50d.json"}),
        ("qre.eps", 0.001, {"results/params/features.json", "results/params/pairwise.json"}),
        ("qre.direction", "backward", {"results/params/features.json"}),
        ("map.perplexity", 5, {"results/params/map.json"}),
        # Old: each of these reran every model's embed and evaluate, whose outputs they do not change.
        ("models.glove-6b-50d.meta.mteb_name", "org/glove", {"results/params/gather.json"}),
        ("embed.on_error", "skip", set()),
        ("evaluate.on_error", "skip", set()),
    ):
        after = param_slices(with_param(params, key, value))
        assert {k for k in before if before[k] != after[k]} == changed, key
    # Written only where the text changed; a model dropped from params loses its slices, and the
    # gathering stage's slice changes (it read the dropped model's folder as long as it was there).
    assert len(write_slices(tmp_path, params)) == len(before)
    assert write_slices(tmp_path, params) == []
    fewer = params | {"models": {k: v for k, v in params["models"].items() if k != "tfidf-svd"}}
    assert sorted(write_slices(tmp_path, fewer)) == ["results/params/embed/tfidf-svd.json",
                                                     "results/params/evaluate/tfidf-svd.json",
                                                     "results/params/gather.json"]
    assert not (tmp_path / "results/params/embed/tfidf-svd.json").exists()


@pytest.mark.parametrize("edited, stale", [
    ("src/encmap/corpus/wikipedia.py", {"curate"}),
    ("src/encmap/corpus/wordnet.py", {"curate", "tasks"}),
    ("src/encmap/qre/features.py", {"features"}),
    ("rules/map.smk", {"map"}),
    ("src/encmap/params.py", set()),  # parse-time code: no stage's
    ("requirements/lock.txt", set(STAGES)),
])
def test_a_digest_changes_exactly_when_a_file_its_stage_runs_changes(tree, edited, stale):
    before = digests(tree)
    f = tree / edited
    f.write_text(f.read_text() + "# an edited comment\n")
    after = digests(tree)
    assert {s for s in STAGES if before[s] != after[s]} == stale


def test_the_code_stage_command_writes_only_the_digests_that_changed(tree, capsys):
    from encmap import cli

    assert cli.main(["deps", "--root", str(tree), "--digest"]) == 0
    assert capsys.readouterr().out.startswith(f"code digests: {len(STAGES)} changed")
    assert sorted(f.stem for f in (tree / "results/code").iterdir()) == sorted(STAGES)
    assert (tree / "results/code/map.sha256").read_text() == stage_digest(tree, "map")
    assert cli.main(["deps", "--root", str(tree), "--digest"]) == 0
    assert capsys.readouterr().out == "code digests: 0 changed\n"
    f = tree / "src/encmap/corpus/wikipedia.py"
    f.write_text(f.read_text() + "# an edited comment\n")
    assert cli.main(["deps", "--root", str(tree), "--digest"]) == 0
    assert capsys.readouterr().out == "code digests: 1 changed (curate)\n"


def test_a_lazy_import_in_a_helper_of_the_step_module_is_found(tree):
    """The former check read only the step function's own imports and missed this."""
    step = tree / "src/encmap/pipeline/pairwise.py"
    text = step.read_text()
    helper = "def _rank_only(pip_file: str):\n"
    assert helper in text
    before = stage_digest(tree, "pairwise")
    step.write_text(text.replace(helper, helper + "    from ..similarity import agreement  # noqa: F401\n"))
    assert "src/encmap/similarity/agreement.py" in stage_code(tree, "pairwise")
    assert "src/encmap/similarity/agreement.py" in stage_digest(tree, "pairwise") != before


def test_a_lazy_import_in_a_function_the_stage_never_calls_is_no_dependency(tree):
    """Function-level reachability: artifacts/pip.py's as_stored serves `encmap place`, not a stage."""
    mod = tree / "src/encmap/artifacts/pip.py"
    text = mod.read_text()
    anchor = "    n, r = spec.U.shape\n    if stores_basis(n, E.shape[1], r):"
    assert anchor in text
    mod.write_text(text.replace(anchor, "    from ..maps import tsne  # noqa: F401\n" + anchor))
    assert "src/encmap/maps/tsne.py" not in stage_code(tree, "pip")
    before = stage_digest(tree, "pip")
    (tree / "src/encmap/maps/tsne.py").write_text((tree / "src/encmap/maps/tsne.py").read_text() + "# edit\n")
    assert stage_digest(tree, "pip") == before


def test_a_stage_listing_code_itself_or_missing_its_digest_is_flagged(tree):
    dvc = tree / "dvc.yaml"
    text = dvc.read_text()
    anchor = "        - results/code/pip.sha256\n"
    assert text.count(anchor) == 1
    dvc.write_text(text.replace(anchor, "        - src/encmap/maps/tsne.py\n"))
    assert check_dvc_yaml(tree) == [
        "stage pip: lists code src/encmap/maps/tsne.py itself (its code is results/code/pip.sha256, which the "
        "code stage writes)", "stage pip: missing results/code/pip.sha256 (the code it runs)"]
    # `encmap deps --write` puts it right again and keeps the data deps.
    assert write_dvc_yaml(tree) and check_dvc_yaml(tree) == []
    assert (tree / "dvc.yaml").read_text() == (REPO / "dvc.yaml").read_text()


def test_an_undeclared_dynamic_import_is_an_error_not_a_silent_gap(tree):
    mod = tree / "src/encmap/encoders/embed.py"
    text = mod.read_text()
    assert 'LOADS_BY_NAME = "encmap.encoders.backends"' in text
    mod.write_text(text.replace('LOADS_BY_NAME = "encmap.encoders.backends"', "BACKEND_PACKAGE = 'x'")
                   .replace("{LOADS_BY_NAME}", "{BACKEND_PACKAGE}"))
    with pytest.raises(EncmapError, match=r"embed\.py: embed_model imports modules by name but the module "
                                          r"declares no LOADS_BY_NAME"):
        stage_code(tree, "embed")


def test_stages_that_embed_depend_on_every_backend():
    for stage in ("embed", "evaluate"):
        assert "src/encmap/encoders/backends" in deps_of(stage)


def test_parse_time_code_is_no_stage_dependency():
    """params validation and file naming run before any job: editing them must not rerun a map."""
    for stage in STAGES:
        assert "src/encmap/deps.py" not in stage_digest(REPO, stage)
        deps = set(deps_of(stage))
        assert not deps & {"Snakefile", "rules/common.smk", "src/encmap/params.py", "src/encmap/params.schema.json",
                           "src/encmap/layout.py", "src/encmap/deps.py", "src/encmap/cli.py"}, stage


def test_the_corpus_code_reaches_only_the_stages_that_read_the_corpus():
    """Old: file_sha256 and read_sentences lived beside the corpus readers, so every stage that
    hashed or read the curated file depended on the Wikipedia template renderer."""
    users = {stage for stage in STAGES if any(d.startswith("src/encmap/corpus/") for d in deps_of(stage))}
    assert users == {"curate", "tasks"}
    wiki = {stage for stage in STAGES if "src/encmap/corpus/wikipedia.py" in deps_of(stage)}
    assert wiki == {"curate"}


def test_pair_cache_keys_hash_only_code_their_stage_runs():
    """A pair stage's reuse key hashes modules by name: each must be code the stage really runs."""
    from encmap.pipeline.cka_rbf import RBF_CODE
    from encmap.pipeline.pairwise import PAIR_CODE
    from encmap.pipeline.stitch import STITCH_CODE

    for stage, modules in (("pairwise", PAIR_CODE), ("cka_rbf", RBF_CODE), ("stitch", STITCH_CODE)):
        files = {f"src/{m.replace('.', '/')}.py" for m in modules}
        assert files <= set(deps_of(stage)), stage


def test_rule_script_step_and_stage_share_one_name():
    """A stage is one rule file, one script and one step module, all named alike."""
    rules = sorted(f.stem for f in (REPO / "rules").glob("*.smk") if f.stem != "common")
    assert rules == sorted(STAGES)
    snakefile = (REPO / "Snakefile").read_text()
    for name in rules:
        text = (REPO / "rules" / f"{name}.smk").read_text()
        assert re.findall(r"^rule (\w+):", text, re.M) == [name], name
        assert f'include: "rules/{name}.smk"' in snakefile, name
        assert (REPO / "scripts" / f"{name}.py").is_file(), name
        script = (REPO / "scripts" / f"{name}.py").read_text()
        assert f"from encmap.pipeline.{name} import {name}_step" in script, name
        assert f"def {name}_step(" in (REPO / "src/encmap/pipeline" / f"{name}.py").read_text(), name
        assert (STAGES[name].get("do") or STAGES[name])["cmd"] == "encmap stage", name  # its job: by name
        params = load_params(REPO / "params.yaml")
        assert stage_job(name + ("@minilm-l6" if "foreach" in ALL_STAGES[name] else ""), params).rule == name
    assert ALL_STAGES[CODE_STAGE]["cmd"] == "encmap deps --digest"  # DVC bookkeeping, no Snakemake job
    steps = sorted(f.stem for f in (REPO / "src/encmap/pipeline").glob("*.py") if f.stem != "__init__")
    assert steps == rules


def test_every_stage_depends_on_the_library_stack_and_curate_on_the_sources_files():
    """A Debian wordnet-base update or another Brown release must make DVC rerun curate."""
    deps = ALL_STAGES["curate"]["deps"]
    for src in yaml.safe_load((REPO / "params.yaml").read_text())["sentences"]["sources"]:
        if src["path"] is not None:
            assert src["path"] in deps, src
    for stage in STAGES:
        assert "  requirements/lock.txt\n" in stage_digest(REPO, stage), stage  # also pins gensim's Wikipedia sample


def test_each_stage_lists_the_params_its_rule_reads():
    """A param missing from a stage would leave DVC blind to its change (e.g. pip.center)."""
    params = {name: [p.replace("{model}", "${key}") for p in STAGE_PARAMS.get(name, ())] for name in STAGES}
    assert params == {"curate": ["sentences"], "embed": ["models.${key} except meta", "embed except on_error",
                                                         "sentences.n"], "pip": ["pip"],
                      "features": ["qre"], "gather": ["models.*.meta"], "pairwise": ["qre.eps", "pairwise"],
                      "cka_rbf": ["similarity.subset", "similarity.rbf"],
                      "stitch": ["similarity.subset", "similarity.stitch"], "agreement": [], "map": ["map", "regress.predictor"],
                      "tasks": ["sentences.n", "evaluate.tasks", "evaluate.seed", "evaluate.supersense", "evaluate.gloss",
                                "evaluate.brown", "evaluate.polarity", "evaluate.data"],
                      "evaluate": ["models.${key} except meta", "sentences.n", "embed.degenerate", "evaluate.seed",
                                   "evaluate.classification", "evaluate.retrieval_k", "evaluate.device", "evaluate.mteb"],
                      "regress": ["regress"]}
    # Every config key a rule file reads is covered by a param its stage lists.
    for name, listed in params.items():
        text = (REPO / "rules" / f"{name}.smk").read_text()
        paths = [p.split(" except ")[0] for p in listed]
        for access in re.findall(r'config((?:\["[\w-]+"\])+)', text):
            key = ".".join(re.findall(r'"([\w-]+)"', access))
            assert any(key == p or key.startswith(p + ".") or p.startswith(key + ".") for p in paths), (name, key)
        if re.search(r"config\[\"models\"\]\[wc\.model\]", text):
            assert "models.${key}" in paths, name
        # What a slice leaves out the rule must not hand its step either (or keep: on_error changes no output).
        if "models.${key} except meta" in listed:
            assert 'science_spec(config["models"][wc.model])' in text, name
    # Every key of `evaluate` is listed by the stage that reads it (tasks build, evaluate scores).
    listed = {p.split(".", 1)[1] for p in params["tasks"] + params["evaluate"] if p.startswith("evaluate.")}
    assert listed | {"on_error"} == set(load_params(REPO / "params.yaml")["evaluate"])  # on_error: no output changes
