"""One GPU per job on a box with several: the count, Snakemake's limit, the assignment (simulated
cards: the logic needs no GPU), the check that a model fits a card, and the forward pass's one
host copy per batch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from support.project import SMALL_MAP, make_project, run, tiny_params

from encmap.device import GPUS_ENV, gpu_count, gpu_slot, set_gpu_limit
from encmap.validation import EncmapError

GIB = 2**30


@pytest.mark.parametrize("env, driver, expected", [
    ({}, 8, 8),                                         # what the driver lists
    ({}, 0, 0),                                         # a CPU-only machine
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, 8, 2),            # SLURM's allocation, or the user's choice
    ({"CUDA_VISIBLE_DEVICES": "3"}, 8, 1),
    ({"CUDA_VISIBLE_DEVICES": ""}, 8, 0),               # hides every card
    ({"CUDA_VISIBLE_DEVICES": "-1"}, 8, 0),
    ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, 8, 1),         # CUDA stops at the first invalid entry
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f6c1a2e-0c4d-4e1b-9d7a-1f0e2b3c4d5e,1"}, 8, 2),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 2),        # more entries than cards
    ({GPUS_ENV: "3"}, 8, 3),                            # the user keeps five for other work
    ({GPUS_ENV: "2", "CUDA_VISIBLE_DEVICES": "0"}, 0, 2),  # the override wins (tests simulate cards so)
    ({"CUDA_VISIBLE_DEVICES": "٠,1"}, 8, 0),            # CUDA reads ASCII digits: an Arabic-Indic zero hides all
    ({GPUS_ENV: "0" * 5000 + "2"}, 8, 2),               # leading zeros, as "00" is 0
    ({GPUS_ENV: "1000000"}, 8, 1_000_000),              # more than the cards: all of them (the bound itself)
])
def test_gpu_count(env, driver, expected):
    assert gpu_count(env, driver_gpus=lambda: driver) == expected


@pytest.mark.parametrize("value", ["two", "²", "１", "٢", "-1", "1.0", "+2", "0x2"])
def test_gpu_count_refuses_a_bad_override(value):
    """Old: "²" (a digit to str.isdigit, not to int) was a raw ValueError; fullwidth and
    Arabic-Indic digits were read as numbers although no shell user means them so."""
    with pytest.raises(EncmapError, match=rf"ENCMAP_GPUS={re.escape(repr(value))}.*number of GPUs"):
        gpu_count({GPUS_ENV: value}, driver_gpus=lambda: 0)


@pytest.mark.parametrize("value", ["7" * 5000, "1" + "0" * 4300, "9" * 4300, "1000001"])
def test_a_count_of_gpus_too_long_to_be_one_is_refused_naming_the_variable(value):
    """Old: 5,000 digits (or 4,301) raised Python's raw 'Exceeds the limit (4300 digits) for integer
    string conversion' ValueError, from the Snakefile (the gpu limit) and every rule's resources alike."""
    from encmap.device import gpus_disabled

    for call in (lambda: gpu_count({GPUS_ENV: value}, driver_gpus=lambda: 8), lambda: gpus_disabled({GPUS_ENV: value})):
        with pytest.raises(EncmapError, match=rf"^ENCMAP_GPUS={re.escape(repr(value[:24]))}(… \({len(value):,} characters\))?: "
                                               r"a number of GPUs of [\d,]+ digits, more than the 1,000,000"):
            call()


@pytest.mark.parametrize("zero", ["0", "00", " 0 ", "000"])
def test_every_spelling_of_zero_is_zero_everywhere(zero):
    """Old: ENCMAP_GPUS="00" set no limit (a count of 0) but did not disable GPUs, so `auto`
    resolved to cuda and every GPU job waited for ever over 0 cards."""
    from encmap.device import gpus_disabled

    assert gpu_count({GPUS_ENV: zero}, driver_gpus=lambda: 8) == 0
    assert gpus_disabled({GPUS_ENV: zero})
    assert not gpus_disabled({GPUS_ENV: "01"}) and gpu_count({GPUS_ENV: "01"}, driver_gpus=lambda: 8) == 1


@pytest.mark.parametrize("zero", ["０", "٠٠"])
def test_a_zero_in_another_script_is_refused_not_waited_on(zero):
    from encmap.device import gpus_disabled

    for call in (lambda: gpus_disabled({GPUS_ENV: zero}), lambda: gpu_count({GPUS_ENV: zero}, driver_gpus=lambda: 8)):
        with pytest.raises(EncmapError, match=r"ENCMAP_GPUS=.*ASCII digits"):
            call()


def test_no_card_to_wait_for_is_an_error_not_a_wait(tmp_path):
    """A job told to find a card among none would wait for ever; it is refused at once."""
    done = []

    def job():
        try:
            with gpu_slot(0, directory=tmp_path, poll=0.01):
                done.append("card")
        except EncmapError as e:
            done.append(str(e))

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(2)
    assert done and "no GPU" in done[0], done


def test_the_count_is_snakemakes_limit_unless_the_user_gave_one():
    from snakemake.resources import Resources

    wf = SimpleNamespace(global_resources=Resources())
    assert set_gpu_limit(wf, {GPUS_ENV: "4"}) == 4
    assert wf.global_resources["gpu"].value == 4
    given = Resources.from_mapping({"gpu": 1})
    wf = SimpleNamespace(global_resources=given)
    assert set_gpu_limit(wf, {GPUS_ENV: "4"}) is None and given["gpu"].value == 1  # --resources gpu=1 wins
    wf = SimpleNamespace(global_resources=Resources())
    assert set_gpu_limit(wf, {GPUS_ENV: "0"}) is None and "gpu" not in wf.global_resources  # CPU: no limit


def test_threads_each_get_a_card_of_their_own_and_every_card_is_used(tmp_path):
    """12 jobs on 3 simulated cards from 6 threads: never two jobs on one card at once, all cards busy."""
    held: list[tuple[int, float, float]] = []
    lock = threading.Lock()

    def job():
        with gpu_slot(3, directory=tmp_path, poll=0.01) as card:
            t0 = time.monotonic()
            time.sleep(0.05)
            with lock:
                held.append((card, t0, time.monotonic()))

    threads = [threading.Thread(target=lambda: [job() for _ in range(2)]) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(held) == 12 and {c for c, *_ in held} == {0, 1, 2}
    for card in range(3):
        spans = sorted((a, b) for c, a, b in held if c == card)
        assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:])), f"card {card} held twice at once"


HOLD = """
import sys, time
from pathlib import Path
from encmap.device import gpu_slot
with gpu_slot(2, directory=Path(sys.argv[1])) as card:
    print(card, flush=True)
    time.sleep(60)
