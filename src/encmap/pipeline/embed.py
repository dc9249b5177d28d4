"""Step of rule ``embed``: one model's forward pass, every encoder variant of it written at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import __version__
from ..artifacts.failures import run_model, write_failure
from ..encoders.embed import embed_model, model_job_device
from ..encoders.result import library_versions
from ..encoders.variants import model_variants
from ..io import read_curated, swap_dir, write_h5


def embed_step(model: str, spec: dict, sentences_path: str, outdir: str, device: str = "auto",
               threads: int | None = None, degenerate: str = "error", n: int | None = None,
               on_error: str = "stop", forward: dict | None = None) -> list[str]:
    """Embed the sentence set with one model; write ``<outdir>/<encoder>.h5`` per variant.

    Every variant is computed and checked before anything is written, and the directory is
    swapped in whole, so a failing encoder leaves no partial artifact. A model that cannot be
    loaded or embedded stops the run naming it (``on_error: stop``) or leaves only a failure
    record (``skip``, :mod:`encmap.artifacts.failures`); then no encoder id is returned.
    ``forward``: the forward-pass settings (:func:`~encmap.encoders.embed.forward_settings`).
    """
    texts, sha = read_curated(sentences_path, n)  # a bad sentence set is never one model's failure
    used = []

    def work():
        with model_job_device(model, spec, device) as dev:  # a GPU of its own on a CUDA machine
            used.append(dev)
            return embed_model(model, spec, texts, dev, threads=threads, degenerate=degenerate, forward=forward)

    res = run_model(model, "embed", on_error, work)
    if isinstance(res, str):
        write_failure(outdir, model, "embed", res, {v.id: v.to_dict() for v in model_variants(model, spec)},
                      sha, len(texts))
        return []
    libraries = library_versions()  # the same for every variant: look them up once

    def write(tmp: Path) -> None:
        for v in res.variants:
            write_h5(tmp / f"{v.id}.h5", {"embeddings": np.asarray(res.arrays[v.id], dtype=np.float32)}, {
                "encoder": v.to_dict() | {"spec": {k: spec[k] for k in sorted(spec)}},
                "encoder_id": v.id,
                "model": model,
                "provenance": res.provenance,
                "degenerate": res.degenerate.get(v.id, ""),
                "sentences_sha256": sha,
                "n": len(texts),
                "libraries": libraries,
                "encmap_version": __version__,
                "device_kind": used[0].split(":")[0],
            })

    swap_dir(Path(outdir), write)
    return [v.id for v in res.variants]
