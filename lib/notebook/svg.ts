/**
 * Static SVG of the plotly figures art-ts makes: scatter traces (lines, dashed or not, markers, `fill: "tonexty"`
 * bands) on a numeric x axis, in panels stacked by their y axes' domains (`yaxis: "y2"` and `layout.yaxis2.domain`),
 * and box traces (quartiles, 1.5 IQR whiskers, the mean, ±sd, every point) on a categorical one.
 *
 * Why not plotly.js in the page: it is 4.8 MB, so it can ride in one output at most, and a notebook whose plots
 * depend on one output's script loses them all when that cell is re-run, cleared, or the file is reopened, while
 * the saved file carries megabytes. An SVG needs no script: it shows in every frontend, trusted or not, in
 * nbconvert's HTML and in a saved file, at a few kilobytes. Markers carry <title>s, shown on hover. Frontends with
 * a plotly renderer (VS Code, JupyterLab with jupyterlab-plotly) draw the same figure interactively from its JSON.
 */
import { mean, quantile, std } from "./stats.ts";
import { escapeHtml, formatNumber } from "./text.ts";

/** A plotly figure: traces and layout, as plotly.js and plotly's JSON MIME type take them. */
export interface PlotlyFigure {
  data: Record<string, unknown>[];
  layout: Record<string, unknown>;
}

const WIDTH = 760;
const FONT = "font-family:system-ui,-apple-system,sans-serif";
const LEGEND_ROW = 20;
/** Roughly how wide a character of 12px text is, to lay the legend out without measuring text. */
const CHAR_WIDTH = 6.6;

/** plotly's line dashes (reference levels such as baselines) as SVG dash arrays. */
const DASH_ARRAYS = new Map([["dash", "6 4"], ["dot", "2 3"], ["dashdot", "6 3 2 3"]]);

interface Box { left: number; top: number; width: number; height: number }
type Point = [number, number];

const num = (value: number) => (Math.round(value * 10) / 10).toString();
const numbers = (value: unknown): number[] => (Array.isArray(value) ? value.filter((v): v is number => typeof v === "number" && Number.isFinite(v)) : []);
const text = (value: unknown): string => (typeof value === "string" ? value : "");
const record = (value: unknown): Record<string, unknown> => (typeof value === "object" && value !== null ? value as Record<string, unknown> : {});
const colorOf = (trace: Record<string, unknown>) => text(record(trace.line).color) || text(record(trace.marker).color) || "#2563eb";

/** Tick values at multiples of 1, 2 or 5 × 10^k covering [lo, hi], the step giving the count nearest `count`. */
export function niceTicks(lo: number, hi: number, count = 6): number[] {
  const magnitude = 10 ** Math.floor(Math.log10((hi - lo) / Math.max(1, count - 1)));
  const ticksAt = (step: number) => {
    const ticks: number[] = [];
    // From whole multiples, rounded to 12 digits: 3 × 0.2 is 0.6, not 0.6000000000000001.
    for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) ticks.push(Number((k * step).toPrecision(12)));
    return ticks;
  };
  const candidates = [10, 5, 2, 1].map((m) => ticksAt(m * magnitude)); // ties go to the larger step
  return candidates.reduce((best, ticks) => (Math.abs(ticks.length - count) < Math.abs(best.length - count) ? ticks : best));
}

/** [lo, hi] around the values with 5% room; a single value gets room of its own. */
function range(values: number[]): [number, number] {
  if (values.length === 0) return [0, 1];
  let lo = Math.min(...values), hi = Math.max(...values);
  if (lo === hi) [lo, hi] = [lo - (Math.abs(lo) || 1) * 0.5, hi + (Math.abs(hi) || 1) * 0.5];
  const pad = (hi - lo) * 0.05;
  return [lo - pad, hi + pad];
}

/** Legend entries laid out in rows across the width. */
function legendRows(entries: { name: string; color: string }[], width: number): { name: string; color: string; x: number; row: number }[] {
  const placed: { name: string; color: string; x: number; row: number }[] = [];
  let x = 0, row = 0;
  for (const entry of entries) {
    const w = 22 + entry.name.length * CHAR_WIDTH + 16;
    if (x > 0 && x + w > width) [x, row] = [0, row + 1];
    placed.push({ ...entry, x, row });
    x += w;
  }
  return placed;
}

/** Which panel (y axis) a trace is drawn in: "y", "y2", …, and its layout key. */
const axisOf = (trace: Record<string, unknown>) => text(trace.yaxis) || "y";
const axisKey = (axis: string) => `yaxis${axis.slice(1)}`;

/** A marker: a circle, or a diamond when the trace asks for one (validation points). */
function marker(trace: Record<string, unknown>, [x, y]: Point, tooltip: string): string {
  const style = record(trace.marker);
  const size = typeof style.size === "number" ? style.size : 6;
  const color = text(style.color) || colorOf(trace);
  const outline = text(record(style.line).color);
  const stroke = outline ? ` stroke="${outline}" stroke-width="1"` : "";
  const title = `<title>${escapeHtml(tooltip)}</title>`;
  if (style.symbol === "diamond") {
    const r = size * 0.7;
    return `<path d="M${num(x)},${num(y - r)}L${num(x + r)},${num(y)}L${num(x)},${num(y + r)}L${num(x - r)},${num(y)}Z" fill="${color}"${stroke}>${title}</path>`;
  }
  return `<circle cx="${num(x)}" cy="${num(y)}" r="${num(size / 2)}" fill="${color}"${stroke}>${title}</circle>`;
}

