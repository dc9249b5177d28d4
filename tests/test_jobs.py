"""Jobs: a `script:` job orphaned by a killed Snakemake stops instead of finishing behind a newer run;
Snakemake's scheduler keeps one re-evaluation timer, not one more per finished job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.project import env

from encmap.workflow.jobs import snakemake_ancestors


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # an orphan's zombie waits for a reaper that may not come


@pytest.mark.parametrize("launcher", ["snakemake", "encmap repro's call"])
def test_a_script_job_stops_when_its_snakemake_is_killed(tmp_path, launcher):
    """A real Snakemake runs a `script:` job (snakemake -> bash -> python); SIGKILL to Snakemake does
    not reach the job. Old: it ran on with parent 1 and later renamed its outputs over a newer run's.
    Old too: under `encmap repro` (Snakemake as `python -m encmap.workflow.snakemake_call`) the job
    found no Snakemake above it and watched nothing."""
    (tmp_path / "Snakefile").write_text('rule job:\n    output: "out"\n    script: "job.py"\n')
    (tmp_path / "argv.json").write_text(json.dumps(["out", "--cores", "1"]))
    command = {"snakemake": ["snakemake", "out", "--cores", "1"],
               "encmap repro's call": [sys.executable, "-m", "encmap.workflow.snakemake_call", "argv.json"]}[launcher]
    (tmp_path / "job.py").write_text("import os, time\n"
                                     "from encmap.workflow.jobs import guard_script_job\n"
                                     "guard_script_job(poll_seconds=0.1)\n"
                                     "open('started', 'w').write(str(os.getpid()))\n"
                                     "time.sleep(60)\n"
                                     "open(snakemake.output[0], 'w').close()\n")
    marker = tmp_path / "started"
    parent = subprocess.Popen(command, cwd=tmp_path, env=env(),
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while not (marker.exists() and marker.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the job never started"
        pid = int(marker.read_text())
        assert parent.pid in [p for p, _ in snakemake_ancestors(pid)]
        os.kill(parent.pid, signal.SIGKILL)  # the job's bash and python live on, with parent 1
        parent.wait()
        deadline = time.time() + 10
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the orphaned job kept running"
        assert not (tmp_path / "out").exists()
    finally:
        if _alive(parent.pid):
            os.killpg(parent.pid, signal.SIGKILL)


def test_encmap_stage_is_a_snakemake_to_the_jobs_it_runs(tmp_path):
    """`encmap stage` (every DVC stage's command) runs Snakemake in its own process: its script jobs
    watch it. Shown on a process with its command line (`<python> .../bin/encmap stage map`)."""
    from encmap.workflow.jobs import _is_snakemake

    # A Python that says it is up before it is asked: until then /proc shows the forked pytest's
    # command line, and a shell may exec its last command and show that one instead.
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"]
    shapes = {"encmap stage": sleeper + ["/venv/bin/encmap", "stage", "map"],
              "encmap repro": sleeper + ["/venv/bin/encmap", "repro"]}
    seen = {}
    for name, argv in shapes.items():
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "up\n"
            seen[name] = _is_snakemake(p.pid)
        finally:
            p.kill()
            p.wait()
    assert seen == {"encmap stage": True, "encmap repro": False}  # repro itself starts a Snakemake child


# N quick jobs, then a 2-thread in-process job (force-use-threads: it runs in the Snakemake
# process) while 2-thread jobs wait, ready but blocked: the scheduler's situation during a long
# job of a large map. It counts the re-evaluation timers alive then.
_TIMERS_SNAKEFILE = """
import threading, time
{patch}
rule all:
    input: expand("q/{{i}}", i=range({n})), "timers", expand("w/{{i}}", i=range(2))
rule quick:
    output: "q/{{i}}"
    priority: 2
    run:
        open(output[0], "w").write(str(time.time()))
rule count:
    output: "timers"
    threads: 2
    priority: 1
    run:
        time.sleep(1.5)  # every chain started so far has a timer alive now
        timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
        open(output[0], "w").write(str(len(timers)))
rule waiting:
    output: "w/{{i}}"
    threads: 2
    run:
        open(output[0], "w").close()
"""


def _timers(tmp_path: Path, patch: bool, n: int = 40, *extra: str) -> tuple[int, list[float]]:
    d = tmp_path / ("patched" if patch else "plain")
    d.mkdir()
    fix = "from encmap.workflow.jobs import one_reevaluation_timer\none_reevaluation_timer()" if patch else ""
    (d / "Snakefile").write_text(_TIMERS_SNAKEFILE.format(patch=fix, n=n))
    subprocess.run(["snakemake", "--cores", "2", "--force-use-threads", "--quiet", "all", *extra], cwd=d,
                   env=env(), check=True, capture_output=True, timeout=300)
    starts = sorted(float((d / "q" / str(i)).read_text()) for i in range(n))
    return int((d / "timers").read_text()), starts


@pytest.mark.slow
def test_the_scheduler_keeps_one_reevaluation_timer_and_still_limits_the_job_rate(tmp_path):
    # Snakemake as pinned starts one more perpetual timer per finished job (the control: if this
    # fails, Snakemake fixed it and encmap.workflow.jobs.one_reevaluation_timer can go).
    plain, _ = _timers(tmp_path, patch=False)
    assert plain >= 20, f"{plain} timers after 40 jobs: Snakemake no longer multiplies them"
    patched, _ = _timers(tmp_path, patch=True)
    assert patched <= 1
    # The rate limit it exists for still holds: 10 jobs at most 4 per second span >= 2 s.
    limited = tmp_path / "limited"
    limited.mkdir()
    _, starts = _timers(limited, True, 10, "--max-jobs-per-timespan", "4/1s")
    assert starts[-1] - starts[0] >= 1.9


def test_a_sooner_reevaluation_is_not_held_back_by_a_later_pending_one():
    """A 1 s rate-limit wake-up asked for while a 10 s one (queue input) is pending still comes in 1 s."""
    import threading
    from types import SimpleNamespace

    from snakemake.scheduling.job_scheduler import JobScheduler

    from encmap.workflow.jobs import one_reevaluation_timer

    assert one_reevaluation_timer()
    sched = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    JobScheduler._schedule_reevalutation(sched, 10)
    JobScheduler._schedule_reevalutation(sched, 0.2)
    JobScheduler._schedule_reevalutation(sched, 0.5)  # later than the pending 0.2 s one: no new timer
    t0 = time.monotonic()
    assert sched._open_jobs.acquire(timeout=3) and time.monotonic() - t0 < 2
    assert not sched._open_jobs.acquire(timeout=1)  # one wake-up, not two


def test_a_leftover_backup_of_an_update_output_does_not_stop_the_next_job(tmp_path, monkeypatch):
    """A job killed after Snakemake backed up its update() output leaves the backup; Snakemake
    9.27.1's next backup of it fails (FileExistsError). The control fails once Snakemake handles
    it itself, and the shim in encmap.workflow.jobs can go."""
    from snakemake.persistence import FileBackupMixin

    from encmap.workflow import jobs

    out = tmp_path / "results/eval/m"
    out.mkdir(parents=True)
    (out / "a.json").write_text("now")
    p = FileBackupMixin()
    p.path = tmp_path / ".snakemake"  # backups go to <path>/backups
    left = p._get_backup_path(out)
    left.mkdir(parents=True)
    (left / "a.json").write_text("before the killed job")
    monkeypatch.setattr(FileBackupMixin, "backup_output", FileBackupMixin.backup_output)  # undone after the test
    with pytest.raises(FileExistsError):  # the control: Snakemake's own behaviour
        p.backup_output(out)
    jobs.replace_stale_backups()
    jobs.replace_stale_backups()  # idempotent
    p.backup_output(out)
    assert (left / "a.json").read_text() == "now"


_REWIRE_ALL = """
import logging, os, random, signal, sys, warnings
import numpy as np
import torch
from threadpoolctl import threadpool_limits
try:
    import wordllama  # noqa: F401  (logging.basicConfig(level=INFO) on import: the case found)
except ImportError:
    logging.basicConfig(level=logging.INFO)
logging.getLogger().addHandler(logging.StreamHandler(sys.stdout))
logging.getLogger("snakemake").setLevel(logging.CRITICAL)
warnings.simplefilter("error")
os.environ["ENCMAP_REWIRED"] = "1"
os.environ.pop("HOME", None)
os.chdir("/")
sys.path.append("/a/path/of/the/library")
random.seed(12345); np.random.seed(12345); torch.manual_seed(12345)
torch.set_default_dtype(torch.float64)
torch.set_num_threads(1 if torch.get_num_threads() > 1 else 2)
threadpool_limits(3, user_api="blas")
signal.signal(signal.SIGUSR1, lambda *a: None)
"""

_PROBE_ALL = """
import hashlib, json, logging, os, random, signal, sys, warnings
import numpy as np
import torch
from threadpoolctl import threadpool_info
digest = lambda x: hashlib.sha256(repr(x).encode()).hexdigest()[:16]
state = {
    "root": [type(h).__name__ for h in logging.getLogger().handlers], "level": logging.getLogger().level,
    "snakemake_level": logging.getLogger("snakemake").level, "warnings": digest(warnings.filters),
    "env": digest(sorted(os.environ.items())), "cwd": os.getcwd(), "path": digest(sys.path),
    "random": digest(random.getstate()), "numpy": digest(np.random.get_state()[1].tolist()),
    "torch_rng": digest(torch.random.get_rng_state().tolist()), "dtype": str(torch.get_default_dtype()),
    "torch_threads": torch.get_num_threads(), "signal": repr(signal.getsignal(signal.SIGUSR1)),
    "blas": sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"),
}
open(snakemake.output[0], "w").write(json.dumps(state, indent=1))
"""

_STATE_SNAKEFILE_ALL = """
import numpy, threadpoolctl, torch  # imported before the jobs: the probes compare the process, not first imports
from encmap.workflow.jobs import in_process

rule all:
    input: "after.json"

rule before:
    output: "before.json"
    log: "logs/before.log"
    run:
        in_process("probe.py", input, output, params, wildcards, threads, log)

rule rewire:
    input: "before.json"
    output: "rewired"
    log: "logs/rewire.log"
    run:
        in_process("rewire.py", input, output, params, wildcards, threads, log)
        open(output[0], "w").close()

rule after:
    input: "rewired"
    output: "after.json"
    log: "logs/after.log"
    run:
        in_process("probe.py", input, output, params, wildcards, threads, log)
"""


@pytest.mark.slow(minutes=1)
def test_an_in_process_job_leaves_snakemakes_process_as_it_found_it(tmp_path):
    """Issue 70 item 3. Old: an in-process job's import rewired Snakemake's process for good: after
    wordllama's `logging.basicConfig(level=INFO)` every Snakemake line was printed twice; a job's
    `os.chdir` lost every relative output; and its warnings filters, environment, sys.path, random
    states, torch's default dtype and threads and the BLAS limit stayed for every later job; a signal
    handler set at import failed the job. The job between two probes changes each; the probes match."""
    (tmp_path / "Snakefile").write_text(_STATE_SNAKEFILE_ALL)
    (tmp_path / "rewire.py").write_text(_REWIRE_ALL)
    (tmp_path / "probe.py").write_text(_PROBE_ALL)
    r = subprocess.run(["snakemake", "--cores", "2", "--force-use-threads"], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "INFO:snakemake" not in out and out.count("Finished jobid") >= 3, out[-3000:]
    before, after = (json.loads((tmp_path / f).read_text()) for f in ("before.json", "after.json"))
    assert after == before, {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert "asked to handle signal" in (tmp_path / "logs/rewire.log").read_text()
# A workflow of in-process jobs (encmap.workflow.jobs.in_process): a probe records what a job sees
# of the process's global state; `leak` imports a library that rewires the process every way it
# can on import; `wordllama` imports the real wordllama (logging.basicConfig(level=INFO)), or does
# what it does where it is not installed, and waits, its handler in place, until Snakemake has
# logged the `side` job's end. `_JOB_LIBRARY` is that leaky library.
_ISOLATION_SNAKEFILE = """
import os, time
from pathlib import Path
from encmap.workflow.jobs import in_process

D = Path(workflow.basedir)
AFTER = {"before": [], "after_leak": ["leak"], "after_wordllama": ["wordllama", "side"]}
wildcard_constraints:
    name="before|after_leak|after_wordllama"
rule all:
    input: expand("{name}.json", name=AFTER)
rule probe:
    input: lambda wc: AFTER[wc.name]
    output: "{name}.json"
    log: "logs/{name}.log"
    run: in_process(D / "probe.py", input, output, params, wildcards, threads, log)
rule leak:
    input: "before.json"
    output: "leak"
    log: "logs/leak.log"
    run: in_process(D / "leak.py", input, output, params, wildcards, threads, log)
rule wordllama:
    input: "after_leak.json"
    output: "wordllama"
    log: "logs/wordllama.log"
    run: in_process(D / "wordllama_job.py", input, output, params, wildcards, threads, log)
rule side:
    input: "after_leak.json"
    output: "side"
    run:
        deadline = time.time() + 120
        while not os.path.exists("imported") and time.time() < deadline:
            time.sleep(0.05)
        open(output[0], "w").close()
"""

_JOB_LIBRARY = """
import faulthandler, io, logging, os, random, signal, sys, warnings
import numpy as np
import torch  # first imported here: what it was before this library changed it is the baseline
from threadpoolctl import threadpool_limits

PRISTINE = {"torch threads": torch.get_num_threads(), "seeded draws": [
    random.Random(0).random(), np.random.RandomState(0).random_sample(),
    torch.rand(1, generator=torch.Generator().manual_seed(0)).item()]}
logging.getLogger().addHandler(logging.StreamHandler())  # a handler of its own, not basicConfig
logging.getLogger().setLevel(logging.DEBUG)
logging.getLogger("snakemake.logging").setLevel(logging.CRITICAL)
warnings.simplefilter("ignore")
os.environ["ENCMAP_LEAK"] = "1"
os.chdir("/")
sys.path.insert(0, "/leaked/path")
threadpool_limits(2, user_api="blas")
torch.set_num_threads(PRISTINE["torch threads"] + 1)
torch.set_default_dtype(torch.float64)
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)
faulthandler.register(signal.SIGUSR2)  # a C-level handler: any thread may install one
try:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
except ValueError:  # Python allows it on the main thread only: prevented already
    pass
