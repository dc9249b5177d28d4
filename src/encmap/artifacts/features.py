"""The feature matrix ``results/features/qre.h5``: QRE features (m, n) and one record per encoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..io import read_h5


def read_feature_matrix(path: str | Path) -> dict[str, Any]:
    """``results/features/qre.h5``: features (m, n), ids, encoder records and attributes."""
    data, attrs = read_h5(path, ["features", "encoder_ids", "encoders"])
    return {"F": data["features"], "ids": [str(x) for x in data["encoder_ids"]],
            "records": [json.loads(x) for x in data["encoders"]], "attrs": attrs}


def encoder_record(attrs: dict[str, Any]) -> dict[str, Any]:
    """What the map shows about an encoder, from the attributes its artifacts carry.

    A record holds ``id``, ``model``, ``layer``, ``pooling``, ``dim`` (truncation), ``d``
    (width) and the model's ``meta``.
    """
    enc = json.loads(attrs["encoder"]) if isinstance(attrs["encoder"], str) else attrs["encoder"]
    return {"id": enc["id"], "model": enc["model"], "layer": enc["layer"], "pooling": enc["pooling"],
            "dim": enc["dim"], "d": int(attrs["d"]), "meta": enc["spec"]["meta"]}
