"""``encmap repro``: DVC's per-model decision, one Snakemake call per batch, the same dvc.lock.

A params file with 200 generated models gives the same per-model staleness as one with 4 (a
changed seed, a features param, an edit to the features code); ``encmap repro`` records what
``dvc repro`` would, byte for byte; a failing model leaves the others recorded.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from support.project import REPO, control_params, make_project, run, tiny_params, tree_hashes, with_param

def per_model(stages) -> dict[str, list[str]]:
    """Stage kinds by model id (``embed@ctl-0003`` -> ``ctl-0003: [embed]``); model-less stages under ``-``."""
    out: dict[str, list[str]] = defaultdict(list)
    for s in stages:
        kind, _, model = s.partition("@")
        out[model or "-"].append(kind)
    return {k: sorted(v) for k, v in out.items()}


def status(proj: Path) -> dict[str, list[str]]:
    return per_model(json.loads(run("dvc status --json gather --with-deps", proj).stdout))


def dry_run(proj: Path) -> tuple[dict, dict]:
    """``encmap repro -n gather``: the first batch and what follows, by model."""
    lines = run("encmap repro -n gather", proj).stdout.splitlines()
    first = [x.strip() for x in lines if x.startswith("  ") and not x.endswith("(after)")]
    then = [x.split()[0] for x in lines if x.endswith("(after)")]
    return per_model(first), per_model(then)


def summary(stale: dict[str, list[str]], changed: str) -> dict:
    """A per-model staleness made independent of m: the changed model's, and the distinct patterns of the others."""
    others = {tuple(v) for k, v in stale.items() if k not in (changed, "-")}
    return {"changed": stale.get(changed), "others": sorted(others), "gathering": stale.get("-"),
            "others_stale": sum(1 for k in stale if k not in (changed, "-"))}


def without_timings(root: Path) -> tuple[dict, dict]:
    hashes = {k: v for k, v in tree_hashes(root, "data", "results").items() if not k.endswith("timing.json")}
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    return hashes, lock


@pytest.mark.slow(minutes=5)
def test_per_model_staleness_with_200_models_is_the_same_as_with_4(tmp_path):
    projects = {m: make_project(tmp_path / f"m{m}", control_params(m), git=True) for m in (4, 200)}
    # The reference: dvc repro, one Snakemake process per stage (2-3 s each: 4 models, not 10), on a
    # copy of the 4-model project.
    reference = make_project(tmp_path / "dvc", control_params(4), git=True)
    run("dvc repro gather", reference)
    for m, proj in projects.items():
        out = run("encmap repro gather", proj).stdout
        assert f"encmap repro: {3 * m + 2} stages recorded in dvc.lock" in out, out[-3000:]  # code ran apart
        assert status(proj) == {}, m
        dry = run("snakemake -n results/features/qre.h5", proj)
        assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-2000:]
        run("git add -A && git commit -qm results", proj)
    # Same bytes and the same dvc.lock as dvc repro wrote.
    assert without_timings(projects[4]) == without_timings(reference)

    changed = "ctl-0003"

    def normalized(stale: dict, m: int) -> dict:
        s = summary(stale, changed)
        return s | {"others_stale": {0: "none", m - 1: "all"}.get(s["others_stale"], s["others_stale"])}

    for what, key, value, expect in (
        ("a model's seed", f"models.{changed}.seed", 99,
         {"changed": ["embed"], "others": [], "gathering": None, "others_stale": "none"}),
        ("a features param", "qre.eps", 0.001,
         {"changed": ["features"], "others": [("features",)], "gathering": None, "others_stale": "all"}),
    ):
        seen = {}
        for m, proj in projects.items():
            params = yaml.safe_load((proj / "params.yaml").read_text())
            (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, key, value), sort_keys=False))
            # DVC sees params.yaml change in its params stage; once that has written the slices,
            # in the stages that read the changed values.
            assert status(proj) == {"-": ["params"]}, (what, m)
            first, then = dry_run(proj)
            run("dvc repro params", proj)
            seen[m] = (normalized(status(proj), m), normalized(first, m), normalized(then, m))
        assert seen[4] == seen[200], (what, seen)
        assert seen[4][0] == seen[4][1] == expect, (what, seen[4])
        assert seen[4][2]["gathering"] == ["gather"], (what, seen[4])
        if what == "a model's seed":  # run it: only that model's artifacts and the matrix change
            for m, proj in projects.items():
                before = tree_hashes(proj, "data", "results")
                out = run("encmap repro gather", proj).stdout
                assert "encmap repro: 4 stages recorded in dvc.lock" in out, out[-3000:]
                diff = {k for k, v in tree_hashes(proj, "data", "results").items() if before.get(k) != v}
                assert diff and all(changed in k or k.startswith("results/features/") for k in diff), diff
                assert {k for k in diff if changed not in k} <= {"results/features/qre.h5",
                                                                  "results/features/metrics.json"}, diff
                assert status(proj) == {}
        for proj in projects.values():  # back to the commit (encmap repro staged dvc.lock: core.autostage)
            run("git reset -q --hard && dvc checkout -q gather --with-deps", proj)

    # Code: the edit shows in DVC's code stage; its digests make exactly the features stages stale.
    for m, proj in projects.items():
        f = proj / "src/encmap/qre/features.py"
        f.write_text(f.read_text() + "# an edited comment\n")
        assert status(proj) == {"-": ["code"]}, m
        first, then = dry_run(proj)
        assert summary(first, changed) == {"changed": ["features"], "others": [("features",)], "gathering": None,
                                           "others_stale": m - 1}, m
        assert then == {"-": ["gather"]}, m
        run("git checkout -q -- .", proj)


