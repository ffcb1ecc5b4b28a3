/** Summary statistics for plots and their text summaries. Empty input gives NaN, never a throw. */
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
