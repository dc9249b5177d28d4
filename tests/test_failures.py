"""Bad input and broken runs: clear errors that name the problem, and nothing half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import pytest
import yaml
from support.project import SMALL_MAP, make_project, ran, run, tiny_params, with_param

pytestmark = pytest.mark.slow


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


def _duplicate_gauss(text: str) -> str:
    gauss = text[text.index("  gauss:"):text.index("pip:")]
    return text.replace("pip:", gauss + "pip:", 1)


def _stray_colon(text: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith("  gauss:"))
    lines[i + 1] = lines[i + 1].rstrip("\n") + " : ]\n"
    return "".join(lines)


@pytest.mark.parametrize("edit,match", [
    (_duplicate_gauss, r"duplicate key 'gauss' at line \d+"),
    # Old: Snakemake's own "Config file is not valid JSON or YAML", naming no line.
    (_stray_colon, r"params.yaml: not valid YAML at line \d+, column \d+"),
])
def test_params_file_errors_name_the_line(tmp_path, tiny_bert, user_file, edit, match):
    import re

    proj = make_project(tmp_path / "p", tiny_params(tiny_bert, user_file))
    text = edit((proj / "params.yaml").read_text())
    (proj / "params.yaml").write_text(text)
    r = run("snakemake -n", proj, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and re.search(match, out), out[-3000:]
    if "at line" in match and "YAML" in match:
        line = int(re.search(r"at line (\d+)", out).group(1))
        assert text.splitlines()[line - 1].endswith(" : ]"), line


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
    from support.models import build_tiny_bert

    params = tiny_params(tiny_bert, user_file)
    for corrupt in ("nan", "zero"):
        broken = build_tiny_bert(tmp_path / f"broken-{corrupt}", corrupt=corrupt)
        params["models"][f"broken-{corrupt}"] = dict(params["models"]["tiny-rand"], source=f"path:{broken}",
                                                    init="pretrained")
    # Old: zero weights with CLS pooling were refused as "pooling 'cls' on a causal (decoder)
    # model" (nothing reads the text, so the first position ignored the last token too).
    params["models"]["broken-zero"]["pooling"] = ["mean", "cls"]
    proj = make_project(tmp_path / "p", params)
    r = run("snakemake --cores 2 --keep-going --until features", proj, check=False)
    assert r.returncode != 0
    for corrupt, match, enc in (("nan", "non-finite values", "l02-max"), ("zero", "all embeddings are zero", "l02-")):
        log = (proj / f"logs/embed/broken-{corrupt}.log").read_text()
        assert match in log and f"encoder 'broken-{corrupt}__{enc}" in log and "causal" not in log, log[-2000:]
        assert not (proj / f"results/embeddings/broken-{corrupt}").exists()
    for model, n in (("tiny-st", 7), ("tiny-rand", 1), ("lsa", 2), ("gauss", 1)):  # the others finished
        assert len(list((proj / f"results/features/encoders/{model}").glob("*.h5"))) == n, model


def test_degenerate_encoder_fails_or_leaves_the_map(tmp_path, tiny_bert, user_file):
    """A real constant encoder: word-piece averages from a checkpoint whose tokenizer lost its
    vocabulary (every token [UNK]): the same vector for every sentence."""
    from support.models import build_tiny_bert

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


def test_a_killed_per_encoder_job_leaves_no_temporary_after_the_rerun(tmp_path, tiny_bert, user_file):
    """SIGKILL while a PIP's temporary file exists; the rerun of that job removes it. Old: the
    `results/pip/<model>/.<encoder>.h5.*.tmp` stayed, though the README says the next run removes it."""
    import signal
    import subprocess
    import time

    from support.project import env

    from encmap.workflow.layout import artifact_paths

    params = tiny_params(tiny_bert, user_file)
    params["models"] = {k: params["models"][k] for k in ("tiny-rand", "gauss", "lsa")}
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "proj", params)
    pip = artifact_paths(params["models"], "pip", only=["gauss"])[0]
    run("snakemake --cores 1 results/embeddings/gauss", proj)
    job = subprocess.Popen(["snakemake", "--cores", "1", pip], cwd=proj, start_new_session=True,
                           env=env() | {"ENCMAP_PAUSE_BEFORE_RENAME": "60"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, temps = time.time() + 120, []
    while not temps and time.time() < deadline and job.poll() is None:
        time.sleep(0.2)
        temps = list((proj / pip).parent.glob(".*.tmp"))
    assert temps, "no temporary file appeared"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert all(p.exists() for p in temps) and not (proj / pip).exists()
    run("snakemake --unlock", proj)  # what Snakemake asks for after a kill
    run(f"snakemake --cores 1 {pip}", proj)
    assert (proj / pip).exists()
    assert not list((proj / "results").rglob("*.tmp")), list((proj / "results").rglob("*.tmp"))


@pytest.mark.slow(minutes=2)
def test_job_killed_mid_write_leaves_nothing_tracked(tmp_path, snakemade):
    """SIGKILL while an artifact's temporary file exists: the rerun completes, DVC never tracks
    the temporary file, and `dvc status` is clean afterwards."""
    import shutil
    import signal
    import subprocess
    import time

    from support.project import env

    from encmap.workflow.integrity import LEDGER

    # Ten control models made by plain Snakemake (conftest's snakemade, built once for the session)
    # and recorded by encmap record, as dvc repro would record them (test_record, test_repro),
    # without the plain run's ledger (none is kept under DVC). The run killed is dvc repro's.
    proj = shutil.copytree(snakemade, tmp_path / "proj", symlinks=True)
    run("encmap record", proj)
    (proj / LEDGER).unlink()
    assert run("git status --porcelain", proj).stdout == ""  # the plain run's end recorded it all, committed
    params = yaml.safe_load((proj / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "models.ctl-0003.seed", 5), sort_keys=False))
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
    assert "embed@ctl-0003" in ran(out)
    assert "up to date" in run("dvc status", proj).stdout
    assert not [p for p in (proj / "results").rglob("*.tmp")]  # the rerun cleared them
    assert ".tmp" not in run("git status --porcelain --ignored", proj).stdout.replace(".snakemake", "")
    manifests = list((proj / ".dvc/cache").rglob("*.dir"))  # what DVC tracked, file by file
    assert manifests  # (the per-encoder directories are tracked as directories)
    for manifest in manifests:
        assert not [e["relpath"] for e in json.loads(manifest.read_text()) if e["relpath"].endswith(".tmp")]




def test_a_model_that_cannot_load_stops_the_run_or_is_skipped(tmp_path, tiny_bert, user_file):
    """Good tiny models plus two broken checkpoints (weights truncated to half; weights missing).
    embed.on_error: stop fails naming the model and writes nothing for it; skip runs the whole
    workflow to the end, the map and the regression without them, and the reports name them."""
    import shutil

    import numpy as np

    params = tiny_params(tiny_bert, user_file)
    # The good models: a transformer (what the broken ones are copies of), a classical one, a control.
    params["models"] = {k: params["models"][k] for k in ("tiny-rand", "gauss", "lsa")}
    params["map"] |= SMALL_MAP  # 4 good encoders
    for name in ("truncated", "no-weights"):
        broken = shutil.copytree(tiny_bert, tmp_path / name)
        weights = broken / "model.safetensors"
        if name == "truncated":
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        else:
            weights.unlink()
        params["models"][name] = dict(params["models"]["tiny-rand"], source=f"path:{broken}", init="pretrained")
    proj = make_project(tmp_path / "stop", params)
    r = run("snakemake --cores 2 results/embeddings/truncated", proj, check=False)
    log = (proj / "logs/embed/truncated.log").read_text()
    assert r.returncode != 0 and "model 'truncated': embed failed:" in log and "on_error: skip" in log, log[-2000:]
    assert not (proj / "results/embeddings/truncated").exists()

    params["embed"]["on_error"] = params["evaluate"]["on_error"] = "skip"
    # Values that fit the 6 encoders of params (what `encmap check` counts) but not the 4 left: the
    # map and the subset stages lower them with a warning. Old: the map stage refused, after all the work.
    params["map"] |= {"perplexity": 1.5, "neighbours": 4, "trustworthiness_k": 2}
    params["similarity"]["subset"] |= {"neighbours": 5, "encoders": ["truncated__l02-max"]}
    proj = make_project(tmp_path / "skip", params)
    run("snakemake --cores 2", proj)
    log = (proj / "logs/map.log").read_text()
    for key, need, used in (("perplexity = 1.5", 6, "1 instead"), ("neighbours = 4", 5, "3 instead"),
                            ("trustworthiness_k = 2", 5, "1 instead")):
        assert f"warning: map.{key} needs {need} encoders on the map, but 4 are left: the run left off 2 " \
               f"(no-weights__l02-max, truncated__l02-max: failed models or degenerate encoders); using {used}" in log, log
    assert "warning: similarity.subset.encoders: truncated__l02-max left off" in (proj / "logs/cka_rbf.log").read_text()
    assert json.loads((proj / "results/map/metrics.json").read_text())["perplexity_used"] == 1.0
    report = json.loads((proj / "results/features/failures.json").read_text())["failures"]
    assert [(f["model"], f["stage"], f["encoders"]) for f in report] == [
        ("no-weights", "embed", ["no-weights__l02-max"]), ("truncated", "embed", ["truncated__l02-max"])]
    assert all(f["error"] for f in report)
    with h5py.File(proj / "results/features/qre.h5", "r") as f:
        ids = [x.decode() for x in f["encoder_ids"][()]]
    assert ids == ["gauss__out", "lsa__d16", "lsa__d8", "tiny-rand__l02-max"], ids
    coords = (proj / "results/map/coords.csv").read_text()
    assert "truncated" not in coords and "tiny-rand__l02-max" in coords
    assert json.loads((proj / "results/map/metrics.json").read_text())["failed_encoders"] == 2
    full = json.loads((proj / "results/regression/failures.json").read_text())["failures"]
    assert sorted((f["model"], f["stage"]) for f in full) == [
        ("no-weights", "embed"), ("no-weights", "evaluate"), ("truncated", "embed"), ("truncated", "evaluate")]
    scores = (proj / "results/regression/scores.csv").read_text()
    assert "truncated" not in scores and np.isfinite(
        json.loads((proj / "results/regression/metrics.json").read_text())["failed_models"])


def test_an_unwritable_artifact_folder_is_named_before_any_job(tmp_path, tiny_bert, user_file):
    """Old: Snakemake's PermissionError traceback, mid-run. chattr +i: even root cannot write."""
    import subprocess

    params = tiny_params(tiny_bert, user_file)
    params["models"] = {k: params["models"][k] for k in ("tiny-rand", "gauss", "lsa")}
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "p", params)
    (proj / "results/map").mkdir(parents=True)
    subprocess.run(["chattr", "+i", str(proj / "results/map")], check=True)
    try:
        r = run("snakemake --cores 2", proj, check=False)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "results/map: not writable (read-only or immutable)" in out, out[-3000:]
        assert "Traceback" not in out and not (proj / "results/embeddings").exists()  # no job ran
    finally:
        subprocess.run(["chattr", "-i", str(proj / "results/map")], check=True)