/** The figure as a standalone <svg> element. */
export function figureSvg(figure: PlotlyFigure): string {
  const { data, layout } = figure;
  const margin = { l: 60, r: 20, t: 50, b: 50, ...record(layout.margin) } as { l: number; r: number; t: number; b: number };
  const boxes = data.filter((t) => t.type === "box");
  const scatters = data.filter((t) => t.type !== "box");
  const showLegend = layout.showlegend !== false;
  const legend = legendRows(showLegend
    ? data.filter((t) => t.showlegend !== false && text(t.name) !== "").map((t) => ({ name: text(t.name), color: colorOf(t) }))
    : [], WIDTH - margin.l - margin.r);
  const legendHeight = legend.length === 0 ? 0 : (legend.at(-1)!.row + 1) * LEGEND_ROW + 8;
  const height = (typeof layout.height === "number" ? layout.height : 420) + legendHeight;
  const plot: Box = { left: margin.l, top: margin.t, width: WIDTH - margin.l - margin.r, height: height - margin.t - margin.b - legendHeight };

  // Scales: categories (one per box) or numbers on x, shared by every panel; each panel's own values on its y.
  const categories = boxes.map((t) => text(t.name));
  const xs = scatters.flatMap((t) => numbers(t.x));
  const [x0, x1] = range(xs);
  const sx = (x: number) => plot.left + ((x - x0) / (x1 - x0)) * plot.width;
  const slot = plot.width / Math.max(1, categories.length);
  const cx = (index: number) => plot.left + slot * (index + 0.5);
  const panels = new Map([...new Set(data.map(axisOf))].map((axis) => {
    const axisLayout = record(layout[axisKey(axis)]);
    const [d0, d1] = numbers(axisLayout.domain).length === 2 ? numbers(axisLayout.domain) as [number, number] : [0, 1];
    const box: Box = { left: plot.left, top: plot.top + (1 - d1) * plot.height, width: plot.width, height: (d1 - d0) * plot.height };
    const [y0, y1] = range(data.filter((t) => axisOf(t) === axis).flatMap((t) => numbers(t.y)));
    const sy = (y: number) => box.top + box.height - ((y - y0) / (y1 - y0)) * box.height;
    return [axis, { box, y0, y1, sy, title: text(record(axisLayout.title).text) }] as const;
  }));
  const bottom = Math.max(...[...panels.values()].map((p) => p.box.top + p.box.height));

  const parts: string[] = [];
  const titleLines = text(record(layout.title).text).split("<br>");
  titleLines.forEach((line, i) => parts.push(`<text x="${margin.l}" y="${22 + i * 20}" font-size="15" font-weight="600" fill="#111827">${line}</text>`));

  // Each panel's grid, ticks, frame and axis title; the x ticks' labels and title under the lowest panel only.
  const integral = xs.every(Number.isInteger);
  const xTicks = categories.length > 0 || xs.length === 0 ? [] : niceTicks(x0, x1).filter((t) => !integral || Number.isInteger(t));
  for (const { box, y0, y1, sy, title } of panels.values()) {
    for (const tick of niceTicks(y0, y1, box.height < 200 ? 4 : 6)) {
      const y = num(sy(tick));
      parts.push(`<line x1="${box.left}" x2="${box.left + box.width}" y1="${y}" y2="${y}" stroke="#e5e7eb"/>`);
      parts.push(`<text x="${box.left - 6}" y="${y}" dy="0.32em" text-anchor="end" font-size="11" fill="#4b5563">${escapeHtml(formatNumber(tick))}</text>`);
    }
    for (const tick of xTicks) parts.push(`<line x1="${num(sx(tick))}" x2="${num(sx(tick))}" y1="${num(box.top)}" y2="${num(box.top + box.height)}" stroke="#f3f4f6"/>`);
    parts.push(`<rect x="${box.left}" y="${num(box.top)}" width="${box.width}" height="${num(box.height)}" fill="none" stroke="#d1d5db"/>`);
    if (title) parts.push(`<text transform="translate(16,${num(box.top + box.height / 2)}) rotate(-90)" text-anchor="middle" font-size="12" fill="#374151">${escapeHtml(title)}</text>`);
  }
  categories.forEach((name, i) => parts.push(`<text x="${num(cx(i))}" y="${num(bottom + 16)}" text-anchor="middle" font-size="11" fill="#4b5563">${escapeHtml(name)}</text>`));
  for (const tick of xTicks) parts.push(`<text x="${num(sx(tick))}" y="${num(bottom + 16)}" text-anchor="middle" font-size="11" fill="#4b5563">${escapeHtml(formatNumber(tick))}</text>`);
  const xTitle = text(record(record(layout.xaxis).title).text);
  if (xTitle) parts.push(`<text x="${num(plot.left + plot.width / 2)}" y="${num(bottom + 36)}" text-anchor="middle" font-size="12" fill="#374151">${escapeHtml(xTitle)}</text>`);

  // Scatter traces in order: a "tonexty" trace fills down to the trace before it (the band under a mean line).
  // A marker's hover text is the trace's `text` for it when given (the step's numbers), else its value.
  let previous: Point[] = [];
  for (const trace of scatters) {
    const { sy } = panels.get(axisOf(trace))!;
    const tx = numbers(trace.x), ty = numbers(trace.y);
    const points: Point[] = tx.slice(0, ty.length).map((x, i) => [sx(x), sy(ty[i]!)]);
    const path = (pts: Point[]) => pts.map(([x, y]) => `${num(x)},${num(y)}`).join(" ");
    if (trace.fill === "tonexty" && previous.length > 0) {
      parts.push(`<polygon points="${path([...points, ...[...previous].reverse()])}" fill="${text(trace.fillcolor) || "rgba(37,99,235,0.18)"}" stroke="none"/>`);
    }
    const mode = text(trace.mode) || "lines";
    const line = record(trace.line);
    if (mode.includes("lines") && line.width !== 0 && points.length > 1) {
      const dash = DASH_ARRAYS.get(text(line.dash));
      parts.push(`<polyline points="${path(points)}" fill="none" stroke="${colorOf(trace)}" stroke-width="${typeof line.width === "number" ? line.width : 2}" stroke-linejoin="round"${dash ? ` stroke-dasharray="${dash}"` : ""}/>`);
    }
    if (mode.includes("markers")) {
      const hover = Array.isArray(trace.text) ? trace.text : [];
      points.forEach((point, i) => parts.push(marker(trace, point, text(hover[i]) || `${text(trace.name)}: ${formatNumber(ty[i]!)} at ${formatNumber(tx[i]!)}`)));
    }
    previous = points;
  }

  // Boxes: quartiles, whiskers to the furthest points within 1.5 IQR, the mean dashed (± sd when asked), every point.
  boxes.forEach((trace, index) => {
    const { sy } = panels.get(axisOf(trace))!;
    const values = numbers(trace.y);
    if (values.length === 0) return;
    const color = colorOf(trace), center = cx(index), half = Math.min(40, slot * 0.3);
    const [q1, median, q3] = [0.25, 0.5, 0.75].map((q) => quantile(values, q)) as [number, number, number];
    const inside = values.filter((v) => v >= q1 - 1.5 * (q3 - q1) && v <= q3 + 1.5 * (q3 - q1));
    const [low, high] = [Math.min(...inside), Math.max(...inside)];
    const vline = (a: number, b: number, dash = "") => `<line x1="${num(center)}" x2="${num(center)}" y1="${num(sy(a))}" y2="${num(sy(b))}" stroke="${color}"${dash}/>`;
    const hline = (v: number, w: number, extra = "") => `<line x1="${num(center - w)}" x2="${num(center + w)}" y1="${num(sy(v))}" y2="${num(sy(v))}" stroke="${color}"${extra}/>`;
    parts.push(vline(low, q1), vline(q3, high), hline(low, half / 2), hline(high, half / 2));
    parts.push(`<rect x="${num(center - half)}" y="${num(sy(q3))}" width="${num(2 * half)}" height="${num(Math.max(1, sy(q1) - sy(q3)))}" fill="${color}" fill-opacity="0.12" stroke="${color}">` +
      `<title>${escapeHtml(`${text(trace.name)}: median ${formatNumber(median)}, quartiles ${formatNumber(q1)}–${formatNumber(q3)}, n=${values.length}`)}</title></rect>`);
    parts.push(hline(median, half, ` stroke-width="2"`));
    const m = mean(values);
    parts.push(hline(m, half, ` stroke-dasharray="4 3"`));
    if (trace.boxmean === "sd") parts.push(vline(m - std(values), m + std(values), ` stroke-dasharray="2 2"`));
    // Points spread across the box by a fixed low-discrepancy sequence, so the same data always draws the same.
    values.forEach((v, i) => parts.push(marker(trace, [center + (((i * 0.618034) % 1) - 0.5) * half * 1.2, sy(v)], `${text(trace.name)}: ${formatNumber(v)}`)));
  });

  for (const entry of legend) {
    const x = plot.left + entry.x, y = height - legendHeight + entry.row * LEGEND_ROW + 8;
    parts.push(`<rect x="${num(x)}" y="${y + 4}" width="14" height="10" rx="2" fill="${entry.color}"/>` +
      `<text x="${num(x + 20)}" y="${y + 13}" font-size="12" fill="#374151">${escapeHtml(entry.name)}</text>`);
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${WIDTH} ${height}" width="100%" style="max-width:${WIDTH}px;height:auto;${FONT}" role="img" aria-label="${titleLines.join(" ")}">` +
    `<rect width="${WIDTH}" height="${height}" fill="white"/>${parts.join("")}</svg>`;
}
