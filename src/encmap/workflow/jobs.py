"""Running a rule's adapter script inside Snakemake's own process (rules with ``run:``).

A ``script:`` job starts a fresh interpreter that imports Snakemake, NumPy, h5py, SciPy and
encmap again: ~1 s of CPU per job, measured to dominate the per-encoder stages (embed, pip,
features) of a map of many small encoders (``benchmarks/bench_scale.py``). Those rules instead
run the very same ``scripts/<rule>.py`` in the Snakemake process (``run:`` blocks; the profiles
set ``force-use-threads`` so that local jobs run in its thread pool instead of spawning a
Snakemake per job), where every import is paid once. The script sees the usual ``snakemake``
object (input, output, params, wildcards, threads, log, resources); its stderr (warnings,
progress, the traceback of a failure) goes to the rule's log file, per thread, so that jobs
running side by side do not mix their logs.

``script:`` jobs run in their own process (``snakemake -> bash -> python``), and a Snakemake
killed with SIGKILL leaves them running with parent 1: :func:`guard_script_job` makes such a job
stop when its Snakemake is gone, and makes its writes refuse to replace an output that a newer
run wrote meanwhile (:func:`encmap.io.set_job_start`).

Threads: BLAS thread counts are process-wide, so jobs sharing a process cannot each set their
own without racing (and a different count changes the last bits of an SVD: artifacts must
reproduce byte for byte). In-process jobs therefore run NumPy/SciPy's BLAS on one thread each,
set once for the process, and get ``threads=None`` (no per-job limit); Snakemake runs as many of
them side by side as there are cores. Torch keeps its own pool (``torch.set_num_threads``).
"""

from __future__ import annotations

import io
import os
import runpy
import sys
import threading
import time
import traceback
from functools import partial
from pathlib import Path
from types import SimpleNamespace

from .isolation import run_isolated

_local = threading.local()
_lock = threading.Lock()
_timer_lock = threading.Lock()  # guards the scheduler's one pending re-evaluation timer
_blas_limit = None  # the process-wide single-thread BLAS setting, held for the process's lifetime


class _ThreadStderr(io.TextIOBase):
    """sys.stderr that writes to the current thread's job log, else to the real stderr."""

    def __init__(self, fallback):
        self.fallback = fallback

    def _target(self):
        return getattr(_local, "stream", None) or self.fallback

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.fallback.fileno()


def in_process(script: str | Path, input, output, params, wildcards, threads, log, resources=None) -> None:
    """Run ``script`` (a rule's adapter) in this process with a ``snakemake`` object; stderr to ``log[0]``.

    ``threads`` (the rule's, what Snakemake scheduled) is not passed on: see the module's note.
    """
    global _blas_limit
    script = Path(script)
    with _lock:
        if _blas_limit is None:
            import numpy  # noqa: F401  (load both BLAS libraries first: a limit binds only loaded ones)
            import scipy.linalg  # noqa: F401
            from threadpoolctl import threadpool_limits

            _blas_limit = threadpool_limits(1, user_api="blas")
        if not isinstance(sys.stderr, _ThreadStderr):
            sys.stderr = _ThreadStderr(sys.stderr)
    job = SimpleNamespace(input=input, output=output, params=params, wildcards=wildcards, threads=None,
                          log=log, resources=resources, in_process=True)
    fh = open(log[0], "w", buffering=1) if log else None
    _local.stream = fh
    try:
        # What the job or its imports change in the process's global state does not outlast it
        # (encmap.workflow.isolation); the adapters import their _job helper from beside them.
        run = partial(runpy.run_path, str(script), init_globals={"snakemake": job}, run_name="__snakemake_job__")
        run_isolated(run, sys_path=[str(script.parent)])
    except BaseException as e:
        if fh:
            traceback.print_exc(file=fh)
        note_refused(e)
        raise
    finally:
        _local.stream = None
        if fh:
            fh.close()


#: Per workflow root, the code files' size and time as this process loaded its code (receipts.code_stats).
_loaded: dict[str, dict] = {}


def code_loaded(root: str | Path) -> dict[str, tuple[int, int]]:
    """The code under ``root`` as this process loaded it: taken once, when Snakemake's process reads
    the Snakefile (its in-process jobs run the modules it then has) or a script job starts."""
    from .receipts import code_stats

    key = str(Path(root).resolve())
    if key not in _loaded:
        _loaded[key] = code_stats(Path(key))
    return _loaded[key]