"""


def test_another_process_holds_its_card_until_it_dies(tmp_path):
    """Two Snakemake runs on one machine share the cards through the lock files; a killed holder frees
    its card (the kernel drops its flock), with no stale lock left behind."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0"
        with gpu_slot(2, directory=tmp_path, poll=0.01) as card:
            assert card == 1
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        with gpu_slot(2, directory=tmp_path, poll=0.01) as card:
            assert card == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_named_card_is_waited_for(tmp_path):
    order = []
    with gpu_slot(2, directory=tmp_path, only=1) as card:
        assert card == 1

        def other():
            with gpu_slot(2, directory=tmp_path, only=1, poll=0.01):
                order.append("other")

        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.1)
        order.append("first done")
    t.join()
    assert order == ["first done", "other"]


def test_a_model_that_fits_no_card_is_refused_before_it_loads(tmp_path):
    cards = {0: (10 * GIB, 16 * GIB), 1: (70 * GIB, 80 * GIB)}
    with pytest.raises(EncmapError) as e:
        with gpu_slot(2, need_bytes=int(75 * GIB), what="model 'big-decoder' (float32)",
                      memory=cards.__getitem__, directory=tmp_path):
            pytest.fail("entered")
    msg = str(e.value)
    assert "model 'big-decoder' (float32)" in msg and "75.0 GiB" in msg and "80.0 GiB (cuda:1)" in msg
    assert "not loaded" in msg and "bfloat16" in msg
    # A model that fits only the large card gets it, though card 0 is free and first.
    with gpu_slot(2, need_bytes=int(30 * GIB), memory=cards.__getitem__, directory=tmp_path) as card:
        assert card == 1


