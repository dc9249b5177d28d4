"""A throw-away single-node SLURM cluster (Debian slurm-wlm + munge, run as root) for tests.

Everything it writes (config, state, spool, logs, pid files) lives in one directory. slurmd runs
"configless" (it fetches the config from slurmctld and links it at /run/slurm/conf), so commands
inside jobs find the cluster too: Snakemake's jobstep plugin strips SLURM_CONF before its srun.
A fake GPU (``File=/dev/null``) lets ``--gpus=1`` jobs schedule.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
RUN_CONF = Path("/run/slurm/conf")  # where a configless slurmd links the config it fetched
# /run/slurm/conf and munged's socket are one per machine: two test runs at once (a CI clone
# beside a worktree's run) each took the other's link for a killed run's. One cluster at a time.
MACHINE_LOCK = Path("/run/encmap-test-slurm.lock")
_held = [0, None]  # how deep this process holds the lock, and its open file


@contextlib.contextmanager
def machine_lock(timeout: float = 3600):
    """Hold the machine's one-cluster lock (re-entrant within a process; waits for another run's)."""
    if _held[0] == 0:
        f = open(MACHINE_LOCK, "a")
        deadline = time.time() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    f.close()
                    raise TimeoutError(f"another test run has held {MACHINE_LOCK} for {timeout:.0f} s")
                time.sleep(1)
        _held[1] = f
    _held[0] += 1
    try:
        yield
    finally:
        _held[0] -= 1
        if _held[0] == 0:
            _held[1].close()  # closing the file releases the lock
            _held[1] = None


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue"):
        if not Path(_sbin(tool)).exists():
            return f"{tool} not installed (apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "slurmd must run as root"
    return None


def running(program: str) -> list[int]:
    """Pids of live processes whose program is ``program`` (zombies left out)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()[0]
            if name == program and state != "Z":
                out.append(int(d.name))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(tool: str) -> str:
    return shutil.which(tool) or f"/usr/sbin/{tool}"


class Cluster:
    """Start with :meth:`start`, stop with :meth:`stop`; ``env`` has ``SLURM_CONF`` set."""

    def __init__(self, root: Path, mem_mb: int = 8000):
        self.root, self.mem_mb = root, mem_mb
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._started_munge = False
        self._lock: contextlib.ExitStack | None = None
        self.host, self.port = socket.gethostname().split(".")[0], _free_port()

    def _write_conf(self) -> None:
        host, r = self.host, self.root
        for d in ("state", "spool", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        cpus = os.cpu_count() or 1
        self.conf.write_text(f"""ClusterName=encmaptest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldPort={self.port}
SlurmctldParameters=enable_configless
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MinJobAge=600
ReturnToService=2
GresTypes=gpu
NodeName={host} CPUs={cpus} RealMemory={self.mem_mb} Gres=gpu:1 State=UNKNOWN
PartitionName=main Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        (r / "gres.conf").write_text(f"AutoDetect=off\nNodeName={host} Name=gpu File=/dev/null\n")

    def start(self, timeout: float = 60) -> "Cluster":
        """Start munged (unless one runs), slurmctld and slurmd; whatever fails, what this call
        started is stopped again before the error is raised. Holds :func:`machine_lock` until
        :meth:`stop`."""
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(machine_lock())
        if RUN_CONF.is_symlink() or RUN_CONF.exists():
            if running("slurmd"):
                self.stop()  # releases the lock; starts nothing
                raise RuntimeError(f"{RUN_CONF} exists and a slurmd runs (pids {running('slurmd')}): another "
                                   "configless cluster runs here")
            # A run killed while its cluster was up left the link behind, and nothing serves it.
            if RUN_CONF.is_symlink() or RUN_CONF.is_file():
                RUN_CONF.unlink()
            else:
                shutil.rmtree(RUN_CONF)
        try:
            self._write_conf()
            if not MUNGE_SOCKET.exists():
                MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
                shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
                subprocess.run([_sbin("munged"), "--force"], check=True, capture_output=True)
                self._started_munge = True
            subprocess.run([_sbin("slurmctld"), "-f", str(self.conf)], check=True, capture_output=True)
            subprocess.run([_sbin("slurmd"), "--conf-server", f"{self.host}:{self.port}"], check=True,
                           capture_output=True, env={k: v for k, v in self.env.items() if k != "SLURM_CONF"})
            deadline = time.time() + timeout
            while time.time() < deadline:
                p = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True, text=True)
                if p.returncode == 0 and p.stdout.strip() == "idle":
                    return self
                time.sleep(1)
            raise RuntimeError(f"SLURM node not idle after {timeout}s; logs in {self.root / 'log'}")
        except BaseException:
            self.stop()
            raise

    def jobs(self) -> list[dict[str, str]]:
        """Every job the controller still remembers (finished ones for MinJobAge seconds)."""
        p = subprocess.run(["scontrol", "show", "job", "-o"], env=self.env, capture_output=True, text=True)
        out = []
        for line in p.stdout.splitlines():
            if line.strip() and not line.startswith("No jobs"):
                out.append(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))
        return out

    def stop(self) -> None:
        pids = [self.root / "slurmd.pid", self.root / "slurmctld.pid"]
        if self._started_munge:
            pids.append(MUNGE_SOCKET.parent / "munged.pid")
        for pid in pids:
            if pid.exists():
                try:
                    os.kill(int(pid.read_text().strip()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass
        deadline = time.time() + 10  # each daemon gone, so that the next start finds none
        while time.time() < deadline and any(
                running(p) for p in ("slurmd", "slurmctld", *(("munged",) if self._started_munge else ()))):
            time.sleep(0.2)
        if RUN_CONF.is_symlink() and str(self.root) in os.readlink(RUN_CONF):
            RUN_CONF.unlink()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
