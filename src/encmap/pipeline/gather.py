"""Step of rule ``gather``: every encoder's features stacked into the m x n matrix ``results/features/qre.h5``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..artifacts.embeddings import check_is_encoder
from ..artifacts.failures import failure_report
from ..artifacts.features import SPECTRAL, SPECTRAL_ARRAYS, encoder_record
from ..io import atomic_write_json, read_h5, write_h5
from ..validation import EncmapError


def gather_step(feature_files: list[str], out: str, metrics: str | None = None, failures: str | None = None,
                meta: dict[str, dict] | None = None) -> None:
    """Stack per-encoder features (n,) into the m x n matrix ``results/features/qre.h5``.

    ``entropy`` (m,), ``profile`` (m, 16), ``head`` (m, 32) and ``log_rank`` (m,) hold each
    encoder's spectral summaries (the regression's spectral baselines). ``encoders`` holds one JSON record per row (model, layer, pooling, truncation, width d and
    the model's ``meta``, given by model id from params: a description changes no computation,
    so it is read here and not carried by the per-encoder artifacts).
    Encoders marked degenerate (``embed.degenerate: drop``) are left out, named in the log,
    in the file's ``dropped`` attribute and in the metrics. So are the encoders of models that
    failed under ``embed.on_error: skip``: in the ``failed`` attribute, the metrics and the
    report ``failures`` (one row per model: id, stage, error, encoders).
    """
    if not feature_files:
        raise EncmapError(f"{out}: no encoder feature files to gather")
    files = sorted(map(Path, feature_files), key=lambda p: p.stem)
    rows, ids, to_base, encoders, dropped = [], [], [], [], {}
    spectral: dict[str, list] = {k: [] for k in SPECTRAL}
    failed: dict[str, dict[str, str]] = {}
    first: dict[str, Any] | None = None
    seen: dict[str, Path] = {}
    for f in files:
        data, attrs = read_h5(f)  # one read per file: a failed model's placeholder holds no dataset
        check_is_encoder(f, attrs, f.stem, "features", f.parent.name)
        if f.stem in seen:
            raise EncmapError(f"{f}: encoder {f.stem!r} is gathered twice (also {seen[f.stem]})")
        seen[f.stem] = f
        if attrs.get("failed"):
            failed[f.stem] = json.loads(attrs["failed"]) | {"model": attrs["model"]}
            continue
        if "features" not in data:
            raise EncmapError(f"{f}: no dataset 'features' (has {sorted(data)}); rerun the 'features' rule for it")
        key = {k: attrs[k] for k in ("sentences_sha256", "direction", "eps")} | {"n": len(data["features"])}
        if first is None:
            first = key
        elif key != first:
            raise EncmapError(f"{f}: features disagree with {files[0]} on {key} vs {first}; rerun the stale encoder")
        if attrs.get("degenerate"):
            dropped[attrs["encoder_id"]] = attrs["degenerate"]
            print(f"warning: encoder {attrs['encoder_id']!r} left off the map: {attrs['degenerate']}", file=sys.stderr)
            continue
        missing = [k for k in SPECTRAL if k not in (data if k in SPECTRAL_ARRAYS else attrs)]
        if missing:
            raise EncmapError(f"{f}: no {missing[0]!r} (features made by an older encmap); rerun the 'features' rule")
        rows.append(data["features"])
        for k in SPECTRAL:
            spectral[k].append(data[k] if k in SPECTRAL_ARRAYS else float(attrs[k]))
        ids.append(attrs["encoder_id"])
        to_base.append(float(attrs["qre_to_base"]))
        if meta is None or attrs["model"] not in meta:
            raise EncmapError(f"{f}: model {attrs['model']!r} has no meta among the gathered models' "
                              f"({sorted(meta or {})[:5]}...); is it still in params.yaml?")
        encoders.append(json.dumps(encoder_record(attrs, meta[attrs["model"]]), sort_keys=True))
    report = failure_report(failed)
    for r in report:
        print(f"warning: model {r['model']!r} left off the map ({r['stage']} failed: {r['error']}): "
              f"{len(r['encoders'])} encoder(s)", file=sys.stderr)
    if not rows:
        raise EncmapError(f"{out}: no encoder to map: degenerate {sorted(dropped)}, failed {sorted(failed)}")
    F = np.vstack(rows)
    write_h5(out, {"features": F, "encoder_ids": np.array(ids, dtype=object), "qre_to_base": np.array(to_base),
                   "encoders": np.array(encoders, dtype=object)}
             | {k: np.vstack(v) if k in SPECTRAL_ARRAYS else np.array(v) for k, v in spectral.items()},
             first | {"m": F.shape[0], "dropped": dropped, "failed": failed, "encmap_version": __version__})
    if failures:
        atomic_write_json(failures, {"failures": report})
    if metrics:
        atomic_write_json(metrics, {"encoders": len(ids), "dropped_encoders": len(dropped),
                                    "failed_encoders": len(failed), "failed_models": len(report),
                                    "n": int(F.shape[1]),
                                    "qre_to_base_mean": float(np.mean(to_base)),
                                    "qre_to_base_min": float(np.min(to_base)),
                                    "qre_to_base_max": float(np.max(to_base))})
