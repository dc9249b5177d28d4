"""The method's scale: the real Snakemake pipeline on m synthetic encoders vs the same work in one process.

Writes a params file of m Gaussian control models (seeded, a spread of widths and ranks), curates
n sentences once (not timed), then measures side by side in one run:

- **pipeline**: ``snakemake --cores all results/features/qre.h5`` (embed, factored PIP and QRE
  features of every encoder, then the gathered matrix), in a fresh copy of the workflow;
- **floor**: the same step functions called in one Python process (no job overhead at all).

Prints wall and CPU time, jobs, the pipeline/floor ratio, peak RSS, bytes on disk per encoder,
checks that both produce the same feature matrix, and extrapolates, from the measured figures,
to 1,101 encoders x 10,000 sentences on this machine.

    python benchmarks/bench_scale.py --m 100 --n 1000
    python benchmarks/bench_scale.py --m 300 --n 10000 --json scale.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
WIDTHS = (64, 128, 256, 384, 512, 768)
WORKFLOW = ("Snakefile", "dvc.yaml", "rules", "scripts", "profiles", "envs", "requirements")
METHOD_M, METHOD_N = 1101, 10_000


def control_models(m: int, seed: int = 0) -> dict[str, dict]:
    """m Gaussian controls: widths drawn from :data:`WIDTHS`, a third each full rank, d/2 and d/4."""
    rng = np.random.default_rng(seed)
    widths = rng.choice(WIDTHS, size=m)
    meta = {"family": "control", "architecture": "gaussian", "parameters": 0, "languages": [],
            "objective": "none", "kind": "control"}
    out = {}
    for i, d in enumerate(widths.tolist()):
        rank = (None, d // 2, d // 4)[i % 3]
        out[f"ctl-{i:04d}"] = {"backend": "control", "method": "gaussian", "dim": d, "rank": rank, "seed": i,
                               "dims": [], "renormalize_truncated": True, "meta": meta}
    return out


def make_project(root: Path, m: int, n: int) -> dict:
    """A fresh copy of the workflow in ``root`` whose params.yaml maps m controls over n sentences."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for name in WORKFLOW:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sentences"] |= {"set": f"bench-n{n}", "n": n}
    params["models"] = control_models(m)
    params["map"]["perplexity"] = min(params["map"]["perplexity"], max(1, (m - 1) // 3))  # valid for small m
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def measured(cmd: list[str], cwd: Path) -> dict:
    """Run ``cmd``; wall time, CPU time and peak RSS of its whole process tree (a wrapper's rusage)."""
    probe = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); w = time.perf_counter() - t; "
             "r = resource.getrusage(resource.RUSAGE_CHILDREN); sys.stderr.write(p.stdout + p.stderr); "
             "print(w, r.ru_utime + r.ru_stime, r.ru_maxrss, p.returncode)")
    p = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=cwd, capture_output=True, text=True)
    wall, cpu, rss, rc = p.stdout.split()
    if int(rc) != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed ({rc}):\n{p.stderr[-4000:]}")
    return {"wall_s": float(wall), "cpu_s": float(cpu), "peak_rss_mb": int(rss) / 1024, "log": p.stderr}


