"""Which encoders and which pairs the costly comparisons (RBF CKA, stitches) run on.

Pure data: encoder records in, ids and pairs out; no I/O. A record is what
:func:`encmap.artifacts.features.encoder_record` stores in ``qre.h5`` (``id``, ``model``,
``layer``, ``pooling``, ``dim``, ``d``, ``meta``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..maps.distances import feature_distances, nearest_neighbours
from ..validation import EncmapError, few, fit_to_mapped

#: Named groups of encoders (params ``similarity.subset.groups``).
GROUPS = ("outputs", "middle", "classical", "controls", "all")


def _kind(r: dict[str, Any]) -> str:
    return (r.get("meta") or {}).get("kind", "")


def _is_output(r: dict[str, Any]) -> bool:
    return r["pooling"] == "output" and r["dim"] is None


def _middle(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The hidden layer nearest the middle of the model's layers (lower on a tie), mean-pooled
    if the model has mean pooling, else in its first pooling."""
    layered = [r for r in rs if r["layer"] is not None]
    if not layered:
        return None
    pooling = "mean" if any(r["pooling"] == "mean" for r in layered) else layered[0]["pooling"]
    layered = [r for r in layered if r["pooling"] == pooling]
    top = max(r["layer"] for r in layered)
    return min(layered, key=lambda r: (abs(r["layer"] - top / 2), r["layer"]))


def select_group(records: Sequence[dict[str, Any]], group: str) -> list[str]:
    """Encoder ids of one named group, in the order of ``records``.

    - ``outputs``: each pretrained model's own output (no truncation);
    - ``middle``: each pretrained model's middle hidden layer (mean-pooled where it can be);
    - ``classical``: every classical encoder;
    - ``controls``: each control model's output (its middle layer if it has no output);
    - ``all``: every encoder.
    """
    if group not in GROUPS:
        raise EncmapError(f"similarity.subset.groups: unknown group {group!r}; groups are {list(GROUPS)}")
    if group == "all":
        return [r["id"] for r in records]
    if group == "classical":
        return [r["id"] for r in records if _kind(r) == "classical"]
    by_model: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_model.setdefault(r["model"], []).append(r)
    kind = "control" if group == "controls" else "pretrained"
    chosen = set()
    for rs in by_model.values():
        if _kind(rs[0]) != kind:
            continue
        out = next((r for r in rs if _is_output(r)), None)
        pick = _middle(rs) if group == "middle" or out is None else out
        if pick is not None:
            chosen.add(pick["id"])
    return [r["id"] for r in records if r["id"] in chosen]


def select_pairs(records: Sequence[dict[str, Any]], groups: Sequence[str], encoders: Sequence[str] = (),
                 neighbours: np.ndarray | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """The subset of encoders and the ordered (source, target) pairs to compare.

    Parameters
    ----------
    records : m encoder records (the map's rows)
    groups : named groups (:data:`GROUPS`) whose encoders form the subset
    encoders : extra encoder ids for the subset
    neighbours : int ndarray (m, k), optional
        Each encoder's k nearest encoders on the map (row indices); adds the pairs (i, j) and
        (j, i) for every encoder i and each of its neighbours j.

    Returns
    -------
    ids : encoders in any pair, in the order of ``records``
    pairs : ordered pairs, every two subset encoders both ways plus the neighbour pairs, sorted
        by the records' order
    """
    order = {r["id"]: i for i, r in enumerate(records)}
    unknown = [e for e in encoders if e not in order]
    if unknown:
        raise EncmapError(f"similarity.subset.encoders: encoder {unknown[0]!r} is not on the map")
    subset = set(encoders)
    for g in groups:
        subset.update(select_group(records, g))
    pairs = {(a, b) for a in subset for b in subset if a != b}
    if neighbours is not None:
        for i, row in enumerate(np.asarray(neighbours)):
            for j in row:
                a, b = records[i]["id"], records[int(j)]["id"]
                pairs |= {(a, b), (b, a)}
    if not pairs:
        raise EncmapError("similarity.subset selects fewer than two encoders: no pair to compare")
    ids = sorted({e for p in pairs for e in p}, key=order.__getitem__)
    return ids, sorted(pairs, key=lambda p: (order[p[0]], order[p[1]]))


def subset_on_map(subset: dict[str, Any], ids: Sequence[str], off: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``similarity.subset`` for the m encoders ``ids`` on a map from which the run left ``off`` some
    (failed models under ``on_error: skip``, degenerate encoders), and warnings saying what changed.

    ``encmap check`` held the subset to every encoder params yield: a named encoder the run left
    off is compared no more, and ``neighbours`` is lowered to what m encoders allow
    (:func:`~encmap.validation.fit_to_mapped`). An encoder params never had is still refused.
    """
    subset, notes = dict(subset), []
    gone = [e for e in subset["encoders"] if e in set(off)]
    if gone:
        subset["encoders"] = [e for e in subset["encoders"] if e not in gone]
        notes.append(f"similarity.subset.encoders: {few(gone)} left off by the run (a failed model or a degenerate "
                     "encoder); compared without")
    subset["neighbours"], note = fit_to_mapped("similarity.subset.neighbours", subset["neighbours"], len(ids), off)
    return subset, notes + ([note] if note else [])


def subset_pairs(records: Sequence[dict[str, Any]], F: np.ndarray,
                 subset: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]]]:
    """The encoders and ordered pairs that params ``similarity.subset`` selects on a map.

    Parameters
    ----------
    records : m encoder records (the map's rows)
    F : ndarray, shape (m, n)
        The map's QRE features; with ``subset["neighbours"]`` = k > 0 each encoder is also paired
        with its k nearest encoders by ℓ1 feature distance.
    subset : dict with ``groups``, ``encoders`` and ``neighbours``

    Returns
    -------
    ids, pairs : see :func:`select_pairs`
    """
    nn = None
    if subset["neighbours"] > 0:
        nn, _ = nearest_neighbours(feature_distances(F, "manhattan"), subset["neighbours"],
                                   key="similarity.subset.neighbours")
    return select_pairs(records, subset["groups"], subset["encoders"], nn)