@pytest.mark.slow(minutes=3)
def test_a_failing_model_leaves_the_others_recorded(tmp_path, tiny_bert, user_file):
    params = control_params(4)
    params["map"] |= {"perplexity": 1, "neighbours": 2, "trustworthiness_k": 1}  # 5 encoders
    broken = shutil.copytree(tiny_bert, tmp_path / "truncated")
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    tiny = tiny_params(tiny_bert, user_file)["models"]["tiny-rand"]
    params["models"]["truncated"] = dict(tiny, source=f"path:{broken}", init="pretrained")
    proj = make_project(tmp_path / "proj", params, git=True)
    r = run("encmap repro gather -- --keep-going", proj, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "model 'truncated': embed failed" in out, out[-4000:]
    left = re.search(r"not run or not recorded: (.*)", out).group(1)
    assert set(left.split(", ")) == {"embed@truncated", "pip@truncated", "features@truncated", "gather"}, left
    # The good models' stages are in dvc.lock: DVC finds only the broken model and the matrix stale.
    assert set(json.loads(run("dvc status --json gather --with-deps", proj).stdout)) == {
        "embed@truncated", "pip@truncated", "features@truncated", "gather"}


def test_every_stage_job_comes_from_params_not_from_a_command():
    from encmap.params import load_params
    from encmap.workflow.stages import stage_job
    from encmap.validation import EncmapError

    params = load_params(REPO / "params.yaml")
    job = stage_job("pip@minilm-l6", params)
    assert job.rule == "pip" and job.prune == ("pip", "minilm-l6")
    assert job.targets[0] == "results/pip/minilm-l6/minilm-l6__l00-max.h5" and len(job.targets) == 24  # its encoders, by id
    assert stage_job("curate", params).targets == (f"data/sentences/{params['sentences']['set']}.txt",)
    assert stage_job("embed@minilm-l6", params).targets == ("results/embeddings/minilm-l6",)
    assert stage_job("map", params).targets == ("results/map/map.html",) and stage_job("map", params).prune is None
    for name, match in (("embed@nosuch", "no model 'nosuch'"), ("embed", "name it embed@<model>"),
                        ("map@minilm-l6", "no per-model stage"), ("mine", "unknown stage 'mine'")):
        with pytest.raises(EncmapError, match=match):
            stage_job(name, params)
    # Every stage of dvc.yaml has a job.
    for name, st in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        if name not in ("code", "params"):
            stage_job(name + ("@minilm-l6" if "foreach" in st else ""), params)
