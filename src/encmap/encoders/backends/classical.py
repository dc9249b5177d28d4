"""Classical encoders: TF-IDF + truncated SVD (LSA), and averages of static token/word vectors."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import hub_provenance, model_id, resolve_source
from ..result import EmbeddingResult, output_only
from ..variants import model_variants

# Penn-Treebank-like tokens, as GloVe's corpora were tokenised: clitics split ("do" "n't",
# "john" "'s"), words with inner hyphens or dots kept whole, punctuation on its own.
_PTB = re.compile(r"n't\b|'(?:s|re|ve|ll|d|m)\b|\w+(?:[-.]\w+)*(?=n't\b)|\w+(?:[-.]\w+)*|[^\w\s]", re.I)


def ptb_tokens(text: str, lowercase: bool) -> list[str]:
    """Tokens of ``text`` the way GloVe's vocabulary spells them."""
    return _PTB.findall(text.lower() if lowercase else text)


def average_rows(table: np.ndarray, rows: list[list[int]]) -> np.ndarray:
    """Mean of ``table`` rows per sentence (n, d); a sentence with no known token gets zeros."""
    out = np.zeros((len(rows), table.shape[1]), dtype=np.float64)
    for i, r in enumerate(rows):
        if r:
            out[i] = table[r].mean(0, dtype=np.float64)
    return out.astype(np.float32)


#: This backend fits to a corpus (TF-IDF + SVD): ``embed`` takes ``fit_texts``.
FITTED = True


#: The last TF-IDF + SVD fitted to a corpus other than the texts it encodes, by its settings and
#: corpus: an evaluation embeds several text lists (each of MTEB's passes) with the encoder
#: fitted on the same curated sentences, and refitting it (a 512-component SVD of 10,000
#: sentences: ~30 s) for each list was most of the work. One entry bounds the memory.
_FITTED: dict[str, tuple] = {}


