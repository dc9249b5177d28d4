"""Every architecture on the leaderboard through the one-pass route, in the precision asked for.

Tiny random checkpoints built offline (tests/support/architectures.py): BERT, XLM-RoBERTa, a T5
encoder, ModernBERT, a Qwen3 decoder (left padding, appended EOS) and a Mistral decoder (right
padding, BOS and EOS), each a sentence-transformers model pooled as its real counterparts are.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from support.architectures import ARCHITECTURES, CAUSAL, build_tiny_architecture

from encmap.encoders.backends import transformer
from encmap.encoders.embed import embed_model
from encmap.encoders.pooling import pool
from encmap.validation import EncmapError, degenerate_reason

TEXTS = ["The city river was seen at night by the people.",
         "A king wrote a book about music and art in the year of the war, and the book was read by every child.",
         "Water is life.",
         "She said the school team would play the game in the house of the state.",
         "The church of the old city has a history of art and science.",
         "Light."]


@pytest.fixture(scope="module")
def archs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    return {a: build_tiny_architecture(a, root / a) for a in ARCHITECTURES}


def spec_for(arch: str, path: Path, **kw) -> dict:
    pooling = ["last", "mean", "max"] if arch in CAUSAL else ["mean", "cls", "max", "last"]
    return {"backend": "sentence-transformers", "source": f"path:{path}", "revision": None, "max_seq_length": 64,
            "batch_size": 4, "prompt": "", "layers": "all", "num_layers": ARCHITECTURES[arch][3],
            "pooling": pooling, "output": True, "dims": [], "renormalize_truncated": True, "init": "pretrained",
            "seed": 0, "dtype": "float32"} | kw


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_gives_its_encode_output_and_every_layer(arch, archs):
    """__out is SentenceTransformer.encode exactly (float32); every layer x pooling has shape (n, 32)
    and varies across sentences."""
    from sentence_transformers import SentenceTransformer

    spec = spec_for(arch, archs[arch])
    res = embed_model(arch, spec, TEXTS)
    ref = SentenceTransformer(str(archs[arch]), device="cpu").encode(TEXTS, batch_size=3)
    np.testing.assert_allclose(res.arrays[f"{arch}__out"], ref, atol=2e-6)
    layers = range(ARCHITECTURES[arch][3] + 1)
    want = {f"{arch}__l{k:02d}-{p}" for k in layers for p in spec["pooling"] if not (k == 0 and p in ("cls", "last"))}
    assert set(res.arrays) == want | {f"{arch}__out"}
    for e, a in res.arrays.items():
        assert a.dtype == np.float32 and a.shape[0] == len(TEXTS) and (e.endswith("__out") or a.shape[1] == 32)
        assert degenerate_reason(a) is None, e
    assert res.provenance["causal"] == (arch in CAUSAL)
    assert res.provenance["padding_side"] == ARCHITECTURES[arch][1]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_transformers_backend_runs_every_architecture(arch, archs):
    """The plain transformers route (no sentence-transformers tail; T5 through its encoder stack)
    gives the same layer variants as the sentence-transformers route, from the same weights."""
    spec = spec_for(arch, archs[arch], output=False)
    st = embed_model(arch, spec, TEXTS)
    tr = embed_model(arch, spec | {"backend": "transformers", "source": f"path:{archs[arch] / 'raw'}"}, TEXTS)
    assert set(tr.arrays) == set(st.arrays)
    for e in st.arrays:
        np.testing.assert_allclose(tr.arrays[e], st.arrays[e], atol=1e-5, err_msg=e)


def _slow_last(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    rows = []
    for i in range(mask.shape[0]):
        real = [j for j in range(mask.shape[1]) if mask[i, j]]
        rows.append(hidden[i, real[-1]])
    return torch.stack(rows)


@pytest.mark.parametrize("side", ["left", "right"])
def test_last_pooling_indexes_each_sentences_last_real_token(side):
    lengths = [5, 1, 3, 7]
    mask = torch.zeros(4, 7, dtype=torch.int64)
    for i, k in enumerate(lengths):
        if side == "right":
            mask[i, :k] = 1
        else:
            mask[i, 7 - k:] = 1
    hidden = torch.randn(4, 7, 6, generator=torch.Generator().manual_seed(0))
    got = pool(hidden, mask, "last")
    assert torch.equal(got, _slow_last(hidden, mask))
    # Hand-checked: right padding takes column length-1, left padding the last column.
    col = [k - 1 for k in lengths] if side == "right" else [6] * 4
    assert torch.equal(got, hidden[torch.arange(4), torch.tensor(col)])


@pytest.mark.parametrize("arch", CAUSAL)
def test_a_decoders_last_token_is_the_state_of_the_unpadded_sentence(arch, archs):
    """Under causal attention the last real token of a padded batch (left padding for qwen3,
    right for mistral) is the last state of the sentence run alone; RoPE makes the left-padding
    offset irrelevant."""
    from transformers import AutoModel, AutoTokenizer

    res = embed_model(arch, spec_for(arch, archs[arch], output=False, pooling=["last"]), TEXTS)
    tok = AutoTokenizer.from_pretrained(archs[arch] / "raw")
    net = AutoModel.from_pretrained(archs[arch] / "raw").eval()
    for i, t in enumerate(TEXTS):
        with torch.inference_mode():
            hs = net(**tok([t], return_tensors="pt"), output_hidden_states=True).hidden_states
        for k in (1, 2):
            np.testing.assert_allclose(res.arrays[f"{arch}__l{k:02d}-last"][i], hs[k][0, -1].numpy(), atol=1e-5)


@pytest.mark.parametrize("arch", CAUSAL)
def test_cls_is_refused_for_a_causal_model(arch, archs):
    with pytest.raises(EncmapError, match=f"model '{arch}': pooling 'cls' on a causal"):
        embed_model(arch, spec_for(arch, archs[arch], pooling=["cls", "mean"]), TEXTS)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_loads_the_model_in_it_and_stores_float32(dtype, archs, monkeypatch):
    """The model's weights are in the dtype asked for; the embeddings are float32 and close to the
    float32 ones (bfloat16 keeps 8 bits of mantissa: ~1e-2 relative)."""
    seen = []
    real = transformer._forward

    def spy(st, tok, net, *args):
        seen.append(next(net.parameters()).dtype)
        return real(st, tok, net, *args)

    monkeypatch.setattr(transformer, "_forward", spy)
    full = embed_model("m", spec_for("qwen3", archs["qwen3"]), TEXTS)
    half = embed_model("m", spec_for("qwen3", archs["qwen3"], dtype=dtype), TEXTS)
    assert seen[0] == torch.float32 and seen[-1] == getattr(torch, dtype)
    assert half.provenance["dtype"] == dtype and full.provenance["dtype"] == "float32"
    for e, a in full.arrays.items():
        assert half.arrays[e].dtype == np.float32
        rel = np.linalg.norm(half.arrays[e] - a) / np.linalg.norm(a)
        assert 0 < rel < 0.05, (e, rel)


def test_out_of_memory_halves_the_batch_and_retries(archs, monkeypatch):
    """A simulated CUDA out-of-memory on batches above 2 sentences: the same results as
    batch_size 2, and the batch size used is recorded; at the floor it is an error naming the
    model and the batch size."""
    real = transformer._forward
    sizes = []

    def tight(st, tok, net, batch, *args):
        sizes.append(len(batch))
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(st, tok, net, batch, *args)

    spec = spec_for("bert", archs["bert"], batch_size=8)
    ref = embed_model("b", spec | {"batch_size": 2}, TEXTS)
    monkeypatch.setattr(transformer, "_forward", tight)
    res = embed_model("b", spec, TEXTS)
    assert sizes == [6, 4, 2, 2, 2]  # batch 8 (all 6 texts) fails, 4 fails, then 2 + 2 + 2
    assert res.provenance["batch_size_used"] == 2
    for e in ref.arrays:
        np.testing.assert_allclose(res.arrays[e], ref.arrays[e], atol=1e-6)

    def never(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(transformer, "_forward", never)
    with pytest.raises(EncmapError, match=r"model 'b': out of cpu memory with a batch of 1 sentence"):
        embed_model("b", spec, TEXTS)



@pytest.mark.parametrize("backend", ["sentence-transformers", "transformers"])
def test_batches_tokenised_ahead_are_the_batches_run_and_give_the_same_bytes(backend, archs, monkeypatch):
    """Read-ahead: every batch's inputs are tokenised in another thread, and the inputs handed to
    the forward pass are those of the batch it runs, also after out-of-memory errors replan the
    batches (a stale batch tokenised under the old plan would be caught here); the arrays are the
    bytes of a pass that tokenises each batch in turn."""
    spec = spec_for("bert", archs["bert"], batch_size=8, backend=backend, output=backend != "transformers")
    monkeypatch.setattr(transformer, "READ_AHEAD", 0)
    in_turn = embed_model("b", spec | {"batch_size": 2}, TEXTS)
    monkeypatch.setattr(transformer, "READ_AHEAD", 2)
    real, real_tokenize = transformer._forward, transformer._tokenize
    sizes, threads = [], set()

    def tokenize(*args):
        threads.add(threading.current_thread().name)
        return real_tokenize(*args)

    def check(st, tok, net, batch, spec, device, want_output, encoded):
        sizes.append(len(batch))
        assert torch.equal(encoded["input_ids"], real_tokenize(st, tok, batch, spec)["input_ids"])
        if len(batch) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(st, tok, net, batch, spec, device, want_output, encoded)

    monkeypatch.setattr(transformer, "_tokenize", tokenize)
    monkeypatch.setattr(transformer, "_forward", check)
    ahead = embed_model("b", spec, TEXTS)
    assert sizes == [6, 4, 2, 2, 2] and threads and threading.current_thread().name not in threads
    assert set(ahead.arrays) == set(in_turn.arrays)
    for e, a in in_turn.arrays.items():
        assert ahead.arrays[e].tobytes() == a.tobytes(), e

def test_token_batches_by_hand():
    """Longest first; each batch as many sentences as fit the budget at its first (longest) length."""
    from encmap.encoders.result import token_batches

    got = token_batches(np.array([5, 3, 3, 10, 1, 30]), 10)
    assert [b.tolist() for b in got] == [[5], [3], [0, 1], [2, 4]]  # 30 > 10 alone; 10: 1; 5: 2; 3: 3 (2 left)
    assert sorted(np.concatenate(got).tolist()) == list(range(6))


def test_token_batches_give_the_sentence_batches_embeddings_and_halve_on_out_of_memory(archs, monkeypatch):
    """``batch_tokens``: batches bounded by padded tokens, not sentences (short sentences in larger
    batches); the embeddings are the sentence-batched ones (float32 rounding apart). Out of memory,
    the token budget is halved and recorded."""
    spec = spec_for("bert", archs["bert"], batch_size=2)
    ref = embed_model("b", spec, TEXTS)
    real = transformer._forward
    padded = []

    sizes = []

    def count(st, tok, net, batch, spec, device, want_output, encoded):
        # The padded tokens from the inputs the pass was handed: the tokenizer itself belongs to
        # the read-ahead thread during the pass (a fast tokenizer's padding state is not thread-safe).
        sizes.append(len(batch))
        padded.append(encoded["input_ids"].numel())
        assert encoded["input_ids"].shape[0] == len(batch)
        if padded[-1] > limit:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(st, tok, net, batch, spec, device, want_output, encoded)

    monkeypatch.setattr(transformer, "_forward", count)
    limit = float("inf")
    res = embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": 64})
    assert max(padded) <= 64 and res.provenance["batch_tokens_used"] == 64
    assert res.provenance["batches"] == len(padded) < len(TEXTS) / 2  # fewer batches than batch_size 2 makes
    for e in ref.arrays:
        np.testing.assert_allclose(res.arrays[e], ref.arrays[e], atol=1e-5)
    padded.clear()
    limit = 40  # the longest sentence alone fits; two of it do not
    sizes.clear()
    res = embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": 64})
    used = res.provenance["batch_tokens_used"]
    failed = [i for i, p in enumerate(padded) if p > limit]
    assert failed and used == 32  # 64 ran out of memory once, and was halved once
    # After the last refusal every batch keeps to the halved budget (a sentence longer than it goes alone).
    assert all(p <= used or k == 1 for p, k in zip(padded[failed[-1] + 1:], sizes[failed[-1] + 1:]))
    for e in ref.arrays:
        np.testing.assert_allclose(res.arrays[e], ref.arrays[e], atol=1e-5)


def test_the_determinism_setting_reaches_torch_and_bad_settings_are_refused(archs):
    spec = spec_for("bert", archs["bert"])
    try:
        embed_model("b", spec, TEXTS, forward={"deterministic": False, "batch_tokens": None})
        assert not torch.are_deterministic_algorithms_enabled()
        embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": None})
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.raises(EncmapError, match="forward settings"):
        embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_token": 64})


# Mistral-7B's published sizes (the e5-mistral / SFR-Embedding decoders of the catalogue).
MISTRAL_7B = dict(hidden=4096, layers=32, intermediate=14336, heads=32, max_seq_length=512, dtype_bytes=2)
#: Its bytes per padded token, by token_budget's formula: 2 x (33 x 4096 + 4 x 4096 + 2 x 14336
#: + 32 x 512) + 8 x 4096 (the output alone).
MISTRAL_PER_TOKEN = 2 * (33 * 4096 + 4 * 4096 + 2 * 14336 + 32 * 512) + 8 * 4096


def test_the_auto_token_budget_by_hand():
    """Half the free memory over the bytes per token, rounded down to a power of two, within
    [16, 32,768]: on simulated cards with the 7 B decoder's sizes."""
    from encmap.encoders.backends.transformer import token_budget

    assert MISTRAL_PER_TOKEN == 425_984
    budget = lambda free: token_budget(free, **MISTRAL_7B, pooled_width=4096)  # noqa: E731
    assert budget(125 * 2**30) == 32_768  # an H200 with the 7 B loaded: 157,568 fit, capped
    assert budget(9 * 2**30) == 8192  # a 24 GB card with the 7 B loaded: 11,342 fit
    assert budget(2 * 1024 * MISTRAL_PER_TOKEN) == 1024  # exactly 1,024 fit
    assert budget(2 * 1024 * MISTRAL_PER_TOKEN - 1) == 512  # one byte less: 1,023 fit, the power below
    assert budget(0) == budget(-5) == 16  # nothing free: the smallest budget, then out-of-memory halving
    # Every layer pooled three ways (33 x 3 variants of 4,096 side by side): fewer tokens fit.
    assert token_budget(9 * 2**30, **MISTRAL_7B, pooled_width=99 * 4096) < budget(9 * 2**30)


