"""What a plain `snakemake` run made, DVC records (`encmap record`): then `dvc status` is clean,
`encmap repro` runs nothing, `dvc exp run -S` reruns one stage, `dvc push` / `dvc pull` carry the
results; and nothing that was not made from the current code, params and inputs is recorded:
each hostile case is named as stale (issue 50)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.project import ran, run, tree_hashes, with_param

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def made(snakemade) -> Path:
    """Ten control models through plain `snakemake --cores 2` (the README's command 1), committed
    (conftest's ``snakemade``: tests change only copies of it)."""
    return snakemade


def copy(made: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "p"
    shutil.copytree(made, dst, symlinks=True)
    return dst


def stale(proj: Path) -> set[str]:
    return set(json.loads(run("dvc status --json", proj).stdout))


def still_stale(out: str) -> dict[str, str]:
    """`encmap record`'s list of what stays stale: stage -> why."""
    return dict(line.strip().removeprefix("still stale: ").split(": ", 1)
                for line in out.splitlines() if line.strip().startswith("still stale: "))


@pytest.mark.slow(minutes=3)
def test_a_plain_snakemake_run_is_recorded_and_then_shared_and_compared(made, tmp_path):
    """Old: after command 1, `encmap repro --dry-run` reported every stage stale and there was no
    dvc.lock, so `dvc push` had nothing to send and `dvc exp run -S map.perplexity=5` reran
    everything. Issue 63: the plain run itself records what it made in dvc.lock (old: a step to
    remember, `encmap record`, which stays for runs made elsewhere)."""
    proj = copy(made, tmp_path)
    assert stale(proj) == set()  # the run's end recorded it
    (proj / "dvc.lock").unlink()  # as a run made elsewhere (a cluster's submit host) leaves the project
    before = tree_hashes(proj, "data", "results")
    assert len(stale(proj)) > 40
    out = run("encmap record", proj).stdout
    assert "encmap record: " in out and not still_stale(out), out
    assert stale(proj) == set()
    assert "0 stale stages" in run("encmap repro -n", proj).stdout
    book = ("results/code/", "results/params/")  # the digests and slices record writes as DVC's bookkeeping does
    assert {k: v for k, v in tree_hashes(proj, "data", "results").items() if not k.startswith(book)} == \
        {k: v for k, v in before.items() if not k.startswith(book)}  # no artifact touched, no job run
    run("git diff --exit-code dvc.lock", proj)  # what the run's end recorded, byte for byte
    out = run("dvc exp run -S map.perplexity=2", proj).stdout
    assert ran(out) == {"map"}, out
    run("git checkout -q -- . && dvc checkout -q", proj)
    # Sharing: push to a remote, a fresh clone pulls the same bytes, up to date.
    run(f"dvc remote add -d store {tmp_path / 'remote'} && git add -A && git commit -qm remote && dvc push -q", proj)
    run(f"git clone -q {proj} {tmp_path / 'clone'}", tmp_path)
    run("dvc pull -q", tmp_path / "clone")
    assert tree_hashes(tmp_path / "clone", "data", "results") == tree_hashes(proj, "data", "results")
    assert stale(tmp_path / "clone") == set()


@pytest.mark.slow(minutes=2)
def test_nothing_that_was_not_made_from_the_current_inputs_is_recorded(made, tmp_path):
    """Each hostile case on its own copy: it is named as stale, the rest is recorded."""
    from encmap.workflow.made import LEDGER

    def case(name: str, edit) -> tuple[dict[str, str], set[str]]:
        proj = copy(made, tmp_path / name)
        (proj / "dvc.lock").unlink()  # what the run's end recorded: a run made elsewhere is recorded here
        edit(proj)
        out = run("encmap record", proj).stdout
        return still_stale(out), stale(proj)

    def touch_output(proj):  # an output edited after the run
        f = proj / "results/map/coords.csv"
        f.write_text(f.read_text().replace(",", ", ", 1))

    left, dvc = case("edited", touch_output)
    assert set(left) == {"map"} and left["map"].endswith("changed since its job wrote it"), left
    assert dvc == {"map"}

    def new_param(proj):  # a params value changed after the run, nothing rerun
        params = yaml.safe_load((proj / "params.yaml").read_text())
        (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "models.ctl-0003.seed", 99),
                                                         sort_keys=False))

    left, dvc = case("param", new_param)
    assert left["embed@ctl-0003"].endswith("made with other params than params.yaml's now"), left
    assert {k for k in left if not k.startswith(("pip@ctl-0003", "features@ctl-0003", "evaluate@ctl-0003"))} == \
        {"embed@ctl-0003", "gather", "pairwise", "cka_rbf", "stitch", "agreement", "map", "regress"}, left
    assert set(left) == dvc

    def new_code(proj):  # the code a stage runs changed
        f = proj / "src/encmap/maps/tsne.py"
        f.write_text(f.read_text() + "\n# an edited comment\n")

    left, dvc = case("code", new_code)
    assert set(left) == {"map"} and left["map"].endswith("made by other code than the stage's now"), left

    def damaged(proj):  # an artifact damaged behind the pipeline's back
        f = proj / "results/embeddings/ctl-0005/ctl-0005__out.h5"
        f.write_bytes(f.read_bytes()[:200])

    left, dvc = case("damaged", damaged)
    assert left["embed@ctl-0005"].endswith("changed since its job wrote it"), left
    assert "pip@ctl-0005" in left and "gather" in left

    def failed(proj):  # a job that failed left its previous output (update()): not made by this params
        params = yaml.safe_load((proj / "params.yaml").read_text())
        (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, "map.seed", 5), sort_keys=False))
        qre = proj / "results/features/qre.h5"
        good = qre.read_bytes()
        qre.write_bytes(good[:300])  # the map job fails reading it
        r = run("snakemake --cores 2 --allowed-rules map results/map/coords.csv", proj, check=False)
        assert r.returncode != 0
        qre.write_bytes(good)

    left, dvc = case("failed", failed)
    assert set(left) == {"map"} and left["map"].endswith("made with other params than params.yaml's now"), left

    def interrupted(proj):  # a run stopped halfway (here: at pip) after a seed change
        new_param(proj)
        run("snakemake --cores 2 --until pip", proj)

    left, dvc = case("interrupted", interrupted)
    assert "embed@ctl-0003" not in left and "pip@ctl-0003" not in left, left  # made by this run: recorded
    assert "its input results/" in left["features@ctl-0003"], left
    assert "gather" in left and set(left) == dvc

    def no_ledger(proj):  # nothing recorded what made the files: nothing can be shown made
        (proj / LEDGER).unlink()

    left, dvc = case("ledger", no_ledger)
    assert set(left) == dvc and len(dvc) > 40 and all("no job of a Snakemake run made it" in w or "above it" in w
                                                      for w in left.values())


