"""Backbone steps: curate, embed, factor the PIP, QRE features, gather the feature matrix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..io import read_h5, write_h5
from ..validation import EncmapError
from .common import CARRIED, encoder_file, swap_dir


def curate_step(sentences: dict, txt: str, manifest: str, sha: str, sources: str | None = None) -> None:
    """Build the sentence set described by ``params['sentences']``.

    ``sources``: also write a TSV of every file each source was read from, with its sha256
    (what exactly went in: a Debian wordnet-base update or another Brown release shows here).
    """
    from itertools import chain

    from ..io import atomic_write_text
    from ..sentences import curate, read_source, source_files_tsv, write_curated

    cands = chain.from_iterable(read_source(s) for s in sentences["sources"])
    weights = {s["name"]: s["weight"] for s in sentences["sources"]}
    cs = curate(cands, n=sentences["n"], seed=sentences["seed"], min_words=sentences["min_words"],
                max_words=sentences["max_words"], min_alpha=sentences["min_alpha"], weights=weights)
    table = source_files_tsv(sentences["sources"]) if sources else None
    write_curated(cs, txt, manifest, sha)
    if sources:
        atomic_write_text(sources, table)


def embed_step(model: str, spec: dict, sentences_path: str, outdir: str, device: str = "auto",
               threads: int | None = None, degenerate: str = "error") -> list[str]:
    """Embed the sentence set with one model; write ``<outdir>/<encoder>.h5`` per variant.

    Every variant is computed and checked before anything is written, and the directory is
    swapped in whole, so a failing encoder leaves no partial artifact.
    """
    from ..models import embed_model, library_versions, model_device
    from ..sentences import file_sha256, read_sentences

    texts = read_sentences(sentences_path)
    dev = model_device(spec, device)
    res = embed_model(model, spec, texts, dev, threads=threads, degenerate=degenerate)
    sha = file_sha256(sentences_path)
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
                "device_kind": dev.split(":")[0],
            })

    swap_dir(Path(outdir), write)
    return [v.id for v in res.variants]


def pip_step(emb_dir: str, encoder: str, out: str, *, tol: float, dense_max_n: int, center: bool,
             normalize_rows: bool, threads: int | None = None) -> None:
    """Factored PIP (λ, trace, rank; V when it fits) of one encoder's embeddings ``<emb_dir>/<encoder>.h5``.

    The format (U derived on read from the embeddings) is :mod:`encmap.pipeline.spectra`'s.
    """
    from threadpoolctl import threadpool_limits

    from ..spectrum import factor_pip, prepare_embeddings
    from .spectra import write_pip

    f = encoder_file(emb_dir, encoder, "embeddings")
    data, attrs = read_h5(f, ["embeddings"])
    name = f"encoder {encoder!r} ({f})"
    E = prepare_embeddings(data["embeddings"], center=center, normalize_rows=normalize_rows, name=name)
    with threadpool_limits(threads):  # the job's share of cores when jobs run side by side
        spec = factor_pip(E, tol=tol, method="svd", name=name)
    write_pip(out, spec, f, dense=E.shape[0] <= dense_max_n, attrs={k: attrs.get(k, "") for k in CARRIED} | {
        "tol": tol, "center": center, "normalize_rows": normalize_rows, "encmap_version": __version__})


def features_step(pip_file: str, out: str, *, direction: str, eps: float, threads: int | None = None) -> None:
    """QRE features (n,) of one encoder from its stored factored PIP."""
    from threadpoolctl import threadpool_limits

    from ..qre import qre_features, qre_to_base
    from .spectra import load_spectrum

    with threadpool_limits(threads):
        spec, attrs = load_spectrum(pip_file)  # derives U from the embeddings: part of the job's work
        feats = qre_features(spec, direction=direction, eps=eps)
        to_base = qre_to_base(spec, direction=direction, eps=eps)
    write_h5(out, {"features": feats}, {k: attrs.get(k, "") for k in CARRIED} | {
        "d": int(attrs["d"]), "direction": direction, "eps": eps,
        "qre_to_base": to_base, "encmap_version": __version__,
    })


def gather_step(feature_files: list[str], out: str, metrics: str | None = None) -> None:
    """Stack per-encoder features (n,) into the m x n matrix ``results/features/qre.h5``.

    ``encoders`` holds one JSON record per row (model, layer, pooling, truncation, width d and
    the model's ``meta``), so the map labels each point from the artifact it was computed from.
    Encoders marked degenerate (``embed.degenerate: drop``) are left out, named in the log,
    in the file's ``dropped`` attribute and in the metrics.
    """
    import sys

    if not feature_files:
        raise EncmapError(f"{out}: no encoder feature files to gather")
    files = sorted(map(Path, feature_files), key=lambda p: p.stem)
    rows, ids, meta, encoders, dropped = [], [], [], [], {}
    first: dict[str, Any] | None = None
    for f in files:
        data, attrs = read_h5(f, ["features"])
        key = {k: attrs[k] for k in ("sentences_sha256", "direction", "eps")} | {"n": len(data["features"])}
        if first is None:
            first = key
        elif key != first:
            raise EncmapError(f"{f}: features disagree with {files[0]} on {key} vs {first}; rerun the stale encoder")
        if attrs.get("degenerate"):
            dropped[attrs["encoder_id"]] = attrs["degenerate"]
            print(f"warning: encoder {attrs['encoder_id']!r} left off the map: {attrs['degenerate']}", file=sys.stderr)
            continue
        rows.append(data["features"])
        ids.append(attrs["encoder_id"])
        meta.append(float(attrs["qre_to_base"]))
        encoders.append(json.dumps(encoder_record(attrs), sort_keys=True))
    if not rows:
        raise EncmapError(f"{out}: every encoder is degenerate ({sorted(dropped)}); nothing to map")
    F = np.vstack(rows)
    write_h5(out, {"features": F, "encoder_ids": np.array(ids, dtype=object), "qre_to_base": np.array(meta),
                   "encoders": np.array(encoders, dtype=object)},
             first | {"m": F.shape[0], "dropped": dropped, "encmap_version": __version__})
    if metrics:
        from ..io import atomic_write_json

        atomic_write_json(metrics, {"encoders": len(ids), "dropped_encoders": len(dropped), "n": int(F.shape[1]),
                                    "qre_to_base_mean": float(np.mean(meta)),
                                    "qre_to_base_min": float(np.min(meta)),
                                    "qre_to_base_max": float(np.max(meta))})


def encoder_record(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the map shows about an encoder, from the attributes its artifacts carry."""
    enc = json.loads(attrs["encoder"]) if isinstance(attrs["encoder"], str) else attrs["encoder"]
    return {"id": enc["id"], "model": enc["model"], "layer": enc["layer"], "pooling": enc["pooling"],
            "dim": enc["dim"], "d": int(attrs["d"]), "meta": enc["spec"]["meta"]}


def describe(path: str) -> str:
    """Attributes of an artifact as JSON (for ``encmap show``)."""
    _, attrs = read_h5(path, [])
    return json.dumps(attrs, indent=2, default=str)
