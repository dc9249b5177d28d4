"""What an in-process job leaves of Snakemake's process: the process as the job found it.

In-process jobs (:func:`.jobs.in_process`) run in Snakemake's own threads, and whatever a job or a
library it imports changes in the process's global state stays for Snakemake and every later job:
``wordllama`` calls ``logging.basicConfig(level=INFO)`` on import, after which every line Snakemake
logs was printed twice. :func:`job` guards each in-process job:

- at its end (other jobs may still run; none of them reads these): the root logger's handlers,
  level and filters and those of Snakemake's loggers, ``logging.disable``, the working directory and
  torch's default dtype are put back as they were before the first job of the batch;
- when no job runs any more (restoring them under a running job would change what it computes):
  environment variables, ``sys.path``, the ``warnings`` filters and ``showwarning``, the global random
  states (``random``, NumPy's legacy global, torch's), torch's thread count and the process's
  single-thread BLAS limit;
- prevented: a signal handler set from a job's thread (Python refuses it there; the request is
  ignored, said in the job's log, instead of failing the job's import).

"Before the first job of the batch": the state taken whenever a job starts while none runs.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

_lock = threading.Lock()
_state: dict[str, Any] = {"running": 0, "saved": None}


def _loggers() -> list[logging.Logger]:
    """The root logger and Snakemake's: those whose output a job's library could double or silence."""
    named = [lg for name, lg in logging.root.manager.loggerDict.items()
             if name.split(".")[0] == "snakemake" and isinstance(lg, logging.Logger)]
    return [logging.root, *named]


def _snapshot() -> dict[str, Any]:
    state: dict[str, Any] = {
        "logging": {lg.name: (list(lg.handlers), lg.level, lg.propagate, lg.disabled, list(lg.filters))
                    for lg in _loggers()},
        "logging_disable": logging.root.manager.disable,
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "path": list(sys.path),
        "warnings": (list(warnings.filters), warnings.showwarning),
        "random": random.getstate(),
    }
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        state["torch"] = (torch.get_default_dtype(), torch.get_num_threads(), torch.random.get_rng_state())
    return state


def _restore_at_job_end(s: dict[str, Any]) -> None:
    for lg in _loggers():
        if lg.name in s["logging"]:
            handlers, level, propagate, disabled, filters = s["logging"][lg.name]
            lg.handlers[:], lg.filters[:] = handlers, filters
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
    logging.disable(s["logging_disable"])
    if os.getcwd() != s["cwd"]:
        os.chdir(s["cwd"])
    if "torch" in s and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_default_dtype() != s["torch"][0]:
            torch.set_default_dtype(s["torch"][0])


def _restore_when_idle(s: dict[str, Any]) -> None:
    for k in [k for k in os.environ if k not in s["environ"]]:
        del os.environ[k]
    for k, v in s["environ"].items():
        if os.environ.get(k) != v:
            os.environ[k] = v
    sys.path[:] = s["path"]
    warnings.filters[:], warnings.showwarning = s["warnings"]
    warnings._filters_mutated()  # the filters' cache, as warnings.catch_warnings resets it
    random.setstate(s["random"])
    if "numpy" in sys.modules:
        np = sys.modules["numpy"]
        if "numpy" in s:
            np.random.set_state(s["numpy"])
        blas_single_thread()
    if "torch" in s and "torch" in sys.modules:
        torch = sys.modules["torch"]
        if torch.get_num_threads() != s["torch"][1]:
            torch.set_num_threads(s["torch"][1])
        torch.random.set_rng_state(s["torch"][2])


def blas_single_thread(once: bool = False) -> None:
    """NumPy's and SciPy's BLAS on one thread, for the whole process (:mod:`.jobs`' note): set before
    the first in-process job (``once``), and again once no job runs (a job's library may change it)."""
    if once and _state.get("blas") is not None:
        return
    import numpy  # noqa: F401  (load both BLAS libraries first: a limit binds only loaded ones)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    _state["blas"] = threadpool_limits(1, user_api="blas")  # held for the process's lifetime


def _signals_stay() -> None:
    """A job's thread cannot set a signal handler (Python raises); a library that tries at import
    would fail the job. The request is ignored instead, and said on the job's stderr (its log)."""
    if getattr(signal.signal, "_encmap_kept", False):
        return
    real = signal.signal

    def keep(signum, handler):
        if threading.current_thread() is threading.main_thread():
            return real(signum, handler)
        sys.stderr.write(f"encmap: a job asked to handle signal {signum} in Snakemake's process; ignored "
                         "(Snakemake's own handlers stay)\n")
        return signal.getsignal(signum)

    keep._encmap_kept = True
    signal.signal = keep


@contextmanager
def job() -> Iterator[None]:
    """Run one in-process job so that it leaves the process's global state as it found it (module
    docstring): what nothing else reads is put back as the job ends, the rest once no job runs."""
    with _lock:
        if _state["running"] == 0:
            _state["saved"] = _snapshot()
            _signals_stay()
        _state["running"] += 1
        saved = _state["saved"]
    try:
        yield
    finally:
        with _lock:
            _state["running"] -= 1
            _restore_at_job_end(saved)
            if _state["running"] == 0:
                _restore_when_idle(saved)
