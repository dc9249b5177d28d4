"""Score tables from outside the pipeline (I/O module): a user's CSV, exported MTEB results, groups.

A score table is CSV with columns ``encoder,task,score``: one downstream score of one encoder on
the map. ``encmap mteb-scores`` writes one from MTEB's published results
(:mod:`encmap.downstream.mteb_results`, the reader the regress stage uses too), so they can join
any regression as targets.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from ..validation import EncmapError


def read_table(path: str | Path, columns: tuple[str, ...], what: str,
               optional: tuple[str, ...] = ()) -> list[tuple[int, dict[str, str]]]:
    """A small CSV table's rows as (line number, {column: stripped value}), every value present.

    Excel's UTF-8 byte-order mark is dropped; a missing column, a short row, or bytes that are not
    UTF-8 are errors naming the file and the line. ``optional`` columns may be absent or empty
    (their value is then "").
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
        rows.append((i, {c: str(row[c]).strip() for c in columns} | {c: str(row.get(c) or "").strip() for c in optional}))
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
    g: dict[str, str] = {}
    for i, row in read_table(p, ("encoder", "group"), "groups table"):
        if row["encoder"] in g:  # the last line would silently win
            raise EncmapError(f"groups table {p} line {i}: encoder {row['encoder']!r} appears twice")
        g[row["encoder"]] = row["group"]
    missing = [e for e in encoders if e not in g]
    if missing:
        raise EncmapError(f"groups table {p}: no group for encoder {missing[0]!r} ({len(missing)} missing)")
    return [g[e] for e in encoders]


def read_models_table(path: str | Path) -> dict[str, tuple[str, str | None]]:
    """``encoder -> (MTEB model name, revision or None)`` from a CSV ``encoder,mteb_model[,revision]``.

    An empty or absent revision means the registry's pinned one. An encoder listed twice is an
    error naming both lines (which MTEB model it is would otherwise depend on the row order).
    """
    p = Path(path)
    out: dict[str, tuple[str, str | None]] = {}
    line_of: dict[str, int] = {}
    for i, row in read_table(p, ("encoder", "mteb_model"), "--models", optional=("revision",)):
        e = row["encoder"]
        if e in out:
            raise EncmapError(f"--models {p} line {i}: encoder {e!r} is mapped twice (lines {line_of[e]} and {i})")
        line_of[e] = i
        out[e] = (row["mteb_model"], row["revision"] or None)
    if not out:
        raise EncmapError(f"--models {p}: no rows")
    return out


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
