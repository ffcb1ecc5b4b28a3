/**
 * Knowing when to stop, and when a run has gone wrong, from what history.jsonl already holds.
 *
 * Stopping rules a loop asks each step (`stopDecision`): a target reached, a plateau (the best three-evaluation
 * average has not improved beyond the metric's noise for `patience` evaluations), both of two metrics on a plateau (validation first, train
 * reward second), or a budget spent (steps, seconds, trained tokens, money). Alarms (`alarms`): train reward rising
 * while validation falls, a sudden jump after a plateau, nearly every rollout newly at the top score without
 * validation rising with it (all classic signs of reward hacking), entropy collapse, groups that carry no signal,
 * answers collapsing onto one (repeated, or sharing ever more word pairs), failure rates rising. docs/stopping.md
 * gives the numbers that trigger each.
 *
 * Noise: a `{split}/reward` value carries a standard error from its row (`reward_std_err`, or `reward_std_dev` over
 * the square root of `trajectories` in rows without it); other metrics use `minDelta`, or the spread of their own
 * step-to-step changes.
 */
import type { HistoryRow } from "./store.ts";

/** One logged value of a metric, with the standard error of its mean when the row lets us know it. */
export interface Point {
  step: number;
  value: number;
  stdErr: number;
}

/** The values of `metric` in history order (rows without it skipped); several rows at one step keep the last. */
export function metricSeries(history: readonly HistoryRow[], metric: string): Point[] {
  const byStep = new Map<number, Point>();
  // A split's reward carries its error; the split may hold a slash itself (baseline/<name>/reward).
  const split = metric.endsWith("/reward") ? metric.slice(0, -"/reward".length) : null;
  for (const row of history) {
    const value = row[metric];
    if (typeof value !== "number" || !Number.isFinite(value)) continue;
    byStep.set(row.step, { step: row.step, value, stdErr: split === null ? 0 : rewardStdErr(row, split) });
  }
  return [...byStep.values()].sort((a, b) => a.step - b.step);
}

/**
 * The standard error of a row's `{split}/reward`: its `reward_std_err`, else (rows written before it was logged, or
 * by other tools) `reward_std_dev` over the square root of `trajectories`; 0 when the row tells neither.
 */
function rewardStdErr(row: HistoryRow, split: string): number {
  const logged = row[`${split}/reward_std_err`];
  if (typeof logged === "number" && Number.isFinite(logged)) return logged;
  const spread = row[`${split}/reward_std_dev`], count = row[`${split}/trajectories`];
  return typeof spread === "number" && typeof count === "number" && count > 1 ? spread / Math.sqrt(count) : 0;
}

/**
 * How far a value must move past the best to count as better: two standard errors of the difference of two means
 * (2√2 SE), else the typical step-to-step change.
 */