def _fit_tfidf_svd(model: str, spec: dict, kmax: int, texts: list[str]):
    """The fitted (vectorizer, svd) and the fit's embeddings (len(texts), kmax)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    t, s = spec["tfidf"], spec["svd"]
    vec = TfidfVectorizer(lowercase=t["lowercase"], sublinear_tf=t["sublinear_tf"], min_df=t["min_df"],
                          max_df=t["max_df"], ngram_range=tuple(t["ngram_range"]), norm=t["norm"])
    X = vec.fit_transform(texts)
    if kmax >= min(X.shape):
        raise EncmapError(f"model {model!r}: SVD size {kmax} must be below min(n, vocabulary) = {min(X.shape)}")
    # Components are ordered by singular value, so the smaller sizes are prefixes.
    svd = TruncatedSVD(n_components=kmax, algorithm=s["algorithm"], n_iter=s["n_iter"], random_state=spec["seed"])
    return vec, svd, svd.fit_transform(X)


def _tfidf_svd(model: str, spec: dict, texts: list[str], fit_texts: list[str] | None = None) -> EmbeddingResult:
    variants = model_variants(model, spec)
    kmax = max(v.dim for v in variants)
    if fit_texts is None:
        vec, svd, Z = _fit_tfidf_svd(model, spec, kmax, texts)
    else:  # the encoder fitted on ``fit_texts`` applied to other texts
        h = hashlib.sha256(json.dumps([spec["tfidf"], spec["svd"], spec["seed"], kmax], sort_keys=True).encode())
        for text in fit_texts:
            h.update(text.encode("utf-8") + b"\0")
        if h.hexdigest() not in _FITTED:
            _FITTED.clear()
            _FITTED[h.hexdigest()] = _fit_tfidf_svd(model, spec, kmax, fit_texts)[:2]
        vec, svd = _FITTED[h.hexdigest()]
        Z = svd.transform(vec.transform(texts))
    arrays = {v.id: np.ascontiguousarray(Z[:, : v.dim], dtype=np.float32) for v in variants}
    return EmbeddingResult(variants, arrays, {"source": "classical:tfidf-svd", "vocabulary": len(vec.vocabulary_)})


#: Names (suffixes) of a checkpoint's input token embedding table: BERT-likes, T5 / Llama-likes, GPT-2.
TOKEN_TABLES = ("word_embeddings.weight", "embed_tokens.weight", "wte.weight")


def local_token_table(ref: str) -> tuple[object, np.ndarray] | None:
    """A local checkpoint's fast tokenizer and input token embedding table (vocabulary, d), read with
    ``tokenizers`` and ``safetensors`` alone, or None where that cannot be done unambiguously (no
    tokenizer.json, no single safetensors file, not exactly one table): then transformers loads it.

    The same ids and the same float32 table as transformers' AutoTokenizer and AutoModel give
    (tests/test_encoders.py checks it byte for byte), without importing torch: a static model's
    jobs then cost seconds less each.
    """
    root = Path(ref)
    weights = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if len(weights) != 1 or not (root / "tokenizer.json").is_file():
        return None
    from safetensors import safe_open
    from tokenizers import Tokenizer

    with safe_open(str(weights[0]), framework="np") as f:
        names = [k for k in f.keys() if k.endswith(TOKEN_TABLES)]
        if len(names) != 1:
            return None
        table = f.get_tensor(names[0]).astype(np.float32, copy=False)
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()  # the file may carry a model's fixed padding and truncation; transformers
    tok.no_truncation()  # applies neither unless asked, and every token counts in the average
    return tok, table


def _static(model: str, spec: dict, texts: list[str]) -> EmbeddingResult:
    # Average of a pretrained model's input token (word-piece) embeddings.
    ref, prov = resolve_source(spec["source"], model)
    local = local_token_table(ref) if spec["revision"] is None else None
    if local is not None:
        tok, table = local
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    else:  # a hub id or a checkpoint the fast path cannot read unambiguously
        from transformers import AutoModel, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(ref, revision=spec["revision"])
        table = AutoModel.from_pretrained(ref, revision=spec["revision"]).get_input_embeddings().weight.detach().numpy()
        ids = tok(texts, add_special_tokens=False)["input_ids"]
    prov |= hub_provenance(spec["source"], spec["revision"], model)
    return output_only(model, spec, average_rows(table, ids), prov | {"model_id": model_id(spec["source"])})


def _word_vectors(model: str, spec: dict, texts: list[str]) -> EmbeddingResult:
    # Average of pretrained word vectors (GloVe): vectors in a .npy, the words in a parquet index.
    import pandas as pd

    ref, prov = resolve_source(spec["source"], model)
    root = Path(ref)
    vec_files, index_files = sorted(root.glob("*_emb.npy")), sorted(root.glob("*index.parquet"))
    if len(vec_files) != 1 or len(index_files) != 1:
        raise EncmapError(f"model {model!r}: {root} must hold one '*_emb.npy' and one '*index.parquet' "
                          f"(found {[f.name for f in vec_files + index_files]})")
    table = np.load(vec_files[0], mmap_mode="r")
    words = pd.read_parquet(index_files[0]).iloc[:, 0].tolist()
    if len(words) != table.shape[0]:
        raise EncmapError(f"model {model!r}: {index_files[0].name} has {len(words)} words but "
                          f"{vec_files[0].name} has {table.shape[0]} vectors")
    row = {w: i for i, w in enumerate(words)}
    toks = [ptb_tokens(t, spec["lowercase"]) for t in texts]
    rows = [[row[w] for w in ts if w in row] for ts in toks]
    n_tok = sum(map(len, toks))
    prov |= {"model_id": model_id(spec["source"]), "vocabulary": len(words),
             "token_coverage": round(sum(map(len, rows)) / max(n_tok, 1), 6),
             "sentences_without_known_word": sum(not r for r in rows)}
    return output_only(model, spec, average_rows(table, rows), prov)


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None,
          fit_texts: list[str] | None = None) -> EmbeddingResult:
    method = {"tfidf-svd": _tfidf_svd, "static": _static, "word-vectors": _word_vectors}.get(spec["method"])
    if method is None:
        raise EncmapError(f"model {model!r}: backend classical has no method {spec['method']!r}")
    if spec["method"] == "tfidf-svd":
        return _tfidf_svd(model, spec, texts, fit_texts)
    return method(model, spec, texts)
