"""A pytest plugin: each test's CPU time, its own process's and that of the processes it waited
for (Snakemake, DVC, each job), beside its wall time. On a machine whose cores are all busy (the
suite's xdist workers outnumber them) wall time says how long a test waited for a core; CPU time
says what it cost.

    PYTHONPATH=benchmarks/tools ENCMAP_TEST_CPU=/tmp/cpu .venv/bin/python -m pytest -p pytest_cpu -q -n auto --dist loadfile --no-loadscope-reorder
    python benchmarks/tools/pytest_cpu.py /tmp/cpu        # the 15 costliest tests

Each worker writes ``<dir>/<worker>.json``: ``[nodeid, own CPU s, children's CPU s, wall s]`` per
test (setup, call and teardown). A process left running past its test (a server a module fixture
stops) counts where it is waited for; one never waited for is not counted.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

_rows: list[list] = []


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own0, kids0), t0 = _cpu(), time.monotonic()
    yield
    (own1, kids1), t1 = _cpu(), time.monotonic()
    _rows.append([item.nodeid, round(own1 - own0, 2), round(kids1 - kids0, 2), round(t1 - t0, 2)])


def pytest_sessionfinish(session):
    out = os.environ.get("ENCMAP_TEST_CPU")
    if out and _rows:
        Path(out).mkdir(parents=True, exist_ok=True)
        # The worker's id from xdist itself: PYTEST_XDIST_WORKER is inherited by a pytest that a test starts.
        name = getattr(session.config, "workerinput", {}).get("workerid", "main")
        (Path(out) / f"{name}.json").write_text(json.dumps(_rows))


def report(folder: str, top: int = 15) -> str:
    """The ``top`` costliest tests (CPU, its own + children's, and wall s) and the total."""
    rows = [r for f in sorted(Path(folder).glob("*.json")) for r in json.loads(f.read_text())]
    rows.sort(key=lambda r: -(r[1] + r[2]))
    lines = [f"{len(rows)} tests, {sum(r[1] + r[2] for r in rows):.0f} s of CPU", "   CPU s   wall s  test"]
    lines += [f"{r[1] + r[2]:8.1f} {r[3]:8.1f}  {r[0]}" for r in rows[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1]))