def test_a_card_short_of_free_memory_is_passed_over(tmp_path):
    free = {0: 1 * GIB, 1: 40 * GIB}
    with gpu_slot(2, need_bytes=8 * GIB, memory=lambda i: (free[i], 80 * GIB), directory=tmp_path) as card:
        assert card == 1


@pytest.mark.gpu
def test_on_real_cards_each_job_holds_a_card_and_a_model_too_large_is_refused(tmp_path, monkeypatch):
    """The assignment on the machine's own CUDA cards: the count is the driver's, a job's thread is
    put on its card (what library code calling "cuda" gets), a second job waits for a card while
    every card is held, and weights larger than any card are refused before anything loads."""
    import torch

    from encmap.device import LOCK_DIR_ENV, _driver_gpus, job_device

    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(GPUS_ENV, raising=False)
    cards = torch.cuda.device_count()
    assert gpu_count() == _driver_gpus() == cards >= 1
    order: list[tuple[str, str]] = []
    entered = [threading.Event() for _ in range(cards)]
    release = threading.Event()

    def hold(k: int) -> None:
        with job_device("auto", gpu=True, what=f"job {k}") as dev:
            # where this thread's plain "cuda" lands (the job's library code never names a card)
            order.append((dev, f"cuda:{torch.zeros(1, device='cuda').device.index}"))
            entered[k].set()
            release.wait(30)

    holders = [threading.Thread(target=hold, args=(k,)) for k in range(cards)]
    for t in holders:
        t.start()
    for e in entered:
        assert e.wait(30)
    assert sorted(order) == [(f"cuda:{i}", f"cuda:{i}") for i in range(cards)]  # every card, none twice
    late: list[str] = []
    got = threading.Event()

    def wait_for_one() -> None:
        with job_device("auto", gpu=True, what="late job") as dev:
            late.append(dev)
            got.set()

    waiter = threading.Thread(target=wait_for_one)
    waiter.start()
    assert not got.wait(1.0), "a job got a card while every card was held"
    release.set()
    assert got.wait(30) and late[0].startswith("cuda:")
    for t in [*holders, waiter]:
        t.join()
    total = max(torch.cuda.mem_get_info(i)[1] for i in range(cards))
    with pytest.raises(EncmapError, match="not loaded"):
        with job_device("auto", gpu=True, need_bytes=lambda: 2 * total, what="model 'huge'"):
            pytest.fail("entered")


def test_weight_bytes_counts_parameters_in_the_params_dtype(tiny_bert):
    """On torch's meta device: no weights read, nothing allocated; float16 is half of float32."""
    import torch
    from transformers import BertModel

    from encmap.encoders.backends.transformer import weight_bytes

    spec = {"source": f"path:{tiny_bert}", "revision": None, "dtype": "float32"}
    n = sum(p.numel() for p in BertModel.from_pretrained(tiny_bert).parameters())
    state = torch.random.get_rng_state()
    assert weight_bytes("tiny", spec) == 4 * n
    assert weight_bytes("tiny", spec | {"dtype": "bfloat16"}) == 2 * n
    assert torch.equal(state, torch.random.get_rng_state())  # the process's random state untouched
    assert weight_bytes("tiny", spec | {"source": "path:/nonexistent"}) is None


