"""The DVC route against a hostile user's ordinary moves: what is recorded as current is what was
made, outputs outlive a failed or interrupted stage, a killed run never blocks the next, no params
value reaches a shell, and refusals are messages. Each test names the old behaviour it guards
against (issue 36). A project of ten control models, computed once; each test works on a copy."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from support.project import REPO, run, tree_hashes, with_param

@pytest.fixture(scope="module")
def computed(snakemade, tmp_path_factory) -> Path:
    """Ten control models, made by plain Snakemake (conftest's ``snakemade``, shared with
    test_record) and recorded in dvc.lock as the run ended, committed: each test works on a copy.
    (The same dvc.lock as ``encmap repro`` of the same params: test_record shows it up to date, and
    test_repro shows ``encmap repro`` records what ``dvc repro`` would.) Without the plain run's
    ledger, as ``dvc repro`` leaves a project (under DVC none is kept): these tests damage files
    behind a DVC-made project."""
    from encmap.workflow.integrity import LEDGER

    proj = copy(snakemade, tmp_path_factory.mktemp("computed"))
    out = run("encmap record", proj).stdout
    assert "still stale" not in out and json.loads(run("dvc status --json", proj).stdout) == {}, out
    (proj / LEDGER).unlink()
    assert run("git status --porcelain", proj).stdout == ""  # the plain run's end recorded it all, committed
    return proj


def copy(computed: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "p"
    shutil.copytree(computed, dst, symlinks=True)
    return dst


def edit_params(proj: Path, key: str, value) -> None:
    params = yaml.safe_load((proj / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, key, value), sort_keys=False))


def lines(r, word: str = "encmap repro") -> str:
    return "\n".join(x for x in (r.stdout + r.stderr).splitlines() if word in x)


@pytest.mark.slow(minutes=2)
def test_a_stage_is_recorded_only_when_its_outputs_were_made(computed, tmp_path):
    """Old: `encmap repro -- -n` (Snakemake ran no job) said "ran 2 of 2 stages ... recorded in
    dvc.lock" after a seed change, and `dvc status` then called the old embeddings current."""
    proj = copy(computed, tmp_path)
    edit_params(proj, "models.ctl-0003.seed", 99)
    r = run("encmap repro -- -n", proj, check=False)
    assert r.returncode == 2 and "Snakemake option --dryrun (read from '-n')" in r.stderr, r.stderr[-2000:]
    r = run("encmap repro -- --touch", proj, check=False)
    assert r.returncode == 2 and "--touch" in r.stderr
    # Options that change which jobs run are refused too (issue 41: --omit-from ran evaluate alone).
    r = run("encmap repro -- --omit-from embed", proj, check=False)
    assert r.returncode == 2 and "--omit-from" in r.stderr, r.stderr[-2000:]
    assert json.loads(run("dvc status --json", proj).stdout) != {}  # still stale: nothing was recorded
    run("encmap repro", proj)
    assert json.loads(run("dvc status --json", proj).stdout) == {}


def test_encmap_repro_imports_snakemake_only_in_the_process_that_runs_it(computed, tmp_path):
    """The options are judged by the child that then runs the call (it imports Snakemake anyway):
    encmap repro's own process imports no Snakemake (old: it imported it to judge the options, ~1.5 s
    of CPU per call, then its child imported it again). A dry run makes no call and judges them itself."""
    from support.fresh import fresh_digests

    proj = copy(computed, tmp_path)
    edit_params(proj, "models.ctl-0003.seed", 99)
    fresh_digests(f"""
import os, sys
from encmap.workflow.repro import repro
os.chdir({str(proj)!r})
assert repro({str(proj)!r}, log=lambda *a: None) == 0
assert not [m for m in sys.modules if m.split(".")[0] == "snakemake"], "encmap repro's own process imported Snakemake"
print("done")
""", seeds=("1",))
    assert json.loads(run("dvc status --json", proj).stdout) == {}
    edit_params(proj, "models.ctl-0003.seed", 98)
    r = run("encmap repro -n -- --touch", proj, check=False)
    assert r.returncode == 2 and "Snakemake option --touch" in r.stderr, r.stderr[-2000:]


