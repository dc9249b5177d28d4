"""The regression at the method's scale (issue 65): stand-in data of 1,101 encoders x 10,000 QRE
features, the default params' protocol with its intervals and permutations, on ``--jobs`` cores.

Stand-in: 1,101 encoders of 300 models (3-4 variants each) in 60 families; features a seeded
low-rank latent state seen through 10,000 noisy columns; the spectral summaries (head 32,
profile 16, entropy, log rank, log scale) as gather stores them; ``--tasks`` scores, each a linear function
of the latent state plus noise; width, layer and parameter records for the baselines. Runs
``regression_table`` (every feature set, both regressors, model/family/random held out, the
bootstrap intervals and the permutation p-values) and ``fit_final`` (the default predictor), and
prints wall and CPU seconds and the peak resident memory of this process and its workers.

    python benchmarks/bench_regress_scale.py --jobs 2
    python benchmarks/bench_regress_scale.py --jobs 2 --tasks 7 --sets qre,head,mean
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import numpy as np
import yaml

from encmap.downstream.regression import FEATURE_SETS, fit_final, predictor_blocks, regression_table


def stand_in(m: int, n: int, models: int, families: int, T: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    model = np.sort(rng.integers(0, models, m))
    groups = np.array([f"m{k}" for k in model])
    fams = np.array([f"f{k % families}" for k in model])
    Z = rng.standard_normal((m, 5)) + rng.standard_normal((models, 5))[model]  # variants share their model's state
    F = np.abs(Z @ rng.standard_normal((5, n)) * 0.01 + 0.05 * rng.standard_normal((m, n))).astype(np.float64)
    Y = Z @ rng.standard_normal((5, T)) + rng.standard_normal((m, T))
    lam = np.sort(rng.dirichlet(np.ones(32), m), axis=1)[:, ::-1]
    spectral = {"head": np.log(lam), "profile": np.log(lam[:, ::2]), "entropy": -(lam * np.log(lam)).sum(axis=1),
                "log_rank": np.log(rng.integers(64, 1024, m).astype(float)),
                "log_scale": rng.normal(0.0, 2.0, m)}
    records = [{"d": int(rng.integers(64, 1024)), "layer": None if i % 4 == 0 else int(i % 12),
                "meta": {"parameters": int(1e6 * (1 + i % 50))}} for i in range(m)]
    return F, Y, groups, fams, spectral, records


def peak_mib() -> tuple[float, float]:
    """Peak resident MiB of this process and of its largest finished child (Linux: KiB)."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=1101)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--models", type=int, default=300)
    ap.add_argument("--families", type=int, default=60)
    ap.add_argument("--tasks", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--sets", default=",".join(FEATURE_SETS), help="feature sets compared (comma-separated)")
    ap.add_argument("--no-uncertainty", action="store_true", help="without intervals and p-values (their cost)")
    ap.add_argument("--params", type=Path, default=Path(__file__).parents[1] / "params.yaml")
    a = ap.parse_args(argv)
    params = yaml.safe_load(a.params.read_text())["regress"]
    if a.no_uncertainty:
        params.pop("uncertainty")
    F, Y, groups, fams, spectral, records = stand_in(a.m, a.n, a.models, a.families, a.tasks)
    tasks = [f"t{j}" for j in range(a.tasks)]
    print(f"{a.m} encoders x {a.n} features, {len(set(groups))} models, {len(set(fams))} families, {a.tasks} task(s), "
          f"{a.jobs} worker(s); uncertainty {params.get('uncertainty')}", flush=True)
    c, t = time.process_time(), time.perf_counter()
    rows, _ = regression_table(F, Y, tasks, groups, records, params, params["seed"], a.jobs, families=fams,
                               spectral=spectral, feature_sets=tuple(a.sets.split(",")))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(f"regression_table: {len(rows)} rows, wall {wall:.1f} s, CPU here {cpu:.1f} s; peak RSS here / a worker: "
          "%.0f / %.0f MiB" % peak_mib(), flush=True)
    for r in rows:
        if r["features"] in ("head", "qre") and r["protocol"] == "grouped":
            print(f"  {r['task']} {r['features']:5s} {r['regressor']:10s} Spearman {r['spearman']:+.3f} "
                  f"[{r['spearman_low']:+.3f}, {r['spearman_high']:+.3f}] p {r['p_value']:.3f}")
    print("    python benchmarks/bench_regress_scale.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:]))
    c, t = time.process_time(), time.perf_counter()
    fit_final(F, Y, tasks, groups, params, params["seed"], a.jobs,
              blocks=predictor_blocks(params["predictor"], F, spectral))
    print(f"fit_final ({params['predictor']}): wall {time.perf_counter() - t:.1f} s, CPU here "
          f"{time.process_time() - c:.1f} s; peak RSS here / a worker: %.0f / %.0f MiB" % peak_mib(), flush=True)


if __name__ == "__main__":
    main()
