"""One real ``snakemake --cores all`` of a tiny GPU project on a lent card, against the CPU route.

The project (``tests/support/project.py``'s tiny params: a sentence-transformers model and a
transformers control, both tiny random BERTs made here, LSA and a Gaussian control; sentences
from the pack's file, the ``lee`` and ``polarity`` tasks from the pack's copy of gensim's test
files) runs twice in the pack's Python, each in a folder of its own, up to every model's scores
and the pairwise step: the GPU route (``embed.device``, ``evaluate.device``, ``pairwise.device``:
``auto``) and the CPU route (all ``cpu``, ``ENCMAP_GPUS=0``). Then:

- which jobs took the card: each embeddings file's ``device_kind``, the pairwise timing's device,
  and, from Snakemake's log, the most jobs with the ``gpu`` resource that ran at once (at most
  the cards: none oversubscribed);
- the two routes' outputs, within :data:`TOLERANCES` (docs/development.md): embeddings, QRE
  features, pairwise QRE and CKA, every score.

    python benchmarks/gpu/gpu_workflow.py --pack .gpu --out $OUT/workflow.json   # via .gpu/workflow.sh
    python benchmarks/gpu/gpu_workflow.py --routes cpu ...                       # one route (a CPU check)

Writes the JSON after each route; exits 1 when a comparison is outside its tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: Largest differences the GPU route may show against the CPU route. The card's float32 kernels
#: round differently from the CPU's (~1e-6 relative for a tiny BERT); each stage after embed
#: inherits that, and a score counts items, so one item on the other side of a boundary moves it.
TOLERANCES = {
    "embeddings": 1e-4,  # ||E_gpu - E_cpu||_F / ||E_cpu||_F, per encoder
    "features": 1e-3,    # max |f_gpu - f_cpu| / max |f_cpu|, QRE features per encoder (qre.h5)
    "pairwise": 1e-3,    # the same for the pairwise QRE and CKA matrices
    "scores": 0.05,      # |score_gpu - score_cpu| per encoder and task (a score in [0, 1])
}
ROUTES = {"gpu": "auto", "cpu": "cpu"}
MODELS_TASKS = ("lee", "polarity")


def project(root: Path, pack: Path, route: str, n: int) -> list[str]:
    """The tiny project in ``root`` (the pack's workflow linked in); returns the targets."""
    import yaml

    sys.path.insert(0, str(pack / "tests"))
    from support.models import build_tiny_bert, build_tiny_st
    from support.project import tiny_params

    root.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "rules", "scripts", "profiles", "envs", "requirements"):
        if not (root / name).exists():
            os.symlink(pack / name, root / name)
    bert = build_tiny_bert(root / "models/bert")
    st = build_tiny_st(root / "models/st", bert)
    p = tiny_params(bert, pack / "data/sentences.txt", n=n, st_dir=st, tasks=MODELS_TASKS)
    p["sentences"]["sources"] = [s for s in p["sentences"]["sources"] if s["kind"] == "file"]
    p["evaluate"]["data"]["gensim"] = str(pack / "data/gensim")
    p["embed"]["device"] = p["evaluate"]["device"] = p["pairwise"]["device"] = ROUTES[route]
    p["embed"]["batch_tokens"] = "auto"
    (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    return ["results/similarity/qre_pairwise.h5", "results/similarity/cka.h5"] + [
        f"results/eval/{m}" for m in sorted(p["models"])]


def gpu_jobs_at_once(log: str) -> int:
    """The most jobs declaring the ``gpu`` resource that Snakemake's log shows running at once."""
    gpu_ids, running, most = set(), 0, 0
    for block in re.split(r"\n(?=\[)", log):
        job = re.search(r"jobid: (\d+)", block)
        if job and re.search(r"resources:.*\bgpu=1\b", block) and "Finished" not in block:
            gpu_ids.add(job.group(1))
            running += 1
            most = max(most, running)
        done = re.search(r"Finished jobid: (\d+)", block)
        if done and done.group(1) in gpu_ids:
            running -= 1
    return most


def run_route(root: Path, pack: Path, route: str, n: int, python: str) -> dict:
    targets = project(root, pack, route, n)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if route == "cpu":
        env["ENCMAP_GPUS"] = "0"
    t = time.perf_counter()
    r = subprocess.run([python, "-m", "snakemake", *targets, "--cores", "all", "--scheduler", "greedy"],
                       cwd=root, env=env, capture_output=True, text=True)
    out = {"seconds": time.perf_counter() - t, "returncode": r.returncode}
    (root / "snakemake.log").write_text(r.stdout + r.stderr)
    if r.returncode:
        out["log_tail"] = (r.stdout + r.stderr)[-3000:]
        return out
    import h5py

    kinds = {}
    for f in sorted((root / "results/embeddings").rglob("*.h5")):
        with h5py.File(f) as h:
            kinds[f.stem] = str(h.attrs.get("device_kind", ""))
    timing = json.loads((root / "results/similarity/qre_pairwise.timing.json").read_text())
    out |= {"embed_device_kinds": sorted(set(kinds.values())), "encoders": len(kinds),
            "pairwise_device": timing.get("device"), "gpu_jobs_at_once": gpu_jobs_at_once(r.stdout + r.stderr),
            "jobs": len(re.findall(r"Finished jobid", r.stdout + r.stderr))}
    return out


def _arrays(root: Path, pattern: str, name: str) -> dict[str, np.ndarray]:
    import h5py

    out = {}
    for f in sorted(root.glob(pattern)):
        with h5py.File(f) as h:
            if name in h:
                out[str(f.relative_to(root))] = np.asarray(h[name][...], dtype=np.float64)
    return out


def _scores(root: Path) -> dict[str, float]:
    """Every number in the score files under results/eval, by file and key path."""
    out: dict[str, float] = {}

    def walk(x, key):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{key}/{k}")
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out[key] = float(x)

    for f in sorted((root / "results/eval").rglob("*.json")):
        walk(json.loads(f.read_text()), str(f.relative_to(root)))
    return out


def compare(gpu: Path, cpu: Path) -> dict:
    """The largest difference of each kind between the two routes' outputs, and whether each is
    within :data:`TOLERANCES`."""
    res = {}
    e1, e2 = (_arrays(r, "results/embeddings/*/*.h5", "embeddings") for r in (gpu, cpu))
    f1, f2 = (_arrays(r, "results/features/encoders/*/*.h5", "features") for r in (gpu, cpu))
    p1, p2 = ({**_arrays(r, "results/similarity/qre_pairwise.h5", "qre"), **_arrays(r, "results/similarity/cka.h5", "cka")}
              for r in (gpu, cpu))
    s1, s2 = _scores(gpu), _scores(cpu)
    for kind, a, b, diff in (
            ("embeddings", e1, e2, lambda x, y: np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)),
            ("features", f1, f2, lambda x, y: np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)),
            ("pairwise", p1, p2, lambda x, y: np.nanmax(np.abs(x - y)) / max(np.nanmax(np.abs(y)), 1e-30)),
            ("scores", s1, s2, lambda x, y: abs(x - y))):
        if set(a) != set(b) or not a:
            res[kind] = {"ok": False, "why": f"{len(a)} vs {len(b)} outputs", "only_one": sorted(set(a) ^ set(b))[:5]}
            continue
        worst = max(a, key=lambda k: diff(a[k], b[k]))
        d = float(diff(a[worst], b[worst]))
        res[kind] = {"max": d, "where": worst, "tolerance": TOLERANCES[kind], "ok": d <= TOLERANCES[kind],
                     "compared": len(a)}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The default: the pack this file is in (its benchmarks/), or the repository (its benchmarks/gpu/).
    ap.add_argument("--pack", default=str(next(p for p in Path(__file__).resolve().parents
                                               if (p / "params.yaml").is_file())))
    ap.add_argument("--work", default=None, help="where the projects go (default: a temporary folder)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--routes", default="gpu,cpu")
    a = ap.parse_args(argv)
    import tempfile

    pack = Path(a.pack).resolve()
    work = Path(a.work or tempfile.mkdtemp(prefix="encmap-workflow-"))
    res: dict = {"date": time.strftime("%Y-%m-%d"), "n": a.n, "tolerances": TOLERANCES}
    try:
        import torch

        res["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (cpu)"
    except ImportError:
        res["card"] = "no torch"

    def save():
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1, default=float))

    routes = a.routes.split(",")
    for route in routes:
        res[route] = run_route(work / route, pack, route, a.n, sys.executable)
        print(route, json.dumps(res[route], default=float)[:600], flush=True)
        save()
    if all(r in res and not res[r]["returncode"] for r in ("gpu", "cpu")):
        res["compare"] = compare(work / "gpu", work / "cpu")
        print("compare", json.dumps(res["compare"], default=float), flush=True)
    res["ok"] = all(not res[r]["returncode"] for r in routes) and all(c["ok"] for c in res.get("compare", {}).values())
    save()
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