REFUSED_SPELLINGS = [["-pt"], ["--tou"], ["--executor", "touch"], ["--configfile", "over.yaml"],
                     ["--config", "map={'seed':9}"], ["--cores", "0"], ["-j", "0"], ["--forceall"],
                     ["--until", "embed"], ["--set-threads", "pairwise=1"], ["--allowed-rules", "map"], ["--bogus"],
                     ["-j", "all"], ["--rerun-triggers", "mtime"], ["results/map"]]


def test_options_are_read_as_snakemake_reads_them_and_only_an_allow_list_passes():
    """Old (issue 41): -pt, --tou and --executor touch were not refused (touch mode: stale contents
    recorded); --configfile over.yaml fitted the map with seed 9 while dvc.lock recorded seed 0;
    --cores 0 hung at 'Select jobs to execute'. Read by Snakemake's own parser, each is refused."""
    from encmap.validation import EncmapError
    from encmap.workflow.snakemake_call import check_args

    for spelling in REFUSED_SPELLINGS:
        with pytest.raises(EncmapError, match="encmap repro: "):
            check_args(spelling)
    for fine in ([], ["--cores", "4", "-k", "-p"], ["--profile", "profiles/slurm", "--jobs", "10"],
                 ["--resources", "gpu=2"], ["--slurm-qos", "high"], ["--cores", "all"]):
        check_args(fine)


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("spelling", [["-pt"], ["--configfile", "over.yaml"], ["--cores", "0"]])
def test_a_refused_option_changes_nothing(computed, tmp_path, spelling):
    """End to end: refused before anything runs (no hang at --cores 0); outputs and dvc.lock unchanged."""
    proj = copy(computed, tmp_path)
    (proj / "over.yaml").write_text("map: {seed: 9}\n")
    edit_params(proj, "models.ctl-0003.seed", 99)
    before, lock = tree_hashes(proj, "data", "results"), (proj / "dvc.lock").read_text()
    r = run("encmap repro -- " + " ".join(f'"{a}"' for a in spelling), proj, check=False)
    assert r.returncode == 2 and "encmap repro:" in r.stderr, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert tree_hashes(proj, "data", "results") == before and (proj / "dvc.lock").read_text() == lock


