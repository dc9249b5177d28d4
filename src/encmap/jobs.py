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

Threads: BLAS thread counts are process-wide, so jobs sharing a process cannot each set their
own without racing (and a different count changes the last bits of an SVD: artifacts must
reproduce byte for byte). In-process jobs therefore run NumPy/SciPy's BLAS on one thread each,
set once for the process, and get ``threads=None`` (no per-job limit); Snakemake runs as many of
them side by side as there are cores. Torch keeps its own pool (``torch.set_num_threads``).
"""

from __future__ import annotations

import io
import runpy
import sys
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

_local = threading.local()
_lock = threading.Lock()
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
        if str(script.parent) not in sys.path:  # the adapters import their _log helper
            sys.path.insert(0, str(script.parent))
    job = SimpleNamespace(input=input, output=output, params=params, wildcards=wildcards, threads=None,
                          log=log, resources=resources, in_process=True)
    fh = open(log[0], "w", buffering=1) if log else None
    _local.stream = fh
    try:
        runpy.run_path(str(script), init_globals={"snakemake": job}, run_name="__snakemake_job__")
    except BaseException:
        if fh:
            traceback.print_exc(file=fh)
        raise
    finally:
        _local.stream = None
        if fh:
            fh.close()
