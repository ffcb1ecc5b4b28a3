/**
 * Progress of a gather: a small reporter interface and a plain terminal default. Notebook front-ends implement
 * the same interface (lib/notebook) and install themselves with setDefaultProgressReporter.
 */
import process from "node:process";
import { clipText } from "./text.ts";

export interface GatherProgressState {
  description: string;
  /** Rollouts finished, failed ones included. */
  completed: number;
  /** Rollouts expected; grows when a group given as a promise resolves to more than was known. */
  total: number;
  exceptions: number;
  /** Running averages over finished trajectories: `reward` and every numeric or boolean metric. */
  metrics: Record<string, number>;
  /** Completion tokens sampled so far (from each Choice's token_ids, else its logprobs). */
  completionTokens: number;
  elapsedSeconds: number;
  /** Alarms a loop raised (reward hacking, collapse: "kind at step N"), shown until the display ends. */
  alarms?: readonly string[];
}

export interface ProgressReporter {
  /** Called after each finished rollout, as often as rollouts finish; throttle in the reporter if drawing is costly. */
  update(state: GatherProgressState): void;
  /**
   * Called once, after the last rollout or when the gather fails. A returned promise settles once the final state
   * is shown, and the gather resolves only then (a notebook kernel could otherwise print the cell's result first).
   */
  finish(state: GatherProgressState): void | Promise<void>;
}

export type ProgressReporterFactory = (description: string) => ProgressReporter;

let defaultFactory: ProgressReporterFactory | null = null;

/** Installs the reporter every gather uses when its options name none (null restores the terminal default). */
export function setDefaultProgressReporter(factory: ProgressReporterFactory | null): void {
  defaultFactory = factory;
}

export function defaultProgressReporter(description: string): ProgressReporter {
  return defaultFactory ? defaultFactory(description) : new TerminalProgress();
}

interface ProgressStream {
  write(text: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

/**
 * One line on stderr. In a terminal it is redrawn in place (at most every `minIntervalMs`); when stderr is a
 * file or a pipe only the final line is written, so logs are not flooded with carriage returns.
 */
export class TerminalProgress implements ProgressReporter {
  private readonly stream: ProgressStream;
  private readonly minIntervalMs: number;
  private lastDraw = 0;

  constructor(options: { stream?: ProgressStream; minIntervalMs?: number } = {}) {
    this.stream = options.stream ?? process.stderr;
    this.minIntervalMs = options.minIntervalMs ?? 100;
  }

  update(state: GatherProgressState): void {
    if (!this.stream.isTTY) return;
    const now = Date.now();
    if (now - this.lastDraw < this.minIntervalMs) return;
    this.lastDraw = now;
    this.stream.write(`\r${fitToWidth(formatProgressLine(state), this.stream.columns)}\x1b[K`);
  }

  finish(state: GatherProgressState): void {
    const line = formatProgressLine(state);
    this.stream.write(this.stream.isTTY ? `\r${fitToWidth(line, this.stream.columns)}\x1b[K\n` : `${line}\n`);
  }
}

/** `gather 12/16 ██████░░ 75% 3.1s reward=0.531 win=0.25 tokens=1,234 exceptions=1` */
export function formatProgressLine(state: GatherProgressState): string {
  const fraction = state.total > 0 ? state.completed / state.total : 0;
  const barWidth = 20;
  const filled = Math.round(fraction * barWidth);
  const parts = [
    `${state.description} ${state.completed}/${state.total}`,
    `${"█".repeat(filled)}${"░".repeat(barWidth - filled)} ${Math.round(fraction * 100)}%`,
    `${state.elapsedSeconds.toFixed(1)}s`,
  ];
  for (const [name, value] of Object.entries(state.metrics)) parts.push(`${name}=${formatNumber(value)}`);
  if (state.completionTokens > 0) parts.push(`tokens=${state.completionTokens.toLocaleString("en-US")}`);
  if (state.exceptions > 0) parts.push(`exceptions=${state.exceptions}`);
  if (state.alarms && state.alarms.length > 0) parts.push(`ALARM ${state.alarms.join(", ")}`);
  return parts.join(" ");
}

function formatNumber(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toPrecision(3);
}

function fitToWidth(line: string, columns: number | undefined): string {
  return columns && line.length >= columns ? clipText(line, columns - 2) : line;
}
