"""The interactive map page: one self-contained, offline HTML file (plotly.js embedded).

Hover shows an encoder's id, metadata, nearest neighbours and, where the regression has them,
its measured and predicted scores; a selector colours the points by any metadata field (or
lineage root); a second one switches between layouts (the ℓ1 map and the exact-QRE map), each
shown with its faithfulness figures; a checkbox draws lineage arrows (``meta.derived_from``); a
search box highlights an encoder and its neighbours; scroll zooms, drag pans. All data travels as JSON inside a ``<script type="application/json">`` element with
``<``, ``>`` and ``&`` escaped, and the page only ever inserts it as text (``textContent``, and
HTML-escaped strings in plotly's hover labels): a metadata value holding HTML is shown, never
run. Pure function of its inputs: the same map gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .fields import NUMERIC_FIELDS, field_column, field_values, layer_paths, lineage


def _json_for_script(obj: Any) -> str:
    """JSON that cannot end or comment out the surrounding <script> element."""
    s = json.dumps(obj, sort_keys=True, ensure_ascii=True, allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_data(ids: Sequence[str], coords: np.ndarray, records: Sequence[dict], fields: Sequence[str],
              nn_idx: np.ndarray, nn_dist: np.ndarray, metric: str, placed: Sequence[dict] = (), *,
              layout: str = "map", others: Mapping[str, np.ndarray] | None = None,
              faithfulness: Mapping[str, Mapping[str, float]] | None = None,
              scores: Mapping[str, Sequence[Sequence[Any]]] | None = None,
              same: Sequence[str | None] | None = None, predictor: str = "qre") -> dict:
    """Everything the page shows, as plain JSON-able data.

    Parameters
    ----------
    ids : m encoder ids; coords : ndarray (m, 2), the main layout; records : m encoder records
    fields : metadata fields offered by the colour selector (first = initial colouring)
    nn_idx, nn_dist : ndarrays (m, k), nearest neighbours in the full feature space
    placed : new encoders marked on the map: dicts with ``id``, ``x``, ``y``, ``record``,
        ``neighbours`` (list of [id, distance]), optionally ``predicted`` (rows ``[task, ridge's
        prediction, low, high, why it extrapolates ("" if it does not)]``, the interval's ends None
        where there is none); drawn on the main layout only
    layout : name of the main layout
    others : further layouts by name, each an ndarray (m, 2) of the same encoders
    faithfulness : per layout name, figures shown beside it (name -> value)
    scores : per encoder id, rows ``[task, measured, predicted]`` (predicted may be None)
    same : per encoder, the map encoder it is identical to and drawn on (None: none); the
        hover of every encoder of such a group names the others
    predictor : the feature set whose predictions ``scores`` holds (named on the page)
    """
    others = dict(others or {})
    faithfulness = faithfulness or {}

    def num(v: Any) -> float | None:  # JSON has no NaN: a figure that is undefined on this map shows n/a
        return None if v is None or not np.isfinite(float(v)) else float(v)

    vals = {f: field_column(records, f) for f in fields}
    _, edges = lineage(records)

    def lay(name: str, xy: np.ndarray) -> dict:
        xy = np.asarray(xy, dtype=np.float64)
        if xy.shape != (len(ids), 2):
            raise ValueError(f"layout {name!r} has shape {xy.shape}, not ({len(ids)}, 2)")
        return {"name": name, "x": [float(c) for c in xy[:, 0]], "y": [float(c) for c in xy[:, 1]],
                "faithfulness": {k: num(v) for k, v in (faithfulness.get(name) or {}).items()}}

    layouts = [lay(layout, coords)] + [lay(k, v) for k, v in others.items()]
    rep = [s or e for e, s in zip(ids, same or [None] * len(ids))]
    twins = [[o for o, r in zip(ids, rep) if r == rep[i] and o != e] for i, e in enumerate(ids)]
    return {
        "ids": list(ids),
        "layouts": layouts,  # the first is the main one (placed encoders are drawn on it)
        "fields": list(fields),
        "numeric": [f for f in fields if f in NUMERIC_FIELDS],
        "values": vals,
        "metric": metric,
        "neighbours": [[[ids[j], float(d)] for j, d in zip(nn_idx[i], nn_dist[i])] for i in range(len(ids))],
        "paths": layer_paths(records),
        "lineage": [[int(c), int(p)] for c, p in edges],
        "scores": [[[str(t), num(a), num(p)] for t, a, p in (scores or {}).get(e, ())] for e in ids],
        "same": twins,
        "predictor": predictor,
        "placed": [{"id": p["id"], "x": float(p["x"]), "y": float(p["y"]), "values": field_values(p["record"]),
                    "same": p.get("same_as"),
                    "neighbours": [[str(a), float(b)] for a, b in p["neighbours"]],
                    "predicted": [[str(t), num(v), num(lo), num(hi), str(why)]
                                  for t, v, lo, hi, why in p.get("predicted", ())]} for p in placed],
    }


#: The page's style and its script on top of plotly.js, files beside this module, embedded as
#: they are (part of the map stage's code digest). Every string from the data reaches the DOM
#: through textContent, or through esc() before plotly's pseudo-HTML hover labels.
READS = ("page.css", "page.js")


def _asset(name: str) -> str:
    return (Path(__file__).parent / name).read_text(encoding="utf-8")




def render_page(data: dict, title: str = "encmap: map of sentence encoders") -> str:
    """The full HTML document for :func:`page_data`'s output."""
    from html import escape

    from plotly.offline import get_plotlyjs

    placed = ", ".join(p["id"] + (" (extrapolating)" if any(r[4] for r in p["predicted"]) else "")
                       for p in data["placed"])
    note = (f"{len(data['ids'])} encoders. Hover a point for its metadata and nearest neighbours; scroll "
            f"to zoom, drag to pan; double-click resets.") + (f" Placed: {placed} (star)." if placed else "")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<title>{escape(title)}</title>\n<style>{_asset('page.css')}</style>\n",
        "<script>", get_plotlyjs(), "</script>\n</head>\n<body>\n<div id=\"side\">\n",
        f"<h1>{escape(title)}</h1>\n<p class=\"note\">{escape(note)}</p>\n",
        "<label for=\"layout\">Layout</label><select id=\"layout\"></select>\n",
        "<div id=\"faithfulness\" class=\"note\"></div>\n",
        "<label for=\"color-by\">Colour by</label><select id=\"color-by\"></select>\n",
        "<label class=\"check\"><input type=\"checkbox\" id=\"lineage\"> lineage arrows (derived from)</label>\n",
        "<label for=\"search\">Find an encoder</label>",
        "<input id=\"search\" list=\"ids\" placeholder=\"encoder id\" autocomplete=\"off\"><datalist id=\"ids\"></datalist>\n",
        "<div id=\"info\"></div>\n<label>Legend</label><div id=\"legend\"></div>\n</div>\n<div id=\"map\"></div>\n",
        "<script type=\"application/json\" id=\"map-data\">", _json_for_script(data), "</script>\n",
        "<script>", _asset("page.js"), "</script>\n</body>\n</html>\n",
    ])
