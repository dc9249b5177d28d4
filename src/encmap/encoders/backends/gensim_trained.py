"""word2vec, fastText and doc2vec trained by the pipeline with gensim (backend ``gensim``).

Each model is trained on :func:`encmap.encoders.training.training_texts` of ``train.corpus`` (no
evaluation item by construction), at the sizes and training lengths params give, so that quality
varies by design. Training is single-threaded (``workers=1``) and seeded, and every seed gensim
would take from Python's ``hash()`` (randomised per process) comes from a sha256 instead, so a
rerun gives byte-identical vectors. The trained model is kept in the encmap cache
(:func:`~encmap.encoders.checkpoints.made_model`), so ``embed`` and ``evaluate`` share it.

Sentence vectors: word2vec and fastText average the vectors of a sentence's tokens (fastText
builds unseen words from character n-grams; word2vec skips them, and a sentence with no known
word gets zeros); doc2vec infers a vector per sentence (``infer_vector``), its random start and
negative samples seeded by the sentence itself, so a sentence's vector does not depend on the
sentences inferred before it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import threading
from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import made_model
from ..result import EmbeddingResult, output_only
from ..training import texts_sha256, tokens, training_texts
from ..variants import check_model_spec
from .classical import average_rows

#: train.algorithm -> (gensim method, its switch): word2vec/fastText sg, doc2vec dm.
ALGORITHMS = {
    "word2vec": {"cbow": ("sg", 0), "skipgram": ("sg", 1)},
    "fasttext": {"cbow": ("sg", 0), "skipgram": ("sg", 1)},
    "doc2vec": {"pv-dm": ("dm", 1), "pv-dbow": ("dm", 0)},
}


def stable_hash(text: str) -> int:
    """A 32-bit seed from ``text`` that is the same in every process (unlike ``hash()``)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little")


def _model_class(method: str):
    from gensim.models import Doc2Vec, FastText, Word2Vec

    return {"word2vec": Word2Vec, "fasttext": FastText, "doc2vec": Doc2Vec}[method]


def train(method: str, train_spec: dict, seed: int, texts: list[str]):
    """A gensim model trained on ``texts`` (a fixed order), deterministically.

    Parameters
    ----------
    method : {"word2vec", "fasttext", "doc2vec"}
    train_spec : dict
        ``algorithm``, ``vector_size``, ``window``, ``min_count``, ``epochs``, ``negative``, ``sample``;
        fasttext also ``bucket``.
    seed : int
    texts : list of str
        Training documents; doc2vec tags each by its position.
    """
    if method not in ALGORITHMS:
        raise EncmapError(f"backend gensim has no method {method!r} (known: {sorted(ALGORITHMS)})")
    t = train_spec
    switch, value = ALGORITHMS[method].get(t["algorithm"], (None, None))
    if switch is None:
        raise EncmapError(f"gensim {method}: algorithm {t['algorithm']!r} unknown (known: {sorted(ALGORITHMS[method])})")
    docs = [tokens(x) for x in texts]
    if method == "doc2vec":
        from gensim.models.doc2vec import TaggedDocument

        docs = [TaggedDocument(d, [i]) for i, d in enumerate(docs)]
    kw = dict(vector_size=t["vector_size"], window=t["window"], min_count=t["min_count"], epochs=t["epochs"],
              negative=t["negative"], sample=t["sample"], seed=seed, workers=1, hashfxn=stable_hash)
    if method == "fasttext":
        kw["bucket"] = t["bucket"]
    return _model_class(method)(docs, **kw, **{switch: value})


def _mean_vectors(model, method: str, texts: list[str]) -> np.ndarray:
    wv = model.wv
    toks = [tokens(x) for x in texts]
    vocab = sorted({w for ts in toks for w in ts if method == "fasttext" or w in wv.key_to_index})
    if not vocab:
        return np.zeros((len(texts), wv.vector_size), np.float32)
    row = {w: i for i, w in enumerate(vocab)}
    table = np.stack([wv[w] for w in vocab])
    return average_rows(table, [[row[w] for w in ts if w in row] for ts in toks])


_INFER_LOCK = threading.Lock()  # see _inferred_vectors


def _inferred_vectors(model, texts: list[str]) -> np.ndarray:
    from functools import partial

    import gensim.models.doc2vec as d2v
    from gensim.models.keyedvectors import pseudorandom_weak_vector

    # infer_vector seeds its starting vector with hash() of the words, and its negative samples
    # from the model's RandomState, which every call advances: both are re-seeded per sentence.
    # The seeding function is a module global: the lock keeps two doc2vec embed jobs running side
    # by side in Snakemake's process from restoring it under each other (a sentence inferred
    # after the other job restored it got a hash()-seeded start: runs that differed by ~1e-2).
    with _INFER_LOCK:
        patched, d2v.pseudorandom_weak_vector = d2v.pseudorandom_weak_vector, partial(pseudorandom_weak_vector,
                                                                                      hashfxn=stable_hash)
        try:
            out = np.empty((len(texts), model.vector_size), np.float32)
            for i, x in enumerate(texts):
                model.random = np.random.RandomState(stable_hash(x))
                out[i] = model.infer_vector(tokens(x))
        finally:
            d2v.pseudorandom_weak_vector = patched
    return out


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None) -> EmbeddingResult:
    try:
        import gensim
    except ImportError:
        raise EncmapError(f"model {model!r}: backend gensim needs gensim (pip install gensim)") from None
    check_model_spec(model, spec)  # before minutes of training: a key missing for this method
    method, t = spec["method"], spec["train"]
    corpus = training_texts(t["corpus"])
    key = {"method": method, "train": t, "seed": spec["seed"], "corpus_sha256": texts_sha256(corpus),
           "versions": {lib: md.version(lib) for lib in ("gensim", "numpy")}}

    def build(out: Path) -> None:
        train(method, t, spec["seed"], corpus).save(str(out / "model"))

    path, sha = made_model("gensim", key, build, model)
    m = _model_class(method).load(str(path / "model"))
    full = _inferred_vectors(m, texts) if method == "doc2vec" else _mean_vectors(m, method, texts)
    prov = {"source": f"trained:gensim-{method}", "corpus": t["corpus"], "corpus_sha256": key["corpus_sha256"],
            "training_documents": len(corpus), "vocabulary": len(m.wv.key_to_index), "trained_sha256": sha,
            "gensim": gensim.__version__}
    return output_only(model, spec, full, prov)