def receipts_follow_touch() -> None:
    """Snakemake touches every output after its job (its clock-skew guard), in the job's process and
    again where it was submitted: the receipt of a file that was still what its job wrote follows
    the touch (:func:`.receipts.follow`), so that the receipt's key stays the file's. Idempotent."""
    from snakemake.io import _IOFile

    from .receipts import follow, stat_key

    touch = _IOFile.touch
    if getattr(touch, "_encmap_receipts", False):
        return

    def touch_and_follow(self, times=None):
        path = os.path.normpath(str(self.file))
        try:
            before = None if os.path.isdir(path) else stat_key(os.stat(path))
        except OSError:
            before = None
        touch(self, times)
        if before is not None:
            follow(Path.cwd(), path, before)

    touch_and_follow._encmap_receipts = True
    _IOFile.touch = touch_and_follow


def write_receipts(root: str | Path, outputs) -> None:
    """A job's last step: its receipts (:mod:`.receipts`), the code changed since it was loaded named."""
    from .receipts import write

    write(Path.cwd(), outputs, code_loaded(root))


#: Set by ``encmap repro`` for the Snakemake calls it makes: DVC records what they write.
UNDER_DVC = "ENCMAP_UNDER_DVC"
#: Artifacts that readers of failed jobs refused, one absolute path per line, until the run's end
#: marks them in the ledger (:func:`encmap.workflow.integrity.record`).
REFUSED_LOG = Path(".snakemake") / "encmap" / "refused.txt"


def note_refused(error: BaseException) -> None:
    """A job failed: the artifacts its readers refused (:attr:`EncmapError.refused`) are noted, so
    that the run's end records none of them as good (the Snakemake route's ledger; under DVC,
    DVC hashes every output itself). An append to a file: safe from any job process or thread."""
    refused, seen = [], set()
    while error is not None and id(error) not in seen:  # the reader's error may be wrapped by its step
        seen.add(id(error))
        refused += getattr(error, "refused", ())
        error = error.__cause__ or error.__context__
    if not refused or os.environ.get("DVC_STAGE") or os.environ.get(UNDER_DVC):
        return
    try:
        log = Path.cwd() / REFUSED_LOG
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write("".join(f"{Path(r).resolve()}\n" for r in refused))
    except OSError as e:  # never hide the job's own error
        sys.stderr.write(f"encmap: could not note the refused files {refused}: {e}\n")


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a process, from /proc; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


#: ``python -m <module>`` forms of a Snakemake process: Snakemake's own, and ``encmap repro``'s call.
SNAKEMAKE_MODULES = ("snakemake", "encmap.workflow.snakemake_call")