def test_one_host_copy_per_batch_gives_the_same_arrays_as_one_per_variant(tiny_bert):
    """Every layer x pooling variant equals its own pooling of a plain forward pass, bit for bit."""
    import torch
    from transformers import AutoTokenizer, BertModel

    from encmap.encoders.backends import transformer
    from encmap.encoders.pooling import pool

    spec = {"backend": "transformers", "source": f"path:{tiny_bert}", "revision": None, "layers": "all",
            "num_layers": 2, "pooling": ["mean", "cls", "max"], "init": "pretrained", "max_seq_length": 64,
            "batch_size": 4, "prompt": "", "seed": 0, "dtype": "float32", "output": False, "dims": []}
    texts = ["the city by the river", "a king of the world", "the music of the night was art", "water", "a b"]
    res = transformer.embed("tiny", spec, texts, "cpu", None)
    tok, net = AutoTokenizer.from_pretrained(tiny_bert), BertModel.from_pretrained(tiny_bert).eval()
    with torch.inference_mode():
        for i, t in enumerate(texts):
            enc = tok([t], return_tensors="pt", truncation=True, max_length=64)
            hs = net(**enc, output_hidden_states=True).hidden_states
            for v in res.variants:
                ref = pool(hs[v.layer].float(), enc["attention_mask"], v.pooling)[0].numpy()
                np.testing.assert_allclose(res.arrays[v.id][i], ref, rtol=1e-5, atol=1e-6, err_msg=v.id)


@pytest.mark.slow(minutes=1)
def test_snakemake_runs_no_more_gpu_jobs_than_cards(tmp_path, tiny_bert, user_file):
    """Two transformer models, cores for both at once: with one (simulated) card their embed jobs run
    one after the other; with two, side by side. The limit is what Snakemake itself enforces."""
    params = tiny_params(tiny_bert, user_file, n=60)
    params["embed"]["device"] = "auto"  # asks for a GPU (on this CPU machine, runs on the CPU)
    params["models"]["tiny-st"] = params["models"]["tiny-rand"] | {"seed": 1}
    params["map"] |= SMALL_MAP
    root = make_project(tmp_path / "p", params)
    targets = "results/embeddings/tiny-st results/embeddings/tiny-rand"

    def embed_spans(gpus: str) -> list[str]:
        run("rm -rf results/embeddings", root)
        out = run(f"{GPUS_ENV}={gpus} snakemake --cores 16 {targets}", root)
        log = out.stdout + out.stderr
        jobs = {m.group(1): m.group(2) for m in re.finditer(r"rule embed:.*?jobid: (\d+).*?model=([\w.-]+)", log, re.S)}
        events = []
        for m in re.finditer(r"rule embed:.*?jobid: (\d+)|Finished jobid: (\d+)", log, re.S):
            if m.group(1):
                events.append("start " + jobs[m.group(1)])
            elif m.group(2) in jobs:
                events.append("end " + jobs[m.group(2)])
        return log, events

    log, events = embed_spans("1")
    assert "gpu=1" in log.replace(" ", "")  # "Provided resources: ... gpu=1"
    assert [e.split()[0] for e in events] == ["start", "end", "start", "end"], events
    log, events = embed_spans("2")
    assert [e.split()[0] for e in events][:2] == ["start", "start"], events


# ------------------------------------------------------------------ the box's own settings (issue 49)

@pytest.fixture
def two_cards(monkeypatch, tmp_path):
    """torch.cuda simulating 2 visible cards of 80 GiB (each thread's current device tracked), and a lock folder."""
    import torch

    from encmap.device import LOCK_DIR_ENV

    current = threading.local()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"sim-{i}"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: getattr(current, "i", 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: setattr(current, "i", i))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (80 * GIB, 80 * GIB))
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    monkeypatch.delenv(GPUS_ENV, raising=False)
    return torch


