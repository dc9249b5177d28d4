"""Artifacts changed behind the pipeline's back, through real Snakemake runs.

Old: each of these ended with `snakemake --cores 2` exiting 0 on a wrong result, or saying
"Nothing to be done" while the damage stayed: another encoder's embeddings accepted (qre.h5 listed
one encoder twice), a sentence file cut after curation used as it was, a truncated / NaN /
reshaped embeddings file or a deleted features file left in place, an edited pair result reused.
Now the ledger (encmap.workflow.integrity) reruns the job of a damaged output (Snakemake's --forcerun), and
where the ledger cannot know (a project copied without .snakemake), each reader refuses the file.
A dry run only reports (old: it dropped the damaged files' entries, so the next run recorded the
damage as good), and the mark stays until the job has rewritten the output (old: the output was
moved aside and stayed gone when the run's targets did not need it).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from support.project import ARTIFACTS, SMALL_MAP, make_project, run, tiny_params, tree_hashes

from encmap.artifacts.features import read_feature_matrix

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert, user_file) -> Path:
    params = tiny_params(tiny_bert, user_file, n=150)
    params["models"] = {k: params["models"][k] for k in ("tiny-rand", "gauss", "lsa")}
    params["map"] |= SMALL_MAP  # 4 encoders
    params["similarity"]["stitch"] |= {"mlp_depths": [], "sample": 150}
    proj = make_project(tmp_path_factory.mktemp("built") / "p", params)
    run("snakemake --cores 2", proj)
    assert (proj / ".snakemake/encmap/ledger.sqlite").is_file()
    assert not (proj / "dvc.lock").exists() and not (proj / "results/code").exists()  # no DVC here: none of its files
    return proj


def copy(built: Path, tmp_path: Path, ledger: bool = True) -> Path:
    proj = tmp_path / "p"
    shutil.copytree(built, proj, symlinks=True)  # copy2: modification times kept
    if not ledger:
        shutil.rmtree(proj / ".snakemake/encmap")
    return proj


def hashes(proj: Path) -> dict[str, str]:
    """Every artifact's sha256, less the wall-clock timing files (which differ by design)."""
    return {k: v for k, v in tree_hashes(proj, *ARTIFACTS).items() if not k.endswith("timing.json")}


def nothing_to_do(proj: Path) -> bool:
    r = run("snakemake -n", proj)
    return "Nothing to be done" in r.stdout + r.stderr


def ids(proj: Path) -> list[str]:
    return read_feature_matrix(proj / "results/features/qre.h5")["ids"]


def ledger(proj: Path) -> list:
    import sqlite3

    with sqlite3.connect(proj / ".snakemake/encmap/ledger.sqlite") as con:
        return [sorted(con.execute(f"SELECT {cols} FROM {t}"))
                for t, cols in (("files", "*"), ("damaged", "path, sha256"))]


def test_another_encoders_file_is_made_again_even_when_the_target_does_not_need_it(built, tmp_path):
    """Old: the damaged directory was moved aside ("its job reruns"), the requested target did not
    need it, and results/embeddings/lsa stayed gone."""
    proj = copy(built, tmp_path)
    before = hashes(proj)
    shutil.copy(proj / "results/embeddings/gauss/gauss__out.h5", proj / "results/embeddings/lsa/lsa__d8.h5")
    (proj / "results/embeddings/lsa/.snakemake_timestamp").touch()
    r = run("snakemake --cores 2 results/features/qre.h5", proj)
    assert "results/embeddings/lsa/lsa__d8.h5: changed since encmap wrote it" in r.stderr
    assert "its job reruns (results/embeddings/lsa)" in r.stderr
    assert ids(proj) == ["gauss__out", "lsa__d16", "lsa__d8", "tiny-rand__l02-max"]
    assert hashes(proj) == before  # made again, byte for byte, nothing gone
    r = run("snakemake -n results/features/qre.h5", proj)
    assert "Nothing to be done" in r.stdout + r.stderr and ledger(proj)[1] == []


def test_a_dry_run_changes_nothing_and_the_damage_is_reported_until_remade(built, tmp_path):
    """Old: `snakemake -n` said "dry run: nothing moved" but dropped the swapped files' ledger
    entries; the next `snakemake` recorded the swapped bytes as good ("Nothing to be done")."""
    proj = copy(built, tmp_path)
    before, recorded = hashes(proj), ledger(proj)
    a, b = proj / "results/pip/lsa/lsa__d8.h5", proj / "results/pip/lsa/lsa__d16.h5"
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    for _ in range(2):  # the message is kept: each dry run reports it, and changes nothing
        r = run("snakemake -n", proj)
        assert "results/pip/lsa/lsa__d8.h5: changed since encmap wrote it" in r.stderr
        assert "results/pip/lsa/lsa__d16.h5: changed since encmap wrote it" in r.stderr
        assert "dry run: nothing changed" in r.stderr
        assert ledger(proj) == recorded
    r = run("snakemake --cores 2", proj)
    assert "Nothing to be done" not in r.stdout + r.stderr
    assert hashes(proj) == before and nothing_to_do(proj) and ledger(proj)[1] == []


def test_a_failed_run_keeps_the_damage_marked(built, tmp_path):
    """A run that ends before the damaged output's job (here: a target that does not need it is
    refused before any job) records the other artifacts but not the damaged bytes as good."""
    proj = copy(built, tmp_path)
    before = hashes(proj)
    emb = proj / "results/embeddings/gauss/gauss__out.h5"
    emb.write_bytes(emb.read_bytes()[:1000])
    r = run("snakemake --cores 2 --allowed-rules map results/map/map.html", proj, check=False)
    assert "results/embeddings/gauss/gauss__out.h5: changed since encmap wrote it" in r.stderr
    from encmap.workflow.integrity import record

    record(proj)  # what onerror does
    assert [p for p, _ in ledger(proj)[1]] == ["results/embeddings/gauss/gauss__out.h5"]
    r = run("snakemake --cores 2", proj)
    assert "gauss__out.h5: changed since encmap wrote it" in r.stderr
    assert hashes(proj) == before and nothing_to_do(proj)


