"""DVC decides what is stale: one model's change reruns that model only; experiments, params
and metrics diffs; push to an SSH remote and pull into a clone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import pytest
import yaml
from support.project import (
    ARTIFACTS,
    GATHERED,
    SMALL_MAP,
    make_project,
    ran,
    run,
    tiny_params,
    tree_hashes,
    with_param,
)

pytestmark = pytest.mark.slow


#: Stages that gather every encoder.
GATHERING = ("gather", "pairwise", "cka_rbf", "stitch", "agreement", "map", "regress")


def computed(root: Path) -> dict:
    """How many pairs the pair stages computed (not reused) in their last run."""
    sim = root / "results/similarity"
    t = {k: v for f in ("qre_pairwise", "cka_rbf", "stitch") for k, v in json.loads((sim / f"{f}.timing.json").read_text()).items()}
    return {k: t[k] for k in ("pairs_computed", "stitch_pairs_computed", "rbf_pairs_computed")}


def repro_ran(out: str) -> set[str]:
    """Stages that `encmap repro` ran (its "ran N of M stages (...)" lines)."""
    return {s for names in re.findall(r"encmap repro: ran \d+ of \d+ stages \(([^)]*)\)", out)
            for s in names.split(", ") if s}


def exp_params(entry) -> list[dict]:
    """Every params.yaml that an entry of `dvc exp show --json` holds (at any depth)."""
    if isinstance(entry, list):
        return [p for x in entry for p in exp_params(x)]
    if not isinstance(entry, dict):
        return []
    own = entry.get("params", {}).get("params.yaml", {}).get("data") if isinstance(entry.get("params"), dict) else None
    return ([own] if own else []) + [p for k, v in entry.items() if k != "params" for p in exp_params(v)]


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


@pytest.mark.slow(minutes=6)
def test_dvc_incremental_exp_and_pull(tmp_path, tiny_bert, user_file, monkeypatch):
    # 6 encoders (tiny-st's layer 2 and output, tiny-rand, lsa x 2, gauss): every stage kind,
    # fewer jobs per `dvc repro` / `dvc exp run`.
    params = tiny_params(tiny_bert, user_file)
    params["models"]["tiny-st"] |= {"layers": [2], "pooling": ["mean"], "dims": []}
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "proj", params, git=True)
    # The first run in one Snakemake call (it records what `dvc repro` would: test_repro); every
    # change below goes through `dvc repro` / `dvc exp run`, one stage at a time.
    out = run("encmap repro", proj).stdout
    assert "encmap repro: Snakemake failed" not in out and json.loads(run("dvc status --json", proj).stdout) == {}
    run("git add -A && git commit -qm results", proj)
    h0 = tree_hashes(proj, *ARTIFACTS)

    # 1. One model's params change: only that model's artifacts (and the gathered matrix) change.
    (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "models.gauss.seed", 1), sort_keys=False))
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

    # A comment edited in the corpus code makes stale only the stages that read the corpus: the
    # Wikipedia reader -> curate; the WordNet reader -> curate and tasks (built from WordNet).
    # Old: file_sha256 and read_sentences lived beside the readers, so every stage went stale.
    # DVC sees the edit in the code stage; once it has rewritten the digests, in those stages.
    for module, stale in (("wikipedia", {"curate"}), ("wordnet", {"curate", "tasks"})):
        f = proj / f"src/encmap/corpus/{module}.py"
        f.write_text(f.read_text() + "# an edited comment\n")
        assert set(json.loads(run("dvc status --json", proj).stdout)) == {"code"}, module
        run("dvc repro code", proj)
        assert set(json.loads(run("dvc status --json", proj).stdout)) == stale, module
        # encmap repro runs them, sees their bytes unchanged, and runs nothing below them.
        assert repro_ran(run("encmap repro", proj).stdout) == stale, module
        run("git reset -q --hard && dvc checkout -q", proj)  # the way back: the commit's bytes, no rerun
        assert json.loads(run("dvc status --json", proj).stdout) == {}, module

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
    # A map param reruns the map alone; `dvc metrics diff` shows what it did (here: the perplexity
    # t-SNE used, lowered to what the map's distinct encoders allow: one pair is one encoder).
    out = run("dvc exp run -S map.perplexity=1.5", proj).stdout
    assert ran(out) == {"map"}, out
    # (and the map stage's params slice, which the params stage wrote)
    diff = changed(h1, tree_hashes(proj, *ARTIFACTS))
    assert not [k for k in diff if not k.startswith(("results/map/", "results/params/map.json"))]
    assert "results/map/coords.csv" in diff
    assert "map.perplexity" in run("dvc params diff", proj).stdout
    mdiff = run("dvc metrics diff --md", proj).stdout
    assert "results/map/metrics.json" in mdiff and "perplexity_used" in mdiff, mdiff
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # A bad value is refused before any output is removed (every output persists), and the way back
    # is `git checkout params.yaml && dvc checkout`. Old: `dvc exp run -S qre.eps=1.5` failed clearly,
    # but DVC had already deleted the features stage's outputs.
    for bad, match in (("qre.eps=1.5", "key qre.eps: 1.5"), ("map.perplexity=abc", "key map.perplexity: 'abc'")):
        r = run(f"dvc exp run -S {bad}", proj, check=False)
        assert r.returncode != 0 and match in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
        assert tree_hashes(proj, *ARTIFACTS) == h1, bad
        run("git checkout -q -- params.yaml && dvc checkout -q", proj)
        assert "up to date" in run("dvc status", proj).stdout
    # A temporary experiment runs in a clean checkout of the commit, as queued ones do. Old: the
    # Brown corpus under the git-ignored vendor/ was missing there, so curate failed.
    out = run("dvc exp run --temp -S map.perplexity=1.2", proj).stdout
    assert ran(out) == {"map"}, out
    assert tree_hashes(proj, *ARTIFACTS) == h1  # the workspace is untouched
    assert "map.perplexity" in run("dvc exp show --no-pager --csv", proj).stdout

    # A regression param reruns the regression (and the map page it feeds) only; `dvc metrics diff` shows its effect.
    out = run("dvc exp run -S 'regress.ridge_alphas=[1000.0]'", proj).stdout
    assert ran(out) == {"regress", "map"}, out  # and the map, whose page shows the predictions
    # The map's coordinates, figures and metrics stay; only its page (hover scores) and timing change.
    assert not [k for k in changed(h1, tree_hashes(proj, *ARTIFACTS))
                if not k.startswith(("results/regression/", "results/params/regress.json", "results/map/map.html",
                                     "results/map/timing.json"))]
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
    # `dvc exp show` lists it as an experiment (not only as the workspace's params).
    shown = json.loads(run("dvc exp show --no-pager --json", proj).stdout)
    assert [8] in [p["models"]["lsa"]["dims"] for c in shown for e in c.get("experiments") or []
                   for p in exp_params(e)], shown
    run("git checkout -q -- . && dvc checkout -q", proj)
    assert tree_hashes(proj, *ARTIFACTS) == h1

    # 2. Push to an SSH remote (dvc-ssh; an SFTP server on loopback with a throwaway key, host
    # key checked against known_hosts); a fresh clone + pull is byte-identical and up to date.
    from support.sshd import sftp_server

    with sftp_server(tmp_path / "home") as sshd:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        key = f"dvc remote modify --local store keyfile {sshd['keyfile']}"  # the key stays out of git
        run(f"dvc remote add -d store {sshd['url_prefix']}{tmp_path}/remote && {key} && git add -A "
            "&& git commit -qm remote && dvc push -q", proj)
        assert (tmp_path / "remote/files/md5").is_dir()
        clone = tmp_path / "clone"
        run(f"git clone -q {proj} {clone}", tmp_path)
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


