"""Helpers shared by the pipeline steps: atomic directory swaps, per-encoder files, the feature matrix."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..io import read_h5
from ..validation import EncmapError


def swap_dir(out: Path, write) -> None:
    """Fill a temporary sibling directory with ``write(tmp)``, then swap it in for ``out``.

    Temporary names end in ``.tmp`` (ignored by git and DVC). A job killed mid-write leaves
    one behind; the next run of the same step removes it.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes 0700
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def encoder_file(indir: str | Path, encoder: str, what: str) -> Path:
    f = Path(indir) / f"{encoder}.h5"
    if not f.is_file():
        raise EncmapError(f"{f}: no {what} for encoder {encoder!r}; rerun the step that makes {indir}")
    return f


#: Attributes that follow an encoder from its embeddings through every per-encoder artifact.
CARRIED = ("encoder_id", "encoder", "model", "sentences_sha256", "degenerate")


def read_feature_matrix(path: str | Path) -> dict[str, Any]:
    """``results/features/qre.h5``: features (m, n), ids, encoder records and attributes."""
    data, attrs = read_h5(path, ["features", "encoder_ids", "encoders"])
    return {"F": data["features"], "ids": [str(x) for x in data["encoder_ids"]],
            "records": [json.loads(x) for x in data["encoders"]], "attrs": attrs}


def rounded(obj: Any, digits: int = 6) -> Any:
    """Metrics rounded for reading (NaN becomes null, which JSON can hold)."""
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, float):
        return None if not np.isfinite(obj) else round(obj, digits)
    return obj