def _is_snakemake(pid: int) -> bool:
    """Whether process ``pid`` is a Snakemake: ``snakemake``, ``python -m snakemake``, ``encmap
    repro``'s call (``python -m encmap.workflow.snakemake_call``) or ``encmap stage``, which runs
    Snakemake in its own process (every DVC stage)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    pairs = list(zip(args, args[1:]))
    return (any(Path(a).name == "snakemake" for a in args)
            or any(a == "-m" and b in SNAKEMAKE_MODULES for a, b in pairs)
            or any(Path(a).name == "encmap" and b == "stage" for a, b in pairs))


def snakemake_ancestors(pid: int | None = None) -> list[tuple[int, int]]:
    """(pid, start time) of every Snakemake process above ``pid`` (default: this one), nearest first."""
    out, pid = [], os.getppid() if pid is None else pid
    while pid > 1:
        stat = _proc_stat(pid)
        if stat is None:
            break
        if _is_snakemake(pid):
            out.append((pid, stat[1]))
        pid = stat[0]
    return out


def guard_script_job(poll_seconds: float = 1.0) -> None:
    """Call first in a ``script:`` job: its writes refuse to replace outputs newer than the job,
    and it exits when a Snakemake above it is gone (killed, or the session ended)."""
    from ..io import set_job_start

    set_job_start(time.time_ns())
    hook = sys.excepthook

    def refuse_then_report(kind, error, tb):  # a failing script job's refused inputs, as in_process does
        note_refused(error)
        hook(kind, error, tb)

    sys.excepthook = refuse_then_report
    watched = snakemake_ancestors()
    if not watched:
        return

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            for pid, started in watched:
                stat = _proc_stat(pid)
                if stat is None or stat[1] != started:  # gone, or its pid reused by another process
                    sys.stderr.write(f"encmap: Snakemake (pid {pid}) is gone; stopping this job so that it cannot "
                                     "overwrite the outputs of a newer run\n")
                    sys.stderr.flush()
                    os._exit(75)

    threading.Thread(target=watch, name="encmap-parent-watch", daemon=True).start()


def one_reevaluation_timer() -> bool:
    """Make Snakemake's scheduler keep at most one pending re-evaluation timer; True if applied.

    Snakemake 9 (checked: 9.27.1) rate-limits submissions by default and, after every pass of its
    scheduling loop, starts a ``threading.Timer`` to wake it one timespan later; every other wake-up
    (each finished job) starts one more never-ending chain, so after N jobs it makes N passes a
    second (25-model map: ~52,000 timer threads, 6–14% of a core, pairwise 111 s vs 98 s). One
    pending daemon timer, the earliest asked for, keeps the rate limiter's guarantee.
    """
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:  # another Snakemake layout: leave it as it is
        return False
    if getattr(JobScheduler, "_encmap_one_timer", False):
        return True
    if not callable(getattr(JobScheduler, "_schedule_reevalutation", None)):
        return False

    def schedule_reevaluation(self, delay: float) -> None:
        due = time.monotonic() + delay
        with _timer_lock:
            pending = getattr(self, "_encmap_timer_due", None)
            if pending is not None and pending <= due:
                return  # the pending timer wakes the loop by then anyway
            self._encmap_timer_due = due  # none pending, or only a later one (a 10 s queue-input wait)

        def fire() -> None:
            with _timer_lock:  # cleared before the wake-up, so that the pass it causes may start the next
                if self._encmap_timer_due == due:
                    self._encmap_timer_due = None
            self._open_jobs.release()

        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timer.start()

    JobScheduler._schedule_reevalutation = schedule_reevaluation
    JobScheduler._encmap_one_timer = True
    return True


def replace_stale_backups() -> None:
    """Let Snakemake back up an ``update()`` output over the backup a killed job left behind.

    Snakemake 9 copies each ``update()`` output to ``.snakemake/backups/`` before a job and removes
    the copy after it; a killed job leaves the copy, and every later backup of that output fails
    with ``FileExistsError`` until it is removed by hand (review of snakemake/snakemake#3833; not
    handled in 9.27.1). The leftover predates the output that must be kept: it is replaced.
    Idempotent; ``tests/test_jobs.py`` fails once Snakemake handles it itself.
    """
    import shutil

    from snakemake.persistence import FileBackupMixin

    backup = FileBackupMixin.backup_output
    if getattr(backup, "_encmap_replaces_stale", False):
        return

    def backup_output(self, path: Path) -> None:
        stale = self._get_backup_path(path)
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale)
        elif stale.exists() or stale.is_symlink():
            stale.unlink()
        return backup(self, path)

    backup_output._encmap_replaces_stale = True
    FileBackupMixin.backup_output = backup_output


def keep_update_outputs_of_failed_jobs() -> None:
    """Never let Snakemake delete the ``update()`` outputs of a job that failed.

    Snakemake 9 (checked: 9.27.1) backs ``update()`` outputs up only in the local executor's main
    process and, on failure with no backup, removes them "since they might be corrupted": under
    SLURM a failed job deleted the previous outputs (git-tracked metrics too). Every encmap step
    replaces its outputs atomically, so an output under its own name is never half-written: a
    failed job's ``update()`` outputs are kept. Other outputs are cleaned as before. Idempotent.
    """
    from snakemake.io import is_flagged
    from snakemake.jobs import Job

    cleanup = Job.cleanup
    if getattr(cleanup, "_encmap_keeps_update", False):
        return

    async def keep_update(self, skip_outputs):
        return await cleanup(self, [*skip_outputs, *(f for f in self.output if is_flagged(f, "update"))])

    keep_update._encmap_keeps_update = True
    Job.cleanup = keep_update
