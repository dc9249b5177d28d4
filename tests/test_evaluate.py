"""Downstream tasks and metrics: hand-checkable values, probe removal, the same encoder as the map."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from support.fresh import fresh_digests

from encmap.artifacts.tasks import task_texts
from encmap.corpus.candidates import BROWN_DIR
from encmap.corpus.cleaning import clean
from encmap.corpus.wordnet import as_sentence, wordnet_synsets
from encmap.downstream.metrics import classification_scores, retrieval_scores, similarity_scores, undersample
from encmap.downstream.tasks import ProbeFilter, build_tasks
from encmap.validation import EncmapError

WORDNET = "/usr/share/wordnet"


def small_evaluate(tasks: list[str], **data) -> dict:
    return {"tasks": tasks, "seed": 0,
            "supersense": {"max_per_class": 6, "min_per_class": 4, "test": 0.5},
            "gloss": {"max_queries": 50, "distractors": 20},
            "brown": {"max_items": 200, "min_per_class": 4, "min_words": 5, "max_words": 60, "test": 0.5},
            "polarity": {"folds": 4},
            "data": {"wordnet": WORDNET, "brown": BROWN_DIR, "gensim": None} | data}


def test_retrieval_three_documents_by_hand():
    # One query; corpus cosines 0.9 (irrelevant), 0.5 (relevant), 0.1: the relevant document is
    # ranked 2nd, so DCG = 1/log2(3), ideal DCG = 1: nDCG@10 = 0.63093, MRR@10 = 1/2.
    Q = np.array([[1.0, 0.0]])
    C = np.array([[0.9, np.sqrt(1 - 0.81)], [0.5, np.sqrt(0.75)], [0.1, np.sqrt(0.99)]])
    s = retrieval_scores(Q, C, [[1]], k=10)
    assert s["ndcg_at_10"] == pytest.approx(1 / np.log2(3), abs=1e-12)
    assert s["mrr_at_10"] == pytest.approx(0.5)
    # Two relevant documents at ranks 1 and 3: DCG = 1 + 1/2, ideal = 1 + 1/log2(3).
    s = retrieval_scores(Q, C, [[0, 2]], k=10)
    assert s["ndcg_at_10"] == pytest.approx(1.5 / (1 + 1 / np.log2(3)), abs=1e-12)
    assert s["mrr_at_10"] == 1.0
    # Beyond k: the relevant document at rank 2 with k = 1 counts nothing.
    assert retrieval_scores(Q, C, [[1]], k=1) == {"ndcg_at_1": 0.0, "mrr_at_1": 0.0}


def test_similarity_four_pairs_by_hand():
    # Cosines of the 4 pairs rank them 1, 2, 4, 3 against human ranks 1, 2, 3, 4:
    # Spearman = 1 - 6 * (0 + 0 + 1 + 1) / (4 * 15) = 0.8.
    angles = np.array([1.2, 0.9, 0.2, 0.5])  # smaller angle, higher cosine
    X = np.vstack([[[1.0, 0.0], [np.cos(a), np.sin(a)]] for a in angles])
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    s = similarity_scores(X, pairs, [1.0, 2.0, 3.0, 4.0])
    assert s["spearman"] == pytest.approx(0.8)
    assert s["pearson"] == pytest.approx(np.corrcoef(np.cos(angles), [1, 2, 3, 4])[0, 1])
    # Scale of either text does not matter (cosine).
    assert similarity_scores(X * np.arange(1, 9)[:, None], pairs, [1, 2, 3, 4])["spearman"] == pytest.approx(0.8)


def test_classification_separable_and_seeded():
    rng = np.random.default_rng(0)
    centres = np.eye(3) * 10
    y = np.repeat(["a", "b", "c"], 20)
    X = centres[np.repeat([0, 1, 2], 20)] + rng.standard_normal((60, 3))
    folds = np.tile([0, 1], 30)
    kw = dict(n_experiments=3, samples_per_label=4, max_iter=100, random_state=0)
    s = classification_scores(X, y, folds, [1], **kw)
    assert s["accuracy"] == 1.0 and s["f1_macro"] == 1.0 and s["n_test"] == 30
    assert classification_scores(X, y, folds, [1], **kw) == s
    # Labels unrelated to X: no better than chance on average over folds.
    shuffled = rng.permutation(y)
    assert classification_scores(X, shuffled, np.arange(60) % 5, list(range(5)), **kw)["accuracy"] < 0.6
    # The undersample takes at most 4 per label, seeded.
    idx = np.flatnonzero(folds == 0)
    sub = undersample(y, idx, 4, np.random.default_rng(1))
    assert sorted(np.unique(y[sub], return_counts=True)[1]) == [4, 4, 4] and set(sub) <= set(idx)
    assert np.array_equal(sub, undersample(y, idx, 4, np.random.default_rng(1)))


def test_probe_sentences_are_removed_and_counted():
    examples = [clean(as_sentence(e)) for s in wordnet_synsets("wordnet", WORDNET) for e in s.examples]
    probes = examples[:400:2]
    variant = examples[401].upper().replace(",", " ,")  # the same text, other case and spacing
    f = ProbeFilter(probes + [variant])
    assert f.match(probes[0]) == "exact" and f.match(examples[401]) == "normalised" and f.match("Other.") is None
    built = build_tasks(small_evaluate(["supersense", "gloss-retrieval"]), probes + [variant])
    for name, task in built["tasks"].items():
        texts = set(task_texts(task))
        assert not texts & set(probes) and examples[401] not in texts, name
    ss = built["tasks"]["supersense"]
    assert ss["removed"]["exact"] >= 190 and ss["removed"]["normalised"] >= 1  # duplicates share a text
    assert built["tasks"]["gloss-retrieval"]["removed"]["corpus"]["exact"] >= 190
    assert len(ss["classes"]) == 45 and set(ss["folds"]) == {0, 1}
    # Same params, same tasks: here and in two fresh interpreters with other hash seeds.
    here = hashlib.sha256(json.dumps(build_tasks(small_evaluate(["supersense"]), probes), sort_keys=True).encode())
    assert fresh_digests(_SAME_TASKS) == [here.hexdigest()] * 2


_SAME_TASKS = """
import hashlib, json
from test_evaluate import WORDNET, small_evaluate
from encmap.corpus.cleaning import clean
from encmap.corpus.wordnet import as_sentence, wordnet_synsets
from encmap.downstream.tasks import build_tasks
probes = [clean(as_sentence(e)) for s in wordnet_synsets("wordnet", WORDNET) for e in s.examples][:400:2]
print(hashlib.sha256(json.dumps(build_tasks(small_evaluate(["supersense"]), probes), sort_keys=True).encode()).hexdigest())
"""


def test_gensim_tasks_read_their_files():
    built = build_tasks(small_evaluate(["lee", "polarity", "wordsim353", "simlex999"]), [])["tasks"]
    assert len(built["lee"]["texts"]) == 50 and len(built["lee"]["pairs"]) == 50 * 49 // 2
    assert "£" in " ".join(built["lee"]["texts"])  # Windows-1252 decoded
    assert len(built["polarity"]["texts"]) == 200 and set(built["polarity"]["labels"]) == {"neg", "pos"}
    assert len(built["wordsim353"]["pairs"]) == 353 and len(built["simlex999"]["pairs"]) == 999
    assert built["wordsim353"]["texts"][built["wordsim353"]["pairs"][1][0]] == "tiger"


def test_missing_task_data_names_how_to_install(tmp_path):
    with pytest.raises(EncmapError, match=r"lee.cor not found; install: pip install gensim"):
        build_tasks(small_evaluate(["lee"], gensim=str(tmp_path)), [])
    with pytest.raises(EncmapError, match=r"data.noun not found; install: apt-get install wordnet-base"):
        build_tasks(small_evaluate(["supersense"], wordnet=str(tmp_path)), [])
    with pytest.raises(EncmapError, match=r"unknown task 'sts'"):
        build_tasks(small_evaluate(["sts"]), [])


LSA = {"backend": "classical", "method": "tfidf-svd", "dims": [4, 8], "seed": 0,
       "tfidf": {"lowercase": True, "sublinear_tf": True, "min_df": 1, "max_df": 1.0, "ngram_range": [1, 1],
                 "norm": "l2"}, "svd": {"algorithm": "arpack", "n_iter": 5},
       "meta": {"family": "LSA", "architecture": "tfidf-svd", "parameters": None, "languages": [],
                "objective": "x", "kind": "classical"}}


def test_tfidf_encoder_is_the_maps_encoder_on_other_texts():
    """Evaluation texts go through the TF-IDF + SVD fitted on the curated sentences: embedding
    the curated sentences that way reproduces the map's embeddings of them."""
    from encmap.encoders.embed import embed_model

    spec = LSA
    probes = [clean(as_sentence(e)) for s in wordnet_synsets("wordnet", WORDNET) for e in s.examples][:300]
    mapped = embed_model("lsa", spec, probes)
    again = embed_model("lsa", spec, probes[:50], fit_texts=probes)
    other = embed_model("lsa", spec, ["A new text about the sea.", "Another one."], fit_texts=probes)
    for e in ("lsa__d4", "lsa__d8"):
        np.testing.assert_allclose(again.arrays[e], mapped.arrays[e][:50], atol=1e-5)
        assert other.arrays[e].shape == (2, int(e[-1]))
    # Fitted on the evaluation texts themselves it would be another encoder.
    assert not np.allclose(embed_model("lsa", spec, probes[:50]).arrays["lsa__d8"], mapped.arrays["lsa__d8"][:50],
                           atol=1e-3)


