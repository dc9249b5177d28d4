"""Each DVC stage depends on exactly the code and params that can change its outputs.

A stage's code is its digest, ``results/code/<stage>.sha256``, which DVC's ``code`` stage writes
from :mod:`encmap.workflow.deps`' import analysis. dvc.yaml is generated whole from the stage
registry (:mod:`encmap.workflow.stages`); these tests hold the committed file to it, show that the
analysis finds what a weaker one missed (a lazy import in a helper, a dynamic import, a file a
module reads) and leaves out what a stage never runs, that a digest (and the pair caches keyed by
it) changes exactly when a file its stage runs changes, and that the workflow's names line up:
rule, script, step module, registry entry and DVC stage.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from support.project import with_param

import encmap
from encmap.params import load_params
from encmap.validation import EncmapError
from encmap.workflow.deps import (
    BOOKKEEPING,
    CODE_ROOTS,
    CODE_STAGE,
    STAGE_PARAMS,
    check_dvc_yaml,
    code_key,
    generated_dvc_yaml,
    param_slices,
    stage_code,
    stage_digest,
    write_dvc_yaml,
    write_slices,
)
from encmap.workflow.stages import STAGES as REGISTRY
from encmap.workflow.stages import stage_job

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
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    assert check_dvc_yaml(tmp_path) == []
    return tmp_path


def test_the_committed_dvc_yaml_is_what_the_registry_generates():
    """One description of the graph: dvc.yaml is generated whole (`encmap deps --write`)."""
    assert (REPO / "dvc.yaml").read_text() == generated_dvc_yaml(REPO)
    assert list(STAGES) == list(REGISTRY)
    code = ALL_STAGES[CODE_STAGE]
    assert code["deps"] == list(CODE_ROOTS) and code["outs"] == [f"results/code/{s}.sha256" for s in STAGES]
    for stage, st in STAGES.items():
        deps = (st.get("do") or st)["deps"]
        assert f"results/code/{stage}.sha256" in deps and not [d for d in deps if d.startswith(("src/", "rules/"))]
        assert (st.get("do") or st)["cmd"] == "encmap stage"


def test_a_hand_edit_of_dvc_yaml_is_flagged_and_written_back(tree):
    dvc = tree / "dvc.yaml"
    text = dvc.read_text()
    anchor = "        - results/code/pip.sha256\n"
    assert text.count(anchor) == 1
    dvc.write_text(text.replace(anchor, "        - src/encmap/maps/tsne.py\n"))
    problems = check_dvc_yaml(tree)
    assert problems[0].startswith("dvc.yaml is not what the stage registry generates")
    assert "-        - src/encmap/maps/tsne.py" in problems and "+        - results/code/pip.sha256" in problems
    assert write_dvc_yaml(tree) and check_dvc_yaml(tree) == []
    assert (tree / "dvc.yaml").read_text() == (REPO / "dvc.yaml").read_text()


def test_files_params_name_are_deps_of_the_stages_that_read_them(tree):
    """A score table or a local copy of MTEB's results named in params becomes a dep of regress
    (was: to be added to dvc.yaml by hand), a source at another path a dep of curate."""
    params = yaml.safe_load((tree / "params.yaml").read_text())
    params["regress"]["score_tables"] = [{"path": "mine/scores.csv", "tasks": ["t"]}]
    params["regress"]["mteb"]["results"] = "/data/mteb-results"
    params["sentences"]["sources"].append({"name": "mine", "kind": "file", "path": "mine/sentences.txt",
                                           "weight": 1.0, "text_field": "text"})
    (tree / "params.yaml").write_text(yaml.safe_dump(params))
    assert write_dvc_yaml(tree)
    stages = yaml.safe_load((tree / "dvc.yaml").read_text())["stages"]
    assert {"mine/scores.csv", "/data/mteb-results"} <= set(stages["regress"]["deps"])
    assert "mine/sentences.txt" in stages["curate"]["deps"]


def test_rule_inputs_and_outputs_are_the_stages_dvc_deps_and_outs():
    """The registry's two granularities agree: every Snakemake input lies in a DVC dep of its
    stage and every Snakemake output in a tracked output (per-encoder files in their model's
    folder, figures in the figures folder), and each tracked output holds some output."""
    params = load_params(REPO / "params.yaml")

    def inside(path: str, paths: list[str]) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)

    for name, st in REGISTRY.items():
        model = "minilm-l6"
        deps = [d.replace("{set}", params["sentences"]["set"]).replace("{model}", model) for d in st.deps]
        tracked = [t.path.replace("{set}", params["sentences"]["set"]).replace("{model}", model) for t in st.tracks]
        ins = [v for value in st.inputs(params).values() for v in ([value] if isinstance(value, str) else value)]
        outs = list(st.outputs(params).values())
        if name in ("pip", "features"):
            outs = list(stage_job(f"{name}@{model}", params).targets)
        fill = {"model": model, "encoder": "minilm-l6__out"}
        for path in ins:
            assert inside(path.format(**fill), deps), (name, path)
        for path in outs:
            assert inside(path.format(**fill), tracked), (name, path)
        for t in tracked:
            assert any(inside(o.format(**fill), [t]) for o in outs), (name, t)


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
        assert "src/encmap/workflow/deps.py" not in stage_digest(REPO, stage)
        deps = set(deps_of(stage))
        assert not deps & {"Snakefile", "rules/common.smk", "src/encmap/params.py", "src/encmap/params.schema.json",
                           "src/encmap/workflow/layout.py", "src/encmap/workflow/deps.py", "src/encmap/cli.py"}, stage


def test_the_corpus_code_reaches_only_the_stages_that_read_the_corpus():
    """Old: file_sha256 and read_sentences lived beside the corpus readers, so every stage that
    hashed or read the curated file depended on the Wikipedia template renderer."""
    users = {stage for stage in STAGES if any(d.startswith("src/encmap/corpus/") for d in deps_of(stage))}
    assert users == {"curate", "tasks"}
    wiki = {stage for stage in STAGES if "src/encmap/corpus/wikipedia.py" in deps_of(stage)}
    assert wiki == {"curate"}


@pytest.mark.parametrize("edited, changes", [
    ("src/encmap/validation.py", True),  # similarity.blocks imports it; the former hand list left it out
    ("src/encmap/similarity/blocks.py", True),
    ("src/encmap/corpus/wikipedia.py", False),
])
def test_a_pair_cache_is_invalidated_by_an_edit_to_any_file_its_stage_runs(tree, tmp_path, edited, changes):
    """One answer to which code matters: the pair stages key the pairs they reuse by their code
    digest (old: hand-written module lists, which already disagreed with the digests). The key
    the rule hands the step changes with the edit, and the step then reuses no stored pair."""
    from support.fake_run import fake_run

    from encmap.pipeline.pairwise import pairwise_step

    run = fake_run(tmp_path / "run")
    outs = [str(tmp_path / f"sim/{k}") for k in ("qre.h5", "cka.h5", "timing.json")]

    def computed(code: str) -> int:
        pairwise_step(run["features"], run["pips"], *outs, eps=1e-6, code=code)
        return json.loads(Path(outs[2]).read_text())["pairs_computed"]

    before = code_key(tree, "pairwise")
    assert computed(before) == 28 and computed(before) == 0  # 8 encoders; a rerun reuses every pair
    f = tree / edited
    f.write_text(f.read_text() + "# an edited comment\n")
    after = code_key(tree, "pairwise")
    assert (after != before) == changes
    assert computed(after) == (28 if changes else 0)
    assert "src/encmap/validation.py" in stage_code(tree, "pairwise")


def test_a_file_a_module_reads_is_part_of_its_stages_code(tree):
    """The map page's script and style are files (READS in encmap.maps.page): an edit to them
    changes the map stage's digest, no other."""
    assert {"src/encmap/maps/page.js", "src/encmap/maps/page.css"} <= set(stage_code(tree, "map"))
    before = digests(tree)
    js = tree / "src/encmap/maps/page.js"
    js.write_text(js.read_text() + "// an edited comment\n")
    after = digests(tree)
    assert {s for s in STAGES if before[s] != after[s]} == {"map"}
    page = tree / "src/encmap/maps/page.py"
    page.write_text(page.read_text().replace('READS = ("page.css", "page.js")', 'READS = ("page.css", "gone.js")'))
    with pytest.raises(EncmapError, match=r"page\.py: READS names 'gone\.js', which is not beside it"):
        stage_code(tree, "map")


