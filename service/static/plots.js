// Line charts drawn as inline SVG: axes with round ticks, one path per series (straight
// segments, or steps for values that change at discrete points such as ranks), dashed
// vertical lines at stage boundaries, an HTML legend and a hover read-out of the values at
// the nearest step. No chart library: the page must work offline.
//
// lineChart({name, title, series: [{label, points: [{x, y}], step?, color?}],
//            markers: [{x, label}], yDomain?: [lo, hi], yLabel?}) -> <figure>

import {fmtNum, h, s} from "./dom.js";

export const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                        "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const W = 560;
const H = 250;
const M = {top: 30, right: 16, bottom: 34, left: 56};
const LABEL_CHAR_PX = 6.6; // about the width of a character of a stage label (11px, bold)
const DOTS_UP_TO = 40; // series this short also get a dot per point

/** Round tick values covering [lo, hi]: steps of 1, 2, 2.5 or 5 times a power of ten. */
export function niceTicks(lo, hi, count = 5, integer = false) {
  if (!(hi > lo)) {
    const pad = Math.abs(lo) * 0.1 || 1;
    lo -= pad;
    hi += pad;
  }
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const factors = integer && mag <= 1 ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10];
  let step = factors.map((f) => f * mag).find((v) => v >= raw);
  if (integer) step = Math.max(1, step);
  const first = Math.floor(lo / step) * step;
  const last = Math.ceil(hi / step) * step;
  const ticks = [];
  for (let v = first; v <= last + step / 1e6; v += step) ticks.push(Number(v.toPrecision(12)));
  return {lo: first, hi: last, ticks};
}

function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  return lo <= hi ? [lo, hi] : null;
}

/** The SVG path of one series: "M x y L x y ..." or, for steps, "M x y H x V y ...". */
function pathOf(points, sx, sy, step) {
  return points.map((p, i) => {
    const x = sx(p.x).toFixed(1);
    const y = sy(p.y).toFixed(1);
    if (i === 0) return `M${x} ${y}`;
    return step ? `H${x} V${y}` : `L${x} ${y}`;
  }).join(" ");
}

function nearest(points, x) {
  let best = null;
  for (const p of points) if (best === null || Math.abs(p.x - x) < Math.abs(best.x - x)) best = p;
  return best;
}

function atOrBefore(points, x) {
  let best = null;
  for (const p of points) if (p.x <= x && (best === null || p.x > best.x)) best = p;
  return best;
}

function hoverLayer(svg, series, sx, sy, invertX) {
  const guide = s("line", {class: "hover-guide", y1: M.top, y2: H - M.bottom});
  const box = s("g", {class: "hover-box"});
  const layer = s("g", {class: "hover", visibility: "hidden"}, guide, box);
  const area = s("rect", {class: "hover-area", x: M.left, y: M.top, width: W - M.left - M.right,
                          height: H - M.top - M.bottom});
  area.addEventListener("mousemove", (ev) => {
    const at = svg.createSVGPoint();
    at.x = ev.clientX;
    at.y = ev.clientY;
    const local = at.matrixTransform(svg.getScreenCTM().inverse());
    const x = invertX(local.x);
    const rows = series.map((sr) => ({sr, p: (sr.step ? atOrBefore : nearest)(sr.points, x)}))
      .filter((r) => r.p);
    if (!rows.length) return;
    const stepX = nearest(rows.map((r) => r.p), x).x;
    guide.setAttribute("x1", sx(stepX));
    guide.setAttribute("x2", sx(stepX));
    const lines = [`step ${fmtNum(stepX)}`, ...rows.slice(0, 12).map((r) =>
      `${r.sr.label}: ${fmtNum(r.p.y)}${r.p.x === stepX ? "" : ` @${fmtNum(r.p.x)}`}`)];
    const width = Math.min(W / 2, 12 + 6.4 * Math.max(...lines.map((t) => t.length)));
    const bx = sx(stepX) > W / 2 ? sx(stepX) - 8 - width : sx(stepX) + 8; // away from the edge
    box.replaceChildren(s("rect", {x: bx, y: M.top + 2, width, height: 8 + lines.length * 14,
                                   rx: 3}),
      ...lines.map((text, i) => s("text", {x: bx + 6, y: M.top + 15 + i * 14, text})));
    layer.setAttribute("visibility", "visible");
  });
  area.addEventListener("mouseleave", () => layer.setAttribute("visibility", "hidden"));
  return [area, layer];
}

