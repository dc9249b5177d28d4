"""DVC stages sent through a real single-node SLURM by the repo's profile (docs/cluster.md):
`encmap repro` (one Snakemake call per batch) for the whole run, `dvc repro` for a change.

Needs Debian's slurm-wlm and munge and root (`.ci/run` installs them and sets
ENCMAP_REQUIRE_SLURM=1, so there a missing cluster fails instead of skipping).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from support.api_server import free_port
from support.project import env, make_project, ran, run, tiny_params, tree_hashes, write_user_file
from support.slurm_cluster import RUN_CONF, Cluster, machine_lock, missing, running

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def need_slurm() -> None:
    why = missing()
    if why:
        if os.environ.get("ENCMAP_REQUIRE_SLURM") == "1":
            pytest.fail(f"ENCMAP_REQUIRE_SLURM is set but {why}")
        pytest.skip(why)


def test_a_killed_runs_link_is_cleaned_up_and_a_failed_start_stops_what_it_started(tmp_path):
    """Old: a test run killed while its cluster was up left /run/slurm/conf, and every later run
    failed at setup ("another configless slurmd runs here") though no slurmd ran; that failed
    start also left the munged it had started running."""
    need_slurm()
    with machine_lock():  # no other test run's cluster comes and goes meanwhile
        assert not running("slurmd") and not running("slurmctld")
        munge_before = bool(running("munged"))

        def stale_link():
            RUN_CONF.parent.mkdir(parents=True, exist_ok=True)
            RUN_CONF.symlink_to(tmp_path / "gone")  # what the killed run's slurmd linked

        stale_link()
        bad = Cluster(tmp_path / "bad")
        bad.conf = tmp_path / "bad.conf"  # a config slurmctld refuses
        bad._write_conf = lambda: bad.conf.write_text("NoSuchKey=1\n")
        with pytest.raises(subprocess.CalledProcessError):
            bad.start()
        assert not running("slurmctld") and not running("slurmd") and bool(running("munged")) == munge_before
        stale_link()
        good = Cluster(tmp_path / "good").start()
        try:
            assert running("slurmd") and RUN_CONF.is_symlink() and str(good.root) in os.readlink(RUN_CONF)
        finally:
            good.stop()
        assert not running("slurmd") and not RUN_CONF.is_symlink() and bool(running("munged")) == munge_before


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_slurm()
    c = Cluster(tmp_path_factory.mktemp("slurm")).start()
    yield c
    c.stop()


def small_params(tmp_path: Path, tiny_bert: Path) -> dict:
    params = tiny_params(tiny_bert, write_user_file(tmp_path / "mine.txt"), n=120)
    st = params["models"]["tiny-st"] | {"layers": [1, 2], "pooling": ["mean"], "dims": []}
    # Three models: the regression's grouped CV needs three groups. lsa: one encoder.
    params["models"] = {"tiny-st": st, "gauss": params["models"]["gauss"],
                        "lsa": params["models"]["lsa"] | {"dims": [8]}}
    # Jobs that may run on a GPU ask SLURM for one (device auto; on this node's fake GPU they run on the CPU).
    params["embed"]["device"] = params["evaluate"]["device"] = params["similarity"]["stitch"]["device"] = "auto"
    # 5 encoders on the map: perplexity <= (5 - 1)/3, trustworthiness needs k < m/2.
    params["map"] |= {"perplexity": 1, "neighbours": 2, "trustworthiness_k": 1}
    return params


def without_timings(root: Path) -> tuple[dict, dict]:
    """Artifact hashes and dvc.lock, less the wall-clock timing files (which differ by design)."""
    hashes = {k: v for k, v in tree_hashes(root, "data", "results").items() if not k.endswith("timing.json")}
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    for stage in lock["stages"].values():
        stage["outs"] = [o for o in stage.get("outs", []) if not o["path"].endswith("timing.json")]
    return hashes, lock


def run_through_slurm(tmp_path: Path, params: dict, cluster, monkeypatch) -> Path:
    """`encmap repro` of a fresh project in tmp_path/slurm, every stage through the test cluster."""
    proj = make_project(tmp_path / "slurm", params, git=True)
    # The repo's profile, with resources this one small node can grant and a short first poll.
    prof = yaml.safe_load((proj / "profiles/slurm/config.yaml").read_text())
    assert prof["executor"] == "slurm" and prof["slurm-status-command"] == "squeue"
    prof["default-resources"].update(mem_mb=1000, cpus_per_task=1, runtime=30)
    prof["set-resources"]["embed"].update(mem_mb=2000, cpus_per_gpu=1)
    for rule in ("pip", "features"):
        prof["set-resources"][rule].update(mem_mb=200)
    prof["set-resources"]["pairwise"].update(mem_mb=1000, cpus_per_task=1)
    prof["set-resources"]["cka_rbf"].update(mem_mb=1000, cpus_per_task=1)
    prof["set-resources"]["stitch"].update(mem_mb=1000, cpus_per_gpu=1)
    prof["set-resources"]["evaluate"].update(mem_mb=2000, cpus_per_gpu=1)
    prof["set-resources"]["regress"].update(mem_mb=1000, cpus_per_task=1)
    prof["slurm-init-seconds-before-status-checks"] = 1  # then every 11, 21, ... s until one ends
    # The failures below are what is tested, not the profile's retry of them (which doubles each wait).
    prof["retries"] = 0
    (proj / "profiles/slurm-test").mkdir()
    (proj / "profiles/slurm-test/config.yaml").write_text(yaml.safe_dump(prof))
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    run("SNAKEMAKE_PROFILE=profiles/slurm-test encmap repro", proj)
    return proj


@pytest.mark.slow(minutes=5)
def test_encmap_repro_through_slurm_matches_a_local_run(tmp_path, tiny_bert, cluster, monkeypatch):
    params = small_params(tmp_path, tiny_bert)
    local = make_project(tmp_path / "local", params, git=True)
    # The local reference runs beside the SLURM one, whose DVC stages mostly wait on status polls.
    # It is `encmap repro` too, in one Snakemake process (test_repro shows it writes what `dvc
    # repro` writes, byte for byte, dvc.lock included; `dvc repro` here cost ~45 s more CPU, one
    # Snakemake process per stage).
    with (tmp_path / "local.log").open("w") as log:
        reference = subprocess.Popen(["encmap", "repro"], cwd=local, env=env(), stdout=log, stderr=subprocess.STDOUT)
    before = {j["JobId"] for j in cluster.jobs()}
    try:
        proj = run_through_slurm(tmp_path, params, cluster, monkeypatch)
    except BaseException:  # a failed SLURM run must not leave the reference running into the next tests
        reference.kill()
        raise
    finally:
        reference.wait()
    assert reference.returncode == 0, (tmp_path / "local.log").read_text()[-6000:]

    # Same bytes, same dvc.lock: where a stage ran does not change what DVC records.
    assert without_timings(proj) == without_timings(local)
    assert "up to date" in run("dvc status", proj).stdout

    jobs = [j for j in cluster.jobs() if j["JobId"] not in before]
    assert {j["JobState"] for j in jobs} == {"COMPLETED"}, jobs
    # The plugin tags each sbatch job with its rule or group: one embed per model; the pip and
    # features jobs of all 5 encoders in one group job (the profile's `encoders` group, up to 64
    # encoders per job): encmap repro sent every stage after curate in one Snakemake call. (dvc
    # repro, one call per stage, sent 6 group jobs: one per model and stage.)
    rules = Counter(re.match(r"rule_([a-z_]+?)(?:_wildcards_|$)", j.get("Comment", "")).group(1) for j in jobs)
    assert rules == {"curate": 1, "embed": 3, "encoders_features_pip": 1, "gather": 1, "pairwise": 1, "cka_rbf": 1,
                     "stitch": 1, "agreement": 1, "map": 1, "tasks": 1, "evaluate": 3, "regress": 1}, rules
    # Only the transformer's embed and evaluate jobs and the stitch job (MLPs) asked for a GPU
    # (resources: gpu=1 -> sbatch --gpus=1).
    gpu = sorted(j["Comment"] for j in jobs if "gpu:1" in j.get("TresPerJob", "") + j.get("TresPerNode", ""))
    assert [g.split("_wildcards")[0] for g in gpu] == ["rule_embed", "rule_evaluate", "rule_stitch"], gpu
    assert "tiny-st" in gpu[0] and "tiny-st" in gpu[1], gpu

    # `dvc repro` sends its stage commands through the same profile: a map param, one sbatch job.
    before = {j["JobId"] for j in cluster.jobs()}
    (proj / "params.yaml").write_text(yaml.safe_dump(params | {"map": params["map"] | {"perplexity": 1.2}},
                                                     sort_keys=False))
    out = run("SNAKEMAKE_PROFILE=profiles/slurm-test dvc repro", proj).stdout
    assert ran(out) == {"map"}, out
    jobs = [j for j in cluster.jobs() if j["JobId"] not in before]
    assert [(j["JobState"], j["Comment"]) for j in jobs] == [("COMPLETED", "rule_map")], jobs
    assert "up to date" in run("dvc status", proj).stdout

    # Outputs persist until a stage succeeds, under SLURM too. Old: with the controller down, "Cannot
    # restore ... no backup found", then "Removing output files of failed job map": results/map/
    # emptied, the git-tracked metrics.json deleted (Snakemake backs update() outputs up only where
    # the job runs locally).
    kept = tree_hashes(proj, "results/map")
    assert "results/map/metrics.json" in kept
    dead = tmp_path / "dead.conf"  # the same cluster, its controller's port closed (sbatch gives up after 2 s, not 10)
    dead.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={free_port()}", Path(cluster.conf).read_text())
                    + "MessageTimeout=2\n")
    (proj / "params.yaml").write_text(yaml.safe_dump(params | {"map": params["map"] | {"perplexity": 1.1}},
                                                     sort_keys=False))
    for cmd in ("SNAKEMAKE_PROFILE=profiles/slurm-test dvc repro", "encmap repro -- --profile profiles/slurm-test"):
        r = run(f"SLURM_CONF={dead} {cmd}", proj, check=False)
        assert r.returncode != 0 and "sbatch" in r.stdout + r.stderr, (cmd, (r.stdout + r.stderr)[-3000:])
        assert tree_hashes(proj, "results/map") == kept, cmd
    run("git checkout -q -- params.yaml", proj)
    # A job that fails on its node (the feature matrix it reads is damaged): its outputs stay too.
    qre = proj / "results/features/qre.h5"
    good = qre.read_bytes()
    qre.write_bytes(good[: len(good) // 3])
    r = run("snakemake --profile profiles/slurm-test --allowed-rules map --forcerun map results/map/coords.csv",
            proj, check=False)
    assert r.returncode != 0, (r.stdout + r.stderr)[-3000:]
    assert tree_hashes(proj, "results/map") == kept
    qre.write_bytes(good)

    # What a plain run through SLURM made, DVC records (issue 50): after a map param changed, plain
    # `snakemake --profile` remakes the map on a node (and the matrix the failed job refused, with what
    # reads it) and records what it made as it ends (issue 63); `encmap record` then finds it all done.
    # qre.eps changed too: every encoder's features job runs again, in the profile's group job, and
    # so does every stage that reads the feature matrix (the whole run, untargeted).
    (proj / "params.yaml").write_text(yaml.safe_dump(params | {"map": params["map"] | {"perplexity": 1.3},
                                                               "qre": params["qre"] | {"eps": 2e-6}},
                                                     sort_keys=False))
    before = {j["JobId"] for j in cluster.jobs()}
    run("snakemake --profile profiles/slurm-test", proj)
    jobs = [j for j in cluster.jobs() if j["JobId"] not in before]
    assert "rule_map" in [j["Comment"] for j in jobs] and {j["JobState"] for j in jobs} == {"COMPLETED"}, jobs
    assert any("encoders" in j["Comment"] and "features" in j["Comment"] for j in jobs), jobs
    assert json.loads(run("dvc status --json", proj).stdout) == {}
    made = tree_hashes(proj, "data", "results")
    out = run("encmap record", proj).stdout
    assert re.search(r"encmap record: (\d+) of \1 stale stages recorded", out) and "still stale" not in out, out
    assert json.loads(run("dvc status --json", proj).stdout) == {}
    assert {k: v for k, v in tree_hashes(proj, "data", "results").items() if not k.startswith("results/params/")} == \
        {k: v for k, v in made.items() if not k.startswith("results/params/")}


def test_no_doc_or_profile_advises_a_slurm_extra_the_plugin_refuses():
    """Old: docs/catalogue.md advised `slurm_extra: "--gres=gpu:1"`, which the pinned
    snakemake-executor-plugin-slurm refuses at every submission (the rules' `gpu` resource is
    already sbatch's --gpus). Every slurm_extra the docs, README and profiles show, through the
    plugin's own check; no cluster needed."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.validation import validate_slurm_extra

    repo = Path(__file__).resolve().parents[1]
    shown = []
    for path in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        shown += [(path.name, v) for v in re.findall(r"""slurm_extra:\s*["']([^"']*)["']""", path.read_text())]

    def walk(node, where):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "slurm_extra":
                    shown.append((where, str(v)))
                walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for path in sorted((repo / "profiles").rglob("*.yaml")):
        walk(yaml.safe_load(path.read_text()), path.name)
    for where, value in shown:
        validate_slurm_extra(SimpleNamespace(resources=SimpleNamespace(slurm_extra=value)))  # WorkflowError: refused