def test_encmap_gpus_0_means_no_gpu_job(two_cards, monkeypatch):
    """Old: ENCMAP_GPUS=0 set no `gpu` limit while jobs still got cuda:0."""
    from encmap.device import job_device, resolve_device
    from encmap.encoders.embed import gpu_request

    spec = {"backend": "sentence-transformers"}
    assert resolve_device("auto") == "cuda" and gpu_request(spec, "auto") == 1
    monkeypatch.setenv(GPUS_ENV, "0")
    assert resolve_device("auto") == "cpu" and gpu_request(spec, "auto") == 0
    with job_device("auto", gpu=True) as dev:
        assert dev == "cpu"
    with pytest.raises(EncmapError, match="ENCMAP_GPUS=0 allows encmap's jobs no GPU"):
        resolve_device("cuda")
    monkeypatch.setenv(GPUS_ENV, "00")  # old: cuda, and every GPU job waited for ever over 0 cards
    assert resolve_device("auto") == "cpu" and gpu_request(spec, "auto") == 0
    with job_device("auto", gpu=True) as dev:
        assert dev == "cpu"
    monkeypatch.setenv(GPUS_ENV, "٠٠")
    with pytest.raises(EncmapError, match="ENCMAP_GPUS='٠٠'"):
        resolve_device("auto")


def test_encmap_gpus_k_means_the_first_k_cards(two_cards, monkeypatch):
    """Old: ENCMAP_GPUS=1 on 2 cards limited the count, but a second holder took cuda:1, the card
    the user kept."""
    from encmap.device import job_device

    monkeypatch.setenv(GPUS_ENV, "1")
    got, second = [], threading.Event()
    with job_device("auto", gpu=True, what="first") as dev:
        got.append(dev)

        def late():
            with job_device("auto", gpu=True, what="second") as d:
                got.append(d)
                second.set()

        t = threading.Thread(target=late)
        t.start()
        assert not second.wait(1.0), "a second job took a card the user kept"
    t.join(30)
    assert got == ["cuda:0", "cuda:0"]


def test_a_named_card_beyond_the_visible_ones_is_refused_before_any_work(two_cards, monkeypatch):
    from encmap.device import resolve_device

    with pytest.raises(EncmapError, match=r"'cuda:5' but encmap's jobs may use cuda:0 to cuda:1 \(2 visible"):
        resolve_device("cuda:5")
    monkeypatch.setenv(GPUS_ENV, "1")
    with pytest.raises(EncmapError, match=r"'cuda:1' but encmap's jobs may use cuda:0 to cuda:0"):
        resolve_device("cuda:1")
    assert resolve_device("cuda:0") == "cuda:0"


@pytest.mark.parametrize("case, why", [("file", "a file, not a folder"), ("under a file", "cannot make that folder"),
                                       ("read-only", "not writable")])
def test_a_bad_lock_folder_is_named(tmp_path, monkeypatch, case, why):
    """Old: ENCMAP_GPU_LOCK_DIR a file, read-only or under a file: raw OSErrors."""
    from encmap.device import LOCK_DIR_ENV, lock_dir

    target = tmp_path / "locks"
    if case == "file":
        target.write_text("a file")
    elif case == "under a file":
        (tmp_path / "afile").write_text("")
        target = tmp_path / "afile" / "locks"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write a read-only folder")  # the other two cases run as root too
        target.mkdir(mode=0o500)
    monkeypatch.setenv(LOCK_DIR_ENV, str(target))
    with pytest.raises(EncmapError, match=f"ENCMAP_GPU_LOCK_DIR={re.escape(str(target))}: {why}"):
        lock_dir()


def test_cards_short_of_memory_because_of_another_program_are_refused_after_a_deadline(tmp_path):
    """Old: every card short of free memory (another program's), the job waited for ever."""
    t0 = time.monotonic()
    with pytest.raises(EncmapError, match=r"model 'm': no GPU has the 8.9 GiB free .* none did for 1 s: "
                                          r"cuda:0 1.0 GiB free of 80.0 GiB, cuda:1 2.0 GiB free of 80.0 GiB"):
        with gpu_slot(2, need_bytes=8 * GIB, memory=lambda i: ((i + 1) * GIB, 80 * GIB), directory=tmp_path,
                      what="model 'm'", poll=0.05, memory_wait=1.0):
            pytest.fail("entered")
    assert 1.0 <= time.monotonic() - t0 < 10
