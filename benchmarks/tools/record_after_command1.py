"""After command 1 in a fresh clone: the README's next line and DVC's sharing and experiments, timed.

In a clone where ``snakemake --cores all`` has run (any params): ``encmap record`` (what it
recorded, its time and peak memory), ``dvc status``, that no artifact changed, ``encmap repro``
(runs nothing), ``dvc exp run -S map.perplexity=5`` (the map alone; ``--perplexity`` for a small map), the way back, ``dvc push`` to
an SSH remote on loopback (the tests' SFTP server) and ``git clone`` + ``dvc pull`` (the same
bytes, nothing stale). Commits in the clone (the recorded dvc.lock, the remote).

    git clone <repo> /tmp/c && cd /tmp/c && snakemake --cores all && cd -
    python benchmarks/tools/record_after_command1.py /tmp/c
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from support.project import ran, tree_hashes  # noqa: E402
from support.sshd import sftp_server  # noqa: E402

ENV = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", DVC_NO_ANALYTICS="1",
           HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
for k in ("NAME", "EMAIL"):
    ENV.setdefault(f"GIT_AUTHOR_{k}", "encmap-bench" if k == "NAME" else "bench@encmap.invalid")
    ENV.setdefault(f"GIT_COMMITTER_{k}", ENV[f"GIT_AUTHOR_{k}"])


def sh(cmd: str, cwd: Path) -> str:
    t = time.perf_counter()
    p = subprocess.run(cmd, shell=True, cwd=cwd, env=ENV, capture_output=True, text=True)
    print(f"$ {cmd}  ({time.perf_counter() - t:.1f} s, rc {p.returncode})", flush=True)
    if p.returncode:
        raise SystemExit((p.stdout + p.stderr)[-4000:])
    return p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("project", help="a clone in which snakemake --cores all has run")
    ap.add_argument("--perplexity", type=float, default=5, help="the experiment's map.perplexity (the README's 5)")
    args = ap.parse_args()
    proj = Path(args.project).resolve()
    book = ("results/code/", "results/params/")  # what record writes as DVC's bookkeeping stages do
    before = {k: v for k, v in tree_hashes(proj, "data", "results").items() if not k.startswith(book)}
    print("stale before:", len(json.loads(sh("dvc status --json", proj))))
    out = sh("/usr/bin/time -v encmap record", proj)
    print("\n".join(x for x in out.splitlines() if x.startswith("encmap record") or "still stale" in x
                    or "Maximum resident" in x))
    print("stale after:", json.loads(sh("dvc status --json", proj)))
    after = {k: v for k, v in tree_hashes(proj, "data", "results").items() if not k.startswith(book)}
    print(f"artifacts unchanged: {after == before} ({len(after)} files)")
    sh("git add -A && git commit -qm 'command 1, recorded'", proj)
    print([x for x in sh("encmap repro", proj).splitlines() if x.startswith("encmap repro")])
    print("exp run ran:", ran(sh(f"dvc exp run -S map.perplexity={args.perplexity:g}", proj)))
    sh("git reset -q --hard && dvc checkout -q", proj)
    print("after the way back:", json.loads(sh("dvc status --json", proj)))
    work = Path(tempfile.mkdtemp(prefix="encmap-share-"))
    with sftp_server(work / "home") as sshd:
        ENV["HOME"] = str(work / "home")
        key = f"dvc remote modify --local bench keyfile {sshd['keyfile']}"
        sh(f"dvc remote add bench {sshd['url_prefix']}{work / 'remote'} && {key} && git add -A "
           "&& git commit -qm 'remote'", proj)
        print("pushed:", sh("dvc push -r bench", proj).strip().splitlines()[-1:],
              f"{sum(f.stat().st_size for f in (work / 'remote').rglob('*') if f.is_file()) / 1e6:,.0f} MB")
        sh(f"git clone -q {proj} {work / 'clone'}", work)
        sh(f"{key} && dvc pull -r bench", work / "clone")
        print("pulled byte-identical:", tree_hashes(work / "clone", "data", "results") == tree_hashes(proj, "data", "results"))
        print("clone's dvc status:", json.loads(sh("dvc status --json", work / "clone")))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