export function lineChart({name, title, series, markers = [], yDomain = null, yLabel = ""}) {
  const shown = series.filter((sr) => sr.points.length);
  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
                        "aria-label": title});
  const figure = h("figure", {class: "plot", "data-plot": name},
                   h("figcaption", {text: title}), svg);
  const xs = extent([...shown.flatMap((sr) => sr.points.map((p) => p.x)),
                     ...markers.map((m) => m.x)]);
  const ys = extent(shown.flatMap((sr) => sr.points.map((p) => p.y)));
  if (!shown.length || !xs || !ys) {
    svg.append(s("text", {class: "empty", x: W / 2, y: H / 2, text: "no data yet"}));
    return figure;
  }
  const xr = {lo: xs[0], hi: xs[1] > xs[0] ? xs[1] : xs[0] + 1}; // steps: the data's own range
  const xt = {...xr, ticks: niceTicks(xr.lo, xr.hi, 6, true).ticks
    .filter((v) => v >= xr.lo && v <= xr.hi)};
  const [ylo, yhi] = yDomain ? [Math.min(yDomain[0], ys[0]), Math.max(yDomain[1], ys[1])] : ys;
  const yt = niceTicks(ylo, yhi, 5);
  const sx = (x) => M.left + ((x - xt.lo) / (xt.hi - xt.lo)) * (W - M.left - M.right);
  const sy = (y) => H - M.bottom - ((y - yt.lo) / (yt.hi - yt.lo)) * (H - M.top - M.bottom);
  const invertX = (px) => xt.lo + ((px - M.left) / (W - M.left - M.right)) * (xt.hi - xt.lo);

  const grid = s("g", {class: "grid"});
  for (const v of yt.ticks) {
    grid.append(s("line", {x1: M.left, x2: W - M.right, y1: sy(v), y2: sy(v)}),
                s("text", {class: "tick y", x: M.left - 6, y: sy(v) + 4, text: fmtNum(v)}));
  }
  for (const v of xt.ticks) {
    grid.append(s("line", {x1: sx(v), x2: sx(v), y1: M.top, y2: H - M.bottom}),
                s("text", {class: "tick x", x: sx(v), y: H - M.bottom + 16, text: fmtNum(v)}));
  }
  svg.append(grid,
             s("rect", {class: "frame", x: M.left, y: M.top, width: W - M.left - M.right,
                        height: H - M.top - M.bottom}),
             s("text", {class: "axis-label", x: W - M.right, y: H - 4, text: "step"}));
  if (yLabel) svg.append(s("text", {class: "axis-label y", x: 4, y: M.top - 9, text: yLabel}));

  const stageLayer = s("g", {class: "stages"});
  const rowEnds = [-Infinity, -Infinity]; // right edge of the last label in each row
  for (const m of markers) {
    // a label right of its line, pulled left to stay inside the chart, on the first row
    // where it does not run into the label before it (e.g. "late" and "finetune" close by)
    const width = m.label.length * LABEL_CHAR_PX;
    const x = Math.max(0, Math.min(sx(m.x) + 4, W - width - 2));
    const row = x >= rowEnds[0] + 4 || x < rowEnds[1] + 4 ? 0 : 1;
    rowEnds[row] = x + width;
    stageLayer.append(s("g", {class: "stage-boundary", "data-step": m.x, "data-stage": m.label},
      m.x > xt.lo ? s("line", {x1: sx(m.x), x2: sx(m.x), y1: M.top, y2: H - M.bottom}) : null,
      s("text", {x, y: M.top - 7 - row * 11, text: m.label})));
  }
  svg.append(stageLayer);

  const legend = h("ul", {class: "legend"});
  shown.forEach((sr, i) => {
    const color = sr.color || PALETTE[i % PALETTE.length];
    const path = s("path", {class: "series", d: pathOf(sr.points, sx, sy, sr.step), stroke: color,
                            "data-label": sr.label, "data-points": sr.points.length});
    const dots = sr.points.length <= DOTS_UP_TO
      ? sr.points.map((p) => s("circle", {class: "dot", cx: sx(p.x), cy: sy(p.y), r: 2.5,
                                          fill: color}))
      : [];
    svg.append(path, ...dots);
    const swatch = h("span", {class: "swatch"});
    swatch.style.background = color;
    legend.append(h("li", {"data-label": sr.label}, swatch, sr.legend || sr.label));
  });
  svg.append(...hoverLayer(svg, shown, sx, sy, invertX));
  figure.append(legend);
  return figure;
}
