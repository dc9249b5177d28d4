"""Jobs: a `script:` job orphaned by a killed Snakemake stops instead of finishing behind a newer run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from encmap.jobs import snakemake_ancestors


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # an orphan's zombie waits for a reaper that may not come


def test_a_script_job_stops_when_its_snakemake_is_killed(tmp_path):
    """Snakemake runs a script job as snakemake -> bash -> python; SIGKILL to Snakemake does not
    reach the job. Old: it ran on with parent 1 and later renamed its outputs over a newer run's."""
    job = tmp_path / "job.py"
    job.write_text("import sys, time\n"
                   "from encmap.jobs import guard_script_job\n"
                   "guard_script_job(poll_seconds=0.1)\n"
                   "open(sys.argv[1], 'w').write('started')\n"
                   "time.sleep(60)\n")
    fake = tmp_path / "snakemake"  # stands for Snakemake: anything whose program is named snakemake
    fake.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                    "subprocess.Popen(['bash', '-c', sys.argv[1]])\ntime.sleep(60)\n")
    fake.chmod(0o755)
    marker = tmp_path / "started"
    parent = subprocess.Popen([str(fake), f"{sys.executable} {job} {marker} & echo $! > {tmp_path}/pid; wait"],
                              start_new_session=True)
    try:
        deadline = time.time() + 30
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the job never started"
        pid = int((tmp_path / "pid").read_text())
        assert [p for p, _ in snakemake_ancestors(pid)] == [parent.pid]
        os.kill(parent.pid, signal.SIGKILL)  # the job's bash and python live on, with parent 1
        parent.wait()
        deadline = time.time() + 10
        while _alive(pid) and time.time() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "the orphaned job kept running"
    finally:
        os.killpg(parent.pid, signal.SIGKILL) if _alive(parent.pid) else None
