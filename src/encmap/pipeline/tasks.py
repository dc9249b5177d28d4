"""Step of rule ``tasks``: every offline evaluation task built once, probe sentences removed."""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..downstream.tasks import build_tasks
from ..io import atomic_write_json, read_curated


def tasks_step(evaluate: dict[str, Any], sentences: str, out: str, n: int | None = None) -> None:
    """``data/eval/tasks.json``: every configured task, probe sentences removed (counted per task).

    ``n``: params ``sentences.n``, checked against the curated set.
    """
    probes, sha = read_curated(sentences, n)
    built = build_tasks(evaluate, probes)
    atomic_write_json(out, built | {"sentences_sha256": sha, "encmap_version": __version__})