sys.stdout = io.StringIO()
"""

_PROBE = """
import json, logging, os, random, signal, sys, warnings
import numpy as np
from threadpoolctl import threadpool_info

torch = sys.modules.get("torch")
sm = logging.getLogger("snakemake.logging")
state = {
    "root logger": [len(logging.root.handlers), logging.root.level, logging.root.manager.disable],
    "snakemake's logger": [sm.level, sm.disabled, len(sm.handlers)],
    "warnings": [repr(f) for f in warnings.filters],
    "environment": dict(os.environ),
    "cwd": os.getcwd(),
    "sys.path": sys.path,
    "blas threads": [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"],
    "torch threads": torch and torch.get_num_threads(),
    "torch dtype": torch and str(torch.get_default_dtype()),
    "caught, ignored signals": [line for line in open("/proc/self/status") if line.startswith(("SigCgt", "SigIgn"))],
    "SIGINT": repr(signal.getsignal(signal.SIGINT)),
    "stdout": type(sys.stdout).__name__,
    "draws": [random.random(), np.random.random_sample(), torch and torch.rand(1, dtype=torch.float32).item()],
}
json.dump(state, open(snakemake.output[0], "w"))
"""


@pytest.mark.slow(minutes=1)
def test_what_an_in_process_job_imports_rewires_neither_snakemake_nor_the_next_job(tmp_path):
    """Issue 70 item 3. Old: after the job that imported wordllama every Snakemake line came twice
    (`INFO:snakemake.logging:…`), and each job saw what earlier jobs' imports had set: a root
    handler at DEBUG, Snakemake's logger silenced, warnings ignored, another environment, working
    directory and sys.path, two BLAS threads, torch's threads and float64 default dtype, seeded
    global generators, a C-level SIGUSR2 handler, a swallowed stdout."""
    (tmp_path / "Snakefile").write_text(_ISOLATION_SNAKEFILE)
    (tmp_path / "leaky.py").write_text(_JOB_LIBRARY)
    (tmp_path / "probe.py").write_text(_PROBE)
    (tmp_path / "leak.py").write_text("import json, os\nout = os.path.abspath(snakemake.output[0])\n"
                                      "import leaky\nopen(out, 'w').write(json.dumps(leaky.PRISTINE))\n")
    (tmp_path / "wordllama_job.py").write_text(
        "import glob, json, logging, time\n"
        "try:\n    import wordllama  # noqa: F401\n    library = 'wordllama'\n"
        "except ImportError:  # what it does on import\n    logging.basicConfig(level=logging.INFO)\n"
        "    library = 'basicConfig'\n"
        "open('imported', 'w').close()\n"
        "deadline, seen = time.time() + 120, False\n"
        "while not seen and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "    seen = any('(Rule: side)' in open(f).read() for f in glob.glob('.snakemake/log/*.snakemake.log'))\n"
        "json.dump({'library': library, 'side ended meanwhile': seen}, open(snakemake.output[0], 'w'))\n")
    p = subprocess.run(["snakemake", "--cores", "2", "--force-use-threads"], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    lines = p.stderr.splitlines()
    assert not [line for line in lines if ":snakemake" in line]
    finished = [line for line in lines if line.startswith("Finished jobid")]
    assert len(finished) == len(set(finished)) == 7 and any("(Rule: side)" in line for line in finished)
    wl = json.loads((tmp_path / "wordllama").read_text())
    assert wl["side ended meanwhile"]
    try:
        import wordllama  # noqa: F401
        assert wl["library"] == "wordllama"
    except ImportError:
        pass
    pristine = json.loads((tmp_path / "leak").read_text())
    before = json.loads((tmp_path / "before.json").read_text())
    expected = before | {"torch threads": pristine["torch threads"], "torch dtype": "torch.float32"}
    for name in ("after_leak", "after_wordllama"):
        seen = json.loads((tmp_path / f"{name}.json").read_text())
        draws = seen.pop("draws")
        assert {k: v for k, v in seen.items() if v != expected[k]} == {}, name
        assert not set(draws) & set(pristine["seeded draws"]), name


def test_a_thread_s_next_job_does_not_see_what_the_last_job_left_in_that_thread():
    """Snakemake's pool threads run job after job: context variables (NumPy's errstate, decimal's
    precision), the thread's signal mask and torch's thread count (per thread in torch, taken from
    the last set_num_threads by a thread's first use) are the thread's own state."""
    import decimal
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch

    from encmap.workflow.isolation import run_isolated

    base = torch.get_num_threads()
    leaked, started = threading.Event(), threading.Event()

    def leak():
        np.seterr(all="raise")
        decimal.getcontext().prec = 3
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        torch.set_num_threads(base + 1)
        leaked.set()
        assert started.wait(30)  # still running while a job starts in another thread

    def view():
        return (np.geterr()["divide"], decimal.getcontext().prec, signal.SIGUSR1 in signal.pthread_sigmask(
            signal.SIG_BLOCK, ()), torch.get_num_threads())

    clean = (np.geterr()["divide"], decimal.getcontext().prec, False, base)
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(run_isolated, leak)
        assert leaked.wait(30)
        beside = pool.submit(run_isolated, view)  # the other thread: its first torch call while `leak` runs
        seen_beside = beside.result(30)
        started.set()
        a.result(30)
        after = [pool.submit(run_isolated, view).result(30) for _ in range(4)]  # on both threads
    assert seen_beside == clean
    assert after == [clean] * 4


def test_a_job_s_leak_is_put_back_without_breaking_a_job_still_running():
    """Side by side: job A leaks a warnings filter, an environment variable and a root handler, and
    ends while job B runs between seeding the global generators and drawing; B's draws are those
    of its seeds (the random states are put back only once no job runs); the environment and the
    handler are put back at A's end already; a job C that starts after A waits until B has ended, then
    sees the warnings as they were."""
    import logging
    import random
    import threading
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from encmap.workflow.isolation import run_isolated

    filters, handlers = list(warnings.filters), list(logging.root.handlers)
    seeded, a_ended, b_ended = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        assert seeded.wait(30)
        warnings.filterwarnings("ignore", message="a leak")
        os.environ["ENCMAP_TEST_LEAK"] = "1"
        logging.root.addHandler(logging.NullHandler())

    def b():
        random.seed(1)
        np.random.seed(1)
        seeded.set()
        assert a_ended.wait(30)
        seen["B's draws"] = [random.random(), np.random.random_sample()]
        seen["at A's end"] = [os.environ.get("ENCMAP_TEST_LEAK"), logging.root.handlers == handlers]
        time.sleep(0.5)  # C, were it not held back, would start now
        b_ended.set()

    def c():
        seen["C after B"] = b_ended.is_set()
        seen["C's warnings"] = warnings.filters == filters

    with ThreadPoolExecutor(3) as pool:
        fb = pool.submit(run_isolated, b)
        pool.submit(run_isolated, a).result(30)
        a_ended.set()
        fc = pool.submit(run_isolated, c)
        fb.result(30)
        fc.result(30)
    assert seen == {"B's draws": [random.Random(1).random(), np.random.RandomState(1).random_sample()],
                    "at A's end": [None, True], "C after B": True, "C's warnings": True}
    assert warnings.filters == filters and "ENCMAP_TEST_LEAK" not in os.environ


def test_the_rules_own_imports_leave_snakemake_s_process_as_they_found_it():
    """What the Snakefile and the rules import into Snakemake's main process (rules/common.smk:
    the config check, the registry, the encoders' settings) changes none of the state an in-process
    job must not change either. Snakemake's own imports (NumPy's warnings filters among them) come
    first there, and are its own."""
    repo = Path(__file__).resolve().parents[1]
    imports = sorted({line.strip() for f in [repo / "Snakefile", *(repo / "rules").glob("*.smk")]
                      for line in f.read_text().splitlines()
                      if line.strip().startswith(("import ", "from ")) and "encmap" in line})
    code = ("import snakemake.api, snakemake.workflow\nfrom encmap.workflow.isolation import Snapshot\n"
            "before = Snapshot()\n" + "\n".join(imports)
            + "\nprint(before.changed())\n")
    p = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert len(imports) >= 10 and p.stdout.strip() == "[]"
