/**
 * Plots as plotly figures, sent as a MIME bundle:
 *   application/vnd.plotly.v1+json  the figure (VS Code and plotly-aware frontends draw it, interactive),
 *   text/html, image/svg+xml        the same figure as static SVG (every other frontend, nbconvert, saved files),
 *   text/plain                      a short summary (logs, and frontends that show neither).
 *
 * The HTML needs no script and no library in the page (lib/notebook/svg.ts says why), so a plot survives re-runs,
 * clearing other outputs and reopening the file, and a saved run stays small.
 */
import { writeFileSync } from "node:fs";
import { ArtError } from "../core/errors.ts";
import type { Trajectory, TrajectoryGroup } from "../core/trajectory.ts";
import { Renderable, type MimeBundle } from "./display.ts";
import { addToReport, htmlPage } from "./report.ts";
import { mean, metricValues, movingMean, quantile, standardError, std, trajectoriesOf } from "./stats.ts";
import { figureSvg, type PlotlyFigure } from "./svg.ts";
import { escapeHtml, formatNumber } from "./text.ts";

export type { PlotlyFigure } from "./svg.ts";

export const PLOTLY_MIME = "application/vnd.plotly.v1+json";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function withAlpha(hex: string, alpha: number): string {
  const n = Number.parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
}

export class Plot extends Renderable {
  readonly title: string;
  readonly figure: PlotlyFigure;
  readonly summary: string;

  constructor(title: string, figure: PlotlyFigure, summary: string) {
    super();
    this.title = title;
    this.figure = figure;
    this.summary = summary;
  }

  /** The figure as static SVG. */
  toSvg(): string {
    return figureSvg(this.figure);
  }

  toMimeBundle(): MimeBundle {
    const svg = this.toSvg();
    return { [PLOTLY_MIME]: this.figure, "text/html": `<div class="art-ts-plot">${svg}</div>`, "image/svg+xml": svg, "text/plain": this.summary };
  }

  /** Text summary, and the plot added to the run's HTML report (whose path is printed). */
  toTerminal(): string {
    const path = addToReport(this.title, this.toSvg());
    return `${this.summary}\n  (plot in ${path})`;
  }

  /** Writes the plot as a standalone HTML page and returns the path. */
  saveHtml(path: string): string {
    writeFileSync(path, htmlPage(this.title, this.toSvg()));
    return path;
  }
}

/** Characters per title line: a left-aligned title this wide stays clear of plotly's toolbar at the top right. */
const TITLE_LINE_CHARS = 60;

