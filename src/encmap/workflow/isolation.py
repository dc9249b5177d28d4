"""Jobs that share Snakemake's process leave its global state as they found it.

In-process jobs (:func:`encmap.workflow.jobs.in_process`) run in Snakemake's thread pool, so what a
job, or a library it imports, changes process-wide rewires Snakemake and every later job: the
``wordllama`` package calls ``logging.basicConfig(level=INFO)`` on import, and every later line of
Snakemake was printed twice. :func:`run_isolated` runs a job so that its changes do not last. The
*baseline* is the state when the first of the jobs running side by side started (taken again each
time the process has no job running); what is put back, when, depends on whether it is safe to
put back while other jobs run:

- **at every job's end** (state no job changes on purpose, so whatever differs is a leak):
  the configuration of every logger that existed (root's handlers and level, Snakemake's own,
  ``logging.disable``), the environment, the working directory, ``sys.path``, signal handlers
  (Python's, and the C-level ones a job's thread can change: ``faulthandler.register``, a native
  library), the thread counts of the BLAS libraries loaded before the first job (jobs.py holds them
  at one), and torch's thread count (per thread in torch: at the job's start too, in its thread),
  default dtype and float32 matmul precision;
- **once no job runs** (state a running job may hold changed on purpose: a
  ``warnings.catch_warnings`` block, draws that follow a ``torch.manual_seed``): ``warnings``' filters
  and ``showwarning``, ``sys.stdout`` / ``sys.stderr``, and the global random states (``random``,
  NumPy's legacy generator, torch's). A job that ends with the warnings or the streams changed
  holds back the jobs that start next until the running ones have ended and the state is put back;
- **per thread** (Snakemake's pool threads run job after job): the job runs in a copy of its
  thread's context (context variables: NumPy's ``errstate``, ``decimal``'s context), and its
  thread's signal mask is put back.

While jobs run, a logger with handlers of its own that propagates to none (Snakemake's) stops
propagating, so that a handler a job adds above it cannot print Snakemake's lines again even before
that job ends; once no job runs it propagates again. A library first imported by a job is read
right after its import (an import hook, :class:`_AfterImport`): a library that imports torch and
sets its thread count in the same job cannot make its setting the baseline.

Not put back: ``torch.use_deterministic_algorithms`` (every embed job sets it from params, and
putting it back would flip it under a running forward pass); loggers created after the baseline (a
library's own). Not prevented: what Snakemake logs while a job that silenced its logger runs
(``logging.disable``, ``dictConfig``) is lost. A library that calls ``signal.signal`` from a job's
thread (Python refuses it there) has its request ignored and said in the job's log
(:func:`_signals_stay`), not the job failed. A job pays ~1 ms of CPU for all this (torch,
transformers and 160 loggers loaded; ~1 s is what running in-process saves per job).
"""

from __future__ import annotations

import contextvars
import ctypes
import importlib.abc
import importlib.util
import logging
import os
import pickle
import random
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class _Item:
    """One piece of process-wide state: ``get(module)`` reads it, ``put(module, value)`` sets it back."""

    name: str
    get: Callable[[Any], Any]
    put: Callable[[Any, Any], None]
    same: Callable[[Any, Any], bool] = lambda a, b: a == b
    module: str | None = None  # a library's state: read only once it is imported (and right after)
    idle: bool = False  # put back only once no job runs
    gate: bool = False  # (idle) a job that ends with it changed holds back the next jobs
    thread: bool = False  # partly per thread: put back at a job's start too, in its thread


