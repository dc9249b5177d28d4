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
        ``neighbours`` (list of [id, distance]); drawn on the main layout only
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
                    "neighbours": [[str(a), float(b)] for a, b in p["neighbours"]]} for p in placed],
    }


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 0; display: flex; height: 100vh; }
#side { width: 300px; padding: 12px; box-sizing: border-box; overflow-y: auto; border-right: 1px solid #ddd; }
#map { flex: 1; min-width: 0; }
label { display: block; margin: 10px 0 4px; font-weight: 600; }
select, input { width: 100%; box-sizing: border-box; padding: 4px; }
#legend div { display: flex; align-items: center; gap: 6px; margin: 2px 0; font-size: 12px; }
#legend span.sw { width: 12px; height: 12px; border-radius: 50%; flex: none; border: 1px solid #444; }
#info { font-size: 12px; white-space: pre-wrap; margin-top: 8px; }
h1 { font-size: 16px; margin: 0 0 6px; }
p.note { font-size: 12px; color: #555; margin: 4px 0; }
div.note { font-size: 12px; color: #333; margin: 4px 0; }
label.check { font-weight: 400; display: flex; align-items: center; gap: 6px; }
label.check input { width: auto; }
"""

# Plain JavaScript on top of plotly.js. Every string from the data reaches the DOM through
# textContent, or through esc() before plotly's pseudo-HTML hover labels.
_SCRIPT = r"""
(function () {
  const D = JSON.parse(document.getElementById("map-data").textContent);
  const m = D.ids.length;
  const PALETTE = ["#1f77b4","#ff7f0e","#2ca02c","#d62728","#9467bd","#8c564b","#e377c2","#7f7f7f",
    "#bcbd22","#17becf","#aec7e8","#ffbb78","#98df8a","#ff9896","#c5b0d5","#c49c94","#f7b6d2",
    "#c7c7c7","#dbdb8d","#9edae5"];
  // Plotly's hover labels parse a small HTML subset and decode only &amp; &lt; &gt; (a &quot;
  // would show as such): escaping those three keeps every tag out and shows quotes as quotes.
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function show(v) { return v === null || v === undefined ? "n/a" : String(v); }
  function fixed3(v) { return v === null ? "n/a" : v.toFixed(3); }
  function hover(i) {
    const lines = ["<b>" + esc(D.ids[i]) + "</b>"];
    if (D.same[i].length) lines.push("the same encoder as (drawn as one): " + esc(D.same[i].join(", ")));
    for (const f of D.fields) lines.push(esc(f) + ": " + esc(show(D.values[f][i])));
    lines.push("nearest (" + esc(D.metric) + "):");
    for (const [id, d] of D.neighbours[i]) lines.push("  " + esc(id) + "  " + d.toPrecision(4));
    if (D.scores[i].length) {
      lines.push("score: measured / predicted (" + esc(D.predictor) + " features, ridge, model held out)");
      for (const [t, a, p] of D.scores[i])
        lines.push("  " + esc(t) + "  " + fixed3(a) + " / " + fixed3(p));
    }
    return lines.join("<br>");
  }
  function colours(field) {
    const vals = D.values[field];
    const nums = vals.filter(v => typeof v === "number");
    const uniq = [...new Set(vals.map(show))];
    if (D.numeric.includes(field) && new Set(nums).size > 12) {
      const lo = Math.min(...nums), hi = Math.max(...nums);
      const logs = field === "parameters" && lo > 0;
      const t = v => (logs ? (Math.log(v) - Math.log(lo)) / (Math.log(hi) - Math.log(lo) || 1) : (v - lo) / (hi - lo || 1));
      const ramp = ["#440154","#3b528b","#21918c","#5ec962","#fde725"];
      const pick = v => (typeof v !== "number") ? "#bbbbbb" : ramp[Math.min(4, Math.floor(t(v) * 4.999))];
      return {colour: vals.map(pick), legend: [["low " + lo, ramp[0]], ["high " + hi, ramp[4]], ["n/a", "#bbbbbb"]]};
    }
    const counts = {};
    for (const v of vals) counts[show(v)] = (counts[show(v)] || 0) + 1;
    let order = uniq.sort((a, b) => counts[b] - counts[a] || (a < b ? -1 : a > b ? 1 : 0));
    if (D.numeric.includes(field)) order = uniq.sort((a, b) => (a === "n/a") - (b === "n/a") || Number(a) - Number(b));
    const col = {};
    order.forEach((c, k) => { col[c] = k < PALETTE.length - 1 ? PALETTE[k] : "#bbbbbb"; });
    return {colour: vals.map(v => col[show(v)]),
            legend: order.slice(0, PALETTE.length).map(c => [c + " (" + counts[c] + ")", col[c]])};
  }
  function legend(entries) {
    const box = document.getElementById("legend");
    box.replaceChildren();
    for (const [text, c] of entries) {
      const row = document.createElement("div");
      const sw = document.createElement("span");
      sw.className = "sw"; sw.style.background = c;
      const t = document.createElement("span");
      t.textContent = text;
      row.append(sw, t); box.append(row);
    }
  }
  let L = 0;  // the layout shown (index into D.layouts)
  function pathXY() {
    const lx = [], ly = [], P = D.layouts[L];
    for (const p of D.paths) { for (const i of p) { lx.push(P.x[i]); ly.push(P.y[i]); } lx.push(null); ly.push(null); }
    return [lx, ly];
  }
  function arrows() {
    if (!document.getElementById("lineage").checked) return [];
    const P = D.layouts[L];
    return D.lineage.map(([c, p]) => ({x: P.x[p], y: P.y[p], ax: P.x[c], ay: P.y[c], xref: "x", yref: "y",
      axref: "x", ayref: "y", showarrow: true, arrowhead: 2, arrowsize: 1, arrowwidth: 1.2,
      arrowcolor: "#b22222", opacity: 0.8, text: ""}));
  }
  function titleText() { return esc(m + " encoders, t-SNE of QRE features: " + D.layouts[L].name); }
  const [lx0, ly0] = pathXY();
  const first = colours(D.fields[0]);
  const traces = [
    {type: "scatter", mode: "lines", x: lx0, y: ly0, hoverinfo: "skip", showlegend: false,
     line: {color: "#999999", width: 0.7}, name: "layers"},
    {type: "scatter", mode: "markers", x: D.layouts[0].x, y: D.layouts[0].y, text: D.ids.map((_, i) => hover(i)),
     hovertemplate: "%{text}<extra></extra>", showlegend: false, name: "encoders",
     marker: {size: 9, color: first.colour, line: {width: 0.6, color: "#333333"}}},
    {type: "scatter", mode: "markers", x: [], y: [], hoverinfo: "skip", showlegend: false, name: "highlight",
     marker: {size: 18, color: "rgba(0,0,0,0)", line: {width: 2.5, color: "#d62728"}}},
    {type: "scatter", mode: "markers+text", x: D.placed.map(p => p.x), y: D.placed.map(p => p.y),
     text: D.placed.map(p => esc(p.id)), textposition: "top center", showlegend: false, name: "placed",
     hovertext: D.placed.map(p => "<b>placed: " + esc(p.id) + "</b><br>" +
       (p.same ? "the same encoder as " + esc(p.same) + "<br>" : "") +
       p.neighbours.map(([id, d]) => esc(id) + "  " + d.toPrecision(4)).join("<br>")),
     hoverinfo: "text", marker: {size: 16, symbol: "star", color: "#000000", line: {width: 1, color: "#ffd700"}}},
  ];
  const layout = {margin: {l: 40, r: 10, t: 30, b: 40}, dragmode: "pan", hovermode: "closest",
    title: {text: titleText(), font: {size: 14}}, annotations: [],
    xaxis: {zeroline: false, title: {text: "t-SNE 1"}}, yaxis: {zeroline: false, title: {text: "t-SNE 2"}, scaleanchor: "x"}};
  Plotly.newPlot("map", traces, layout, {scrollZoom: true, displaylogo: false, responsive: true});
  legend(first.legend);

  const faith = document.getElementById("faithfulness");
  function showFaithfulness() {
    faith.replaceChildren();
    for (const [k, v] of Object.entries(D.layouts[L].faithfulness)) {
      const row = document.createElement("div");
      row.textContent = k + ": " + fixed3(v);
      faith.append(row);
    }
  }
  const lsel = document.getElementById("layout");
  D.layouts.forEach((P, k) => { const o = document.createElement("option"); o.value = String(k); o.textContent = P.name; lsel.append(o); });
  lsel.addEventListener("change", () => {
    L = Number(lsel.value);
    const [lx, ly] = pathXY(), P = D.layouts[L];
    const placedShown = L === 0;
    Plotly.update("map", {x: [lx, P.x, [], placedShown ? D.placed.map(p => p.x) : []],
                          y: [ly, P.y, [], placedShown ? D.placed.map(p => p.y) : []]},
                  {"title.text": titleText(), annotations: arrows(), "xaxis.autorange": true, "yaxis.autorange": true},
                  [0, 1, 2, 3]);
    showFaithfulness();
    highlight();
  });
  showFaithfulness();
  const lin = document.getElementById("lineage");
  lin.disabled = D.lineage.length === 0;
  lin.addEventListener("change", () => Plotly.relayout("map", {annotations: arrows()}));

  const sel = document.getElementById("color-by");
  for (const f of D.fields) { const o = document.createElement("option"); o.value = f; o.textContent = f; sel.append(o); }
  sel.addEventListener("change", () => {
    const c = colours(sel.value);
    Plotly.restyle("map", {"marker.color": [c.colour]}, [1]);
    legend(c.legend);
  });

  const list = document.getElementById("ids");
  for (const id of [...D.ids, ...D.placed.map(p => p.id)]) { const o = document.createElement("option"); o.value = id; list.append(o); }
  const info = document.getElementById("info");
  const search = document.getElementById("search");
  function highlight() {
    const q = search.value.trim();
    let i = D.ids.indexOf(q), nb, at;
    const p = D.placed.find(p => p.id === q);
    const P = D.layouts[L];
    if (i >= 0) { nb = D.neighbours[i]; at = [P.x[i], P.y[i]]; }
    else if (p && L === 0) { nb = p.neighbours; at = [p.x, p.y]; }
    else {
      Plotly.restyle("map", {x: [[]], y: [[]]}, [2]);
      info.textContent = q ? "no encoder " + q : "";
      return;
    }
    const idx = nb.map(([id]) => D.ids.indexOf(id)).filter(j => j >= 0);
    Plotly.restyle("map", {x: [[at[0], ...idx.map(j => P.x[j])]], y: [[at[1], ...idx.map(j => P.y[j])]],
      "marker.size": [[22, ...idx.map(() => 14)]]}, [2]);
    info.textContent = q + "\nnearest in feature space (" + D.metric + "):\n" +
      nb.map(([id, d], r) => (r + 1) + ". " + id + "  " + d.toPrecision(4)).join("\n");
  }
  search.addEventListener("input", highlight);
  search.addEventListener("change", highlight);
  window.encmapMap = {data: D, highlight: highlight, layout: () => L};
})();
"""


def render_page(data: dict, title: str = "encmap: map of sentence encoders") -> str:
    """The full HTML document for :func:`page_data`'s output."""
    from html import escape

    from plotly.offline import get_plotlyjs

    placed = ", ".join(p["id"] for p in data["placed"])
    note = (f"{len(data['ids'])} encoders. Hover a point for its metadata and nearest neighbours; scroll "
            f"to zoom, drag to pan; double-click resets.") + (f" Placed: {placed} (star)." if placed else "")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<title>{escape(title)}</title>\n<style>{_STYLE}</style>\n",
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
        "<script>", _SCRIPT, "</script>\n</body>\n</html>\n",
    ])
