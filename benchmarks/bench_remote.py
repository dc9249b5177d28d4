"""`dvc push` / `dvc pull` of a run's artifacts through an SSH remote: time and bytes.

Copies the named artifact folders of a finished run (e.g. the default run's ``results/pip``
before and after the PIP storage change, and ``results/embeddings``) into a fresh DVC project,
pushes them to an SFTP server on loopback (``tests/support/sshd.py``: dvc-ssh, a throwaway key), then
pulls them into an empty clone, and prints seconds and bytes of each.

    python benchmarks/bench_remote.py RUN_DIR results/pip results/embeddings
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.sshd import sftp_server  # noqa: E402


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished run's project directory")
    ap.add_argument("folders", nargs="+", help="artifact folders to push and pull, relative to RUN")
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="encmap-remote-"))
    env = dict(os.environ, HOME=str(work / "home"), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               GIT_AUTHOR_NAME="bench", GIT_COMMITTER_NAME="bench", GIT_AUTHOR_EMAIL="b@x", GIT_COMMITTER_EMAIL="b@x")

    def sh(cmd: str, cwd: Path) -> float:
        t = time.perf_counter()
        p = subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"`{cmd}` failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return time.perf_counter() - t

    rows = []
    try:
        with sftp_server(work / "home") as sshd:
            for folder in args.folders:
                name = folder.strip("/").replace("/", "-")
                proj, clone = work / f"{name}-proj", work / f"{name}-clone"
                proj.mkdir()
                sh("git init -q && dvc init -q", proj)
                shutil.copytree(args.run / folder, proj / "data")
                size = tree_bytes(proj / "data")
                files = sum(1 for f in (proj / "data").rglob("*") if f.is_file())
                key = f"dvc remote modify --local store keyfile {sshd['keyfile']}"
                sh(f"dvc add -q data && dvc remote add -d store {sshd['url_prefix']}{work}/remote-{name} && {key} "
                   "&& git add -A && git commit -qm data", proj)
                push = sh("dvc push -q", proj)
                sh(f"git clone -q {proj} {clone}", work)
                pull = sh(f"{key} && dvc pull -q", clone)
                assert tree_bytes(clone / "data") == size
                rows.append({"folder": folder, "files": files, "bytes": size, "push_s": push, "pull_s": pull})
                print(f"{folder}: {files} files, {size / 1e9:.2f} GB; push {push:.1f} s "
                      f"({size / 1e6 / push:.0f} MB/s), pull {pull:.1f} s ({size / 1e6 / pull:.0f} MB/s)", flush=True)
                shutil.rmtree(proj)
                shutil.rmtree(clone)
                shutil.rmtree(work / f"remote-{name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