@pytest.mark.slow(minutes=1)
def test_a_profile_that_changes_what_runs_is_refused(computed, tmp_path):
    proj = copy(computed, tmp_path)
    (proj / "profiles/sneaky").mkdir()
    (proj / "profiles/sneaky/config.yaml").write_text("cores: 2\ntouch: true\n")
    r = run("encmap repro -- --profile profiles/sneaky", proj, check=False)
    assert r.returncode == 2 and "profiles/sneaky/config.yaml: key 'touch'" in r.stderr, r.stderr[-2000:]
    r = run("SNAKEMAKE_PROFILE=profiles/sneaky encmap repro", proj, check=False)
    assert r.returncode == 2 and "key 'touch'" in r.stderr, r.stderr[-2000:]
    (proj / "profiles/fine").mkdir()
    (proj / "profiles/fine/config.yaml").write_text("cores: 2\nkeep-going: true\nprintshellcmds: true\n")
    run("encmap repro -- --profile profiles/fine", proj)
    # Old (issue 49): only config.yaml / config.v8+.yaml in a folder were read, and `encmap stage` read
    # none: touch: true given any other way made "recorded" mean "touched". Every spelling and channel
    # Snakemake reads is judged as it reads it.
    edit_params(proj, "map.seed", 7)
    coords = (proj / "results/map/coords.csv").read_bytes()
    (proj / "evil.yaml").write_text("touch: true\n")
    (proj / "profiles/v9").mkdir()
    (proj / "profiles/v9/config.yaml").write_text("cores: 2\n")
    (proj / "profiles/v9/profile.v9+.yaml").write_text("cores: 2\ntouch: true\n")  # what Snakemake 9 reads here
    (proj / "profiles/named").mkdir()
    (proj / "profiles/named/profile.yaml").write_text("touch: true\n")
    for how, where in (("encmap repro -- --profile evil.yaml", "evil.yaml"),
                       ("encmap repro -- --profile profiles/v9", "profiles/v9/profile.v9+.yaml"),
                       ("encmap repro -- --profile profiles/named", "profiles/named/profile.yaml"),
                       ("encmap repro -- --workflow-profile evil.yaml", "evil.yaml"),
                       ("SNAKEMAKE_PROFILE=profiles/v9 encmap repro", "profiles/v9/profile.v9+.yaml"),
                       ("SNAKEMAKE_PROFILE=profiles/v9 dvc repro map", "profiles/v9/profile.v9+.yaml")):
        r = run(how, proj, check=False)
        assert r.returncode != 0 and f"{where}: key 'touch'" in r.stderr + r.stdout, (how, (r.stdout + r.stderr)[-2000:])
        assert (proj / "results/map/coords.csv").read_bytes() == coords, how
    r = run("encmap repro -- --batch map=1/2", proj, check=False)  # old: a raw AttributeError ('rulename')
    assert r.returncode == 2 and "option --batch" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    (proj / "profiles/default/config.v9+.yaml").write_text("touch: true\n")  # the workflow profile
    r = run("encmap repro", proj, check=False)
    assert r.returncode == 2 and "profiles/default/config.v9+.yaml: key 'touch'" in r.stderr, r.stderr[-2000:]
    assert (proj / "results/map/coords.csv").read_bytes() == coords
    assert "map" in run("dvc status", proj).stdout  # still stale: nothing recorded it as made


@pytest.mark.slow(minutes=2)
def test_a_failed_job_whose_previous_output_snakemake_put_back_is_not_recorded(computed, tmp_path):
    """Old (issue 41): the RBF CKA subset cut to one encoder, cka_rbf failed, Snakemake restored its
    update() outputs, and encmap repro recorded the stage with the new params and the old outputs:
    `dvc status` and `snakemake -n` then said up to date."""
    from encmap.artifacts.features import read_feature_matrix

    proj = copy(computed, tmp_path)
    one = read_feature_matrix(proj / "results/features/qre.h5")["ids"][0]
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["similarity"]["subset"] |= {"groups": [], "encoders": [one], "neighbours": 0}
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    r = run("encmap repro", proj, check=False)
    assert r.returncode == 1, lines(r)
    stale = json.loads(run("dvc status --json", proj).stdout)
    failed = [s for s in stale if s in ("cka_rbf", "stitch")]
    assert failed, (stale, lines(r))
    now = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
    for s in failed:
        assert now[s] == lock[s], s  # not recorded: the lock still pairs the old params with the old outputs



@pytest.mark.slow(minutes=2)
def test_a_model_deleted_from_params_leaves_the_gathered_results(computed, tmp_path):
    """Old: qre.h5, coords.csv, the page and the regression kept the deleted model and neither
    `encmap repro` nor `dvc repro` saw anything stale (gather read the features directory)."""
    from encmap.artifacts.features import read_feature_matrix

    proj = copy(computed, tmp_path)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    del params["models"]["ctl-0004"]
    params["map"]["perplexity"] = 2  # 9 encoders left
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run("dvc repro params", proj)
    assert "gather" in json.loads(run("dvc status --json", proj).stdout)
    run("encmap repro", proj)
    ids = read_feature_matrix(proj / "results/features/qre.h5")["ids"]
    assert len(ids) == 9 and not [e for e in ids if e.startswith("ctl-0004")]
    for f in ("results/map/coords.csv", "results/map/map.html", "results/regression/predictions.csv"):
        assert "ctl-0004" not in (proj / f).read_text(), f
    assert json.loads(run("dvc status --json", proj).stdout) == {}