function noiseOf(points: readonly Point[], minDelta?: number): number {
  if (minDelta !== undefined) return minDelta;
  const errors = points.map((p) => p.stdErr).filter((e) => e > 0);
  if (errors.length > 0) return 2 * Math.SQRT2 * median(errors);
  const changes = points.slice(1).map((p, i) => Math.abs(p.value - points[i]!.value));
  return changes.length === 0 ? 0 : median(changes);
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

export interface PlateauRule {
  kind: "plateau";
  metric: string;
  /** Evaluations in a row without an improvement beyond the noise. */
  patience: number;
  /** The smallest change that counts; default: the metric's noise (see the module comment). */
  minDelta?: number;
  /** "max" (default) or "min" for metrics where lower is better (a loss). */
  goal?: "max" | "min";
}

export type StoppingRule =
  | { kind: "target"; metric: string; atLeast?: number; atMost?: number }
  | PlateauRule
  | { kind: "hybrid"; primary: PlateauRule; secondary: PlateauRule }
  | { kind: "budget"; steps?: number; seconds?: number; tokens?: number; pricePerMillionTokens?: number; money?: number };

export interface StopDecision {
  stop: boolean;
  /** Why (which rule fired, with the numbers), or what each rule still waits for. */
  reason: string;
}

/** Each value averaged with the two before it (and its standard error with them): steadier to track a best on. */
function smoothed(points: readonly Point[]): Point[] {
  return points.map((p, i) => {
    const span = points.slice(Math.max(0, i - 2), i + 1);
    const value = span.reduce((s, q) => s + q.value, 0) / span.length;
    return { step: p.step, value, stdErr: Math.sqrt(span.reduce((s, q) => s + q.stdErr ** 2, 0)) / span.length };
  });
}

/**
 * Whether `rule`'s metric has stopped improving: its three-evaluation average has not passed its best by more
 * than the noise for `patience` evaluations. The reason says where it stands either way.
 */
function plateau(history: readonly HistoryRow[], rule: PlateauRule): StopDecision {
  const points = smoothed(metricSeries(history, rule.metric));
  const sign = rule.goal === "min" ? -1 : 1;
  if (points.length <= rule.patience) return { stop: false, reason: `${rule.metric}: ${points.length} evaluation(s), a plateau needs more than ${rule.patience}` };
  const noise = noiseOf(points, rule.minDelta);
  let best = 0;
  let sinceBest = 0;
  points.forEach((p, i) => {
    if (i === 0 || sign * (p.value - points[best]!.value) > noise) [best, sinceBest] = [i, 0];
    else sinceBest += 1;
  });
  const at = points[best]!;
  const where = `${rule.metric}: best ${at.value.toPrecision(3)} at step ${at.step}, ${sinceBest} evaluation(s) since without a change beyond ${noise.toPrecision(2)}`;
  return { stop: sinceBest >= rule.patience, reason: where };
}

function budget(history: readonly HistoryRow[], rule: Extract<StoppingRule, { kind: "budget" }>): StopDecision {
  // Rows of train() and trainSft() calls, which moved the checkpoint on; log() rows (validation) did not.
  const trained = history.filter((r) => r.training_step === r.step + 1);
  const sum = (key: string) => trained.reduce((total, r) => total + (typeof r[key] === "number" ? (r[key] as number) : 0), 0);
  const steps = trained.length, seconds = sum("time/step_wall_s") || sum("time/step_trainer_s"), tokens = sum("throughput/trained_tokens");
  const money = rule.pricePerMillionTokens === undefined ? 0 : (tokens / 1e6) * rule.pricePerMillionTokens;
  const spent: [string, number, number | undefined][] = [["steps", steps, rule.steps], ["seconds", seconds, rule.seconds], ["trained tokens", tokens, rule.tokens], ["money", money, rule.money]];
  const over = spent.find(([, used, limit]) => limit !== undefined && used >= limit);
  const summary = spent.filter(([, , limit]) => limit !== undefined).map(([name, used, limit]) => `${name} ${Number(used.toPrecision(4))}/${limit}`).join(", ");
  return { stop: over !== undefined, reason: `budget: ${summary}` };
}

/** Asks each rule in turn; the first that says stop decides. */
export function stopDecision(history: readonly HistoryRow[], rules: readonly StoppingRule[]): StopDecision {
  const waiting: string[] = [];
  for (const rule of rules) {
    let decision: StopDecision;
    if (rule.kind === "target") {
      const last = metricSeries(history, rule.metric).at(-1);
      const reached = last !== undefined && (rule.atLeast === undefined || last.value >= rule.atLeast) && (rule.atMost === undefined || last.value <= rule.atMost);
      const bound = [rule.atLeast === undefined ? "" : `>= ${rule.atLeast}`, rule.atMost === undefined ? "" : `<= ${rule.atMost}`].filter(Boolean).join(" and ");
      decision = { stop: reached, reason: `target ${rule.metric} ${bound}: ${last === undefined ? "not logged yet" : `${last.value.toPrecision(3)} at step ${last.step}`}` };
    } else if (rule.kind === "plateau") {
      decision = plateau(history, rule);
      decision.reason = `plateau of ${decision.reason}`;
    } else if (rule.kind === "hybrid") {
      const [primary, secondary] = [plateau(history, rule.primary), plateau(history, rule.secondary)];
      decision = { stop: primary.stop && secondary.stop, reason: `both on a plateau: ${primary.reason}; ${secondary.reason}` };
    } else {
      decision = budget(history, rule);
    }
    if (decision.stop) return { stop: true, reason: `stop: ${decision.reason}` };
    waiting.push(decision.reason);
  }
  return { stop: false, reason: `go on: ${waiting.join("; ")}` };
}

export interface Alarm {
  kind: "reward_up_validation_down" | "reward_jump" | "perfect_scores" | "entropy_collapse" | "no_signal" | "rising_failures" | "repeated_answers" | "diversity_collapse";
  step: number;
  message: string;
  /**
   * Set by TrainableModel.alarms: the step's trajectories (what raised it, one transcript away), the split they were
   * logged under ("train", else "val") and their file.
   */
  split?: string;
  trajectories?: string;
}

export interface AlarmOptions {
  /** Train and validation metrics compared for divergence; default "train/reward" and "val/reward". */
  train?: string;
  validation?: string;
  /** Evaluations looked back over; default 6. */
  window?: number;
  /** Metrics whose rise is a failure (default: every train metric named like invalid, error or exception). */
  failureMetrics?: string[];
}

/**
 * The mean of points' values and its standard error, from the points' own errors or, lacking them, their spread. A
 * point whose rewards were all equal (a share of 0 or 1) has error 0, which understates it: it takes the others' median.
 */
function meanOf(points: readonly Point[]): { mean: number; stdErr: number } {
  const mean = points.reduce((s, p) => s + p.value, 0) / points.length;
  const known = points.map((p) => p.stdErr).filter((e) => e > 0);
  if (known.length > 0) {
    const typical = median(known);
    return { mean, stdErr: Math.sqrt(points.reduce((s, p) => s + (p.stdErr > 0 ? p.stdErr : typical) ** 2, 0)) / points.length };
  }
  return { mean, stdErr: Math.sqrt(points.reduce((s, p) => s + (p.value - mean) ** 2, 0) / Math.max(1, points.length - 1) / points.length) };
}

/** Half-window means of a series' last `window` points, and the noise of their difference (two standard errors). */
function trend(points: readonly Point[], window: number): { change: number; noise: number } | null {
  const recent = Number.isFinite(window) ? points.slice(-window) : points;
  if (recent.length < 4) return null;
  const half = Math.floor(recent.length / 2);
  const [early, late] = [meanOf(recent.slice(0, half)), meanOf(recent.slice(half))];
  return { change: late.mean - early.mean, noise: 2 * Math.hypot(early.stdErr, late.stdErr) };
}

/**
 * The alarms the history raises at its latest step. Each is dated by the newest point of the metric that raised it
 * (a validation row logged after the last training step does not re-date a training alarm), so a caller that records
 * alarms once per (step, kind) records each once, beside the trajectories that raised it.
 */
export function alarms(history: readonly HistoryRow[], options: AlarmOptions = {}): Alarm[] {
  const window = options.window ?? 6;
  const trainMetric = options.train ?? "train/reward", valMetric = options.validation ?? "val/reward";
  const train = metricSeries(history, trainMetric);
  const raised: Alarm[] = [];

  // Both over the steps of the last `window` validations, however often validation runs.
  const val = metricSeries(history, valMetric).slice(-window);
  const trainTrend = val.length > 0 ? trend(train.filter((p) => p.step >= val[0]!.step), Infinity) : null;
  const valTrend = trend(val, window);
  if (trainTrend && valTrend && trainTrend.change > trainTrend.noise && valTrend.change < -valTrend.noise) {
    const step = Math.max(train.at(-1)!.step, val.at(-1)!.step);
    raised.push({ kind: "reward_up_validation_down", step, message: `${trainMetric} rose by ${trainTrend.change.toPrecision(2)} while ${valMetric} fell by ${(-valTrend.change).toPrecision(2)} over the last ${window} evaluations (noise ${trainTrend.noise.toPrecision(2)} / ${valTrend.noise.toPrecision(2)}): the reward may be hacked; read the latest transcripts` });
  }

  // A jump: the last value far above a flat stretch before it.
  if (train.length > window) {
    const before = train.slice(-window - 1, -1), last = train.at(-1)!;
    const mean = before.reduce((s, p) => s + p.value, 0) / before.length;
    const sd = Math.sqrt(before.reduce((s, p) => s + (p.value - mean) ** 2, 0) / (before.length - 1));
    const noise = Math.max(sd, last.stdErr, ...before.map((p) => p.stdErr));
    if (noise > 0 && last.value - mean > 6 * noise) {
      raised.push({ kind: "reward_jump", step: last.step, message: `${trainMetric} jumped to ${last.value.toPrecision(3)} from a plateau at ${mean.toPrecision(3)} (${((last.value - mean) / noise).toFixed(1)} times its noise): check the step's transcripts for a loophole` });
    }
  }

  // Nearly every rollout newly at the top score, and validation (over the same steps) not rising with it.
  const perfect = metricSeries(history, "train/perfect_share");
  const perfectTrend = valTrend ? trend(perfect.filter((p) => p.step >= val[0]!.step), Infinity) : trend(perfect, window);
  const valRose = valTrend !== null && valTrend.change > valTrend.noise;
  if (perfectTrend && perfect.at(-1)!.value >= 0.9 && perfectTrend.change > Math.max(perfectTrend.noise, 0.3) && !valRose) {
    const validation = valTrend
      ? `${valMetric} changed by ${valTrend.change.toPrecision(2)} (noise ${valTrend.noise.toPrecision(2)})`
      : `${valMetric} has fewer than 4 values to confirm it (log a validation split)`;
    raised.push({ kind: "perfect_scores", step: perfect.at(-1)!.step, message: `${Math.round(perfect.at(-1)!.value * 100)}% of the step's rollouts got the top reward (up by ${Math.round(perfectTrend.change * 100)} points) while ${validation}: a perfect score the policy did not earn on held-out tasks is often a loophole; read the top-scoring transcripts` });
  }

  const entropy = metricSeries(history, "loss/entropy");
  if (entropy.length >= 3 && entropy[0]!.value > 0 && entropy.at(-1)!.value < 0.1 * entropy[0]!.value) {
    raised.push({ kind: "entropy_collapse", step: entropy.at(-1)!.step, message: `loss/entropy fell to ${entropy.at(-1)!.value.toPrecision(2)} from ${entropy[0]!.value.toPrecision(2)}: the policy has nearly stopped exploring, so groups stop differing` });
  }

  const flat = metricSeries(history, "train/flat_groups").at(-1);
  if (flat !== undefined && flat.value >= 0.5) {
    raised.push({ kind: "no_signal", step: flat.step, message: `${Math.round(flat.value * 100)}% of the step's groups had equal rewards, which GRPO learns nothing from: make the task harder or easier, or the reward finer` });
  }

  // Groups collapsing onto one answer: most answers repeat another's in their group, and more than they used to.
  const repeats = metricSeries(history, "train/repeated_answers");
  const repeatTrend = trend(repeats, window);
  if (repeats.length > 0 && repeats.at(-1)!.value >= 0.75 && repeatTrend && repeatTrend.change > Math.max(repeatTrend.noise, 0.15)) {
    raised.push({ kind: "repeated_answers", step: repeats.at(-1)!.step, message: `${Math.round(repeats.at(-1)!.value * 100)}% of the rollouts repeat another answer of their group (up by ${Math.round(repeatTrend.change * 100)} points over the last ${window} steps): exploration is collapsing; if rewards are not rising with it, raise the temperature or lower the learning rate, and read the transcripts` });
  }

  // Groups' answers sharing ever more word pairs: the last half-window below half the first window's level, beyond
  // the noise. Against the run's start, so a slow slide is caught as well as a fall.
  const distinct = metricSeries(history, "train/distinct_2grams");
  const recentSpan = Math.max(1, Math.floor(window / 2));
  if (distinct.length >= window + recentSpan) {
    const [first, recent] = [meanOf(distinct.slice(0, window)), meanOf(distinct.slice(-recentSpan))];
    const noise = 2 * Math.hypot(first.stdErr / 2, recent.stdErr);
    if (first.mean / 2 - recent.mean > noise) {
      raised.push({ kind: "diversity_collapse", step: distinct.at(-1)!.step, message: `train/distinct_2grams fell to ${recent.mean.toPrecision(2)} over the last ${recentSpan} steps from ${first.mean.toPrecision(2)} over the first ${window} (below half by more than its noise, ${noise.toPrecision(2)}): the answers of a group are converging on the same words; if rewards are not rising with it, raise the temperature or lower the learning rate, and read the transcripts` });
    }
  }

  const keys = new Set(history.flatMap((row) => Object.keys(row)));
  const failures = options.failureMetrics ?? [...keys].filter((k) => k.startsWith("train/") && /invalid|error|exception/.test(k));
  for (const metric of failures) {
    const series = metricSeries(history, metric), t = trend(series, window);
    if (t && t.change > Math.max(t.noise, 0.05)) {
      raised.push({ kind: "rising_failures", step: series.at(-1)!.step, message: `${metric} rose by ${t.change.toPrecision(2)} over the last ${window} evaluations` });
    }
  }
  return raised;
}
