"""Failure records: what a model left when it could not be embedded or scored (``on_error: skip``).

With ``embed.on_error: skip`` (or ``evaluate.on_error``) a model that cannot be loaded, embedded
or scored leaves ``<outdir>/failed.json`` in place of its per-encoder files: its id, the stage, the
error's message and its encoders. Every later per-encoder artifact of those encoders (PIP,
features) is a placeholder carrying the record in its ``failed`` attribute; ``gather`` leaves
them off the feature matrix, exactly like degenerate encoders, and lists them in
``results/features/failures.json`` and in ``qre.h5``'s ``failed`` attribute, which the map and the
pair stages read; ``regress`` reads the evaluation records. With ``stop`` the error names the
model and nothing is written for it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..io import read_json, swap_dir
from ..validation import EncmapError

#: The record's file name inside a model's output directory.
FAILED = "failed.json"

ON_ERROR = ("stop", "skip")

log = logging.getLogger("encmap")
T = TypeVar("T")


def error_text(e: BaseException) -> str:
    """One line naming the error: its type and its message (the first lines of it)."""
    msg = " ".join(str(e).split())[:500]
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def run_model(model: str, stage: str, on_error: str, work: Callable[[], T]) -> T | str:
    """Run one model's ``work``; on failure raise naming the model (``stop``) or return the
    error's text (``skip``), which the caller records with :func:`write_failure`."""
    if on_error not in ON_ERROR:
        raise EncmapError(f"{stage}.on_error must be one of {ON_ERROR}, got {on_error!r}")
    try:
        return work()
    except Exception as e:  # noqa: BLE001 (any failure of one model's load or forward pass)
        if on_error == "stop":
            if isinstance(e, EncmapError) and f"'{model}" in str(e):
                raise  # already names the model or one of its encoders
            hint = (f" (set {stage}.on_error: skip to record it and go on with the other models)"
                    if stage in ("embed", "evaluate") else "")
            raise EncmapError(f"model {model!r}: {stage} failed: {error_text(e)}{hint}") from e
        log.warning("model %r: %s failed, recorded and skipped (%s.on_error: skip): %s", model, stage, stage,
                    error_text(e))
        return error_text(e)


def write_failure(outdir: str | Path, model: str, stage: str, error: str, encoders: dict[str, dict[str, Any]],
                  sentences_sha256: str, n: int) -> None:
    """Replace ``outdir`` by a directory holding only the failure record (atomically).

    ``encoders``: the variants the model would have given, by id (their records), so that every
    per-encoder job downstream knows what it stands for.
    """
    record = {"model": model, "stage": stage, "error": error, "encoders": encoders,
              "sentences_sha256": sentences_sha256, "n": n}

    def write(tmp: Path) -> None:
        (tmp / FAILED).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    swap_dir(Path(outdir), write)


def read_failure(model_dir: str | Path) -> dict[str, Any] | None:
    """The failure record of a model's output directory, or None when the model succeeded."""
    f = Path(model_dir) / FAILED
    if not f.is_file():
        return None
    record = read_json(f, "delete the directory and rerun the stage")
    for key in ("model", "stage", "error", "encoders"):
        if key not in record:
            raise EncmapError(f"{f}: failure record without {key!r}; delete the directory and rerun the stage")
    if record["model"] != Path(model_dir).name:
        raise EncmapError(f"{f}: the failure record of model {record['model']!r}, read as model "
                          f"{Path(model_dir).name!r} (copied by hand?); delete it and rerun the stage")
    return record


def failed_attrs(record: dict[str, Any], encoder: str) -> dict[str, Any]:
    """Attributes of a placeholder per-encoder artifact standing for ``encoder`` of a failed model."""
    if encoder not in record["encoders"]:
        raise EncmapError(f"encoder {encoder!r} is not among the encoders of failed model {record['model']!r} "
                          f"({sorted(record['encoders'])}); rerun its {record['stage']} stage")
    return {"encoder_id": encoder, "encoder": record["encoders"][encoder], "model": record["model"],
            "sentences_sha256": record.get("sentences_sha256", ""), "degenerate": "",
            "failed": {"stage": record["stage"], "error": record["error"]}}


def failure_report(failed: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """One row per failed model (id, stage, error, its encoders) from per-encoder failure attributes."""
    by_model: dict[str, dict[str, Any]] = {}
    for e in sorted(failed):
        r = failed[e]
        by_model.setdefault(r["model"], {"model": r["model"], "stage": r["stage"], "error": r["error"],
                                         "encoders": []})["encoders"].append(e)
    return [by_model[m] for m in sorted(by_model)]