def set_param(proj: Path, path: str, value) -> None:
    params = yaml.safe_load((proj / "params.yaml").read_text())
    (proj / "params.yaml").write_text(yaml.safe_dump(with_param(params, path, value), sort_keys=False))


@pytest.mark.slow(minutes=2)
def test_a_dry_run_a_touch_run_and_a_slurm_job_that_wrote_nothing_made_nothing(made, tmp_path):
    """Issue 63, cases 1-3. Old: after a params change, `snakemake -n` (or `--executor dryrun`, or
    `-n` with a SLURM profile), `snakemake --touch`, or a SLURM job reported COMPLETED that wrote
    nothing (its update() outputs kept) left the map recorded as made by `encmap record`; and
    `encmap repro` through such a SLURM recorded it as made too."""
    from support.silent_slurm import silent_slurm

    proj = copy(made, tmp_path)  # recorded in dvc.lock by the run's end
    coords = (proj / "results/map/coords.csv").read_bytes()
    set_param(proj, "map.seed", 5)
    fake = tmp_path / "silent-slurm"
    profile = silent_slurm(fake, proj)
    for cmd in ("snakemake --cores 2 -n", "snakemake --cores 2 --executor dryrun", "snakemake --cores 2 --touch",
                f"PATH={fake}:$PATH snakemake -n --profile {profile}", f"PATH={fake}:$PATH snakemake --profile {profile}"):
        run(cmd, proj)
        left = still_stale(run("encmap record", proj).stdout)
        assert set(left) == {"map"} and left["map"].endswith("made with other params than params.yaml's now"), \
            (cmd, left)
    assert (proj / "results/map/coords.csv").read_bytes() == coords
    out = run(f"PATH={fake}:$PATH encmap repro -- --profile {profile}", proj, check=False)
    assert out.returncode == 1 and "0 stages recorded" in out.stdout and stale(proj) == {"map"}, out.stdout[-2000:]
    run("encmap repro", proj)
    assert stale(proj) == set() and (proj / "results/map/coords.csv").read_bytes() != coords