def floor(root: Path) -> None:
    """The pipeline's work in this one process: the same step functions, no Snakemake, no jobs."""
    from encmap.workflow.layout import artifact_paths
    from encmap.pipeline.embed import embed_step
    from encmap.pipeline.features import features_step
    from encmap.pipeline.gather import gather_step
    from encmap.pipeline.pip import pip_step

    params = yaml.safe_load((root / "params.yaml").read_text())
    sentences = root / f"data/sentences/{params['sentences']['set']}.txt"
    models, pip = params["models"], params["pip"]
    out = root / "floor"
    for model in sorted(models):  # BLAS uses every core, as the pipeline's parallel jobs do
        ids = embed_step(model, models[model], str(sentences), str(out / "embeddings" / model), device="cpu",
                         degenerate=params["embed"]["degenerate"])
        for e in ids:
            pip_step(str(out / "embeddings" / model), e, str(out / "pip" / model / f"{e}.h5"), tol=pip["tol"],
                     dense_max_n=pip["dense_max_n"], center=pip["center"], normalize_rows=pip["normalize_rows"])
            features_step(str(out / "pip" / model / f"{e}.h5"), str(out / "features" / model / f"{e}.h5"),
                          direction=params["qre"]["direction"], eps=params["qre"]["eps"])
    gather_step([str(out / "features" / p.split("/", 3)[3]) for p in artifact_paths(models, "features")],
                str(out / "qre.h5"))


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=100, help="encoders (one control model each)")
    ap.add_argument("--n", type=int, default=1000, help="sentences")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/encmap-bench-scale"))
    ap.add_argument("--cores", default="all")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--floor", type=Path, help=argparse.SUPPRESS)  # internal: run the floor in this project
    args = ap.parse_args()
    if args.floor:
        floor(args.floor)
        return
    root = args.workdir / f"m{args.m}-n{args.n}"
    params = make_project(root, args.m, args.n)
    sm = [str(Path(sys.executable).parent / "snakemake"), "--cores", args.cores, "--nolock"]
    measured([*sm, f"data/sentences/{params['sentences']['set']}.txt"], root)  # curate once, not timed

    pipe = measured([*sm, "results/features/qre.h5"], root)
    done = re.findall(r"(\d+) of (\d+) steps", pipe["log"])
    jobs = int(done[-1][1]) if done else 0
    flo = measured([sys.executable, __file__, "--floor", str(root)], root)

    from encmap.artifacts.features import read_feature_matrix

    a, b = read_feature_matrix(root / "results/features/qre.h5"), read_feature_matrix(root / "floor/qre.h5")
    # In-process jobs run BLAS on one thread, the floor on all: equal up to rounding, not bit for bit.
    diff = float(np.max(np.abs(a["F"] - b["F"]) / np.maximum(np.abs(b["F"]), 1e-300)))
    same = a["ids"] == b["ids"] and diff < 1e-10
    m, n = args.m, args.n
    per = {k: tree_bytes(root / "results" / k) / m for k in ("embeddings", "pip", "features/encoders")}
    over_job = (pipe["wall_s"] - flo["wall_s"]) / max(jobs, 1)
    res = {"m": m, "n": n, "jobs": jobs, "pipeline": {k: v for k, v in pipe.items() if k != "log"},
           "floor": {k: v for k, v in flo.items() if k != "log"}, "ratio": pipe["wall_s"] / flo["wall_s"],
           "cpu_ratio": pipe["cpu_s"] / flo["cpu_s"], "overhead_per_job_s": over_job,
           "bytes_per_encoder": per, "pip_over_embeddings": per["pip"] / per["embeddings"],
           "same_features": bool(same), "max_rel_diff": diff, "widths": list(WIDTHS)}
    print(f"m = {m} encoders, n = {n} sentences, widths {WIDTHS} (ranks d, d/2, d/4)")
    print(f"  pipeline: {pipe['wall_s']:8.1f} s wall, {pipe['cpu_s']:8.1f} s CPU, {jobs} jobs, "
          f"peak RSS {pipe['peak_rss_mb']:.0f} MB")
    print(f"  floor:    {flo['wall_s']:8.1f} s wall, {flo['cpu_s']:8.1f} s CPU (one process), "
          f"peak RSS {flo['peak_rss_mb']:.0f} MB")
    print(f"  pipeline / floor: {res['ratio']:.1f}x wall, {res['cpu_ratio']:.1f}x CPU; "
          f"{over_job:.2f} s wall of overhead per job; same feature matrix: {same} (max rel. diff {diff:.1e})")
    print("  bytes per encoder: " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in per.items())
          + f"; PIP / embeddings = {res['pip_over_embeddings']:.1%}")
    # Extrapolation: floor work scales with the encoder count (and, for the SVD, ~linearly in n at
    # these widths); overhead with the job count; bytes with m and n. Only an n = 10,000 run gives
    # the method's floor directly.
    scale_m, scale_n = METHOD_M / m, METHOD_N / n
    floor_h = flo["wall_s"] * scale_m * scale_n / 3600
    over_h = max(over_job, 0.0) * jobs * scale_m / 3600
    res["extrapolated"] = {"floor_h": floor_h, "overhead_h": over_h, "pipeline_h": floor_h + over_h,
                           "embeddings_gb": per["embeddings"] * METHOD_M * scale_n / 1e9,
                           "pip_gb": per["pip"] * METHOD_M * scale_n / 1e9,
                           "sbatch_jobs": round(jobs * scale_m)}
    x = res["extrapolated"]
    print(f"  extrapolated to {METHOD_M:,} encoders x {METHOD_N:,} sentences on this machine"
          f"{'' if n == METHOD_N else ' (floor scaled linearly in n: run at n = 10,000 for a measured one)'}: "
          f"floor {floor_h:.2f} h + job overhead {over_h:.2f} h = {floor_h + over_h:.2f} h "
          f"(the pipeline itself, scaled: {pipe['wall_s'] * scale_m * scale_n / 3600:.2f} h); "
          f"{x['sbatch_jobs']:,} jobs; disk {x['embeddings_gb']:.1f} GB embeddings + {x['pip_gb']:.1f} GB PIP")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
