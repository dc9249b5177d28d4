"""What the map says about each encoder: metadata fields, and the CSV tables of the map stage.

Pure data (records in, strings out); no file I/O. An encoder *record* is what
:func:`encmap.artifacts.features.encoder_record` stores in ``qre.h5``: ``id``, ``model``,
``layer``, ``pooling``, ``dim`` (truncation), ``d`` (width) and the model's ``meta``.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Sequence

import numpy as np

from ..io import csv_cell
from ..validation import EncmapError, lineage_cycle

#: Metadata fields a map can be coloured by, in column order.
FIELDS = ("model", "family", "architecture", "layer", "pooling", "dimension", "parameters",
          "languages", "objective", "kind")
#: Fields of catalogue entries (``encmap catalogue``), optional in ``meta``: empty where a model has none.
OPTIONAL_FIELDS = ("organisation", "language_scope", "license", "release_year", "instructions")
#: Fields whose values are numbers (coloured on a scale when they take many values).
NUMERIC_FIELDS = ("layer", "dimension", "parameters", "release_year")
#: Fields computed from every record at once: ``lineage`` is each model's lineage root (see :func:`lineage`).
DERIVED_FIELDS = ("lineage",)


def check_fields(fields: Sequence[str], what: str = "map.fields") -> list[str]:
    """Return ``fields`` if every one is a known metadata field, else raise naming the first unknown."""
    known = FIELDS + OPTIONAL_FIELDS + DERIVED_FIELDS
    bad = [f for f in fields if f not in known]
    if bad:
        raise EncmapError(f"{what}: unknown metadata field {bad[0]!r}; fields are {list(known)}")
    if not fields:
        raise EncmapError(f"{what}: name at least one metadata field")
    return list(fields)


def field_values(record: dict[str, Any]) -> dict[str, Any]:
    """One encoder's metadata fields (None where not applicable, e.g. the layer of an output)."""
    meta = record.get("meta") or {}
    missing = [k for k in ("family", "architecture", "parameters", "languages", "objective", "kind") if k not in meta]
    if missing:
        raise EncmapError(f"encoder {record.get('id')!r}: meta has no {missing[0]!r} (params.yaml models.<model>.meta)")
    langs = meta["languages"]
    return {
        "model": record["model"], "family": meta["family"], "architecture": meta["architecture"],
        "layer": record["layer"], "pooling": record["pooling"], "dimension": int(record["d"]),
        "parameters": meta["parameters"], "languages": ",".join(langs) if langs else "none",
        "objective": meta["objective"], "kind": meta["kind"],
    } | {f: meta.get(f) for f in OPTIONAL_FIELDS}


def coords_csv(ids: Sequence[str], coords: np.ndarray, records: Sequence[dict],
               same_as: Sequence[str | None] | None = None) -> str:
    """``encoder,x,y,<every field>,same_as``: one row per encoder, in the order given.

    ``same_as``: per encoder, the map encoder it is identical to and drawn on (empty: none).
    """
    same_as = [None] * len(ids) if same_as is None else list(same_as)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["encoder", "x", "y", *FIELDS, "same_as"])
    for e, (x, y), r, s in zip(ids, np.asarray(coords, dtype=np.float64), records, same_as):
        vals = field_values(r)
        w.writerow([e, csv_cell(float(x)), csv_cell(float(y)), *(csv_cell(vals[f]) for f in FIELDS), s or ""])
    return buf.getvalue()


def neighbours_csv(ids: Sequence[str], idx: np.ndarray, dist: np.ndarray, metric: str,
                   names: Sequence[str] | None = None) -> str:
    """``encoder,rank,neighbour,distance,metric``: the k nearest of every encoder.

    ``idx`` (m, k) indexes ``names`` (default ``ids``: neighbours among the same encoders).
    """
    names = ids if names is None else names
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["encoder", "rank", "neighbour", "distance", "metric"])
    for i, e in enumerate(ids):
        for r, (j, d) in enumerate(zip(idx[i], dist[i]), start=1):
            w.writerow([e, r, names[j], csv_cell(float(d)), metric])
    return buf.getvalue()


def layer_paths(records: Sequence[dict]) -> list[list[int]]:
    """Row indices of each (model, pooling) group's layer encoders, in layer order (>= 2 each)."""
    groups: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for i, r in enumerate(records):
        if r["layer"] is not None:
            groups.setdefault((r["model"], r["pooling"]), []).append((int(r["layer"]), i))
    return [[i for _, i in sorted(g)] for _, g in sorted(groups.items()) if len(g) >= 2]


def _representative(records: Sequence[dict]) -> dict[str, int]:
    """Row of each model's own output (no truncation), else its first row: where lineage edges end."""
    rep: dict[str, int] = {}
    for i, r in enumerate(records):
        if r["pooling"] == "output" and r["dim"] is None:
            rep[r["model"]] = i
        rep.setdefault(r["model"], i)
    return rep


def lineage(records: Sequence[dict]) -> tuple[list[str | None], list[tuple[int, int]]]:
    """Each encoder's lineage root, and the lineage edges between models on the map.

    A model's ``meta.derived_from.model`` names its parent: a model id of this map, or a hub id
    or name off the map. The root is the furthest ancestor reachable that way, so a distillation
    of all-MiniLM-L6-v2 shares its root with it; a model with no parent is its own root if a model
    on the map derives from it, and has none (None) otherwise.

    Returns
    -------
    roots : list of m (str or None)
    edges : list of (child_row, parent_row)
        One per model whose parent is on the map, between the two models' own outputs (a
        model without one: its first encoder).
    """
    parent: dict[str, str] = {}
    for r in records:
        d = (r.get("meta") or {}).get("derived_from")
        if d:
            parent[r["model"]] = str(d["model"])
    rep = _representative(records)

    cycle = lineage_cycle(parent)
    if cycle:
        raise EncmapError(f"meta.derived_from forms a cycle: {' -> '.join(cycle)}")

    def root(model: str) -> str:
        while model in parent:
            model = parent[model]
        return model

    has_child = set(parent.values())
    roots = {m: root(m) if (m in parent or m in has_child) else None for m in rep}
    edges = [(rep[c], rep[p]) for c, p in sorted(parent.items()) if p in rep and c in rep]
    return [roots[r["model"]] for r in records], edges


def field_column(records: Sequence[dict], field: str) -> list[Any]:
    """The values of one field (a metadata field or a derived one) for every record, in order."""
    if field == "lineage":
        return lineage(records)[0]
    return [field_values(r)[field] for r in records]
