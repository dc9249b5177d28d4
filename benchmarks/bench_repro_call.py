"""``encmap repro``'s own CPU per call, this checkout against an older one, side by side.

On a copy of a finished DVC project, each round runs, for both checkouts in alternating order,
``encmap repro`` after a map param changed (one stage, one Snakemake call) and ``encmap repro``
with nothing stale; the CPU of the whole process tree (Snakemake's call and its jobs included) is
read from the kernel's accounting of waited-for children. The older checkout's ``src`` goes first on
``PYTHONPATH`` (its child processes inherit it), so both run in the same environment.

    python benchmarks/bench_repro_call.py --project /tmp/p --base-src /tmp/base/src --rounds 4
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml


def cpu_of(cmd: list[str], cwd: Path, env: dict) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", required=True, help="a finished DVC project (copied, not changed)")
    ap.add_argument("--base-src", required=True, help="the older checkout's src/ directory")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    encmap = str(Path(sys.executable).with_name("encmap"))  # the venv's, wherever PATH points
    work = Path(tempfile.mkdtemp()) / "p"
    shutil.copytree(a.project, work, symlinks=True)
    envs = {"base": os.environ | {"PYTHONPATH": str(Path(a.base_src).resolve())},
            "this": {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in envs}
    seed = 100
    for r in range(a.rounds):
        for name in (("base", "this") if r % 2 == 0 else ("this", "base")):
            params = yaml.safe_load((work / "params.yaml").read_text())
            seed += 1
            params["map"]["seed"] = seed
            (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            one = cpu_of([encmap, "repro"], work, envs[name])
            none = cpu_of([encmap, "repro"], work, envs[name])
            rows[name].append((one, none))
            print(f"round {r} {name}: one stage {one:.2f} s, nothing stale {none:.2f} s of CPU", flush=True)
    for name, got in rows.items():
        ones, nones = sorted(x for x, _ in got), sorted(y for _, y in got)
        print(f"{name}: median one stage {ones[len(ones) // 2]:.2f} s, nothing stale {nones[len(nones) // 2]:.2f} s")


if __name__ == "__main__":
    main()
