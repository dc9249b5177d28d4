"""Fixtures (tiny checkpoints, a user sentence file), the order tests run in, and the markers.

Markers (``pyproject.toml``) say what a test needs, so each kind can be selected or left out
with ``-m``: ``slow`` (real Snakemake/DVC runs or real models), ``browser`` (headless Chromium),
``slurm`` (a single-node SLURM cluster), ``gpu`` (a CUDA device: skipped without one) and
``network`` (the Hugging Face hub: skipped when it cannot be reached). Helpers that are not
fixtures live in ``tests/support/``.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path

import pytest
from support.models import build_tiny_bert, build_tiny_st
from support.project import write_user_file

# The suite runs as many workers as cores, and each test's Snakemake takes all the cores for its
# own jobs, so the cores are oversubscribed: torch's OpenMP threads, spin-waiting for their next
# task by default, then burn time another test's process needs. Set here, before any torch import
# and before xdist starts its workers, it reaches every process of the suite (support.project.env
# copies os.environ). Results do not depend on it. Measured: the tiny pipeline beside two busy
# processes on this machine's two cores, 78.6 / 70.3 s of CPU spinning, 64.8 / 62.8 s passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(config, items):
    """Test files in the order of their longest test (``@pytest.mark.slow(minutes=N)``, N measured
    on the 2-core CI machine), each file's tests kept together and in their own order.

    The test command hands whole files to pytest-xdist's workers (``--dist loadfile``), so a
    module-scoped fixture (a built pipeline) is built once; starting the files with the longest
    tests first keeps one worker from ending with one of them running alone. Every worker must
    sort alike: the key is the collection's own data.
    """
    def minutes(item) -> float:
        mark = item.get_closest_marker("slow")
        return mark.kwargs.get("minutes", 0) if mark else 0

    longest: dict[str, float] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0), minutes(item))
    items.sort(key=lambda item: -longest[item.path])


@pytest.hookimpl(optionalhook=True)  # a machine without pytest-xdist (the GPU box's Python) has no such hook
def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker more than there are cores. A test spends part of its time waiting
    (on a SLURM poll, a server's start, a subprocess's I/O), and with one worker per core each
    wait left a core idle: sampled every 10 s through a CI run, the two cores were busy 183% of
    200% on average."""
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


@pytest.hookimpl(optionalhook=True)  # a machine without pytest-xdist (the GPU box's Python) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` that keeps the longest files on different workers (longest first).

    xdist's worker starts a test only once it knows the next one (for fixture teardown), so its
    scheduler tops a worker up whenever two or fewer of its tests are pending: a worker given a
    one-test file (``test_dvc``) was given the next longest file with it, and ran the two one
    after the other while the other worker ran out of work. Here a worker is topped up when one
    test is pending: with the *shortest* file when that test is a one-test file not yet started
    (it may be long), else with the longest file left.
    """
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirstScheduling(LoadFileScheduling):
        def _assign_work_unit(self, node, last: bool = False) -> None:
            scope, unit = self.workqueue.popitem(last=last)
            self.assigned_work.setdefault(node, {})[scope] = unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(t) for t, done in unit.items() if not done])

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            work = self.assigned_work.get(node, {})
            pending = [(scope, t) for scope, unit in work.items() for t, done in unit.items() if not done]
            if len(pending) > 1:
                return
            lone = len(pending) == 1 and len(work[pending[0][0]]) == 1
            self._assign_work_unit(node, last=lone)

    return LongestFirstScheduling(config, log)


@lru_cache(maxsize=1)
def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@lru_cache(maxsize=1)
def _hub_reachable() -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return True
    except OSError:
        return False


def pytest_runtest_setup(item):
    """Skip what this machine cannot run: a GPU test without CUDA, a network test offline."""
    if item.get_closest_marker("gpu") and not _cuda():
        pytest.skip("needs a CUDA device (run on a GPU machine)")
    if item.get_closest_marker("network") and not _hub_reachable():
        pytest.skip("needs the Hugging Face hub (huggingface.co:443 unreachable)")


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_st(tmp_path_factory, tiny_bert) -> Path:
    return build_tiny_st(tmp_path_factory.mktemp("models") / "tiny-st", tiny_bert)


@pytest.fixture(scope="session")
def user_file(tmp_path_factory) -> Path:
    return write_user_file(tmp_path_factory.mktemp("user") / "mine.txt")


@pytest.fixture(scope="session")
def snakemade(tmp_path_factory) -> Path:
    """Ten control models (``light_params``) through plain ``snakemake --cores 2`` (the README's
    command 1, which records itself in dvc.lock: a DVC project), committed; built once for the session (test_record reads copies of it;
    test_dvc_route's project and test_failures' killed ``dvc repro`` start from copies recorded by
    ``encmap record``)."""
    from support.project import built_once, light_params, make_project, run

    def build(root: Path) -> None:
        make_project(root, light_params(), git=True)
        run("snakemake --cores 2", root)
        run("git add -A && git commit -qm 'snakemake run'", root)

    return built_once(tmp_path_factory, "snakemade", build)


@pytest.fixture
def many_threads(monkeypatch):
    """Two threads per pool by default, here and in subprocesses: what a job's ``threads`` must
    bring down to its share, on any machine (a one-core machine's default is already one, and
    ``OMP_NUM_THREADS=1`` in the environment would make the limit tests pass whatever the code)."""
    from threadpoolctl import threadpool_limits

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(var, "2")
    with threadpool_limits(limits=2):
        yield 2
