"""Step of rule ``tasks``: every offline evaluation task built once, probe sentences removed."""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..downstream.tasks import build_tasks
from ..io import atomic_write_json, file_sha256, read_sentences


def tasks_step(evaluate: dict[str, Any], sentences: str, out: str) -> None:
    """``data/eval/tasks.json``: every configured task, probe sentences removed (counted per task)."""
    built = build_tasks(evaluate, read_sentences(sentences))
    atomic_write_json(out, built | {"sentences_sha256": file_sha256(sentences), "encmap_version": __version__})
