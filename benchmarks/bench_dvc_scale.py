"""The DVC route's bookkeeping at scale: m seeded control models in a fresh git + DVC copy.

Small n, so bookkeeping rather than maths is measured. Side by side in one run, on one copy of
the workflow taken from ``--workflow`` (default: this checkout; give an older checkout to measure
"before"; its ``src`` is put first on PYTHONPATH so its encmap runs):

- ``snakemake -n`` (the whole DAG), ``dvc status`` with nothing computed, and (once the sentences
  are curated, untimed) one DVC stage's own command (``snakemake -n ... --force
  results/embeddings/<model> --allowed-rules embed``);
- with ``--repro``: ``encmap repro`` (the whole pipeline; DVC's decision, one Snakemake call per
  batch) against ``snakemake --cores all`` on a second copy of the same config, ``dvc status``
  with everything computed, a no-op ``encmap repro``, ``encmap repro`` after one model's seed
  changed, and how many stages that recorded (``--target gather``: only up to the feature matrix);
- with ``--dvc-repro``: the same runs through ``dvc repro`` on a third copy (one Snakemake
  process per stage), and ``dvc exp run -S models.<id>.seed=...``. A workflow from before
  ``encmap repro`` existed has only this route;
- with ``--record``: after the plain ``snakemake --cores all``, ``encmap record`` on that copy
  (what it made, recorded in ``dvc.lock`` with no job run), how many stages it recorded, and
  ``dvc status`` afterwards (with ``--target gather`` the stages past the matrix stay stale).

    python benchmarks/bench_dvc_scale.py --m 1101                     # the bookkeeping without compute
    python benchmarks/bench_dvc_scale.py --m 1101 --record --target gather  # a plain run, then encmap record
    python benchmarks/bench_dvc_scale.py --m 300 --repro               # and the runs
    python benchmarks/bench_dvc_scale.py --m 30 --repro --dvc-repro    # both routes side by side
    python benchmarks/bench_dvc_scale.py --m 30 --dvc-repro --workflow /tmp/before --json before.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).parent))

from bench_scale import WORKFLOW, control_models  # noqa: E402


def project(root: Path, workflow: Path, m: int, n: int) -> str:
    """A git + DVC repository at ``root`` with ``workflow``'s files and m control models; the first model id."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in (*WORKFLOW, ".gitignore", ".dvcignore"):
        src = workflow / name
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    shutil.copytree(workflow / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    params = yaml.safe_load((workflow / "params.yaml").read_text())
    params["sentences"] |= {"set": f"bench-n{n}", "n": n}
    params["models"] = control_models(m)
    params["map"]["perplexity"] = min(params["map"]["perplexity"], max(1, (m - 1) // 3))
    params["map"]["neighbours"] = min(params["map"]["neighbours"], m - 1)
    params["map"]["trustworthiness_k"] = min(params["map"]["trustworthiness_k"], max(1, (m - 1) // 2))
    # The pair stages (RBF CKA, stitches) compare a fixed subset: all controls would be m^2 stitches,
    # the maths rather than the bookkeeping this measures.
    params["similarity"]["subset"] = {"groups": [], "neighbours": 0,
                                      "encoders": [f"{k}__out" for k in sorted(params["models"])[:4]]}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "bench"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True, env=ENV)
    return sorted(params["models"])[0]


ENV: dict[str, str] = {}


def timed(cmd: list[str], cwd: Path, check: bool = True) -> tuple[float, str]:
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV)
    wall = time.perf_counter() - t
    if check and p.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed ({p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
    return wall, p.stdout + p.stderr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--workflow", default=str(REPO), help="checkout whose workflow and src are measured")
    ap.add_argument("--root", default="/tmp/bench-dvc-scale")
    ap.add_argument("--repro", action="store_true", help="also run encmap repro against snakemake (seconds per model)")
    ap.add_argument("--dvc-repro", action="store_true", help="also run dvc repro (one Snakemake process per stage)")
    ap.add_argument("--record", action="store_true", help="a plain snakemake run, then encmap record on it")
    ap.add_argument("--target", choices=["all", "gather"], default="all",
                    help="the whole pipeline (default) or up to the feature matrix (no pair stages, map, regression)")
    ap.add_argument("--repro-first", action="store_true",
                    help="time the first route before snakemake --cores all (the machine's drift lands on the other side)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    workflow = Path(args.workflow).resolve()
    ENV.update(os.environ, PYTHONPATH=str(workflow / "src"), DVC_NO_ANALYTICS="1",
               PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    root = Path(args.root) / "dvc"
    first = project(root, workflow, args.m, args.n)
    sm, dvc = str(BIN / "snakemake"), str(BIN / "dvc")
    out: dict[str, float | int | str] = {"m": args.m, "n": args.n, "workflow": str(workflow), "target": args.target}
    dvc_target, smk_target = ([], []) if args.target == "all" else (["gather"], ["results/features/qre.h5"])
    out["snakemake_n_s"], log = timed([sm, "-n", "--cores", "2"], root)
    out["jobs"] = int(next(line.split()[1] for line in log.splitlines() if line.startswith("total")))
    out["dvc_status_empty_s"], log = timed([dvc, "status"], root)
    out["dvc_status_lines"] = len(log.splitlines())
    timed([sm, "--cores", "2", f"data/sentences/bench-n{args.n}.txt"], root)  # curate once, not timed
    stage = [sm, "-n", "--cores", "all", "--nolock", "--force", f"results/embeddings/{first}", "--allowed-rules", "embed"]
    out["stage_command_s"] = statistics.median(timed(stage, root)[0] for _ in range(3))  # median of 3

    def plain_run() -> None:
        plain = Path(args.root) / "snakemake"
        project(plain, workflow, args.m, args.n)
        out["snakemake_all_s"], _ = timed([sm, "--cores", "all", *smk_target], plain)
        if args.record:
            out["record_s"], log = timed([str(BIN / "encmap"), "record"], plain)
            done = next(x for x in log.splitlines() if x.startswith("encmap record:") and " recorded " in x)
            out["record_stages"], out["record_stale_before"] = (int(w) for w in done.split()[2:5:2])
            out["record_still_stale"] = sum(1 for x in log.splitlines() if x.strip().startswith("still stale: "))
            out["dvc_status_after_record_s"], log = timed([dvc, "status", "--json"], plain)
            out["dvc_status_after_record_stale"] = len(json.loads(next(x for x in log.splitlines() if x.startswith("{"))))

    if (args.repro or args.dvc_repro or args.record) and not args.repro_first:
        plain_run()
    if args.repro:
        routes = [("encmap_repro", root, [str(BIN / "encmap"), "repro", *dvc_target])]
    else:
        routes = []
    if args.dvc_repro:
        other = Path(args.root) / "dvc-repro"
        if args.repro:
            project(other, workflow, args.m, args.n)
            timed([sm, "--cores", "2", f"data/sentences/bench-n{args.n}.txt"], other)
        routes.append(("dvc_repro", other if args.repro else root, [dvc, "repro", *dvc_target]))
    for name, where, cmd in routes:
        out[f"{name}_s"], _ = timed(cmd, where)
        if "snakemake_all_s" not in out:
            plain_run()
        out[f"{name}_over_snakemake"] = out[f"{name}_s"] / out["snakemake_all_s"]
        out[f"{name}_dvc_status_done_s"], log = timed([dvc, "status"], where)
        out[f"{name}_dvc_status_done_lines"] = len(log.splitlines())
        out[f"{name}_noop_s"], _ = timed(cmd, where)
        params = yaml.safe_load((where / "params.yaml").read_text())
        params["models"][first]["seed"] += 1000
        (where / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        out[f"{name}_one_changed_s"], log = timed(cmd, where)
        out[f"{name}_stages_run_one_changed"] = log.count("Running stage") if name == "dvc_repro" else int(
            next(x.split()[2] for x in log.splitlines() if x.startswith("encmap repro:") and "recorded" in x))
        if name == "dvc_repro":
            out["dvc_exp_run_one_changed_s"], log = timed(
                [dvc, "exp", "run", *dvc_target, "-S", f"models.{first}.seed={params['models'][first]['seed'] + 1}"],
                where)
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
