"""benchmarks/bench_gpu.py runs end to end (here on the CPU, small) and its ratios are what it measured."""

from __future__ import annotations

import importlib.util
import json

import pytest
from support.project import REPO, write_user_file


@pytest.mark.slow(minutes=2)
def test_the_gpu_benchmark_runs_every_part_and_its_ratios_are_its_timings(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks/bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sentences = write_user_file(tmp_path / "s.txt", 80)
    res = bench.main(["--small", "--device", "cpu", "--n", "80", "--m", "5", "--sentences", str(sentences),
                      "--out", str(tmp_path / "out.json")])
    assert json.loads((tmp_path / "out.json").read_text())["n"] == 80
    for name in ("minilm-l6", "bert-base-random"):
        r = res["embed"][name]
        for key in ("output_only", "all_variants", "all_variants_batch_tokens", "all_variants_nondeterministic"):
            assert r[key]["time_vs_encode"] == pytest.approx(r[key]["seconds"] / r["encode"]["seconds"])
        assert r["output_only"]["variants"] == 1 and r["all_variants"]["variants"] > 1
        assert r["all_variants_batch_tokens"]["batches"] < r["all_variants"]["batches"]
    assert res["dtypes"]["float16"]["weights_vs_float32"] == pytest.approx(0.5, rel=0.01)
    pw = res["pairwise"]["cpu"]
    assert pw["pairs_computed"] == 10 and pw["step_vs_floor"] == pytest.approx(pw["step_seconds"] / pw["floor_seconds"])
    out = capsys.readouterr().out
    assert "pairwise m=5 n=80 on cpu" in out and "encode's time" in out
