"""benchmarks/gpu/bench_gpu.py runs end to end, and its ratios are what it measured: packed by
benchmarks/gpu/gpu_pack.sh and run by the pack's run.sh, as on a lent GPU machine, under an imitation
of that machine's Python (only torch, transformers, sentence-transformers, h5py, scipy,
scikit-learn and pytest importable), here on the CPU and small."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from support.device_env import bare_python
from support.project import BIN, REPO, write_user_file


@pytest.mark.slow(minutes=3)
def test_the_gpu_pack_runs_on_a_bare_machine_and_its_ratios_are_its_timings(tmp_path):
    sentences = write_user_file(tmp_path / "s.txt", 80)
    pack = tmp_path / "pack"
    env = dict(os.environ, GPU_PACK_DEST=str(pack), PYTHON=str(BIN / "python"))
    r = subprocess.run(["bash", str(REPO / "benchmarks/gpu/gpu_pack.sh"), str(sentences)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sum(f.stat().st_size for f in pack.rglob("*") if f.is_file()) < 64 * 2**20  # the device's carry
    out = tmp_path / "out"
    bare = dict(os.environ, OUT=str(out), PYTHON=str(bare_python(tmp_path / "bare")),
                ENCMAP_GPU_LOCK_DIR=str(tmp_path / "locks"))
    for key in ("ENCMAP_CACHE", "PYTHONPATH", "VIRTUAL_ENV"):
        bare.pop(key, None)
    r = subprocess.run(["bash", str(pack / "run.sh"), "--small", "--device", "cpu", "--n", "80", "--m", "5",
                        "--parts", "embed,dtypes,pairwise,big", "--big", "mistral-7b,qwen2-1.5b-all-layers"],
                       cwd=tmp_path, env=bare, capture_output=True, text=True)
    log = (out / "bench.log").read_text()
    assert r.returncode == 0, log[-4000:] + (out / "pytest.log").read_text()[-2000:]
    tests = (out / "pytest.log").read_text()
    assert "3 skipped" in tests and "error" not in tests.lower(), tests  # collected under the bare Python
    res = json.loads((out / "gpu.json").read_text())
    assert res["n"] == 80 and res["complete"]
    for name in ("minilm-l6", "bert-base-random"):
        e = res["embed"][name]
        enc = e["encode"]
        for key in ("output_only", "output_only_in_turn", "all_variants", "all_variants_in_turn",
                    "all_variants_host_checks", "all_variants_batch_tokens", "all_variants_nondeterministic"):
            assert e[key]["time_vs_encode"] == pytest.approx(e[key]["seconds"] / (enc["seconds"] + enc["load_seconds"]))
            assert e[key]["time_vs_encode_pass_only"] == pytest.approx(e[key]["seconds"] / enc["seconds"])
        assert e["output_only"]["variants"] == 1 and e["all_variants"]["variants"] > 1
        assert e["all_variants"]["proven"] == 0  # the CPU checks on the host (CHECKS_ON_DEVICE)
        assert e["all_variants_batch_tokens"]["batches"] < e["all_variants"]["batches"]
    assert res["dtypes"]["float16"]["weights_vs_float32"] == pytest.approx(0.5, rel=0.01)
    pw = res["pairwise"]["cpu"]
    assert pw["pairs_computed"] == 10 and pw["step_vs_floor"] == pytest.approx(pw["step_seconds"] / pw["floor_seconds"])
    assert "pairwise m=5 n=80 on cpu" in log and "encode's time" in log
    # The big models as the catalogue writes them (tiny here): the ratios are the timings'.
    big = res["big"]
    for run, encoders in (("mistral-7b", 1), ("qwen2-1.5b-all-layers", 3)):
        r, f, c = big[run], big[run]["forward"], big[run]["chain"]
        assert r["dtype"] == "bfloat16" and r["pooling"] == ["last"] and r["batch_size"] == 16
        assert f["fraction_of_gemm"] == pytest.approx(f["tflop_per_s"] / big["gemm_bf16_tflop_per_s"])
        assert f["tflop_per_s"] == pytest.approx(f["tflop"] / f["seconds"]) and f["real_tokens"] <= f["padded_tokens"]
        assert r["chain_vs_forward"] == pytest.approx(c["seconds"] / f["seconds"])
        assert c["seconds"] == pytest.approx(c["embed_seconds"] + c["pip_seconds"] + c["features_seconds"])
        assert c["encoders"] == encoders and c["host_peak_mib"] > 100 and c["batch_tokens_used"] is None  # CPU
        assert f"{run} " in log and "of the bf16 GEMM" in log


def test_a_cut_short_run_keeps_what_it_measured(tmp_path):
    """gpu.json is rewritten whole after every measurement: what a time limit cut off is missing,
    what came before is there, and the summary says the run was cut short."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks/gpu/bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = {"card": "test", "embed": {"m": {"encode": {"seconds": 1.0, "load_seconds": 0.5},
                                            "output_only": {"seconds": 1.8, "sentences_per_s": 5.0,
                                                            "time_vs_encode": 1.2, "time_vs_encode_pass_only": 1.8}}}}
    bench.save(res, tmp_path / "gpu.json")
    assert json.loads((tmp_path / "gpu.json").read_text()) == res
    assert [f.name for f in tmp_path.iterdir()] == ["gpu.json"]  # no temporary left beside it
    lines = bench.summary(res)
    assert "cut short" in lines[0] and len(lines) == 2 and "1.20x encode's time" in lines[1]
    assert bench.vs_encode({"seconds": 3.0}, {"seconds": 2.0, "load_seconds": 1.0}) == {
        "time_vs_encode": 1.0, "time_vs_encode_pass_only": 1.5}


