"""The feature matrix ``results/features/qre.h5``: QRE features (m, n) and one record per encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..io import h5_datasets, read_h5
from ..validation import EncmapError, check_unique_ids


#: What the matrix holds beside the features of each encoder: its spectrum's summaries
#: (:mod:`encmap.qre.spectral`): ``entropy`` (m,), ``profile`` (m, 16), ``head`` (m, 32),
#: ``log_rank`` (m,) and ``log_scale`` (m,): ln(tr M / n), the scale ρ = M / tr M leaves out.
SPECTRAL = ("entropy", "profile", "head", "log_rank", "log_scale")
#: Of those, the ones each encoder's features file holds as datasets (the others are attributes).
SPECTRAL_ARRAYS = ("profile", "head")


def read_feature_matrix(path: str | Path, require_records: bool = True) -> dict[str, Any]:
    """``results/features/qre.h5``: features (m, n), ids, encoder records, attributes, and the
    spectral summaries (``spectral``: :data:`SPECTRAL` by name, e.g. ``{"entropy": (m,),
    "profile": (m, 16), ...}``; those it has: none for a user's own matrix).

    ``require_records=False``: any matrix with datasets ``features`` (m, n) and ``encoder_ids``
    (m) is read (``records`` None when it has no ``encoders``), e.g. a user's own for ``encmap
    regress``.
    """
    _, attrs = read_h5(path, [])
    names = ["features", "encoder_ids"]
    present = h5_datasets(path)
    with_records = require_records or "encoders" in present
    spectral = [k for k in SPECTRAL if k in present]
    data, _ = read_h5(path, names + (["encoders"] if with_records else []) + spectral)
    F, ids = np.asarray(data["features"]), [str(x) for x in data["encoder_ids"]]
    if F.ndim != 2 or F.shape[0] != len(ids):
        raise EncmapError(f"{path}: features of shape {F.shape} for {len(ids)} encoder_ids; expected (m, n) with "
                          "one row per id")
    check_unique_ids(ids, f"{path}: dataset 'encoder_ids'")
    summaries = {k: np.asarray(data[k], dtype=np.float64) for k in spectral}
    bad = [k for k, v in summaries.items() if v.shape[0] != len(ids)]
    if bad:
        raise EncmapError(f"{path}: dataset {bad[0]!r} has {summaries[bad[0]].shape[0]} rows for {len(ids)} encoders")
    return {"F": F, "ids": ids, "records": [json.loads(x) for x in data["encoders"]] if with_records else None,
            "attrs": attrs, "spectral": summaries}


def left_off(attrs: dict[str, Any]) -> list[str]:
    """The encoders ``gather`` left off the matrix whose attributes are ``attrs``: those of models
    that failed (``on_error: skip``, attribute ``failed``), then the degenerate ones (``dropped``)."""
    out = []
    for key in ("failed", "dropped"):
        value = attrs.get(key) or "{}"
        out += sorted(json.loads(value) if isinstance(value, str) else value)
    return out


def encoder_record(attrs: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """What the map shows about an encoder: the attributes its artifacts carry, and its model's meta.

    A record holds ``id``, ``model``, ``layer``, ``pooling``, ``dim`` (truncation), ``d``
    (width) and the model's ``meta`` (from params: the artifacts carry no description).
    """
    enc = json.loads(attrs["encoder"]) if isinstance(attrs["encoder"], str) else attrs["encoder"]
    return {"id": enc["id"], "model": enc["model"], "layer": enc["layer"], "pooling": enc["pooling"],
            "dim": enc["dim"], "d": int(attrs["d"]), "meta": meta}


def read_pairwise_qre(pairwise: str | Path, fm: dict[str, Any]) -> np.ndarray:
    """The directed exact QRE matrix (m, m) of ``results/similarity/qre_pairwise.h5``, checked to
    describe the feature matrix ``fm``'s encoders (same order), sentence set and eps."""
    pw, pattrs = read_h5(pairwise, ["qre", "encoder_ids"])
    if list(map(str, pw["encoder_ids"])) != fm["ids"] or pattrs["sentences_sha256"] != fm["attrs"]["sentences_sha256"] \
            or float(pattrs["eps"]) != float(fm["attrs"]["eps"]):
        raise EncmapError(f"{pairwise} and the feature matrix describe different encoders, sentence sets or eps "
                          f"({pattrs['sentences_sha256'][:12]}… vs {fm['attrs']['sentences_sha256'][:12]}…); "
                          "rerun the pairwise stage")
    return np.asarray(pw["qre"], dtype=np.float64)
