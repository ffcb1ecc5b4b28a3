/** Summary statistics for plots and their text summaries. Empty input gives NaN, never a throw. */
import { ArtError } from "../core/errors.ts";
import { Trajectory, TrajectoryGroup, type MetricValue } from "../core/trajectory.ts";

export function mean(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  let sum = 0;
  for (const v of values) sum += v;
  return sum / values.length;
}

/** Population standard deviation (what GRPO's advantage normalisation uses). */
export function std(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const m = mean(values);
  let sq = 0;
  for (const v of values) sq += (v - m) * (v - m);
  return Math.sqrt(sq / values.length);
}

/** Standard error of the mean (sample std / sqrt(n)); 0 for a single value. */
export function standardError(values: readonly number[]): number {
  const n = values.length;
  if (n === 0) return NaN;
  if (n === 1) return 0;
  return std(values) * Math.sqrt(n / (n - 1)) / Math.sqrt(n);
}

/** The standard normal distribution's upper tail, P(Z > z) (Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7). */
export function normalUpperTail(z: number): number {
  const x = Math.abs(z) / Math.SQRT2;
  const t = 1 / (1 + 0.3275911 * x);
  const erfc = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))) * Math.exp(-x * x);
  return z >= 0 ? erfc / 2 : 1 - erfc / 2;
}

/** How far apart two samples' means are, measured against chance. */
export interface MeanComparison {
  /** mean(after) − mean(before) */
  difference: number;
  /** the difference's standard error, unpooled: √(s²_before / n_before + s²_after / n_after) */
  standardError: number;
  /** difference / standardError */
  z: number;
  /** two-sided p-value of z under the normal distribution: the chance of a difference this large if the means were equal */
  p: number;
}

/**
 * Compares the means of two independent samples (held-out games before and after training, say) with the
 * large-sample z-test: the difference over its unpooled standard error, read on the normal distribution. For 0/1
 * values (wins) it is the two-proportion z-test. Meant for a few dozen values per side or more, where the normal
 * approximation holds; each side needs two values at least.
 */
export function compareMeans(before: readonly number[], after: readonly number[]): MeanComparison {
  if (before.length < 2 || after.length < 2) {
    throw new ArtError("bad_sample", `compareMeans needs two values or more on each side, got ${before.length} and ${after.length}.`);
  }
  const difference = mean(after) - mean(before);
  const error = Math.hypot(standardError(before), standardError(after));
  const z = error > 0 ? difference / error : difference === 0 ? 0 : Math.sign(difference) * Infinity;
  return { difference, standardError: error, z, p: 2 * normalUpperTail(Math.abs(z)) };
}

/** The mean of each value and the `window - 1` before it (fewer at the start): a trailing moving mean. */
export function movingMean(values: readonly number[], window: number): number[] {
  return values.map((_, i) => mean(values.slice(Math.max(0, i + 1 - window), i + 1)));
}

/** The q-th quantile (0..1) with linear interpolation between order statistics. */
export function quantile(values: readonly number[], q: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const position = (sorted.length - 1) * Math.min(1, Math.max(0, q));
  const lower = Math.floor(position);
  const upper = Math.ceil(position);
  return sorted[lower]! + (sorted[upper]! - sorted[lower]!) * (position - lower);
}

function metricNumber(value: MetricValue | undefined): number | undefined {
  if (typeof value === "boolean") return Number(value);
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

/** All trajectories of groups and loose trajectories, in order. */
export function trajectoriesOf(items: Iterable<TrajectoryGroup | Trajectory>): Trajectory[] {
  const result: Trajectory[] = [];
  for (const item of items) {
    if (item instanceof TrajectoryGroup) result.push(...item.trajectories);
    else result.push(item);
  }
  return result;
}

/** The values of one metric over trajectories: "reward" is the reward, any other name a metrics entry. */
export function metricValues(trajectories: readonly Trajectory[], metric: string): number[] {
  const values: number[] = [];
  for (const t of trajectories) {
    const value = metric === "reward" ? metricNumber(t.reward) : metricNumber(t.metrics[metric]);
    if (value !== undefined) values.push(value);
  }
  return values;
}
