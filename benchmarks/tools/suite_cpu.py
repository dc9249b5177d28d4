"""Where a command's CPU goes, by kind of Python process: the suite, a pipeline, a DVC run.

Every Python process the command starts (pytest's workers, dvc, encmap, Snakemake, each script
job, Snakemake on a SLURM node) records its own CPU time when it exits, through a
``sitecustomize`` put first on ``PYTHONPATH``; the processes are then grouped by kind (``dvc
status``, ``snakemake_call``, ``job:regress``, ...). Processes that end without running their exit
handlers (joblib's worker processes, a killed job) and non-Python ones (git, SLURM's daemons,
Chromium) are not counted: the total says how much of the command's CPU that leaves out.
The recording ``sitecustomize`` takes the place of any other on the path (a venv's own) for the run.

    python benchmarks/tools/suite_cpu.py -- .venv/bin/python -m pytest -q -n auto --dist loadfile --no-loadscope-reorder
    python benchmarks/tools/suite_cpu.py --log /tmp/procs.jsonl --report-only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

SITECUSTOMIZE = '''
import atexit, json, os, resource, sys, time
_log = os.environ.get("ENCMAP_PROC_LOG")
if _log:
    _t0 = time.time()

    def _record():
        r = resource.getrusage(resource.RUSAGE_SELF)
        try:
            with open(_log, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[:3], "wall": time.time() - _t0,
                                    "cpu": r.ru_utime + r.ru_stime, "torch": "torch" in sys.modules,
                                    "sklearn": "sklearn" in sys.modules}) + "\\n")
        except OSError:
            pass

    atexit.register(_record)
'''


def kind(argv: list[str]) -> str:
    """A process's kind from its command line."""
    first = argv[0] if argv else ""
    name = first.rsplit("/", 1)[-1]
    if name in ("dvc", "encmap"):
        return f"{name} {argv[1] if len(argv) > 1 else ''}".strip()
    if name == "snakemake":
        return "snakemake (command line)"
    if "snakemake_call" in " ".join(argv):
        return "snakemake_call (a DVC stage's or encmap repro's Snakemake)"
    if first.endswith("pytest/__main__.py"):
        return "pytest (its main process)"
    if first.endswith("snakemake/__main__.py"):
        return "snakemake (a SLURM job on its node)"
    job = re.search(r"tmp[^.]*\.(\w+)\.py$", first)
    if job:
        return f"job:{job.group(1)}"
    if first == "-c":
        return "python -c (pytest-xdist workers: in-process tests)"
    return name or "?"


def report(log: Path, total_cpu: float | None) -> None:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[kind(r["argv"])].append(r)
    logged = sum(r["cpu"] for r in rows)
    print(f"{len(rows)} Python processes, {logged:.0f} s of CPU"
          + (f" of the command's {total_cpu:.0f} s" if total_cpu else ""))
    print(f"{'CPU s':>8} {'procs':>6} {'s each':>7} {'sklearn':>8} {'torch':>6}  kind")
    for k, rs in sorted(groups.items(), key=lambda kv: -sum(r["cpu"] for r in kv[1])):
        cpu = sum(r["cpu"] for r in rs)
        print(f"{cpu:8.0f} {len(rs):6d} {cpu / len(rs):7.2f} {sum(r.get('sklearn', False) for r in rs):8d} "
              f"{sum(r['torch'] for r in rs):6d}  {k}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, help="the JSON-lines record (default: a temporary file)")
    ap.add_argument("--report-only", action="store_true", help="group an existing --log, run nothing")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args()
    if args.report_only:
        report(args.log, None)
        return
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give a command after --")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = args.log or Path(d) / "procs.jsonl"
        log.unlink(missing_ok=True)
        env = dict(os.environ, ENCMAP_PROC_LOG=str(log),
                   PYTHONPATH=os.pathsep.join([d, *filter(None, [os.environ.get("PYTHONPATH")])]))
        rc = subprocess.run(cmd, env=env).returncode
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        report(log, r.ru_utime + r.ru_stime)
    sys.exit(rc)


if __name__ == "__main__":
    main()
