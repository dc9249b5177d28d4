"""The evaluation tasks file ``data/eval/tasks.json``: every task built once, read by each ``evaluate`` job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..io import read_json
from ..validation import EncmapError


def read_tasks(path: str | Path) -> dict[str, Any]:
    """``data/eval/tasks.json`` as built by the ``tasks`` step; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise EncmapError(f"{p}: evaluation tasks not found; run the 'tasks' rule first")
    return read_json(p)


def task_texts(task: dict[str, Any]) -> list[str]:
    """Every text one task needs embedded."""
    if task["type"] == "retrieval":
        return task["queries"] + task["corpus"]
    return task["texts"]
