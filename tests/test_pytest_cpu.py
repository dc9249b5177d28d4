"""benchmarks/tools/pytest_cpu.py counts each test's CPU, its children's included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_test_gets_its_own_and_its_childrens_cpu(tmp_path):
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys, time\n"
        f"def test_a():\n    exec({burn.format(s=0.3)!r})\n"
        f"def test_b():\n    subprocess.run([sys.executable, '-c', {burn.format(s=0.4)!r}], check=True)\n"
        "def test_c():\n    time.sleep(0.3)\n")
    out = tmp_path / "cpu"
    env = dict(os.environ, PYTHONPATH=str(REPO / "benchmarks/tools"), ENCMAP_TEST_CPU=str(out))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "pytest_cpu", "-p", "no:cacheprovider",
                        "-p", "no:xdist", str(tmp_path / "test_burn.py")], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    rows = {n.split("::")[1]: (own, kids, wall) for n, own, kids, wall in json.loads((out / "main.json").read_text())}
    assert 0.3 <= rows["test_a"][0] < 0.6 and rows["test_a"][1] < 0.05  # its own burn, no child
    assert rows["test_b"][0] < 0.2 and 0.4 <= rows["test_b"][1] < 0.9  # the child's burn (and its start)
    assert rows["test_c"][0] + rows["test_c"][1] < 0.1 and rows["test_c"][2] >= 0.3  # waited, spent nothing
    report = subprocess.run([sys.executable, str(REPO / "benchmarks/tools/pytest_cpu.py"), str(out)],
                            capture_output=True, text=True, check=True).stdout
    assert report.startswith("3 tests, ") and report.splitlines()[2].endswith("test_burn.py::test_b"), report
