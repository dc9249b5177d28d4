"""MTEB tasks by name, for every variant of a model from shared forward passes (I/O module, online).

``mteb.evaluate`` encodes a task's texts through the model object it is given, one model at a
time. Each variant of an encmap model is given to it as its own MTEB encoder, but they share one
cache of embeddings keyed by the exact texts, filled by a single multi-variant forward pass: the
first variant to see a list of texts embeds it for all of them. Task data comes from the
Hugging Face hub (online, or its local cache); results are not cached by mteb (``cache=None``)
so that DVC alone decides what is stale.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np

from ..validation import EncmapError


def load_mteb():
    """The ``mteb`` package, or an error that says how to install it."""
    try:
        import mteb
    except ImportError:
        raise EncmapError("evaluate.mteb_tasks needs the mteb package: pip install mteb==2.26.24 "
                          "(in requirements/lock.txt) and the Hugging Face hub online") from None
    return mteb


def mteb_tasks(names: list[str]) -> list[Any]:
    """MTEB task objects by name (their data loads from the hub when evaluated)."""
    mteb = load_mteb()
    try:
        return list(mteb.get_tasks(tasks=names))
    except (KeyError, ValueError) as e:
        raise EncmapError(f"evaluate.mteb_tasks: {e}") from None


class SharedPass:
    """Embeddings of every variant per exact list of texts, computed once by ``embed``.

    ``embed(texts)`` returns ``{encoder_id: array (len(texts), d)}`` for all variants of the
    model (one forward pass).
    """

    def __init__(self, embed: Callable[[list[str]], dict[str, np.ndarray]]):
        self.embed = embed
        self.passes = 0
        self._cache: dict[str, dict[str, np.ndarray]] = {}

    def get(self, texts: list[str], encoder: str) -> np.ndarray:
        key = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()
        if key not in self._cache:
            self._cache[key] = self.embed(texts)
            self.passes += 1
        return np.asarray(self._cache[key][encoder], dtype=np.float32)


def variant_encoder(encoder: str, shared: SharedPass):
    """An MTEB encoder (``AbsEncoder``: cosine similarity) that returns one variant's embeddings."""
    load_mteb()
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta

    class VariantEncoder(AbsEncoder):
        def __init__(self) -> None:
            self.model = None
            self.mteb_model_meta = ModelMeta(
                loader=None, name=f"encmap/{encoder}", revision="encmap", release_date=None, languages=None,
                n_parameters=None, memory_usage_mb=None, max_tokens=None, embed_dim=None, license=None,
                open_weights=None, public_training_code=None, public_training_data=None, framework=["PyTorch"],
                similarity_fn_name="cosine", use_instructions=False, training_datasets=None)

        def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
            texts = [t for batch in inputs for t in batch["text"]]
            return shared.get(texts, encoder)

    return VariantEncoder()


def run_mteb(tasks: list[Any], encoders: list[str], embed: Callable[[list[str]], dict[str, np.ndarray]],
             split: str = "test", shared: SharedPass | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Every encoder on every MTEB task: ``{encoder: {"mteb:<Task>": {main_score, metric, scores}}}``.

    The main score is the mean of MTEB's ``main_score`` over the task's subsets (languages) in
    ``split``. ``shared`` (default: a new one around ``embed``) holds the shared passes.
    """
    mteb = load_mteb()
    shared = shared or SharedPass(embed)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for e in encoders:
        res = mteb.evaluate(variant_encoder(e, shared), tasks, cache=None, show_progress_bar=False)
        out[e] = {}
        for tr in res.task_results:
            subsets = tr.scores.get(split)
            if not subsets:
                raise EncmapError(f"MTEB task {tr.task_name}: no '{split}' split in its results ({sorted(tr.scores)})")
            main = float(np.mean([s["main_score"] for s in subsets]))
            out[e][f"mteb:{tr.task_name}"] = {"main_score": main, "metric": "main_score",
                                               "scores": {"main_score": main, "subsets": len(subsets)}}
    return out
