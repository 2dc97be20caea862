// Building DOM and SVG nodes without innerHTML (text from the API is never parsed as markup),
// and formatting numbers, sizes and times for display.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(node, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** An HTML element: h("td", {class: "num"}, "42"). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element: s("line", {x1: 0, y1: 0, x2: 10, y2: 10}). */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** A number with about four significant digits: 0.6187, 12.64, 1.2e-5, 8,515. */
export function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : "-∞";
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e7)) return v.toExponential(2);
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  return String(Number(v.toPrecision(4)));
}

export function fmtRatio(v) {
  return v === null || v === undefined ? "–" : `${fmtNum(Number(v.toPrecision(3)))}×`;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i === 0 ? n : n.toPrecision(3)} ${units[i]}`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const t = new Date(iso);
  return t.toLocaleString(undefined, {month: "short", day: "numeric", hour: "2-digit",
                                      minute: "2-digit", second: "2-digit"});
}

export function fmtDuration(fromIso, toIso) {
  if (!fromIso) return "–";
  const s = Math.max(0, ((toIso ? new Date(toIso) : new Date()) - new Date(fromIso)) / 1000);
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}
