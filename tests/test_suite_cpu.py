"""benchmarks/tools/suite_cpu.py counts every Python process a command starts, grouped by kind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_python_process_is_counted_with_its_cpu(tmp_path):
    # A parent that burns ~0.3 s of CPU and starts two children (`python -c`) that burn ~0.2 s each.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    parent = tmp_path / "parent.py"
    parent.write_text(burn.format(s=0.3) + "import subprocess, sys\n"
                      + f"for _ in range(2): subprocess.run([sys.executable, '-c', {burn.format(s=0.2)!r}], check=True)\n")
    log = tmp_path / "procs.jsonl"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks/tools/suite_cpu.py"), "--log", str(log), "--",
                        sys.executable, str(parent)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {m.group(3): (float(m.group(1)), int(m.group(2)))
            for m in re.finditer(r"^\s*(\d+)\s+(\d+)\s+[\d.]+\s+\d+\s+\d+\s+(.+)$", r.stdout, re.M)}
    assert rows["parent.py"][1] == 1 and rows["python -c (pytest-xdist workers: in-process tests)"][1] == 2, r.stdout
    assert len(log.read_text().splitlines()) == 3
    total = re.search(r"3 Python processes, (\d+) s of CPU of the command's (\d+) s", r.stdout)
    assert total and 0 < int(total.group(1)) <= int(total.group(2)) + 1, r.stdout