def test_rule_script_step_and_stage_share_one_name():
    """A stage is one rule file, one script, one step module and one registry entry, all named alike."""
    rules = sorted(f.stem for f in (REPO / "rules").glob("*.smk") if f.stem != "common")
    assert rules == sorted(STAGES) == sorted(REGISTRY)
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
                      "evaluate": ["models.${key} except meta", "sentences.n", "embed.degenerate", "embed.deterministic",
                                   "embed.batch_tokens", "evaluate.seed",
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


def test_the_params_validation_marker_is_keyed_by_what_validation_runs():
    """The marker that spares a second validation of the same config is keyed by the same import
    analysis as the stages' digests, not a hand list: every module validate_params can run."""
    from encmap.workflow.deps import module_files

    got = {f.relative_to(Path(encmap.__file__).parent).as_posix() for f in module_files("encmap.params", "validate_params")}
    assert {"params.py", "validation.py", "encoders/variants.py", "similarity/stitch.py"} <= got
    assert "qre/features.py" not in got  # and not the science it never runs


def test_a_new_public_api_name_reruns_no_stage(tree):
    """The API's table (encmap.api) is resolved lazily from encmap.__getattr__, which no job
    calls: adding a name to it changes no stage's code digest (a thousand-model map reruns nothing)."""
    before = digests(tree)
    api = tree / "src/encmap/api.py"
    api.write_text(api.read_text().replace('    "EncmapError": "encmap.validation",\n',
                                           '    "EncmapError": "encmap.validation",\n    "rbf_gram": "encmap.similarity.cka",\n'))
    assert digests(tree) == before
    assert not any("src/encmap/api.py" in stage_code(tree, s) for s in STAGES)


def _encmap_import_graph() -> dict[str, set[str]]:
    """encmap module -> the encmap modules it imports anywhere (top level or inside a function)."""
    import ast

    src = Path(encmap.__file__).parent
    graph: dict[str, set[str]] = {}
    for p in src.rglob("*.py"):
        parts = list(p.relative_to(src.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mod = ".".join(parts[:-1] if is_pkg else parts)
        pkg = mod if is_pkg else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = []
            if isinstance(n, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)] if n.level else []
                target = ".".join(base + ([n.module] if n.module else []))
                names = [target] + [f"{target}.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            for name in names:
                while name.startswith("encmap") and not ((src.parent / name.replace(".", "/")).with_suffix(".py").exists()
                                                         or (src.parent / name.replace(".", "/")).is_dir()):
                    name = name.rsplit(".", 1)[0]  # a symbol: its module
                if name.startswith("encmap") and name != mod:
                    deps.add(name)
        graph[mod] = deps
    return graph


def test_the_science_and_params_sit_below_the_plumbing_and_the_plumbing_has_no_cycle():
    """Issue 41 item 13. Old: workflow/deps.py <-> workflow/stages.py imported each other, and
    params.py imported workflow.deps. Only the entry points (the CLI, encmap place) reach into the plumbing."""
    graph = _encmap_import_graph()
    assert "encmap.workflow.deps" in graph and "encmap.params" in graph  # the analysis sees the package
    upward = {m: sorted(d for d in deps if d.startswith("encmap.workflow")) for m, deps in graph.items()
              if not m.startswith("encmap.workflow") and m not in ("encmap.cli", "encmap.place")}
    assert {m: d for m, d in upward.items() if d} == {}
    plumbing = {m: {d for d in deps if d.startswith("encmap.workflow.")} for m, deps in graph.items()
                if m.startswith("encmap.workflow.")}

    def reaches(a: str, b: str, seen: set) -> bool:
        return any(d == b or (d not in seen and not seen.add(d) and reaches(d, b, seen)) for d in plumbing.get(a, ()))

    cycles = sorted((a, b) for a in plumbing for b in plumbing[a] if reaches(b, a, set()))
    assert cycles == []