@pytest.mark.slow(minutes=2)
def test_the_files_curate_and_tasks_read_are_inputs_of_what_they_made(made, tmp_path):
    """Issue 63, case 4. Old: a curate source (a `file` source) or a file of the tasks' data
    (`evaluate.data`) edited after the run: `encmap record` recorded curate and tasks as made from
    it (their jobs had no Snakemake inputs to compare), though DVC hashes them as their deps."""
    from support.project import write_user_file

    proj = copy(made, tmp_path)
    mine = write_user_file(tmp_path / "mine.txt")
    shutil.copytree(Path(yaml.safe_load((proj / "params.yaml").read_text())["evaluate"]["data"]["brown"]),
                    tmp_path / "brown")
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params["sentences"]["sources"].append({"name": "mine", "kind": "file", "path": str(mine), "weight": 1.0,
                                          "text_field": "text"})
    params["evaluate"]["data"]["brown"] = str(tmp_path / "brown")
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run("encmap deps --write", proj)  # dvc.yaml names the sources params names
    sentences = f"data/sentences/{params['sentences']['set']}.txt"
    run(f"snakemake --cores 2 --allowed-rules curate tasks {sentences} data/eval/tasks.json", proj)
    left = still_stale(run("encmap record", proj).stdout)
    assert "curate" not in left and "tasks" not in left, left  # made from these files: recorded
    first = sorted((tmp_path / "brown").iterdir())[3]
    first.write_bytes(first.read_bytes() + b"\nan added line\n")
    left = still_stale(run("encmap record", proj).stdout)
    assert left["tasks"] == f"data/eval/tasks.json: its input {tmp_path / 'brown'} changed since", left
    assert "curate" not in left, left
    mine.write_text(mine.read_text().replace("\n", " Edited.\n", 3))
    left = still_stale(run("encmap record", proj).stdout)
    assert left["curate"].endswith(f"its input {mine} changed since"), left
    assert stale(proj) >= {"curate", "tasks"}
    # Issue 70 item 2. Old: the README's plain run said "Nothing to be done" over the old sentences.
    r = run("snakemake --cores 2 -n", proj)
    assert "Nothing to be done" not in r.stdout and "rule curate:" in r.stdout and "rule tasks:" in r.stdout, r.stdout
    assert ".snakemake/encmap/sources/curate.sha256" in r.stdout  # the reason: the sources' digest changed
    run("snakemake --cores 2 --touch", proj)  # taken as made without a job: DVC still calls them stale
    r = run("snakemake --cores 2", proj)
    assert "Nothing to be done" in r.stdout + r.stderr, r.stdout + r.stderr
    said = still_stale(r.stdout + r.stderr)  # even so, its last lines say which stages and why
    assert said["curate"].endswith(f"its input {mine} changed since") and "tasks" in said, r.stdout + r.stderr