def test_the_big_models_have_their_published_sizes():
    """bench_gpu.py's big models, built on torch's meta device from the configurations written in
    it: the parameter counts of the published checkpoints (Mistral-7B-v0.1's 7,241,732,096 less
    its 32,000 x 4,096 LM head; gte-Qwen2-1.5B-instruct's 1,543,268,864), and their catalogue
    entries as `encmap catalogue` writes a decoder above 1 B parameters."""
    import importlib.util

    import torch
    import transformers

    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks/gpu/bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    want = {"mistral-7b": 7_241_732_096 - 32_000 * 4096, "qwen2-1.5b": 1_543_268_864}
    assert bench.BIG_PARAMETERS == want
    for name, (cls, sizes, _) in bench.BIG_MODELS.items():
        with torch.device("meta"):
            net = transformers.AutoModel.from_config(getattr(transformers, cls)(**sizes))
        assert sum(p.numel() for p in net.parameters()) == want[name], name
        entry = bench.catalogue_spec(name, "all", REPO, sizes["num_hidden_layers"], want[name])
        assert (entry["dtype"], entry["pooling"], entry["batch_size"], entry["layers"], entry["num_layers"]) == (
            "bfloat16", ["last"], 16, "all", sizes["num_hidden_layers"])


@pytest.mark.slow(minutes=2)
def test_the_workflow_pack_runs_snakemake_on_a_bare_machine(tmp_path):
    """GPU_PACK_WORKFLOW=1: Snakemake's wheels travel inside the carry's 64 MiB; on a Python that
    has only the card's packages (no pip) they are unpacked and the pack's workflow.sh runs one real
    Snakemake of the tiny project (curate, embed, tasks, evaluate, pip, features, gather, pairwise:
    34 jobs); the routes' comparison finds a route equal to itself and a changed embedding out of
    its tolerance."""
    import importlib.util
    import shutil

    import h5py

    sentences = write_user_file(tmp_path / "s.txt", 80)
    pack = tmp_path / "pack"
    env = dict(os.environ, GPU_PACK_DEST=str(pack), PYTHON=str(BIN / "python"), GPU_PACK_WORKFLOW="1",
               GPU_WHEELS=str(REPO / ".gpu-wheels"))
    r = subprocess.run(["bash", str(REPO / "benchmarks/gpu/gpu_pack.sh"), str(sentences)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    size = sum(f.stat().st_size for f in pack.rglob("*") if f.is_file())
    assert size < 48 * 2**20  # with the checkout that travels beside it (~2 MB), under the 64 MiB carry
    assert not (pack / "models/minilm-l6").exists() and list((pack / "wheels").glob("snakemake-9*.whl"))
    out, work = tmp_path / "out", tmp_path / "work"
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ENCMAP_CACHE")}
    bare |= {"OUT": str(out), "PYTHON": str(bare_python(tmp_path / "bare")),
             "ENCMAP_GPU_LOCK_DIR": str(tmp_path / "locks")}
    r = subprocess.run(["bash", str(pack / "workflow.sh"), "--routes", "gpu", "--work", str(work)], cwd=tmp_path,
                       env=bare, capture_output=True, text=True)
    log = (out / "workflow.log").read_text()
    assert r.returncode == 0, log[-4000:]
    assert "snakemake" in log.split("\n")[0].split()  # unpacked: the bare Python had no Snakemake
    res = json.loads((out / "workflow.json").read_text())
    g = res["gpu"]
    assert res["ok"] and g["jobs"] == 34 and g["encoders"] == 11 and g["embed_device_kinds"] == ["cpu"]
    assert g["gpu_jobs_at_once"] == 1  # declared, one at a time (no card here: auto resolves to the CPU)

    spec = importlib.util.spec_from_file_location("gpu_workflow", REPO / "benchmarks/gpu/gpu_workflow.py")
    wf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wf)
    same = wf.compare(work / "gpu", work / "gpu")
    assert all(c["ok"] and c["max"] == 0 for c in same.values()) and same["embeddings"]["compared"] == 11
    shutil.copytree(work / "gpu" / "results", tmp_path / "other/results", symlinks=True)
    with h5py.File(tmp_path / "other/results/embeddings/tiny-st/tiny-st__out.h5", "r+") as h:
        h["embeddings"][0] *= 1.01
    moved = wf.compare(tmp_path / "other", work / "gpu")
    assert not moved["embeddings"]["ok"] and moved["embeddings"]["where"].endswith("tiny-st__out.h5")
    assert moved["features"]["ok"] and moved["scores"]["ok"]  # the stages after embed were not rerun
