"""Score tables from outside the pipeline (I/O module): a user's CSV, exported MTEB results, groups.

A score table is CSV with columns ``encoder,task,score``: one downstream score of one encoder on
the map. ``encmap mteb-scores`` writes one from MTEB's own result files (laid out
``<results>/<org__model>/<revision>/<TaskName>.json``, ``scores -> split -> [{main_score,
hf_subset, ...}]``), so published MTEB results join the regression as extra targets.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from ..validation import EncmapError


def read_table(path: str | Path, columns: tuple[str, ...], what: str) -> list[tuple[int, dict[str, str]]]:
    """A small CSV table's rows as (line number, {column: stripped value}), every value present.

    Excel's UTF-8 byte-order mark is dropped; a missing column, a short row, or bytes that are not
    UTF-8 are errors naming the file and the line.
    """
    p = Path(path)
    if not p.is_file():
        raise EncmapError(f"{what} {p}: file not found")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise EncmapError(f"{what} {p}: not UTF-8 ({e.reason} at byte {e.start})") from None
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or not set(columns) <= {f.strip() for f in reader.fieldnames}:
        raise EncmapError(f"{what} {p}: needs columns {','.join(columns)} (has {reader.fieldnames})")
    rows = []
    for i, row in enumerate(reader, start=2):
        row = {(k or "").strip(): v for k, v in row.items()}
        missing = [c for c in columns if row.get(c) is None or not str(row[c]).strip()]
        if missing:
            raise EncmapError(f"{what} {p} line {i}: no value for {missing[0]!r}")
        rows.append((i, {c: str(row[c]).strip() for c in columns}))
    return rows


def read_score_table(path: str | Path, encoders: list[str], tasks: list[str] | None = None) -> dict[str, dict[str, float]]:
    """A user's score table (CSV with columns ``encoder,task,score``), checked.

    Every encoder must be one of ``encoders``; with ``tasks`` given, every task must be one of
    them (the tasks its params entry declares). Errors name the file, the row and the value.
    """
    p = Path(path)
    known = set(encoders)
    out: dict[str, dict[str, float]] = {}
    for i, row in read_table(p, ("encoder", "task", "score"), "score table"):
        e, t = row["encoder"], row["task"]
        if e not in known:
            raise EncmapError(f"score table {p} line {i}: unknown encoder {e!r} (not on the map; "
                              f"`encmap encoders` lists them)")
        if tasks is not None and t not in tasks:
            raise EncmapError(f"score table {p} line {i}: unknown task {t!r} (declared for this table: {tasks})")
        try:
            v = float(row["score"])
        except ValueError:
            raise EncmapError(f"score table {p} line {i}: score {row['score']!r} is not a number") from None
        if not np.isfinite(v):
            raise EncmapError(f"score table {p} line {i}: score {row['score']!r} is not finite")
        if t in out.get(e, {}):
            raise EncmapError(f"score table {p} line {i}: encoder {e!r} task {t!r} appears twice")
        out.setdefault(e, {})[t] = v
    if not out:
        raise EncmapError(f"score table {p}: no rows")
    return out


def read_groups(path: str | Path, encoders: list[str]) -> list[str]:
    """Group of each encoder from a CSV with columns ``encoder,group`` (every encoder needs one)."""
    p = Path(path)
    g = {row["encoder"]: row["group"] for _, row in read_table(p, ("encoder", "group"), "groups table")}
    missing = [e for e in encoders if e not in g]
    if missing:
        raise EncmapError(f"groups table {p}: no group for encoder {missing[0]!r} ({len(missing)} missing)")
    return [g[e] for e in encoders]


def mteb_scores(results: str | Path, models: dict[str, str], split: str = "test") -> list[dict[str, object]]:
    """Rows ``{encoder, task, score}`` from an MTEB results directory.

    Parameters
    ----------
    results : path
        MTEB's results folder (``<org__model>/<revision>/<TaskName>.json`` beneath it).
    models : dict
        Encoder id on the map -> MTEB model name (``org/model`` or ``org__model``).
    split : str
        The split whose main scores are read (MTEB: ``test`` for most tasks).

    Returns
    -------
    list of dict
        One row per encoder and task: the mean of ``main_score`` over the task's subsets
        (languages) in ``split``. A task file without that split is skipped; a model folder
        that is missing, or has results of several revisions, is an error naming it.
    """
    root = Path(results)
    if not root.is_dir():
        raise EncmapError(f"MTEB results {root}: not a directory")
    rows = []
    for enc, name in sorted(models.items()):
        mdir = root / name.replace("/", "__")
        revs = sorted(p for p in mdir.iterdir() if p.is_dir()) if mdir.is_dir() else []
        if len(revs) != 1:
            raise EncmapError(f"MTEB results {mdir}: expected one revision folder for encoder {enc!r}, "
                              f"found {[r.name for r in revs]}")
        for f in sorted(revs[0].glob("*.json")):
            if f.name == "model_meta.json":
                continue
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
                subsets = data["scores"].get(split)
                if subsets is None:
                    continue
                values = [float(s["main_score"]) for s in subsets]
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
                raise EncmapError(f"MTEB result {f}: not an MTEB result file ({type(e).__name__}: {e})") from None
            if not values:
                raise EncmapError(f"MTEB result {f}: split {split!r} holds no subset, so no score")
            if not np.all(np.isfinite(values)):
                raise EncmapError(f"MTEB result {f}: a main_score of split {split!r} is not a number ({values})")
            score = float(np.mean(values))
            rows.append({"encoder": enc, "task": data.get("task_name", f.stem), "score": score})
    if not rows:
        raise EncmapError(f"MTEB results {root}: no '{split}' scores for any of {sorted(models.values())}")
    return rows


def score_table_text(rows: list[dict[str, object]]) -> str:
    """``encoder,task,score`` CSV text."""
    from ..io import csv_table

    return csv_table(rows, ["encoder", "task", "score"])


def held_out_scores(predictions: str | Path, protocol: str = "grouped", features: str = "qre",
                    regressor: str = "ridge") -> dict[str, list[tuple[str, float, float]]]:
    """Each encoder's measured and held-out predicted score per task, from the regression's predictions.csv.

    Only the rows of one protocol (default: grouped, i.e. the encoder's model held out), one
    feature set and one regressor: what the map page shows on hover.

    Returns
    -------
    dict
        encoder id -> [(task, measured, predicted), ...] in the file's task order.
    """
    rows = read_table(predictions, ("encoder", "task", "protocol", "features", "regressor", "actual", "predicted"),
                      "regression predictions")
    out: dict[str, list[tuple[str, float, float]]] = {}
    for line, r in rows:
        if (r["protocol"], r["features"], r["regressor"]) != (protocol, features, regressor):
            continue
        try:
            out.setdefault(r["encoder"], []).append((r["task"], float(r["actual"]), float(r["predicted"])))
        except ValueError:
            raise EncmapError(f"regression predictions {predictions}: line {line}: actual / predicted "
                              f"{r['actual']!r} / {r['predicted']!r} are not numbers") from None
    return out
