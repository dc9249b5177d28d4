"""Many small independent fits side by side: one process per core, one BLAS thread each.

The evaluation classifiers (logistic regressions on a few hundred rows) and the regression's
nested cross-validation (thousands of tiny ElasticNet / Ridge fits) are far too small for a
multi-threaded BLAS: with two BLAS threads on two cores a logistic regression of the default
tasks took 4-5x longer than with one (the threads spin-wait on every small product). Their
parallelism is across fits instead, in separate processes (joblib's loky backend), each pinned
to one BLAS thread. That also makes every result independent of how many cores computed it:
the same params give the same bytes on a laptop and on a 64-core node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from typing import Any, TypeVar

T = TypeVar("T")


def _single_threaded(fn: Callable[[Any], T], item: Any) -> T:
    from sklearn import config_context
    from threadpoolctl import threadpool_limits

    # Thousands of fits on a few dozen rows spend more time in scikit-learn's checks of their
    # inputs and hyper-parameters than in the fits (~14% of the regression step of the tiny test
    # config, the same bytes): the inputs were checked once (encmap.validation, the schema) and
    # are finite where a fit sees them (missing values are imputed first), so the checks are off.
    with threadpool_limits(1), config_context(assume_finite=True, skip_parameter_validation=True):
        return fn(item)


def map_single_threaded(fn: Callable[[Any], T], items: Iterable[Any], n_jobs: int | None) -> list[T]:
    """``[fn(x) for x in items]`` in ``n_jobs`` worker processes, BLAS on one thread in each.

    Parameters
    ----------
    fn : callable
        A picklable function of one item (module-level, or a ``functools.partial`` of one).
        Large NumPy arguments travel to the workers as memory maps (joblib).
    items : iterable
        Consumed lazily, a few items ahead of the workers.
    n_jobs : int or None
        Worker processes; ``None`` or ``1`` runs every call here, in order, also on one BLAS
        thread (the result is the same either way).

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
        return [_single_threaded(fn, x) for x in items]
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, backend="loky")(delayed(_single_threaded)(fn, x) for x in items)
