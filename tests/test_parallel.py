"""Independent fits in worker processes: same results in the same order, one BLAS thread each."""

from __future__ import annotations

from functools import partial

import numpy as np

from encmap.parallel import map_single_threaded


def blas_threads_and_sum(x: np.ndarray, scale: float) -> tuple[int, float]:
    from threadpoolctl import threadpool_info

    threads = {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
    return max(threads), float(scale * (x @ x.T).sum())


def test_workers_keep_order_and_run_blas_on_one_thread(many_threads):
    xs = [np.full((40, 40), float(i)) for i in range(5)]  # 12.8 kB each
    fn = partial(blas_threads_and_sum, scale=0.5)
    serial = map_single_threaded(fn, xs, None)
    assert serial == map_single_threaded(fn, xs, 2) == map_single_threaded(fn, iter(xs), 3)
    assert [s for _, s in serial] == [0.5 * 40 ** 3 * i * i for i in range(5)]
    assert {t for t, _ in serial} == {1}
    # Large arrays travel as memory maps (joblib); the result is the same.
    big = [np.arange(300_000, dtype=np.float64).reshape(600, 500) / 1e5]
    assert map_single_threaded(fn, big, 2) == map_single_threaded(fn, big, 1)
