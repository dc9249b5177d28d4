
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
  // A colour per category, however many: the 20 of the palette, then golden-angle hues at three
  // lightnesses and saturations (hundreds of models stay apart by hue, and the legend, the hover
  // and a click on a legend row say which is which).
  function categoryColour(k) {
    if (k < PALETTE.length) return PALETTE[k];
    const j = k - PALETTE.length;
    const h = (j * 137.508 + 20) % 360, s = [72, 52, 88][j % 3], l = [42, 58, 32][Math.floor(j / 3) % 3];
    return "hsl(" + h.toFixed(1) + "," + s + "%," + l + "%)";
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
    // Maps, not plain objects: a category is any string, "constructor" and "__proto__" included.
    const counts = new Map();
    for (const v of vals) counts.set(show(v), (counts.get(show(v)) || 0) + 1);
    let order = uniq.sort((a, b) => counts.get(b) - counts.get(a) || (a < b ? -1 : a > b ? 1 : 0));
    if (D.numeric.includes(field)) order = uniq.sort((a, b) => (a === "n/a") - (b === "n/a") || Number(a) - Number(b));
    const col = new Map();
    let k = 0;
    for (const c of order) col.set(c, c === "n/a" ? "#bbbbbb" : categoryColour(k++));
    return {colour: vals.map(v => col.get(show(v))),
            legend: order.map(c => [c + " (" + counts.get(c) + ")", col.get(c), c])};
  }
  function legend(entries) {
    const box = document.getElementById("legend");
    box.replaceChildren();
    for (const [text, c, value] of entries) {
      const row = document.createElement("div");
      const sw = document.createElement("span");
      sw.className = "sw"; sw.style.background = c;
      const t = document.createElement("span");
      t.textContent = text;
      row.append(sw, t); box.append(row);
      if (value !== undefined) {  // a category: a click rings its points and lists them
        row.className = "category"; row.title = "show these points";
        row.addEventListener("click", () => ringCategory(value));
      }
    }
  }
  function ringCategory(value) {
    const field = document.getElementById("color-by").value, P = D.layouts[L];
    const idx = D.ids.map((_, i) => i).filter(i => show(D.values[field][i]) === value);
    search.value = "";
    Plotly.restyle("map", {x: [idx.map(i => P.x[i])], y: [idx.map(i => P.y[i])],
      "marker.size": [idx.map(() => 16)]}, [2]);
    info.textContent = field + ": " + value + " (" + idx.length + ")\n" + idx.map(i => D.ids[i]).join("\n");
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
  // One placed encoder's predicted score on a task: [task, value, low, high, why it extrapolates].
  function predictedLine([t, v, lo, hi, why]) {
    const f = x => x === null ? "n/a" : x.toFixed(3);
    return t + ": " + f(v) + (lo === null ? "" : " [" + f(lo) + ", " + f(hi) + "]") +
      (why ? "  EXTRAPOLATING: " + why : "");
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
       p.neighbours.map(([id, d]) => esc(id) + "  " + d.toPrecision(4)).join("<br>") +
       (p.predicted.length ? "<br><i>predicted (" + esc(D.predictor) + ", ridge)</i><br>" +
        p.predicted.map(r => esc(predictedLine(r))).join("<br>") : "")),
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
      nb.map(([id, d], r) => (r + 1) + ". " + id + "  " + d.toPrecision(4)).join("\n") +
      (i < 0 && p.predicted.length ? "\npredicted (" + D.predictor + ", ridge; [conformal interval]):\n" +
       p.predicted.map(predictedLine).join("\n") : "");
  }
  search.addEventListener("input", highlight);
  search.addEventListener("change", highlight);
  window.encmapMap = {data: D, highlight: highlight, layout: () => L, ringCategory: ringCategory};
})();