def test_without_the_ledger_the_reader_refuses_another_encoders_file(built, tmp_path):
    proj = copy(built, tmp_path, ledger=False)
    shutil.copy(proj / "results/embeddings/gauss/gauss__out.h5", proj / "results/embeddings/lsa/lsa__d8.h5")
    (proj / "results/embeddings/lsa/.snakemake_timestamp").touch()
    r = run("snakemake --cores 2", proj, check=False)
    assert r.returncode != 0
    log = (proj / "logs/pip/lsa/lsa__d8.log").read_text()
    assert "lsa__d8.h5: holds the embeddings of encoder 'gauss__out' of model 'gauss'" in log, log[-2000:]
    assert ids(proj).count("gauss__out") == 1


@pytest.mark.slow(minutes=3)  # with the module's build (~1.5 min) before it
def test_a_sentence_file_cut_after_curation(built, tmp_path):
    txt = "data/sentences/tiny.txt"
    proj = copy(built, tmp_path)
    lines = (proj / txt).read_text().splitlines(keepends=True)
    (proj / txt).write_text("".join(lines[:100]))
    r = run("snakemake --cores 2", proj)  # the ledger reruns its job: curated again
    assert f"{txt}: changed since encmap wrote it" in r.stderr
    assert (proj / txt).read_text() == "".join(lines)
    assert read_feature_matrix(proj / "results/features/qre.h5")["F"].shape[1] == 150

    proj = copy(built, tmp_path / "no-ledger", ledger=False)
    (proj / txt).write_text("".join(lines[:100]))
    r = run("snakemake --cores 2 --keep-going", proj, check=False)
    assert r.returncode != 0
    log = (proj / "logs/embed/gauss.log").read_text()
    assert f"{txt}: changed after curation" in log and "rerun curate" in log, log[-2000:]
    assert read_feature_matrix(proj / "results/features/qre.h5")["F"].shape[1] == 150  # nothing rebuilt on 100


@pytest.mark.parametrize("damage", ["truncate", "nan", "shape", "delete-features"])
def test_damaged_artifacts_are_made_again(built, tmp_path, damage):
    proj = copy(built, tmp_path)
    before = hashes(proj)
    emb = proj / "results/embeddings/gauss/gauss__out.h5"
    if damage == "truncate":
        emb.write_bytes(emb.read_bytes()[:1000])
    elif damage == "nan":
        data = emb.read_bytes()
        with h5py.File(emb, "r") as f:
            offset = f["embeddings"].id.get_offset()
        emb.write_bytes(data[:offset] + np.float32(np.nan).tobytes() + data[offset + 4:])  # in place
    elif damage == "shape":
        with h5py.File(emb, "r") as f:
            attrs = dict(f.attrs)
        from encmap.io import write_h5

        write_h5(emb, {"embeddings": np.ones((150, 3), np.float32)}, attrs)
    else:
        (proj / "results/features/encoders/lsa/lsa__d16.h5").unlink()
    r = run("snakemake --cores 2", proj)
    assert ("changed since encmap wrote it" in r.stderr) != (damage == "delete-features")
    assert hashes(proj) == before
    assert nothing_to_do(proj)


def test_an_edited_pair_result_is_recomputed(built, tmp_path):
    pw = "results/similarity/qre_pairwise.h5"
    for ledger in (True, False):
        proj = copy(built, tmp_path / str(ledger), ledger=ledger)
        before = hashes(proj)
        with h5py.File(proj / pw, "r+") as f:  # a copy, never a DVC-tracked file
            f["qre"][0, 1] += 1.0
        run("snakemake --cores 2 --forcerun pairwise", proj)
        assert hashes(proj) == before, ledger


def test_a_job_of_linear_stitches_imports_no_torch_and_makes_the_same_rows(built, tmp_path):
    """Only MLP stitches run on a device (torch); a stitch job with none resolves no device, so it
    imports no torch (~1.3 s of CPU per job). Run in a fresh interpreter on the built project's
    inputs, it makes the rows its Snakemake job made, byte for byte."""
    import json

    import yaml
    from support.fresh import fresh_digests

    sim = yaml.safe_load((built / "params.yaml").read_text())["similarity"]
    assert sim["stitch"]["mlp_depths"] == []
    out = {k: str(tmp_path / f"stitch.{k}") for k in ("stitches", "csv", "timing")}
    embeddings = sorted(str(p) for p in (built / "results/embeddings").iterdir())
    fresh_digests(f"""
import sys
from encmap.pipeline.stitch import stitch_step
stitch_step({str(built / "results/features/qre.h5")!r}, {embeddings!r}, {out!r}, subset={sim["subset"]!r},
            stitch={sim["stitch"]!r}, threads=1, code="another")
assert "torch" not in sys.modules, "a job of linear stitches imported torch"
print("done")
""", seeds=("1",))
    made = built / "results/similarity"
    assert Path(out["csv"]).read_bytes() == (made / "stitches.csv").read_bytes()
    assert json.loads(Path(out["stitches"]).read_text())["rows"] == json.loads((made / "stitches.json").read_text())["rows"]
    assert json.loads(Path(out["timing"]).read_text())["device"] == "cpu"