def test_auto_is_sentence_batches_off_a_card_and_the_card_budget_on_one(archs, monkeypatch):
    """``auto`` asks the card for its free memory only on CUDA (a simulated card here); on the
    CPU it is None: sentence batches."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(archs["mistral"])
    spec = spec_for("mistral", archs["mistral"], dtype="bfloat16")
    asked = []

    def mem_get_info(device):
        asked.append(str(device))
        return 2 * 1024 * per_token, 80 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    c = config
    per_token = 2 * ((c.num_hidden_layers + 5) * c.hidden_size + 2 * c.intermediate_size
                     + c.num_attention_heads * 64) + 8 * 100
    assert transformer.auto_batch_tokens(config, spec, "cpu", 100) is None and not asked
    assert transformer.auto_batch_tokens(config, spec, "cuda:1", 100) == 1024 and asked == ["cuda:1"]


@pytest.mark.parametrize("backend", ["sentence-transformers", "transformers"])
def test_auto_on_the_cpu_gives_the_bytes_of_sentence_batches(backend, archs):
    """The default ``batch_tokens: auto`` leaves the CPU's embeddings and provenance exactly those of
    ``null``: the same bytes written."""
    spec = spec_for("bert", archs["bert"], backend=backend, batch_size=2,
                    **({"dims": [8]} if backend == "sentence-transformers" else {"output": False}))
    null = embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": None})
    auto = embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": "auto"})
    assert null.provenance == auto.provenance and auto.provenance["batch_tokens_used"] is None
    assert list(null.arrays) == list(auto.arrays)
    for e in null.arrays:
        assert null.arrays[e].tobytes() == auto.arrays[e].tobytes(), e


def test_auto_takes_the_budget_the_card_gives_and_bad_budgets_are_refused(archs, monkeypatch):
    """On a card, ``auto`` resolves once, after the load, with the width of every variant pooled
    side by side; the budget it gives is the budget used."""
    spec = spec_for("bert", archs["bert"], batch_size=2)
    seen = []

    def fake(config, s, device, pooled_width):
        seen.append((config.hidden_size, device, pooled_width))
        return 64

    monkeypatch.setattr(transformer, "auto_batch_tokens", fake)
    res = embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": "auto"})
    width = seen[0][0]
    assert seen == [(width, "cpu", width * len(res.variants))]  # every layer x pooling + the output, all of width h
    assert res.provenance["batch_tokens_used"] == 64
    for bad in ("Auto", 0, True, 2.5):
        with pytest.raises(EncmapError, match="batch_tokens must be"):
            embed_model("b", spec, TEXTS, forward={"deterministic": True, "batch_tokens": bad})


def test_variants_that_cannot_fit_the_host_are_refused_before_the_pass(archs, monkeypatch):
    """Every variant's (n, width) float32 array, counted before the pass: more than the host has
    is refused naming both figures, and no batch runs."""
    import encmap.validation as validation

    from encmap.encoders.variants import model_variants

    spec = spec_for("bert", archs["bert"], dims=[8])
    layered = len(model_variants("b", spec)) - 2  # but the output and its truncation
    need = validation.check_host_memory("m", 10_000, [4096] * 99, available=10**12)
    assert need == 4 * 10_000 * 4096 * 99  # 16.2 GB: a 7 B's 33 states x 3 poolings
    with pytest.raises(EncmapError, match=r"need 15.1 GiB of host memory .* but 8.0 GiB is available"):
        validation.check_host_memory("m", 10_000, [4096] * 99, available=8 * 2**30)
    assert validation.host_memory_available() > 0  # this Linux host's MemAvailable

    ran = []
    monkeypatch.setattr(transformer, "_forward", lambda *a: ran.append(1))
    monkeypatch.setattr(validation, "host_memory_available", lambda: 1024)
    from transformers import AutoConfig

    h = AutoConfig.from_pretrained(archs["bert"]).hidden_size
    want = 4 * len(TEXTS) * (h * layered + h + 8)  # every layer x pooling, the output, its truncation
    with pytest.raises(EncmapError, match=rf"model 'b': its {layered + 2} variants of 6 sentences need "
                                          rf"{want / 1024:.1f} KiB .* but 1.0 KiB is available"):
        embed_model("b", spec, TEXTS)
    assert not ran