def _loaded(name: str):
    """The module ``name`` if it is imported whole (not still running its own import), else None."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


# -- logging -------------------------------------------------------------------------------------

def _loggers() -> dict[str, logging.Logger]:
    return {"": logging.root, **{n: lg for n, lg in list(logging.Logger.manager.loggerDict.items())
                                  if isinstance(lg, logging.Logger)}}


def _logging_state(_):
    return (logging.Logger.manager.disable, logging.getLogRecordFactory(), logging.getLoggerClass(),
            {n: (lg, lg.level, tuple(lg.handlers), lg.propagate, lg.disabled, tuple(lg.filters))
             for n, lg in _loggers().items()})


def _same_logging(now, base) -> bool:  # the loggers of the baseline; a library's new ones are its own
    return now[:3] == base[:3] and all(now[3].get(n) == v for n, v in base[3].items())


def _put_logging(_, base) -> None:
    disable, factory, cls, loggers = base
    if logging.Logger.manager.disable != disable:
        logging.disable(disable)
    logging.setLogRecordFactory(factory)
    logging.setLoggerClass(cls)
    for lg, level, handlers, propagate, disabled, filters in loggers.values():
        if lg.level != level:
            lg.setLevel(level)  # clears the loggers' cached levels too
        if tuple(lg.handlers) != handlers:
            lg.handlers = list(handlers)
        if tuple(lg.filters) != filters:
            lg.filters = list(filters)
        lg.propagate, lg.disabled = propagate, disabled


def _quiet_propagation() -> list[logging.Logger]:
    """Loggers with handlers of their own that propagate to no handler (Snakemake's): made not to
    propagate, which changes nothing now and keeps a handler added above them from repeating them."""
    quieted = []
    for lg in _loggers().values():
        if lg is logging.root or not (lg.handlers and lg.propagate):
            continue
        up = lg.parent
        while up is not None and not up.handlers:
            up = up.parent
        if up is None:
            lg.propagate = False
            quieted.append(lg)
    return quieted


# -- environment, working directory, sys.path ----------------------------------------------------

def _put_environ(_, base: dict[str, str]) -> None:
    for k in [k for k in os.environ if k not in base]:
        del os.environ[k]
    for k, v in base.items():
        if os.environ.get(k) != v:
            os.environ[k] = v


def _put_path(_, base: list[str]) -> None:
    sys.path[:] = base


# -- signals -------------------------------------------------------------------------------------

class _Sigaction(ctypes.Structure):
    """glibc's ``struct sigaction`` on Linux (x86-64, AArch64 and the other generic layouts)."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ubyte * 128), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


try:  # C-level handlers: a job's thread cannot call signal.signal, but it can call sigaction
    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
    if _libc is not None:
        _libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
except (OSError, AttributeError):  # Python's handlers only
    _libc = None


def _sigaction(sig: int) -> tuple | None:
    """What handles ``sig`` at C level: (handler, mask, flags) and the struct itself, or None.

    Only the kernel's 64 mask bits are compared: glibc copies the rest of its 128-byte mask from
    uninitialised memory."""
    sa = _Sigaction()
    if _libc.sigaction(sig, None, ctypes.byref(sa)) != 0:
        return None
    return (sa.handler, bytes(sa.mask[:8]), sa.flags), bytes(sa)


def _signals_state(_):
    sigs = sorted(signal.valid_signals())
    python = {s: signal.getsignal(s) for s in sigs}
    native = {s: _sigaction(s) for s in sigs} if _libc is not None else {}
    return python, native


def _same_signals(now, base) -> bool:
    return now[0] == base[0] and all((n and n[0]) == (b and b[0]) for n, b in zip(now[1].values(), base[1].values()))


def _put_signals(_, base) -> None:
    python, native = base
    if threading.current_thread() is threading.main_thread():
        for s, handler in python.items():
            if handler is not None and signal.getsignal(s) != handler:
                signal.signal(s, handler)
    for s, was in native.items():
        # Where Python's own handler changed, the host (Snakemake's main thread) changed it: not
        # overridden under it.
        now = _sigaction(s)
        if was is not None and now is not None and signal.getsignal(s) == python[s] and now[0] != was[0]:
            _libc.sigaction(s, ctypes.byref(_Sigaction.from_buffer_copy(was[1])), None)


def _sigmask() -> set | None:
    return signal.pthread_sigmask(signal.SIG_BLOCK, ()) if hasattr(signal, "pthread_sigmask") else None


# -- thread counts -------------------------------------------------------------------------------

_blas: list | None = None  # threadpoolctl's controllers of the BLAS libraries loaded at the first baseline


def _blas_state(_):
    return tuple((lib, lib.get_num_threads()) for lib in _blas)


def _put_blas(_, base) -> None:
    for lib, n in base:
        if lib.get_num_threads() != n:
            lib.set_num_threads(n)


# -- random states -------------------------------------------------------------------------------

def _same_pickled(a, b) -> bool:  # NumPy's state holds an array: == would compare element-wise
    return pickle.dumps(a) == pickle.dumps(b)


def _warnings_state(_):
    return tuple(warnings.filters), warnings.showwarning, warnings.defaultaction


def _put_warnings(_, base) -> None:
    filters, warnings.showwarning, warnings.defaultaction = base
    warnings.filters[:] = filters  # in place: the list the C implementation reads
    warnings._filters_mutated()  # as simplefilter does: the per-module "once" caches are stale


def _put_stdio(_, base) -> None:
    sys.stdout, sys.stderr = base


_ITEMS = (
    _Item("logging", _logging_state, _put_logging, _same_logging),
    _Item("environment variables", lambda _: dict(os.environ), _put_environ),
    _Item("working directory", lambda _: os.getcwd(), lambda _, d: os.chdir(d)),
    _Item("sys.path", lambda _: list(sys.path), _put_path),
    _Item("signal handlers", _signals_state, _put_signals, _same_signals),
    _Item("BLAS thread counts", _blas_state, _put_blas),
    _Item("torch thread count", lambda t: t.get_num_threads(), lambda t, n: t.set_num_threads(n),
          module="torch", thread=True),
    _Item("torch default dtype", lambda t: t.get_default_dtype(), lambda t, d: t.set_default_dtype(d), module="torch"),
    _Item("torch float32 matmul precision", lambda t: t.get_float32_matmul_precision(),
          lambda t, p: t.set_float32_matmul_precision(p), module="torch"),
    _Item("warnings", _warnings_state, _put_warnings, idle=True, gate=True),
    _Item("sys.stdout and sys.stderr", lambda _: (sys.stdout, sys.stderr), _put_stdio, idle=True, gate=True),
    _Item("random's state", lambda _: random.getstate(), lambda _, s: random.setstate(s), idle=True),
    _Item("NumPy's global random state", lambda r: r.get_state(), lambda r, s: r.set_state(s), _same_pickled,
          module="numpy.random", idle=True),
    _Item("torch's random state", lambda t: t.get_rng_state(), lambda t, s: t.set_rng_state(s),
          lambda a, b: bool((a == b).all()), module="torch", idle=True),
)


class Snapshot:
    """The process's state (every :data:`_ITEMS` entry whose library is imported) at one moment."""

    def __init__(self, watch: bool = False) -> None:
        """``watch``: a library not imported yet is read right after its import (the jobs' baseline)."""
        global _blas
        if _blas is None:  # the BLAS libraries jobs.py limits, listed once (~10 ms)
            from threadpoolctl import ThreadpoolController

            _blas = [lib for lib in ThreadpoolController().lib_controllers if lib.user_api == "blas"]
        self.values: dict[_Item, Any] = {}
        for item in _ITEMS:
            self.read(item, watch=watch)

    def read(self, item: _Item, module=None, watch: bool = False) -> None:
        """Record ``item`` now (``module``: its library, passed while that is still being imported)."""
        if item.module is not None:
            module = module or _loaded(item.module)
            if module is None:
                if watch:
                    _watcher().watch(item.module)
                return
        self.values[item] = item.get(module)

    def changed(self, which: Callable[[_Item], bool] = lambda item: True) -> list[str]:
        """What differs from this snapshot now, by name."""
        return [item.name for item, base in self.values.items() if which(item) and not self._same(item, base)]

    @staticmethod
    def _same(item: _Item, base) -> bool:
        module = _loaded(item.module) if item.module else None
        return (item.module is not None and module is None) or item.same(item.get(module), base)

    def put_back(self, which: Callable[[_Item], bool]) -> None:
        """Set every ``which`` item that differs from this snapshot back to it."""
        for item, base in self.values.items():
            if not which(item) or self._same(item, base):
                continue
            try:
                item.put(_loaded(item.module) if item.module else None, base)
            except Exception as e:  # never hide the job's own result; say it where Snakemake's output goes
                sys.__stderr__.write(f"encmap: could not put back {item.name} after an in-process job: {e!r}\n")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls :func:`_imported` right after a watched module's own import, before the code that
    imported it goes on (which may change the library's state at once)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._finding = threading.local()

    def watch(self, name: str) -> None:
        self.names.add(name)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or getattr(self._finding, "on", False):
            return None
        self._finding.on = True
        try:
            spec = importlib.util.find_spec(fullname)  # the other finders' answer
        finally:
            self._finding.on = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenRead(spec.loader, fullname)
        return spec


class _ThenRead(importlib.abc.Loader):
    def __init__(self, loader, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader  # the module sees its own loader
        self.loader.exec_module(module)
        _imported(self.name, module)


_cond = threading.Condition()
_running = 0  # in-process jobs running now
_hold = False  # a job ended with the warnings or streams changed: jobs wait for the running ones to end
_baseline: Snapshot | None = None
_quieted: list[logging.Logger] = []
_after_import: _AfterImport | None = None


def _watcher() -> _AfterImport:
    global _after_import
    if _after_import is None:
        _after_import = _AfterImport()
    return _after_import


def _imported(name: str, module) -> None:
    """A watched library's state right after its import: the baseline of the jobs running now."""
    _watcher().names.discard(name)
    with _cond:
        if _baseline is not None and _running:
            for item in _ITEMS:
                if item.module == name:
                    _baseline.read(item, module)


def _enter(sys_path: Iterable[str]) -> None:
    global _running, _baseline, _quieted
    with _cond:
        while _hold:
            _cond.wait()
        if _running == 0:
            _quieted = _quiet_propagation()
            _baseline = Snapshot(watch=True)
        for p in sys_path:  # the host's own addition (the adapters import their helper): part of the baseline
            for lst in (sys.path, _baseline.values[_PATH]):
                if p not in lst:
                    lst.insert(0, p)
        _running += 1
        _baseline.put_back(lambda item: item.thread)


def _leave() -> None:
    global _running, _hold
    with _cond:
        _baseline.put_back(lambda item: not item.idle)
        _running -= 1
        if _running == 0:
            _baseline.put_back(lambda item: item.idle)
            for lg in _quieted:
                lg.propagate = True
            _hold = False
            _cond.notify_all()
        elif _baseline.changed(lambda item: item.gate):
            _hold = True


_PATH = next(item for item in _ITEMS if item.name == "sys.path")


def _signals_stay() -> None:
    """A job's thread cannot set a Python signal handler (Python raises ValueError there), and a
    library that tries at import would fail the job: the request is ignored instead, and said on the
    job's stderr (its log). Snakemake's main thread sets its handlers as before."""
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


def run_isolated(run: Callable[[], T], *, sys_path: Iterable[str] = ()) -> T:
    """``run()`` as a job sharing this process with Snakemake and other jobs: what it changes in the
    process's global state is put back (see the module's note). ``sys_path``: entries the job needs
    on ``sys.path``, added for the process's lifetime."""
    _signals_stay()
    _enter(list(sys_path))
    mask = _sigmask()
    try:
        return contextvars.copy_context().run(run)
    finally:
        if mask is not None and _sigmask() != mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _leave()