@pytest.mark.slow(minutes=2)
def test_an_upstream_output_remade_byte_for_byte_stops_the_cascade(computed, tmp_path):
    """The curated sentences edited by hand: curate runs again and gives the recorded bytes.
    Old: encmap repro then reran every embed, tasks and every evaluate (they had been stale
    because of the edited file); dvc repro runs curate alone."""
    proj = copy(computed, tmp_path)
    before = tree_hashes(proj, "data", "results")
    f = proj / "data/sentences/ctl-n80.txt"
    f.write_text(f.read_text() + "a line added by hand\n")
    r = run("encmap repro", proj)
    assert "ran 1 of 1 stages (curate); 0 outputs changed" in r.stdout, lines(r)
    assert "encmap repro: 1 stages recorded in dvc.lock" in r.stdout, lines(r)
    assert "localrule embed" not in r.stdout + r.stderr and "localrule evaluate" not in r.stdout + r.stderr
    assert tree_hashes(proj, "data", "results") == before
    assert json.loads(run("dvc status --json", proj).stdout) == {}


@pytest.mark.slow(minutes=2)
def test_no_params_value_reaches_a_shell(computed, tmp_path):
    """Old: `dvc repro -s curate` (which skips the params stage that validates) interpolated
    sentences.set into a shell command and ran the command it carried."""
    proj = copy(computed, tmp_path)
    edit_params(proj, "sentences.set", "tiny --version; touch pwned; echo ")
    for cmd in ("dvc repro -s curate", "dvc repro -s -f curate", "encmap repro curate"):
        r = run(cmd, proj, check=False)
        assert r.returncode != 0, cmd
        assert "sentences.set" in r.stdout + r.stderr, (cmd, (r.stdout + r.stderr)[-2000:])
        assert not (proj / "pwned").exists(), cmd
    assert {(st.get("do") or st)["cmd"] for name, st in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items()
            if name not in ("code", "params")} == {"encmap stage"}  # no ${...} in any command