/** Breaks a long title at spaces into lines of at most TITLE_LINE_CHARS (plotly draws one line, clipped, otherwise). */
export function titleLines(title: string): string[] {
  const lines: string[] = [];
  for (const word of title.split(/\s+/).filter((w) => w !== "")) {
    const last = lines.at(-1);
    if (last !== undefined && last.length + 1 + word.length <= TITLE_LINE_CHARS) lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  return lines;
}

function baseLayout(title: string, xTitle: string, yTitle: string): Record<string, unknown> {
  const lines = titleLines(title);
  return {
    // plotly's title text is HTML-like: escape it, then join the lines with <br>.
    title: { text: lines.map(escapeHtml).join("<br>"), x: 0, xanchor: "left", font: { size: 15 } },
    xaxis: { title: { text: xTitle }, zeroline: false },
    yaxis: { title: { text: yTitle }, zeroline: false },
    height: 420,
    margin: { l: 60, r: 20, t: 30 + 20 * Math.max(1, lines.length), b: 50 },
    legend: { orientation: "h", y: -0.2 },
    template: { layout: { paper_bgcolor: "white", plot_bgcolor: "white" } },
  };
}

// ---------------------------------------------------------------------------------------------------------------
// Reward curve

/** The values of every metric at one step, one entry per trajectory ("reward" included). */
export interface StepRecord {
  step: number;
  split: "train" | "val";
  values: Record<string, number[]>;
}

/** Collects the reward and every numeric or boolean metric of a step's trajectories. */
export function stepRecord(step: number, items: Iterable<TrajectoryGroup | Trajectory>, split: "train" | "val" = "train"): StepRecord {
  const trajectories = trajectoriesOf(items);
  const names = new Set<string>(["reward"]);
  for (const t of trajectories) for (const name of Object.keys(t.metrics)) names.add(name);
  const values: Record<string, number[]> = {};
  for (const name of names) values[name] = metricValues(trajectories, name);
  return { step, split, values };
}

export interface RewardCurveOptions {
  /** Metrics drawn, one panel each with its own axis. Default ["reward"]. */
  metrics?: string[];
  /**
   * The shaded band around each step's mean: ± one standard deviation (within the step's smallest and largest value),
   * the 10th–90th percentile, or min–max. Default "std".
   */
  band?: "std" | "p10-p90" | "minmax";
  /**
   * Steps in the moving mean drawn as the curve over the faint per-step means; 1 draws the means themselves. Default:
   * a tenth of the training steps, at least 1.
   */
  smooth?: number;
  title?: string;
  /**
   * Reference levels beside the curve, e.g. `{ "base model": games, heuristic: heuristicGames }`: each baseline's
   * mean of each metric, a dashed line across the steps in that metric's panel. Trajectories (or groups) give every
   * metric they carry; plain numbers give the first metric's.
   */
  baselines?: Record<string, Series>;
}

/** Dash patterns of the baselines' lines, one per metric. */
const BASELINE_DASHES = ["dash", "dot", "dashdot"];
/** The space between two panels, as a share of the plotting height. */
const PANEL_GAP = 0.08;

/** The band's lower and upper edge for a step's values; ± sd stays within the values (a 0/1 metric's band in [0, 1]). */
function bandEdges(values: readonly number[], band: "std" | "p10-p90" | "minmax"): [number, number] {
  if (band === "std") return [Math.max(Math.min(...values), mean(values) - std(values)), Math.min(Math.max(...values), mean(values) + std(values))];
  const [low, high] = band === "minmax" ? [0, 1] : [0.1, 0.9];
  return [quantile(values, low), quantile(values, high)];
}

/** What hovering a step shows: its mean, standard deviation and count. */
function stepNumbers(label: string, step: number, values: readonly number[]): string {
  return `${label}, step ${step}: mean ${formatNumber(mean(values))} ± ${formatNumber(std(values))} sd (n=${values.length}), ` +
    `range ${formatNumber(Math.min(...values))}–${formatNumber(Math.max(...values))}`;
}

/**
 * Training curves, one panel per metric with its own axis: each step's mean as a faint point (hover: the step's
 * numbers), a moving mean over them as the curve, a band of ± one standard deviation around the means, validation
 * steps as diamonds, baselines as dashed levels. Several runs (`{ "lr 1e-5": historyA, "lr 1e-4": historyB }`) are
 * overlaid in each panel, a colour per run.
 */
export function rewardCurve(history: readonly StepRecord[] | Readonly<Record<string, readonly StepRecord[]>>, options: RewardCurveOptions = {}): Plot {
  const runs: [string, readonly StepRecord[]][] = Array.isArray(history) ? [["", history as readonly StepRecord[]]] : Object.entries(history);
  const metrics = options.metrics ?? ["reward"];
  const band = options.band ?? "std";
  const title = options.title ?? "Reward per step";
  const trainSteps = Math.max(0, ...runs.map(([, records]) => new Set(records.filter((r) => r.split === "train").map((r) => r.step)).size));
  const smooth = options.smooth ?? Math.max(1, Math.round(trainSteps / 10));
  if (!Number.isInteger(smooth) || smooth < 1) throw new ArtError("plot.curve", `rewardCurve(): smooth must be an integer >= 1 (steps in the moving mean), got ${smooth}.`);
  const data: Record<string, unknown>[] = [];
  const lines: string[] = [];
  const allSteps = runs.flatMap(([, records]) => records.map((r) => r.step));
  // Across the steps drawn (one step gets a step's width, so a baseline's line shows).
  const [first, last] = allSteps.length === 0 ? [0, 1] : [Math.min(...allSteps), Math.max(Math.min(...allSteps) + 1, ...allSteps)];
  metrics.forEach((metric, panel) => {
    const yaxis = panel === 0 ? "y" : `y${panel + 1}`;
    runs.forEach(([run, records], r) => {
      const color = PALETTE[(runs.length > 1 ? r : panel) % PALETTE.length]!;
      const label = run === "" ? metric : run;
      // Each run's legend entry once, in the first panel; a single run's entries name the metric.
      const legend = { legendgroup: label, showlegend: runs.length === 1 || panel === 0 };
      const points = (split: "train" | "val") => records
        .filter((rec) => rec.split === split && (rec.values[metric]?.length ?? 0) > 0)
        .sort((a, b) => a.step - b.step)
        .map((rec) => ({ step: rec.step, values: rec.values[metric]! }));
      const train = points("train"), val = points("val");
      if (train.length > 0) {
        const steps = train.map((p) => p.step);
        const means = train.map((p) => mean(p.values));
        const edges = train.map((p) => bandEdges(p.values, band));
        data.push({ type: "scatter", mode: "lines", x: steps, y: edges.map((e) => e[0]), yaxis, line: { width: 0 }, hoverinfo: "skip", showlegend: false, legendgroup: label });
        data.push({ type: "scatter", mode: "lines", x: steps, y: edges.map((e) => e[1]), yaxis, line: { width: 0 }, fill: "tonexty",
          fillcolor: withAlpha(color, 0.15), name: `${label} ${band}`, hoverinfo: "skip", showlegend: false, legendgroup: label });
        data.push({ type: "scatter", mode: "markers", x: steps, y: means, yaxis, name: `${label} per step`, marker: { color: withAlpha(color, 0.45), size: 5 },
          text: train.map((p) => stepNumbers(run === "" ? metric : `${run}: ${metric}`, p.step, p.values)), hoverinfo: "text", showlegend: false, legendgroup: label });
        data.push({ type: "scatter", mode: "lines", x: steps, y: movingMean(means, smooth), yaxis, name: label, line: { color, width: 2.5 },
          hoverinfo: "skip", ...legend });
        const best = means.reduce((b, m, i) => (m > means[b]! ? i : b), 0);
        lines.push(`${run === "" ? "" : `${run}: `}${metric}: step ${steps[0]} ${formatNumber(means[0]!)} → step ${steps.at(-1)} ${formatNumber(means.at(-1)!)} ` +
          `(best ${formatNumber(means[best]!)} at step ${steps[best]})`);
      }
      if (val.length > 0) {
        const means = val.map((p) => mean(p.values));
        data.push({ type: "scatter", mode: "markers", x: val.map((p) => p.step), y: means, yaxis, name: `${label} (val)`,
          marker: { color, size: 10, symbol: "diamond", line: { color: "white", width: 1 } },
          text: val.map((p) => stepNumbers(`${run === "" ? metric : `${run}: ${metric}`} (val)`, p.step, p.values)), hoverinfo: "text", ...legend });
        lines.push(`${run === "" ? "" : `${run}: `}${metric} (val): last ${formatNumber(means.at(-1)!)} at step ${val.at(-1)!.step}`);
      }
    });
    Object.entries(options.baselines ?? {}).forEach(([name, series], index) => {
      const numeric = series.every((x) => typeof x === "number");
      if (numeric && panel > 0) return;
      const values = seriesValues(series, metric);
      if (values.length === 0) return;
      const level = mean(values);
      const label = metrics.length === 1 ? `${name} (baseline)` : `${name}: ${metric} (baseline)`;
      const color = PALETTE[((runs.length > 1 ? runs.length : metrics.length) + index) % PALETTE.length]!;
      data.push({ type: "scatter", mode: "lines", x: [first, last], y: [level, level], yaxis, name: label,
        line: { color, width: 1.5, dash: BASELINE_DASHES[panel % BASELINE_DASHES.length] } });
      lines.push(`${label}: ${formatNumber(level)} ± ${formatNumber(standardError(values))} (n=${values.length})`);
    });
  });
  const stepCount = new Set(allSteps).size;
  const summary = [`${title}: ${stepCount} step(s), band ${band === "std" ? "± sd" : band}${smooth > 1 ? `, curve = mean of ${smooth} steps` : ""}`,
    ...lines.map((l) => `  ${l}`)].join("\n");
  // One panel per metric, top to bottom, sharing the step axis drawn under the last.
  const layout = baseLayout(title, "step", metrics[0]!);
  const height = (1 - PANEL_GAP * (metrics.length - 1)) / metrics.length;
  metrics.forEach((metric, panel) => {
    const top = 1 - panel * (height + PANEL_GAP);
    layout[panel === 0 ? "yaxis" : `yaxis${panel + 1}`] = { title: { text: metric }, zeroline: false, anchor: "x", domain: [Math.max(0, top - height), top] };
  });
  layout.xaxis = { ...(layout.xaxis as Record<string, unknown>), anchor: metrics.length === 1 ? "y" : `y${metrics.length}` };
  if (metrics.length > 1) layout.height = 140 + 200 * metrics.length;
  return new Plot(title, { data, layout }, summary);
}

// ---------------------------------------------------------------------------------------------------------------
// Training loss per optimizer step

export interface LossCurveOptions {
  title?: string;
  /** Steps in the moving mean drawn over the raw losses (single steps are noisy); default 10, 1 draws none. */
  window?: number;
}

/**
 * The loss of each optimizer step (e.g. `trainSft()`'s `losses`) and its moving mean. Lower is better, so the
 * summary names the lowest step and compares the mean of the first and last `window` steps.
 */
export function lossCurve(losses: readonly number[], options: LossCurveOptions = {}): Plot {
  const title = options.title ?? "Training loss per step";
  const window = options.window ?? 10;
  if (losses.length === 0) throw new ArtError("plot.loss", "lossCurve(): no losses to draw; pass the losses trainSft() returned.");
  if (!Number.isInteger(window) || window < 1) throw new ArtError("plot.loss", `lossCurve(): window must be an integer >= 1, got ${window}.`);
  const steps = losses.map((_, i) => i + 1);
  const data: Record<string, unknown>[] = [{ type: "scatter", mode: losses.length === 1 ? "markers" : "lines", x: steps, y: [...losses], name: "loss",
    line: { color: PALETTE[0], width: window > 1 ? 1 : 2 }, marker: { color: PALETTE[0], size: 5 } }];
  // The first and the last `span` steps, never overlapping.
  const span = Math.max(1, Math.min(window, Math.floor(losses.length / 2)));
  if (window > 1 && losses.length > window) {
    data.push({ type: "scatter", mode: "lines", x: steps, y: movingMean(losses, window), name: `mean of ${window} steps`, line: { color: PALETTE[1], width: 2 } });
  }
  const lowest = losses.reduce((best, loss, i) => (loss < losses[best]! ? i : best), 0);
  const summary = [`${title}: ${losses.length} step(s)`,
    `  loss: step 1 ${formatNumber(losses[0]!)} → step ${losses.length} ${formatNumber(losses.at(-1)!)} (lowest ${formatNumber(losses[lowest]!)} at step ${lowest + 1})`,
    `  mean of the first ${span} step(s) ${formatNumber(mean(losses.slice(0, span)))}, of the last ${span} ${formatNumber(mean(losses.slice(-span)))}`].join("\n");
  return new Plot(title, { data, layout: baseLayout(title, "optimizer step", "loss") }, summary);
}

// ---------------------------------------------------------------------------------------------------------------
// Reward distribution per group

export interface RewardDistributionOptions {
  metric?: string;
  title?: string;
  /** One label per group; default "group 1", "group 2", ... */
  labels?: string[];
}

/** One box per group with every trajectory shown as a point; the summary counts groups GRPO cannot learn from. */
export function rewardDistribution(groups: readonly TrajectoryGroup[], options: RewardDistributionOptions = {}): Plot {
  const metric = options.metric ?? "reward";
  const title = options.title ?? `${metric} per group`;
  const data: Record<string, unknown>[] = [];
  const lines: string[] = [];
  let flat = 0;
  groups.forEach((group, index) => {
    const values = metricValues(group.trajectories, metric);
    const label = options.labels?.[index] ?? `group ${index + 1}`;
    const color = PALETTE[index % PALETTE.length]!;
    data.push({ type: "box", y: values, name: label, boxpoints: "all", jitter: 0.4, pointpos: 0, boxmean: true,
      marker: { color, size: 5 }, line: { color } });
    if (values.length > 0 && std(values) === 0) flat += 1;
    if (index < 12) {
      lines.push(`${label}: mean ${formatNumber(mean(values))} sd ${formatNumber(std(values))} ` +
        `[${formatNumber(Math.min(...values))}, ${formatNumber(Math.max(...values))}] n=${values.length}`);
    }
  });
  if (groups.length > 12) lines.push(`... ${groups.length - 12} more group(s)`);
  const header = `${title}: ${groups.length} group(s)` +
    (flat > 0 ? `, ${flat} with equal ${metric}s (GRPO learns nothing from those)` : "");
  const layout = { ...baseLayout(title, "group", metric), showlegend: false };
  return new Plot(title, { data, layout }, [header, ...lines.map((l) => `  ${l}`)].join("\n"));
}

// ---------------------------------------------------------------------------------------------------------------
// Baseline versus trained

export type Series = readonly number[] | readonly (TrajectoryGroup | Trajectory)[];

export interface ComparisonOptions {
  /** Which value of a trajectory is compared when a series holds trajectories. Default "reward". */
  metric?: string;
  title?: string;
}

function seriesValues(series: Series, metric: string): number[] {
  if (series.every((x) => typeof x === "number")) return [...(series as readonly number[])];
  return metricValues(trajectoriesOf(series as readonly (TrajectoryGroup | Trajectory)[]), metric);
}

/** Compares models (e.g. { baseline, trained }): a box per series with its mean and sd, and mean ± standard error in the summary. */
export function compareRewards(series: Record<string, Series>, options: ComparisonOptions = {}): Plot {
  const metric = options.metric ?? "reward";
  const title = options.title ?? `${metric}: ${Object.keys(series).join(" vs ")}`;
  const entries = Object.entries(series).map(([name, s]) => ({ name, values: seriesValues(s, metric) }));
  if (entries.length === 0) throw new ArtError("plot.compare", "compareRewards(): pass at least one series, e.g. { baseline, trained }.");
  const data = entries.map(({ name, values }, index) => {
    const color = PALETTE[index % PALETTE.length]!;
    return { type: "box", y: values, name, boxpoints: "all", jitter: 0.4, pointpos: 0, boxmean: "sd", marker: { color, size: 5 }, line: { color } };
  });
  const first = mean(entries[0]!.values);
  const lines = entries.map(({ name, values }, index) => {
    const delta = index === 0 ? "" : ` (${mean(values) - first >= 0 ? "+" : ""}${formatNumber(mean(values) - first)} vs ${entries[0]!.name})`;
    return `${name}: ${formatNumber(mean(values))} ± ${formatNumber(standardError(values))} (n=${values.length})${delta}`;
  });
  const layout = { ...baseLayout(title, "", metric), showlegend: false };
  return new Plot(title, { data, layout }, [title, ...lines.map((l) => `  ${l}`)].join("\n"));
}