def test_tfidf_fitted_once_for_every_pass_over_other_texts(monkeypatch):
    """Several text lists embedded with the encoder fitted on one corpus (MTEB's passes) fit it
    once; another corpus or other SVD settings fit again; the results are a fresh fit's."""
    from sklearn.decomposition import TruncatedSVD

    from encmap.encoders.backends import classical
    from encmap.encoders.embed import embed_model

    monkeypatch.setattr(classical, "_FITTED", {})  # not what an earlier test fitted
    fits = []
    fit = TruncatedSVD.fit_transform
    monkeypatch.setattr(TruncatedSVD, "fit_transform", lambda self, X, y=None: fits.append(X.shape) or fit(self, X))
    probes = [clean(as_sentence(e)) for s in wordnet_synsets("wordnet", WORDNET) for e in s.examples][:300]
    a, b = (["A new text about the sea.", "Another one."], probes[100:140])
    first = embed_model("lsa", LSA, a, fit_texts=probes)
    second = embed_model("lsa", LSA, b, fit_texts=probes)
    assert len(fits) == 1
    embed_model("lsa", LSA, a, fit_texts=probes[:299])
    embed_model("lsa", LSA | {"seed": 1}, a, fit_texts=probes[:299])
    assert len(fits) == 3
    for texts, res in ((a, first), (b, second)):
        classical._FITTED.clear()
        fresh = embed_model("lsa", LSA, texts, fit_texts=probes)
        for e, arr in fresh.arrays.items():
            np.testing.assert_array_equal(res.arrays[e], arr)
    assert len(fits) == 5


