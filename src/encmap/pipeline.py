"""One function per pipeline step: read inputs, call the maths, write artifacts atomically.

``scripts/*.py`` are thin adapters that pass Snakemake's inputs, outputs and params here.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .io import read_h5, write_h5
from .validation import EncmapError


def curate_step(sentences: dict, txt: str, manifest: str, sha: str) -> None:
    """Build the sentence set described by ``params['sentences']``."""
    from itertools import chain

    from .sentences import curate, read_source, write_curated

    cands = chain.from_iterable(read_source(s) for s in sentences["sources"])
    weights = {s["name"]: s.get("weight", 1.0) for s in sentences["sources"]}
    cs = curate(cands, n=sentences["n"], seed=sentences["seed"], min_words=sentences["min_words"],
                max_words=sentences["max_words"], min_alpha=sentences["min_alpha"], weights=weights)
    write_curated(cs, txt, manifest, sha)


def embed_step(model: str, spec: dict, sentences_path: str, outdir: str, device: str = "auto",
               threads: int | None = None) -> list[str]:
    """Embed the sentence set with one model; write ``<outdir>/<encoder>.h5`` per variant.

    Every variant is computed and checked before anything is written, and the directory is
    swapped in whole, so a failing encoder leaves no partial artifact.
    """
    from .device import resolve_device
    from .models import embed_model, library_versions
    from .sentences import file_sha256, read_sentences

    if threads:
        import torch

        torch.set_num_threads(threads)  # the job's share of cores, not every core on the node
    texts = read_sentences(sentences_path)
    dev = resolve_device(device)
    res = embed_model(model, spec, texts, dev)
    sha = file_sha256(sentences_path)

    def write(tmp: Path) -> None:
        for v in res.variants:
            write_h5(tmp / f"{v.id}.h5", {"embeddings": res.arrays[v.id].astype(np.float32)}, {
                "encoder": v.to_dict() | {"spec": {k: spec[k] for k in sorted(spec)}},
                "encoder_id": v.id,
                "model": model,
                "provenance": res.provenance,
                "sentences_sha256": sha,
                "n": len(texts),
                "libraries": library_versions(),
                "encmap_version": __version__,
                "device_kind": dev.split(":")[0],
            })

    _swap_dir(Path(outdir), write)
    return [v.id for v in res.variants]


def _swap_dir(out: Path, write) -> None:
    """Fill a temporary sibling directory with ``write(tmp)``, then swap it in for ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes 0700
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _encoder_file(indir: str | Path, encoder: str, what: str) -> Path:
    f = Path(indir) / f"{encoder}.h5"
    if not f.is_file():
        raise EncmapError(f"{f}: no {what} for encoder {encoder!r}; rerun the step that makes {indir}")
    return f


def pip_step(emb_dir: str, encoder: str, out: str, *, tol: float, dense_max_n: int,
             threads: int | None = None) -> None:
    """Factored PIP (U, λ, trace, rank) of one encoder's embeddings ``<emb_dir>/<encoder>.h5``."""
    from threadpoolctl import threadpool_limits

    from .spectrum import factor_pip

    f = _encoder_file(emb_dir, encoder, "embeddings")
    data, attrs = read_h5(f, ["embeddings"])
    E = data["embeddings"]
    with threadpool_limits(threads):  # the job's share of cores when jobs run side by side
        spec = factor_pip(E, tol=tol, name=f"encoder {encoder!r} ({f})")
    ds: dict[str, Any] = {"U": spec.U, "lam": spec.lam}
    if E.shape[0] <= dense_max_n:
        ds["pip"] = spec.dense_pip()
    write_h5(out, ds, {
        "encoder_id": attrs["encoder_id"], "encoder": attrs["encoder"], "model": attrs["model"],
        "sentences_sha256": attrs["sentences_sha256"], "n": int(E.shape[0]), "d": int(E.shape[1]),
        "rank": spec.rank, "trace": spec.trace, "tol": tol, "encmap_version": __version__,
        "note": "rho = U diag(lam) U^T; PIP = trace * rho",
    })


def load_spectrum(path: str | Path):
    """Read a stored factored PIP back into a :class:`~encmap.spectrum.Spectrum`."""
    from .spectrum import spectrum_from_arrays

    data, attrs = read_h5(path, ["U", "lam"])
    return spectrum_from_arrays(data["U"], data["lam"], attrs["trace"]), attrs


def features_step(pip_file: str, out: str, *, direction: str, eps: float, threads: int | None = None) -> None:
    """QRE features (n,) of one encoder from its stored factored PIP."""
    from threadpoolctl import threadpool_limits

    from .qre import qre_features, qre_to_base

    spec, attrs = load_spectrum(pip_file)
    with threadpool_limits(threads):
        feats = qre_features(spec, direction=direction, eps=eps)
        to_base = qre_to_base(spec, direction=direction, eps=eps)
    write_h5(out, {"features": feats}, {
        "encoder_id": attrs["encoder_id"], "model": attrs["model"], "encoder": attrs["encoder"],
        "sentences_sha256": attrs["sentences_sha256"], "direction": direction, "eps": eps,
        "qre_to_base": to_base, "encmap_version": __version__,
    })


def gather_step(feature_files: list[str], out: str, metrics: str | None = None) -> None:
    """Stack per-encoder features (n,) into the m x n matrix ``results/features/qre.h5``."""
    if not feature_files:
        raise EncmapError(f"{out}: no encoder feature files to gather")
    files = sorted(map(Path, feature_files), key=lambda p: p.stem)
    rows, ids, meta = [], [], []
    first: dict[str, Any] | None = None
    for f in files:
        data, attrs = read_h5(f, ["features"])
        key = {k: attrs[k] for k in ("sentences_sha256", "direction", "eps")}
        if first is None:
            first = key
        elif key != first or data["features"].shape != rows[0].shape:
            raise EncmapError(f"{f}: features disagree with {files[0]} on {key} vs {first}; rerun the stale encoder")
        rows.append(data["features"])
        ids.append(attrs["encoder_id"])
        meta.append(float(attrs["qre_to_base"]))
    F = np.vstack(rows)
    write_h5(out, {"features": F, "encoder_ids": np.array(ids, dtype=object), "qre_to_base": np.array(meta)},
             first | {"m": F.shape[0], "n": F.shape[1], "encmap_version": __version__})
    if metrics:
        from .io import atomic_write_json

        atomic_write_json(metrics, {"encoders": len(ids), "n": int(F.shape[1]),
                                    "qre_to_base_mean": float(np.mean(meta)),
                                    "qre_to_base_min": float(np.min(meta)),
                                    "qre_to_base_max": float(np.max(meta))})


def describe(path: str) -> str:
    """Attributes of an artifact as JSON (for ``encmap show``)."""
    _, attrs = read_h5(path, [])
    return json.dumps(attrs, indent=2, default=str)
