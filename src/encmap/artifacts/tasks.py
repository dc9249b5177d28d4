"""The evaluation tasks file ``data/eval/tasks.json``: every task built once, read by each ``evaluate`` job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..validation import EncmapError


def read_tasks(path: str | Path) -> dict[str, Any]:
    """``data/eval/tasks.json`` as built by the ``tasks`` step; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise EncmapError(f"{p}: evaluation tasks not found; run the 'tasks' rule first")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EncmapError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None


def task_texts(task: dict[str, Any]) -> list[str]:
    """Every text one task needs embedded."""
    if task["type"] == "retrieval":
        return task["queries"] + task["corpus"]
    return task["texts"]