def test_mteb_tasks_by_name_without_download():
    """The online route: tasks resolve by name from mteb's registry (metadata only, no data)."""
    from encmap.downstream.mteb_tasks import mteb_tasks

    (task,) = mteb_tasks(["STSBenchmark"])
    assert task.metadata.name == "STSBenchmark" and task.metadata.main_score == "cosine_spearman"
    with pytest.raises(EncmapError, match="NoSuchTask"):
        mteb_tasks(["NoSuchTask"])


def test_mteb_evaluates_every_variant_from_shared_passes():
    """A local MTEB STS task (its data in memory) through ``mteb.evaluate``: each variant's main
    score equals encmap's own Spearman of cosine (an independent implementation), and the
    variants share the forward passes (one per distinct list of texts, not one per variant)."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata

    from encmap.downstream.mteb_tasks import SharedPass, run_mteb

    rng = np.random.default_rng(0)
    left = [f"sentence {i} about topic {i % 3}" for i in range(12)]
    right = [f"another {i} on topic {(i * 5) % 4}" for i in range(12)]
    human = rng.uniform(0, 5, 12).round(2).tolist()

    class LocalSTS(AbsTaskSTS):
        metadata = TaskMetadata(
            name="LocalSTS", description="twelve pairs in memory", type="STS", dataset={"path": "local/none",
                                                                                        "revision": "1"},
            eval_splits=["test"], eval_langs=["eng-Latn"], main_score="cosine_spearman", category="t2t",
            domains=None, date=None, license=None, annotations_creators=None, dialect=None, sample_creation=None,
            bibtex_citation="", reference=None)

        def load_data(self, **kwargs):
            self.dataset = {"default": DatasetDict({"test": Dataset.from_dict(
                {"sentence1": left, "sentence2": right, "score": human})})}
            self.data_loaded = True

    table = rng.standard_normal((64, 16))

    def embed(texts):  # a deterministic "model" with two variants: full width and a truncation
        X = np.array([table[[hash_word(w) for w in t.split()]].sum(0) for t in texts])
        return {"m__out": X, "m__out-d4": X[:, :4]}

    shared = SharedPass(embed)
    res = run_mteb([LocalSTS()], ["m__out", "m__out-d4"], embed, shared=shared)
    X = embed(left + right)
    pairs = [[i, 12 + i] for i in range(12)]
    for e in ("m__out", "m__out-d4"):
        ours = similarity_scores(X[e], pairs, human)["spearman"]
        assert res[e]["mteb:LocalSTS"]["main_score"] == pytest.approx(ours, abs=1e-9), e
    assert 1 <= shared.passes <= 2  # mteb encodes the two columns; the second variant reuses both


def hash_word(w: str) -> int:
    """A stable word -> row index (never Python's salted hash())."""
    import zlib

    return zlib.crc32(w.encode()) % 64


def test_encoders_scored_side_by_side_give_the_serial_scores(monkeypatch):
    """evaluate_step scores a model's variants in worker processes: the same numbers as one by one."""
    from functools import partial

    from encmap import parallel
    from encmap.downstream.metrics import score_tasks
    from encmap.parallel import map_single_threaded

    monkeypatch.setattr(parallel, "POOL_MIN_SECONDS", 0)  # every variant to the workers, however small

    rng = np.random.default_rng(5)
    texts = [f"t{i}" for i in range(60)]
    rows = {t: i for i, t in enumerate(texts)}
    labels = [str(i % 4) for i in range(60)]
    tasks = {"cls": {"type": "classification", "main_score": "accuracy", "texts": texts, "labels": labels,
                     "folds": [(i // 4) % 2 for i in range(60)], "test_folds": [1]},
             "ret": {"type": "retrieval", "queries": texts[:10], "corpus": texts[10:],
                     "relevant": [[i] for i in range(10)]},
             "sim": {"type": "similarity", "main_score": "spearman", "texts": texts[:8],
                     "pairs": [[0, 1], [2, 3], [4, 5], [6, 7], [1, 2]], "human": [0.1, 0.5, 0.2, 0.9, 0.4]}}
    params = {"classification": {"n_experiments": 3, "samples_per_label": 10, "max_iter": 100}, "retrieval_k": 10}
    centres = rng.standard_normal((4, 16)) * 3
    Xs = [(centres[[i % 4 for i in range(60)]] + rng.standard_normal((60, 16)) * s).astype(np.float32)
          for s in (0.5, 4.0, 12.0)]
    fn = partial(score_tasks, tasks=tasks, rows=rows, params=params, random_state=0)
    serial = [fn(X) for X in Xs]
    assert map_single_threaded(fn, Xs, 2) == serial
    assert serial[0]["cls"]["main_score"] > serial[2]["cls"]["main_score"]  # less noise, better accuracy
