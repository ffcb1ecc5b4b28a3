/**
 * Progress in notebooks, for gather (core's ProgressReporter interface) and for any loop (progress()).
 *
 * In a kernel, progress is one output rewritten in place (display_id updates, both kernels): a bar, counts,
 * running metric averages, completion tokens and their rate, exceptions. Importing art-ts inside a kernel
 * installs this as the default reporter of every gather. In a terminal, core's TerminalProgress draws it.
 */
import type { MetricValue } from "../core/trajectory.ts";
import { ArtError } from "../core/errors.ts";
import { interruptScope, type InterruptScope } from "../core/interrupt.ts";
import {
  formatProgressLine, setDefaultProgressReporter, TerminalProgress, type GatherProgressState, type ProgressReporter,
} from "../core/progress.ts";
import { HtmlView, LiveDisplay } from "./display.ts";
import { detectKernel } from "./kernel.ts";
import { escapeHtml, formatDuration, formatNumber } from "./text.ts";

/** At most this many metrics are drawn; the state has all of them. */
const SHOWN_METRICS = 6;

/** The state as HTML: a bar (green when finished) and the same details as the text line. */
export function progressHtml(state: GatherProgressState, finished: boolean): string {
  const fraction = state.total > 0 ? Math.min(1, state.completed / state.total) : finished ? 1 : 0;
  const details = [`${state.completed}/${state.total}`, formatDuration(state.elapsedSeconds)];
  const metrics = Object.entries(state.metrics).slice(0, SHOWN_METRICS).map(([name, value]) => `${name} ${formatNumber(value)}`);
  if (metrics.length > 0) details.push(metrics.join(" "));
  if (state.completionTokens > 0) {
    const rate = state.completionTokens / Math.max(state.elapsedSeconds, 1e-3);
    details.push(`${formatNumber(state.completionTokens)} tokens (${formatNumber(Math.round(rate))}/s)`);
  }
  const exceptions = state.exceptions > 0 ? ` &middot; <span style="color:#b91c1c">${state.exceptions} exception(s)</span>` : "";
  const alarms = (state.alarms ?? []).map((alarm) => `<div style="color:#b91c1c">&#9888; ALARM ${escapeHtml(alarm)}</div>`).join("");
  return (
    `<div style="font-family:ui-monospace,monospace;font-size:12px;line-height:1.6">` +
    (state.description ? `<b>${escapeHtml(state.description)}</b> ` : "") +
    `<span style="display:inline-block;width:200px;height:9px;background:#e5e7eb;border-radius:4px;vertical-align:middle">` +
    `<span style="display:block;width:${(fraction * 100).toFixed(1)}%;height:100%;background:${finished ? "#16a34a" : "#2563eb"};border-radius:4px"></span></span> ` +
    details.map(escapeHtml).join(" &middot; ") + exceptions + alarms + `</div>`
  );
}

/** A ProgressReporter drawing into one live notebook output; redraws closer than `minIntervalMs` are skipped. */
export class NotebookProgress implements ProgressReporter {
  private readonly live = new LiveDisplay();
  private readonly minIntervalMs: number;
  private readonly now: () => number;
  private lastDrawAt = -Infinity;

  constructor(options: { minIntervalMs?: number; now?: () => number } = {}) {
    this.minIntervalMs = options.minIntervalMs ?? 200;
    this.now = options.now ?? Date.now;
  }

  update(state: GatherProgressState): void {
    const now = this.now();
    if (now - this.lastDrawAt < this.minIntervalMs) return;
    this.lastDrawAt = now;
    void this.live.show(new HtmlView(progressHtml(state, false), formatProgressLine(state)));
  }

  /** Settles once the final state has been sent (the Deno kernel drops outputs sent after a cell ends). */
  finish(state: GatherProgressState): Promise<void> {
    return this.live.show(new HtmlView(progressHtml(state, true), formatProgressLine(state)));
  }
}

/** The reporter for where the code runs: a live output in a notebook kernel, core's stderr line in a terminal. */
export function progressReporter(): ProgressReporter {
  return detectKernel() === "terminal" ? new TerminalProgress() : new NotebookProgress();
}

// Inside a kernel, every gather shows a live output instead of writing carriage returns to stderr.
if (detectKernel() !== "terminal") setDefaultProgressReporter(() => new NotebookProgress());

export interface ProgressOptions {
  /** Default: progressReporter() for where the code runs. */
  reporter?: ProgressReporter;
  /** Clock in milliseconds, for tests. */
  now?: () => number;
}

