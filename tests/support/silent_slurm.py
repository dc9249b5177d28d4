"""A stand-in SLURM whose jobs write nothing: ``sbatch`` accepts every job and runs none, and
``squeue``/``sacct`` report each one COMPLETED. What the submit host sees of a job that ran on a
node-local disk, or whose script exited 0 early. The real single-node cluster (tests/test_slurm.py)
cannot produce it: its jobs run."""

from __future__ import annotations

from pathlib import Path

import yaml

SBATCH = """#!/bin/sh
cat > /dev/null
n=$(( $(cat "$0.ids" 2>/dev/null | wc -l) + 1000 ))
echo "$n" >> "$0.ids"
echo "$n"
"""
STATUS = """#!/bin/sh
for id in $(cat "$(dirname "$0")/sbatch.ids" 2>/dev/null); do echo "$id|COMPLETED"; done
"""
#: sacct answers the plugin's account lookup (``-o Account``) too.
SACCT = """#!/bin/sh
case "$*" in *Account*) echo acct; exit 0;; esac
""" + STATUS.split("\n", 1)[1]
TOOLS = {"sbatch": SBATCH, "squeue": STATUS, "sacct": SACCT, "scontrol": "#!/bin/sh\necho 'MaxArraySize = 1001'\n",
         "sinfo": "#!/bin/sh\nexit 0\n", "sacctmgr": "#!/bin/sh\necho acct\n", "sshare": "#!/bin/sh\necho acct\n"}


#: A stage-out step: the files already there copied back in place, new inodes, the same bytes and times.
STAGE_OUT = """for f in $(find {folder} -type f); do cp -p "$f" "$f.x" && mv "$f.x" "$f"; done
"""


def silent_slurm(bin_dir: Path, proj: Path, stage_out: str | None = None) -> str:
    """The stand-in's tools in ``bin_dir`` (to put first on PATH) and a profile for them in
    ``proj``: its path, relative to ``proj``. ``stage_out``: a folder of ``proj`` each job "stages
    out" (:data:`STAGE_OUT`) though it wrote nothing."""
    bin_dir.mkdir(parents=True)
    tools = dict(TOOLS)
    if stage_out:
        tools["sbatch"] = SBATCH.replace("cat > /dev/null\n", "cat > /dev/null\n" + STAGE_OUT.format(
            folder=proj / stage_out))
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    prof = proj / "profiles/silent"
    prof.mkdir(parents=True)
    (prof / "config.yaml").write_text(yaml.safe_dump({
        "executor": "slurm", "jobs": 4, "latency-wait": 1, "slurm-status-command": "squeue",
        "slurm-init-seconds-before-status-checks": 1,
        "default-resources": {"slurm_partition": "main", "runtime": 10, "mem_mb": 100}}))
    return "profiles/silent"