@pytest.mark.slow(minutes=5)  # the file's tests add up to ~12 min
def test_a_killed_run_never_blocks_the_next(computed, tmp_path):
    """Old: after kill -9 of encmap repro, Snakemake's incomplete-output markers stopped later runs
    with IncompleteFilesException (dvc repro users cannot pass --rerun-incomplete): here the killed
    change is taken back (the README's way back) and two others made, a seed and qre.eps, so that
    one call runs embed and features jobs and reads the marked embeddings without remaking them."""
    import os
    import signal
    import subprocess
    import time

    from support.project import env

    proj = copy(computed, tmp_path / "killed")
    edit_params(proj, "models.ctl-0002.seed", 7)
    run("dvc repro params", proj)  # the slices written first: the pause below holds the embed job
    job = subprocess.Popen(["encmap", "repro"], cwd=proj, env=env() | {"ENCMAP_PAUSE_BEFORE_RENAME": "20"},
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline and job.poll() is None and \
            not list((proj / "results/embeddings").glob(".ctl-0002.*.tmp")):
        time.sleep(0.2)
    assert list((proj / "results/embeddings").glob(".ctl-0002.*.tmp")), "the embed job never reached its write"
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert list((proj / ".snakemake/incomplete").iterdir())  # the markers the kill left
    run("git checkout HEAD -- params.yaml dvc.lock results && dvc checkout -q", proj)
    edit_params(proj, "qre.eps", 0.001)  # every features stage: its DAG reads the marked embeddings
    edit_params(proj, "models.ctl-0003.seed", 9)  # and an embed job in the same call
    # Up to the feature matrix: the jobs that read the marked files (what follows gather reads the matrix).
    for cmd in ("dvc repro gather", "encmap repro gather"):  # each on its own copy of the killed project
        again = copy(proj, tmp_path / cmd.split()[0])
        r = run(cmd, again, check=False)
        assert r.returncode == 0 and "IncompleteFilesException" not in r.stdout + r.stderr, (cmd, r.stderr[-3000:])
        assert json.loads(run("dvc status --json gather --with-deps", again).stdout) == {}, cmd


@pytest.mark.slow(minutes=2)
def test_encmap_repro_refusals_are_messages_not_tracebacks(computed, tmp_path):
    """Old: an unknown stage (StageNotFound) and DVC's lock held by another dvc (LockError) ended
    in tracebacks."""
    import subprocess

    from support.project import env

    proj = copy(computed, tmp_path)
    r = run("encmap repro nosuchstage", proj, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nosuchstage" in r.stderr, r.stderr[-2000:]
    holder = subprocess.Popen([sys.executable, "-c", "import time; from dvc.repo import Repo, lock_repo; r = Repo('.');\n"
                               "with lock_repo(r):\n    print('held', flush=True); time.sleep(30)"],
                              cwd=proj, env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run("encmap repro", proj, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "LockError" in r.stderr, r.stderr[-2000:]
    finally:
        holder.kill()
        holder.wait()
    # Another dvc (a live process) writing inside a stale stage's output: DVC's rwlock error names
    # the blocker once per locked path; the message names it once. Old: the same PID line 7 times.
    edit_params(proj, "models.ctl-0003.seed", 99)
    blocker = subprocess.Popen(["sleep", "60"])
    try:
        held = {str(proj / f"results/embeddings/ctl-0003/part{i}"): {"pid": blocker.pid, "cmd": "dvc repro"}
                for i in range(7)}
        (proj / ".dvc/tmp/rwlock").write_text(json.dumps({"read": {}, "write": held}))
        before = tree_hashes(proj, "results/embeddings"), yaml.safe_load((proj / "dvc.lock").read_text())
        r = run("encmap repro", proj, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "is busy" in r.stderr, r.stderr[-2000:]
        assert r.stderr.count(f"(PID {blocker.pid})") == 1, r.stderr[-2000:]
        after = tree_hashes(proj, "results/embeddings"), yaml.safe_load((proj / "dvc.lock").read_text())
        assert after[0] == before[0]  # the blocked stage did not run
        assert after[1]["stages"]["embed@ctl-0003"] == before[1]["stages"]["embed@ctl-0003"]  # nor was it recorded
    finally:
        blocker.kill()
        blocker.wait()


@pytest.mark.slow(minutes=3)
def test_outputs_survive_a_failed_or_interrupted_stage(computed, tmp_path):
    """Old: Snakemake deleted a job's outputs when the job started, so a map stage that failed
    left no map (and no git-tracked metrics.json, which `dvc checkout` cannot restore), a failed
    regress an empty results/regression, and Ctrl-C during `dvc repro evaluate@<model>` no
    results/eval/<model>."""
    import os
    import signal
    import subprocess
    import time

    import h5py

    from support.project import env

    proj = copy(computed, tmp_path)
    before = tree_hashes(proj, "results")

    def kept(prefix: str) -> bool:
        now = tree_hashes(proj, "results")
        return {k: v for k, v in now.items() if k.startswith(prefix)} == \
            {k: v for k, v in before.items() if k.startswith(prefix)} != {}

    with h5py.File(proj / "results/similarity/qre_pairwise.h5", "r+") as f:  # the map refuses it
        f.attrs["eps"] = 0.5
    r = run("dvc repro -s -f map", proj, check=False)
    assert r.returncode != 0 and "different encoders, sentence sets or eps" in r.stdout + r.stderr
    assert kept("results/map/")
    (proj / "results/eval/ctl-0001/ctl-0001__out.json").write_text("{")  # the regression refuses it
    r = run("snakemake --cores 2 --forcerun regress results/regression/metrics.json", proj, check=False)
    assert r.returncode != 0 and kept("results/regression/")

    proj = copy(computed, tmp_path / "int")
    edit_params(proj, "models.ctl-0005.seed", 11)
    run("dvc repro params embed@ctl-0005 tasks", proj)
    job = subprocess.Popen(["dvc", "repro", "-s", "evaluate@ctl-0005"], cwd=proj, start_new_session=True,
                           env=env() | {"ENCMAP_PAUSE_BEFORE_RENAME": "60"}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((proj / "results/eval").glob(".*ctl-0005*")):
        time.sleep(0.2)
    assert list((proj / "results/eval").glob(".*ctl-0005*")), "the job never reached its write"
    os.killpg(job.pid, signal.SIGINT)  # Ctrl-C
    job.wait()
    assert kept("results/eval/ctl-0005/")
    run("dvc repro evaluate@ctl-0005", proj)  # and the backup that Ctrl-C left does not stop the next run
    assert "evaluate@ctl-0005" not in json.loads(run("dvc status --json", proj).stdout)


@pytest.mark.slow(minutes=2)
def test_the_readmes_way_back_restores_the_last_committed_state(computed, tmp_path):
    """Old recipe `git checkout params.yaml && dvc checkout`: dvc.lock still named the new
    outputs (dvc checkout restored them) and the git-tracked metrics stayed new."""
    proj = copy(computed, tmp_path)
    before = tree_hashes(proj, "data", "results")
    edit_params(proj, "map.perplexity", 2)
    run("encmap repro", proj)
    assert tree_hashes(proj, "data", "results") != before
    readme = (REPO / "README.md").read_text()
    recipe = re.search(r"To get back to the last committed state[^`]*`([^`]+)`", readme.replace("\n", " ")).group(1)
    run(recipe, proj)
    assert tree_hashes(proj, "data", "results") == before
    assert json.loads(run("dvc status --json", proj).stdout) == {}


@pytest.mark.slow(minutes=2)
def test_a_file_a_reader_refused_is_never_recorded_as_good(computed, tmp_path):
    """Old (issue 41): after `encmap repro`, two PIP files swapped, then plain `snakemake`: the
    features job refused them, but the error hook recorded the swapped files in the ledger as good
    and the next `snakemake -n` said "Nothing to be done" with both still swapped."""
    proj = copy(computed, tmp_path)
    a, b = sorted((proj / "results/pip").glob("ctl-000[12]/*.h5"))[:2]
    good = {a: a.read_bytes(), b: b.read_bytes()}
    a.write_bytes(good[b]), b.write_bytes(good[a])  # swapped by copying: new times, as `cp` gives
    r = run("snakemake --cores 2", proj, check=False)
    assert r.returncode != 0 and "read as encoder" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    r = run("snakemake -n --cores 2", proj)
    out = r.stdout + r.stderr
    assert "Nothing to be done" not in out and "refused by a reader" in out, out[-3000:]
    # Each run remakes what its readers refused (a swapped file is found when a job reads it: the
    # first failure may stop the run before the other one is read); none is ever taken for good.
    named = []
    for _ in range(3):
        r = run("snakemake --cores 2", proj, check=False)
        if r.returncode == 0:
            break
        named.append(re.search(r"(results/pip/\S+\.h5): holds the PIP", r.stdout + r.stderr).group(1))
    assert r.returncode == 0 and len(named) == len(set(named)) <= 1, named
    assert a.read_bytes() == good[a] and b.read_bytes() == good[b]
    # What DVC recorded holds again, but for the wall-clock timing files of the stages rerun.
    changed = {path for st in json.loads(run("dvc status --json", proj).stdout).values() for entry in st
               for path in entry.get("changed outs", {})}
    assert all(path.endswith("timing.json") for path in changed), changed