/**
 * Progress of any loop (training steps, evaluation games) with the same display as gather: call
 * update(n, metrics, completionTokens) as items finish and done() at the end.
 */
export class Progress {
  completed = 0;
  completionTokens = 0;
  exceptions = 0;
  /** Alarms shown, by kind: the steps they fired at, first and last, and the latest message. */
  readonly alarms = new Map<string, { first: number; last: number; message: string }>();
  private readonly sums = new Map<string, { sum: number; count: number }>();
  private readonly reporter: ProgressReporter;
  private readonly now: () => number;
  private readonly startedAt: number;
  private finished = false;
  /** update() is a loop's step boundary: an interrupt from the kernel stops the loop there */
  private readonly interrupt: InterruptScope;

  readonly total: number;
  readonly label: string;

  constructor(total: number, label = "", options: ProgressOptions = {}) {
    this.total = total;
    this.label = label;
    if (!Number.isFinite(total) || total < 0) {
      throw new ArtError("progress.total", `progress(total): total must be a finite number >= 0, got ${total}.`);
    }
    this.reporter = options.reporter ?? progressReporter();
    this.now = options.now ?? Date.now;
    this.startedAt = this.now();
    this.interrupt = interruptScope(() => `the loop of progress "${this.label}" (${this.completed}/${this.total} done)`);
    this.reporter.update(this.state());
  }

  /** Records `n` more finished items, their metrics (averaged; booleans count as 0/1) and tokens (summed). */
  update(n = 1, metrics: Record<string, MetricValue> = {}, completionTokens = 0): void {
    if (this.finished) return;
    this.interruptCheck();
    this.completed += n;
    this.completionTokens += completionTokens;
    for (const [name, value] of Object.entries(metrics)) {
      const x = typeof value === "boolean" ? Number(value) : value;
      if (!Number.isFinite(x)) continue; // a NaN metric must not poison the running average
      const entry = this.sums.get(name) ?? { sum: 0, count: 0 };
      entry.sum += x;
      entry.count += 1;
      this.sums.set(name, entry);
    }
    this.reporter.update(this.state());
  }

  /**
   * Shows alarms under the bar from now on (model.alarms(): reward hacking, collapse, no signal), a line per kind:
   * "kind at step N: message", or "kind at steps A–B: message" (the latest) once it has fired at several steps.
   */
  alarm(...raised: readonly { kind: string; step: number; message: string }[]): void {
    if (this.finished) return;
    for (const { kind, step, message } of raised) {
      const seen = this.alarms.get(kind);
      this.alarms.set(kind, { first: Math.min(step, seen?.first ?? step), last: Math.max(step, seen?.last ?? step), message });
    }
    this.reporter.update(this.state());
  }

  /** Counts a failed item (shown as exceptions). */
  fail(n = 1): void {
    if (this.finished) return;
    this.interruptCheck();
    this.exceptions += n;
    this.completed += n;
    this.reporter.update(this.state());
  }

  /**
   * Draws the final state. In a notebook, await it when it ends a cell: it settles once the final state has
   * been sent (the Deno kernel drops outputs sent after a cell ends).
   */
  done(): Promise<void> {
    if (this.finished) return Promise.resolve();
    this.finished = true;
    this.interrupt.end();
    return Promise.resolve(this.reporter.finish(this.state()));
  }

  /** Stops the loop on an interrupt from the kernel, drawing the state it reached first. */
  private interruptCheck(): void {
    try {
      this.interrupt.check();
    } catch (error) {
      this.finished = true;
      this.interrupt.end();
      void this.reporter.finish(this.state());
      throw error;
    }
  }

  averages(): Record<string, number> {
    const result: Record<string, number> = {};
    for (const [name, { sum, count }] of this.sums) result[name] = sum / count;
    return result;
  }

  state(): GatherProgressState {
    return {
      description: this.label,
      completed: this.completed,
      total: this.total,
      exceptions: this.exceptions,
      metrics: this.averages(),
      completionTokens: this.completionTokens,
      elapsedSeconds: (this.now() - this.startedAt) / 1000,
      ...(this.alarms.size > 0 ? {
        alarms: [...this.alarms].map(([kind, { first, last, message }]) => `${kind} at step${first === last ? ` ${last}` : `s ${first}–${last}`}: ${message}`),
      } : {}),
    };
  }
}

/** A progress display over `total` items: `.update(n, metrics, tokens)` as items finish, `await .done()` at the end. */
export function progress(total: number, label = "", options: ProgressOptions = {}): Progress {
  return new Progress(total, label, options);
}
