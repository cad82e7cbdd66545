"""The report page's style and drawing script (`runtime.report` builds the page around them).

Both are inline in the page, so it opens with no network (no CDN, no font or script to
fetch). The script reads the page's JSON block and draws each plot as SVG: a polyline and
one circle per point, each circle carrying its time and value (`data-t`, `data-v`), so a
browser test can count the points drawn and compare them with the data; it marks the body
with how many plots it drew (`data-plots-drawn`).
"""

from __future__ import annotations

__all__ = ["SCRIPT", "STYLE"]

STYLE = """
:root { color-scheme: light; --ink: #1f2328; --muted: #59636e; --line: #d1d9e0;
        --panel: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1400px; padding: 16px 24px 40px; color: var(--ink);
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 22px; margin: 4px 0 2px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }
p.meta, p.note, figcaption small { color: var(--muted); }
ul.pipeline { margin: 4px 0; padding-left: 20px; font-family: ui-monospace, monospace; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr));
         gap: 16px; }
figure.plot { margin: 0; padding: 10px 12px 8px; border: 1px solid var(--line);
              border-radius: 6px; background: #fff; min-width: 0; }
figcaption { font-weight: 600; }
figcaption small { display: block; font-weight: 400; }
.canvas svg { display: block; width: 100%; height: auto; }
svg .axis { stroke: #8c959f; stroke-width: 1; }
svg .grid { stroke: #eaeef2; stroke-width: 1; }
svg text { font: 11px system-ui, sans-serif; fill: var(--muted); }
svg polyline { fill: none; stroke-width: 1.6; }
svg .empty { font-size: 13px; }
.keys { display: flex; flex-wrap: wrap; gap: 4px 14px; margin-top: 4px; font-size: 12px; }
.keys span::before { content: ""; display: inline-block; width: 10px; height: 10px;
                     margin-right: 5px; border-radius: 2px; background: var(--key); }
pre.stats-table { background: var(--panel); border: 1px solid var(--line); border-radius: 6px;
                  padding: 10px 12px; overflow-x: auto; font-size: 12.5px;
                  white-space: pre-wrap; overflow-wrap: anywhere; }
dl.legend { display: grid; grid-template-columns: minmax(120px, max-content) 1fr;
            gap: 4px 16px; }
dl.legend dt { font-family: ui-monospace, monospace; font-weight: 600; }
dl.legend dd { margin: 0; }
"""

# Plain ES2017, no library. Colors: the Okabe-Ito palette (distinct under color blindness).
SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("aioloader-report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var W = 640, H = 230, L = 52, R = 14, T = 12, B = 34;
  var COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
                "#000000", "#F0E442"];
  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function nice(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
  }
  function label(v) {
    if (v === 0) return "0";
    if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US");
    return String(Number(v.toPrecision(3)));
  }
  var drawn = 0;
  data.plots.forEach(function (plot) {
    var box = document.querySelector('figure[data-plot="' + plot.id + '"] .canvas');
    if (!box) return;
    var t = plot.t, top = plot.max;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, role: "img",
                         "aria-label": plot.title, "data-points": String(t.length)}, box);
    var tmax = t.length ? Math.max(t[t.length - 1], 1e-9) : 1;
    if (top === null) {
      var most = 0;
      plot.series.forEach(function (s) { s.values.forEach(function (v) {
        if (v > most) most = v; }); });
      top = nice(most);
    }
    var x = function (s) { return L + (W - L - R) * s / tmax; };
    var y = function (v) { return T + (H - T - B) * (1 - Math.min(v, top) / top); };
    [0, 0.5, 1].forEach(function (f) {
      el("line", {x1: L, x2: W - R, y1: y(top * f), y2: y(top * f),
                  "class": f ? "grid" : "axis"}, svg);
      el("text", {x: L - 6, y: y(top * f) + 4, "text-anchor": "end"}, svg)
        .textContent = label(top * f);
      el("text", {x: x(tmax * f), y: H - B + 16, "text-anchor": f === 1 ? "end" :
                  (f ? "middle" : "start")}, svg).textContent = label(tmax * f) + " s";
    });
    el("line", {x1: L, x2: L, y1: T, y2: H - B, "class": "axis"}, svg);
    el("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle"}, svg)
      .textContent = "seconds since the loader started";
    if (!t.length) {
      el("text", {x: (L + W - R) / 2, y: (T + H - B) / 2, "text-anchor": "middle",
                  "class": "empty"}, svg).textContent = "no interval measured yet";
    }
    var keys = document.createElement("div");
    keys.className = "keys";
    plot.series.forEach(function (s, i) {
      var color = COLORS[i % COLORS.length];
      var pts = t.map(function (s_, k) { return x(t[k]) + "," + y(s.values[k]); });
      el("polyline", {points: pts.join(" "), stroke: color, "data-series": s.name}, svg);
      var g = el("g", {"class": "points", "data-series": s.name, fill: color}, svg);
      t.forEach(function (tk, k) {
        var c = el("circle", {cx: x(tk), cy: y(s.values[k]), r: 2.2,
                              "data-t": String(tk), "data-v": String(s.values[k])}, g);
        el("title", {}, c).textContent = s.name + ": " + label(s.values[k]) + " " +
          plot.unit + " at " + label(tk) + " s";
      });
      var key = document.createElement("span");
      key.style.setProperty("--key", color);
      key.textContent = s.name;
      keys.appendChild(key);
    });
    box.appendChild(keys);
    drawn += 1;
  });
  document.body.setAttribute("data-plots-drawn", String(drawn));
})();
"""