@pytest.mark.slow(minutes=2)
def test_a_damaged_ledger_is_set_aside_and_the_code_is_taken_as_the_job_starts(made, tmp_path):
    """Issue 63, cases 5 and 6 (one run for both: a plain run costs a minute). Old: made.sqlite
    damaged (random bytes, a folder in its place): every plain `snakemake` died after its first job
    with sqlite3's traceback, `encmap record` too, the file never named. And the code digest was
    taken when the stage's first job finished: a code edit while the job ran was recorded as the
    code that made its output."""
    import subprocess

    from support.project import env

    from encmap.workflow.made import LEDGER

    proj = copy(made, tmp_path)  # recorded in dvc.lock by the run's end
    (proj / LEDGER).write_bytes(bytes(range(256)) * 20)
    set_param(proj, "map.seed", 5)
    job = subprocess.Popen("snakemake --cores 2", shell=True, cwd=proj, env=env(), text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = []
    for line in job.stderr:  # the map job has started (Snakemake prints it as it submits it)
        err.append(line)
        if line.strip() in ("rule map:", "localrule map:"):
            code = proj / "src/encmap/maps/tsne.py"
            code.write_text(code.read_text() + "\n# edited while the map job ran\n")
            break
    err = "".join(err) + job.stderr.read()
    assert job.wait() == 0, err[-3000:]
    lines = [x for x in err.splitlines() if str(proj / LEDGER) in x]
    assert len(lines) == 1 and "not a readable ledger" in lines[0] and "set aside" in lines[0], err[-3000:]
    assert "Traceback" not in err and (proj / (LEDGER + ".damaged")).is_file()
    left = still_stale(run("encmap record", proj).stdout)  # what the fresh ledger knows: map, by the old code
    assert set(left) == {"map"} and left["map"].endswith("made by other code than the stage's now"), left
    (proj / LEDGER).unlink()
    (proj / LEDGER).mkdir()
    r = run("encmap record", proj)
    assert "Traceback" not in r.stdout + r.stderr and f"{proj / LEDGER}: not a readable ledger" in r.stderr, r.stderr
    assert still_stale(r.stdout) == {"map": "results/map/neighbours.csv: no job of a Snakemake run made it"}


@pytest.mark.slow(minutes=1)
def test_dvc_hashes_nothing_a_job_wrote_and_records_what_it_would_record_itself(made, tmp_path, monkeypatch):
    """Issue 63 item 3 (the default run's recording within 5 s). Old: recording had DVC read and
    md5 every artifact again (1.1 GB on the default run, 1.8 s), and ask git, reading its whole
    index, once per output. Now the md5 each job took of what it wrote (its receipt) is DVC's, in the
    process that took the receipts (a plain run's end): DVC hashes only what the recording itself
    writes (the code digests and params slices), and the lock holds what DVC writes hashing every file
    itself (`dvc commit -f`). Issue 70: rows at rest, of another process (``encmap record`` run later,
    a ledger of before the md5), are never handed to DVC: DVC reads those files itself. An output git
    tracks is still refused by DVC."""
    import sqlite3

    import dvc_data.hashfile.hash as dvc_hash

    from encmap.validation import EncmapError
    from encmap.workflow import repro
    from encmap.workflow.made import LEDGER
    from encmap.workflow.repro import record

    proj = copy(made, tmp_path)
    monkeypatch.chdir(proj)  # as the command runs: DVC names stages from the working directory
    with sqlite3.connect(proj / LEDGER) as con:  # the copies are new inodes: the ledger as the run left it here
        con.executemany("UPDATE files SET ino = ?, ctime_ns = ? WHERE path = ?",
                        [((st := (proj / path).stat()).st_ino, st.st_ctime_ns, path)
                         for path, in con.execute("SELECT path FROM files")])
        sessions = {s for s, in con.execute("SELECT DISTINCT session FROM files WHERE md5 IS NOT NULL")}
    assert len(sessions) == 1  # one run, one process took every receipt
    hashed: list[str] = []
    real = dvc_hash._hash_file
    monkeypatch.setattr(dvc_hash, "_hash_file", lambda path, *a, **k: hashed.append(path) or real(path, *a, **k))

    def record_afresh() -> dict:
        """`encmap record` as on a fresh clone: no lock, DVC's hash state and cache empty."""
        (proj / "dvc.lock").unlink(missing_ok=True)
        for d in (".dvc/tmp", ".dvc/cache"):
            shutil.rmtree(proj / d, ignore_errors=True)
        hashed.clear()
        said = []
        record(proj, log=said.append)
        assert stale(proj) == set(), said
        return yaml.safe_load((proj / "dvc.lock").read_text())

    def artifacts(paths: list[str]) -> set[str]:
        """The jobs' files among ``paths`` (not the code, the recording's own files, dot files)."""
        book = ("results/code/", "results/params/")  # what the recording writes itself
        inside = (Path(p).relative_to(proj) for p in paths if Path(p).is_relative_to(proj))
        return {str(p) for p in inside if p.parts[0] in ("data", "results") and not p.name.startswith(".")
                and not str(p).startswith(book)}

    monkeypatch.setattr(repro, "SESSION", sessions.pop())  # as in the run's own process, at its end
    mine = record_afresh()
    assert hashed and not artifacts(hashed), sorted(artifacts(hashed))[:5]
    monkeypatch.undo()
    monkeypatch.chdir(proj)
    monkeypatch.setattr(dvc_hash, "_hash_file", lambda path, *a, **k: hashed.append(path) or real(path, *a, **k))
    assert record_afresh() == mine and len(artifacts(hashed)) > 20  # another process: DVC reads them
    with sqlite3.connect(proj / LEDGER) as con:  # a ledger as the code of before the md5 wrote it
        con.execute("ALTER TABLE files DROP COLUMN md5")
    assert record_afresh() == mine and len(artifacts(hashed)) > 20
    run("git add -f results/map/map.html", proj)
    with pytest.raises(EncmapError, match="results/map/map.html"):
        record_afresh()
    run("git rm -q --cached results/map/map.html", proj)
    shutil.rmtree(proj / ".dvc/tmp")  # DVC's own hashes, every file read by DVC
    run("dvc commit -f -q", proj)
    assert yaml.safe_load((proj / "dvc.lock").read_text()) == mine

def lock_md5s(proj: Path) -> dict[str, str]:
    """Every output path dvc.lock records -> its md5."""
    lock = yaml.safe_load((proj / "dvc.lock").read_text()) if (proj / "dvc.lock").exists() else {"stages": {}}
    return {o["path"]: o.get("md5") for s in lock["stages"].values() for o in s.get("outs", [])}


def cache_is_honest(proj: Path) -> list[str]:
    """Objects of DVC's cache whose bytes do not hash to their name (none, when honest)."""
    import hashlib

    bad = []
    for f in (proj / ".dvc/cache/files/md5").rglob("*"):
        if f.is_file() and not f.name.endswith(".dir"):
            if hashlib.md5(f.read_bytes()).hexdigest() != f.parent.name + f.name:
                bad.append(str(f))
    return bad


@pytest.mark.slow(minutes=2)
def test_an_output_counts_as_made_only_on_its_jobs_word(made, tmp_path):
    """Issue 70 item 1. Old: "made" was read from file metadata. Another file put in an output's place
    with its size and time (`touch -r`, `cp -p`, `rsync -a`) was recorded as made, its foreign md5 in
    dvc.lock; a ledger row with a wrong md5 (size, time and inode right) put that md5 in dvc.lock and
    the file in DVC's cache under a name its bytes do not hash to; a SLURM job that wrote nothing,
    under `dvc repro`, let DVC record the stage over the old map; a damaged output then `snakemake
    --touch` was taken as the good entry (every later run: "Nothing to be done")."""
    import hashlib
    import os
    import sqlite3

    from support.silent_slurm import silent_slurm

    from encmap.workflow.made import LEDGER

    def fresh(name: str) -> Path:
        proj = copy(made, tmp_path / name)
        (proj / "dvc.lock").unlink()  # what the run's end recorded: the recording is made again here
        return proj

    # Same size and time, other bytes, a new inode (as `touch -r old new; mv new old`, `cp -p`, rsync -a).
    proj = fresh("swapped")
    coords = proj / "results/map/coords.csv"
    data = bytearray(coords.read_bytes())
    data[-2] = ord("7") if data[-2] != ord("7") else ord("3")
    (proj / "new.csv").write_bytes(bytes(data))
    run(f"touch -r {coords} new.csv && mv new.csv {coords}", proj)
    left = still_stale(run("encmap record", proj).stdout)
    assert set(left) == {"map"} and left["map"] == "results/map/coords.csv: changed since its job wrote it", left
    assert "results/map/coords.csv" not in lock_md5s(proj) and stale(proj) == {"map"}

    # An edit in place, its time set back (`cp -p` onto the file): same inode, size and time; only the
    # change time, which no one can set, tells (DVC's own key would not).
    proj = fresh("in-place")
    with sqlite3.connect(proj / LEDGER) as con:  # the ledger as this very project has it (not a copy's)
        con.executemany("UPDATE files SET ino = ?, ctime_ns = ? WHERE path = ?",
                        [((st := (proj / p).stat()).st_ino, st.st_ctime_ns, p)
                         for p, in con.execute("SELECT path FROM files")])
    nb = proj / "results/map/neighbours.csv"
    other = bytearray(nb.read_bytes())
    other[-2] = ord("7") if other[-2] != ord("7") else ord("3")
    (tmp_path / "other.csv").write_bytes(bytes(other))
    run(f"touch -r {nb} {tmp_path / 'other.csv'} && cp -p {tmp_path / 'other.csv'} {nb}", proj)
    left = still_stale(run("encmap record", proj).stdout)
    assert left.get("map") == "results/map/neighbours.csv: changed since its job wrote it", left

    # A ledger row whose md5 is wrong for its file, its size, time and inode right.
    proj = fresh("forged")
    for d in (".dvc/tmp", ".dvc/cache"):
        shutil.rmtree(proj / d, ignore_errors=True)
    with sqlite3.connect(proj / LEDGER) as con:  # the copy's inodes, as a ledger of this very project has them
        con.executemany("UPDATE files SET ino = ?, ctime_ns = ? WHERE path = ?",
                        [((st := (proj / p).stat()).st_ino, st.st_ctime_ns, p)
                         for p, in con.execute("SELECT path FROM files")])
        con.execute("UPDATE files SET md5 = ? WHERE path = 'results/map/coords.csv'", ("0" * 32,))
    run("encmap record", proj)
    true = hashlib.md5((proj / "results/map/coords.csv").read_bytes()).hexdigest()
    assert lock_md5s(proj)["results/map/coords.csv"] == true and stale(proj) == set()
    assert not cache_is_honest(proj) and (proj / ".dvc/cache/files/md5" / true[:2] / true[2:]).is_file()

    # The DVC route through a SLURM whose job writes nothing: the stage is not recorded.
    proj = copy(made, tmp_path / "dvc-slurm")
    set_param(proj, "map.seed", 7)
    before = lock_md5s(proj)
    fake = tmp_path / "silent"
    profile = silent_slurm(fake, proj)
    r = run(f"PATH={fake}:$PATH SNAKEMAKE_PROFILE={profile} dvc repro map", proj, check=False)
    said = r.stdout + r.stderr
    assert r.returncode != 0 and "not written by a job of this call" in said, said[-3000:]
    maps = lambda md5s: {k: v for k, v in md5s.items() if k.startswith("results/map")}  # noqa: E731
    assert maps(lock_md5s(proj)) == maps(before) and stale(proj) == {"map"}

    # A damaged output, then `snakemake --touch`: not taken as good; the next run makes it again.
    proj = copy(made, tmp_path / "touched")
    emb = proj / "results/embeddings/ctl-0005/ctl-0005__out.h5"
    emb.write_bytes(emb.read_bytes()[:300])
    r = run("snakemake --cores 2 --touch", proj)
    assert "ctl-0005__out.h5: changed since encmap wrote it" in r.stderr and "touch run" in r.stderr, r.stderr[-2000:]
    r = run("snakemake --cores 2 -n", proj)
    assert "Nothing to be done" not in r.stdout + r.stderr and "rule embed" in r.stdout + r.stderr, r.stdout[-2000:]
    assert "embed@ctl-0005" in still_stale(run("encmap record", proj).stdout)
    os.utime(emb)  # only a time changed: still the damaged bytes, still remade
    assert "Nothing to be done" not in run("snakemake --cores 2 -n", proj).stdout


@pytest.mark.slow(minutes=3)
def test_a_scheduler_or_a_code_edit_mid_run_makes_nothing(made, tmp_path):
    """Issue 70 item 1 (runs). Old: a SLURM job that wrote nothing while a stage-out step copied the old
    files back to new inodes ended "recorded as made" (params seed 7, the map seed 0); and in-process
    jobs that ran the already-imported module after a code edit were recorded as made by the edited code."""
    import subprocess

    from support.project import env
    from support.silent_slurm import silent_slurm

    proj = copy(made, tmp_path / "stage-out")
    set_param(proj, "map.seed", 7)
    fake = tmp_path / "silent"
    profile = silent_slurm(fake, proj, stage_out="results/map")
    r = run(f"PATH={fake}:$PATH snakemake --profile {profile}", proj)
    assert "results/map/coords.csv: Snakemake reports its map job done, but its job left no receipt" in r.stderr, \
        r.stderr[-3000:]
    assert "still stale: map: " in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]  # the run's end says so
    r = run("snakemake --cores 2 -n", proj)
    assert "Nothing to be done" not in r.stdout + r.stderr and "its last map job finished without writing it" \
        in r.stderr, r.stderr[-3000:]

    proj = copy(made, tmp_path / "edited")
    set_param(proj, "qre.eps", 0.002)  # every features job runs again, in Snakemake's own process
    job = subprocess.Popen("snakemake --cores 2", shell=True, cwd=proj, env=env(), text=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = []
    for line in job.stderr:
        err.append(line)
        if line.strip() in ("rule features:", "localrule features:"):
            code = proj / "src/encmap/qre/features.py"
            code.write_text(code.read_text() + "\n# edited while the features jobs ran\n")
            break
    err = "".join(err) + job.stderr.read()
    assert job.wait() == 0, err[-3000:]
    left = still_stale(run("encmap record", proj).stdout)
    features = {k: v for k, v in left.items() if k.startswith("features@")}
    assert len(features) == 10, left
    assert all(v.endswith("made by other code than the stage's now") for v in features.values()), left


@pytest.mark.slow(minutes=1)
def test_a_ledger_that_cannot_be_used_is_named_and_a_run_goes_on(made, tmp_path, monkeypatch):
    """Issue 70 item 6. Old: a ledger whose table had another schema, one that could not be written, one
    locked by another process, a folder named ledger.sqlite-wal: raw tracebacks from `encmap record`
    and `encmap repro`, and plain `snakemake` died after its first job."""
    import sqlite3

    from encmap.validation import EncmapError
    from encmap.workflow import made as made_module
    from encmap.workflow.repro import record

    proj = copy(made, tmp_path / "schema")
    db = proj / made_module.LEDGER
    with sqlite3.connect(db) as con:
        con.execute("DROP TABLE made")
        con.execute("CREATE TABLE made (path TEXT PRIMARY KEY, digest TEXT)")
    r = run("encmap record", proj)
    assert "Traceback" not in r.stderr and f"{db}: not a readable ledger (another schema: table made" in r.stderr

    proj = copy(made, tmp_path / "wal")
    db = proj / made_module.LEDGER
    (proj / (made_module.LEDGER + "-wal")).mkdir()
    set_param(proj, "map.seed", 3)  # a stale stage: encmap repro reaches the ledger
    for cmd in ("encmap record", "encmap repro"):
        r = run(cmd, proj, check=False)
        assert r.returncode == 2 and "Traceback" not in r.stderr and f"{db}-wal is in the way" in r.stderr, r.stderr
    r = run("snakemake --cores 2 --forcerun map results/map/coords.csv", proj)  # the map job runs, and the run ends
    assert "Traceback" not in r.stderr and r.stderr.count(f"{db}-wal is in the way") >= 1, r.stderr[-3000:]
    assert "Finished jobid" in r.stderr and "goes on without" in r.stderr

    proj = copy(made, tmp_path / "unwritable")
    shutil.rmtree(proj / ".snakemake/encmap")
    (proj / ".snakemake/encmap").write_text("a file where the ledger's folder goes")
    r = run("encmap record", proj, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "the ledger cannot be written" in r.stderr, r.stderr

    proj = copy(made, tmp_path / "locked")
    monkeypatch.chdir(proj)
    monkeypatch.setattr(made_module, "WAIT_S", 0.5)
    holder = sqlite3.connect(proj / made_module.LEDGER)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(EncmapError, match="locked by another process of this project"):
            record(proj, log=lambda s: None)
    finally:
        holder.close()
