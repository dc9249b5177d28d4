"""Many small independent fits side by side: one process per core, one BLAS thread each.

The evaluation classifiers (logistic regressions on a few hundred rows) and the regression's
nested cross-validation (thousands of tiny ElasticNet / Ridge fits) are far too small for a
multi-threaded BLAS: with two BLAS threads on two cores a logistic regression of the default
tasks took 4-5x longer than with one (the threads spin-wait on every small product). Their
parallelism is across fits instead, in separate processes (joblib's loky backend), each pinned
to one BLAS thread. That also makes every result independent of how many cores computed it:
the same params give the same bytes on a laptop and on a 64-core node.

Workers are started only for work that pays for them: each is a fresh interpreter that imports
NumPy, SciPy, scikit-learn and encmap again (~1.5 s of CPU and ~0.6 s of wall time for two
workers here), more than a small map's whole work (the tiny test config's evaluate and regress
jobs). So items run in this process, timed, until the work they predict for the rest reaches
:data:`POOL_MIN_SECONDS`; only the rest goes to the workers. Nor are they started where the
cores are busy already: if the items run here got less than :data:`BUSY_SHARE` of a core (their
CPU time over their wall time), other processes hold the cores, and workers would only take
their time from them and add their own start (the tiny test config's regression fits beside
two busy processes on two cores: 14.7 s of wall either way, 13.9 s of CPU with workers, 9.8 s
without). The results are the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sized
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

#: Predicted seconds of CPU for the items left (their mean so far x how many) from which they go
#: to worker processes rather than on here, one after another. 0: every item to the workers.
POOL_MIN_SECONDS = 2.0
#: Share of a core (CPU over wall time) the items run here must have had for workers to start:
#: below it other processes hold the cores. Alone, a single-threaded loop gets ~1.0; beside one
#: other busy process on each core, ~0.5.
BUSY_SHARE = 0.8


@contextmanager
def _one_thread():
    """BLAS on one thread, scikit-learn's checks of inputs and hyper-parameters off."""
    from sklearn import config_context
    from threadpoolctl import threadpool_limits

    # Thousands of fits on a few dozen rows spend more time in scikit-learn's checks of their
    # inputs and hyper-parameters than in the fits (~14% of the regression step of the tiny test
    # config, the same bytes): the inputs were checked once (encmap.validation, the schema) and
    # are finite where a fit sees them (missing values are imputed first), so the checks are off.
    # Entered once per run of items here, not per item: threadpoolctl looks up every loaded
    # library each time (~2 ms; 0.6 s of the tiny config's 294 regression units).
    with threadpool_limits(1), config_context(assume_finite=True, skip_parameter_validation=True):
        yield


def _single_threaded(fn: Callable[[Any], T], item: Any) -> T:
    """``fn(item)`` under :func:`_one_thread` (what a worker process runs)."""
    with _one_thread():
        return fn(item)


def map_single_threaded(fn: Callable[[Any], T], items: Iterable[Any], n_jobs: int | None) -> list[T]:
    """``[fn(x) for x in items]`` in ``n_jobs`` worker processes, BLAS on one thread in each.

    Parameters
    ----------
    fn : callable
        A picklable function of one item (module-level, or a ``functools.partial`` of one).
        Large NumPy arguments travel to the workers as memory maps (joblib).
    items : iterable
        Consumed lazily, a few items ahead of the workers. A sequence (a list) is first worked
        through here until the rest is predicted to take :data:`POOL_MIN_SECONDS` while the
        items here had at least :data:`BUSY_SHARE` of a core (else all of it here); an iterator
        without a length goes to the workers at once.
    n_jobs : int or None
        At most this many worker processes; ``None`` or ``1`` runs every call here, in order,
        also on one BLAS thread (the result is the same either way).

    Returns
    -------
    list
        ``fn(x)`` for every item, in the items' order. Results from workers are unpickled
        copies: equal values, but not the same sharing of objects as an in-process call, so a
        result that is saved should be plain numbers and arrays (a pickle of a fitted
        scikit-learn pipeline differs in bytes between the two paths).
    """
    if isinstance(items, Sized):  # no pool of workers for a single item
        n_jobs = min(n_jobs or 1, len(items))
    if not n_jobs or n_jobs <= 1:
        with _one_thread():
            return [fn(x) for x in items]
    done: list[T] = []
    if isinstance(items, Sized) and hasattr(items, "__getitem__"):
        spent = waited = 0.0  # this thread's CPU (the prediction holds on a loaded machine too), and wall time
        with _one_thread():
            for k in range(len(items)):
                if POOL_MIN_SECONDS <= 0 or (done and spent / len(done) * (len(items) - k) >= POOL_MIN_SECONDS
                                             and spent >= BUSY_SHARE * waited):
                    items, n_jobs = items[k:], min(n_jobs, len(items) - k)
                    break
                t, w = time.thread_time(), time.perf_counter()
                done.append(fn(items[k]))
                spent += time.thread_time() - t
                waited += time.perf_counter() - w
            else:
                return done
    from joblib import Parallel, delayed

    return done + Parallel(n_jobs=n_jobs, backend="loky")(delayed(_single_threaded)(fn, x) for x in items)
