/**
 * What a model costs to run on a task, beside how well it does: ART·E's comparison of baselines and the trained
 * model (accuracy, cost per 1,000 runs, latency), from each model's evaluation trajectories and what
 * Trajectory.finish() recorded in them (`duration`, `turns`, `prompt_tokens`, `completion_tokens`; docs/stopping.md).
 */
import type { Trajectory } from "../core/trajectory.ts";
import { Renderable, type MimeBundle } from "../notebook/display.ts";

/** Money per million tokens: one price for every token, or an API's separate prices for prompt and completion. */
export type TokenPrice = number | { prompt: number; completion: number };

/** One model of the comparison: its name and its evaluation rollouts on the task. */
export interface CostModel {
  name: string;
  trajectories: readonly Pick<Trajectory, "reward" | "metrics">[];
  /** This model's price; default: the table's (each API model has its own). */
  pricePerMillionTokens?: TokenPrice;
}

export interface CostTableOptions {
  /** The price of models that do not name their own; without any, cost is not shown. */
  pricePerMillionTokens?: TokenPrice;
  /** The trajectory metric whose mean is the accuracy (a boolean such as ART·E's `correct`, or 0..1); default the reward. */
  accuracyMetric?: string;
  /** Written before costs in the Markdown; default "$". */
  currency?: string;
}

/** One model's line: each number a mean over the runs that recorded it, null when none did. */
export interface CostRow {
  name: string;
  runs: number;
  accuracy: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
  /** Tokens of the runs that recorded both kinds, at the model's price, times 1,000. */
  costPer1000Runs: number | null;
  /** Seconds from a rollout's start to its finish(). */
  latencySeconds: number | null;
  turns: number | null;
}

/** The comparison's rows, shown as a Markdown table in a notebook (text in a terminal). */
export class CostTable extends Renderable {
  readonly rows: CostRow[];
  readonly currency: string;

  constructor(rows: CostRow[], currency: string) {
    super();
    this.rows = rows;
    this.currency = currency;
  }

  markdown(): string {
    const cell = (value: number | null, format: (v: number) => string) => (value === null ? "—" : format(value));
    const lines = this.rows.map((row) => `| ${row.name.replace(/\|/g, "\\|")} | ${cell(row.accuracy, (a) => `${(a * 100).toFixed(1)}%`)} | ` +
      `${cell(row.costPer1000Runs, (c) => `${this.currency}${c >= 0.01 || c === 0 ? c.toFixed(2) : c.toPrecision(2)}`)} | ` +
      `${cell(row.latencySeconds, (s) => `${s >= 10 ? s.toFixed(0) : s.toPrecision(2)} s`)} | ${cell(row.turns, (t) => t.toFixed(1))} | ${row.runs} |`);
    return ["| model | accuracy | cost / 1,000 runs | latency | turns | runs |", "| --- | ---: | ---: | ---: | ---: | ---: |", ...lines].join("\n");
  }

  toMimeBundle(): MimeBundle {
    return { "text/markdown": this.markdown(), "text/plain": this.markdown() };
  }

  toTerminal(): string {
    return this.markdown();
  }
}

/** The mean of the values that are numbers or booleans (as 0/1); null without any. */
function meanOf(values: readonly unknown[]): number | null {
  const numbers = values.filter((v) => typeof v === "number" || typeof v === "boolean").map(Number).filter(Number.isFinite);
  return numbers.length === 0 ? null : numbers.reduce((a, b) => a + b, 0) / numbers.length;
}

/** ART·E's comparison table (accuracy, cost per 1,000 runs, latency, turns) of `models`, in the order given. */
export function costTable(models: readonly CostModel[], options: CostTableOptions = {}): CostTable {
  const rows = models.map((model): CostRow => {
    const runs = model.trajectories;
    const price = model.pricePerMillionTokens ?? options.pricePerMillionTokens;
    const [promptPrice, completionPrice] = typeof price === "number" ? [price, price] : [price?.prompt, price?.completion];
    // A run's cost needs both counts: one alone would price it too cheap.
    const costs = promptPrice === undefined || completionPrice === undefined ? [] : runs.flatMap(({ metrics: m }) =>
      typeof m.prompt_tokens === "number" && typeof m.completion_tokens === "number" ? [(m.prompt_tokens * promptPrice + m.completion_tokens * completionPrice) / 1e6] : []);
    const cost = meanOf(costs);
    return {
      name: model.name,
      runs: runs.length,
      accuracy: meanOf(runs.map((t) => (options.accuracyMetric === undefined ? t.reward : t.metrics[options.accuracyMetric]))),
      promptTokens: meanOf(runs.map((t) => t.metrics.prompt_tokens)),
      completionTokens: meanOf(runs.map((t) => t.metrics.completion_tokens)),
      costPer1000Runs: cost === null ? null : cost * 1000,
      latencySeconds: meanOf(runs.map((t) => t.metrics.duration)),
      turns: meanOf(runs.map((t) => t.metrics.turns)),
    };
  });
  return new CostTable(rows, options.currency ?? "$");
}
