"""Independent fits in worker processes: same results in the same order, one BLAS thread each."""

from __future__ import annotations

import os
import time
from functools import partial

import numpy as np

from encmap import parallel
from encmap.parallel import map_single_threaded


def blas_threads_and_sum(x: np.ndarray, scale: float) -> tuple[int, float]:
    from threadpoolctl import threadpool_info

    threads = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
    return max(threads), float(scale * (x @ x.T).sum())


def test_workers_keep_order_and_run_blas_on_one_thread(many_threads, monkeypatch):
    monkeypatch.setattr(parallel, "POOL_MIN_SECONDS", 0)  # every item to the workers
    xs = [np.full((40, 40), float(i)) for i in range(5)]  # 12.8 kB each
    fn = partial(blas_threads_and_sum, scale=0.5)
    serial = map_single_threaded(fn, xs, None)
    assert serial == map_single_threaded(fn, xs, 2) == map_single_threaded(fn, iter(xs), 3)
    assert [s for _, s in serial] == [0.5 * 40 ** 3 * i * i for i in range(5)]
    assert {t for t, _ in serial} == {1}
    # Large arrays travel as memory maps (joblib); the result is the same.
    big = [np.arange(300_000, dtype=np.float64).reshape(600, 500) / 1e5]
    assert map_single_threaded(fn, big, 2) == map_single_threaded(fn, big, 1)


def pid_after_cpu(seconds: float, i: int) -> tuple[int, int]:
    """(i, the process that ran it) after ``seconds`` of this thread's CPU."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass
    return i, os.getpid()


def test_workers_start_only_for_work_that_pays_for_them(monkeypatch):
    """Small work runs here (no interpreter started for it); once the items done predict
    POOL_MIN_SECONDS of CPU for the rest, the rest goes to the workers; results in order."""
    monkeypatch.setattr(parallel, "POOL_MIN_SECONDS", 0.2)
    monkeypatch.setattr(parallel, "BUSY_SHARE", 0.0)  # whatever else runs beside this test (below)
    small = map_single_threaded(partial(pid_after_cpu, 0.001), list(range(6)), 2)
    assert small == [(i, os.getpid()) for i in range(6)]  # 6 ms predicted: all here
    big = map_single_threaded(partial(pid_after_cpu, 0.05), list(range(8)), 2)
    assert [i for i, _ in big] == list(range(8))
    # The first item predicts 7 x 50 ms >= 0.2 s: it alone ran here, the other seven in workers.
    assert big[0][1] == os.getpid() and os.getpid() not in {p for _, p in big[1:]}
    # An iterator has no length to predict from: to the workers at once.
    assert os.getpid() not in {p for _, p in map_single_threaded(partial(pid_after_cpu, 0.0), iter(range(3)), 2)}


def test_no_workers_where_other_processes_hold_the_cores(monkeypatch):
    """With two busy processes per core, the items here get under half a core (n / (2n + 1) of
    one), well under BUSY_SHARE: work that would pay for workers on idle cores runs here to the
    end. Old: the workers started anyway, each importing scikit-learn again (~2 s of CPU) only to
    share the same cores."""
    import subprocess
    import sys

    monkeypatch.setattr(parallel, "POOL_MIN_SECONDS", 0.2)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    spin = [subprocess.Popen([sys.executable, "-c", "print('up', flush=True)\nwhile True: pass"],
                             stdout=subprocess.PIPE, text=True) for _ in range(2 * cores)]
    try:
        assert all(p.stdout.readline() == "up\n" for p in spin)  # every one spinning before the first item
        busy = map_single_threaded(partial(pid_after_cpu, 0.05), list(range(8)), 2)
    finally:
        for p in spin:
            p.kill()
            p.wait()
    assert busy == [(i, os.getpid()) for i in range(8)]
