/** The files of a trainable model's folder: history.jsonl rows and trajectories/{split}/{step:04d}.jsonl. */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";
import type { Trajectory, TrajectoryGroup } from "../core/trajectory.ts";

/** One line of history.jsonl: the step, when, and metrics named `{split}/{metric}`. */
export interface HistoryRow {
  step: number;
  recorded_at: string;
  [metric: string]: number | string | boolean | null;
}

/**
 * The metrics ART logs for a split: `{split}/reward` and the mean of each numeric or boolean trajectory metric
 * (booleans count as 0/1); `{split}/reward_std_dev`, the mean over groups of more than one trajectory of the
 * population std of their rewards; `{split}/exception_rate`, the share of the groups' entries that are exceptions;
 * `{split}/flat_groups`, the share of those groups whose rewards are all equal; and `{split}/trajectories`, their count.
 */
export function summarizeGroups(split: string, groups: Pick<TrajectoryGroup, "trajectories" | "exceptions">[]): Record<string, number> {
  const sums = new Map<string, { total: number; count: number }>();
  const add = (key: string, value: number) => {
    const entry = sums.get(key) ?? { total: 0, count: 0 };
    entry.total += value;
    entry.count += 1;
    sums.set(key, entry);
  };
  const trajectories = groups.flatMap((g) => g.trajectories);
  for (const t of trajectories) {
    add("reward", t.reward);
    for (const [key, value] of Object.entries(t.metrics)) add(key, typeof value === "boolean" ? Number(value) : value);
  }
  const multi = groups.filter((g) => g.trajectories.length > 1);
  const spreads = multi.map((g) => {
    const rewards = g.trajectories.map((t) => t.reward);
    const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
    return Math.sqrt(rewards.reduce((a, r) => a + (r - mean) ** 2, 0) / rewards.length);
  });
  const exceptions = groups.reduce((n, g) => n + g.exceptions.length, 0);
  const row: Record<string, number> = {
    [`${split}/trajectories`]: trajectories.length,
    [`${split}/reward_std_dev`]: spreads.length === 0 ? 0 : spreads.reduce((a, b) => a + b, 0) / spreads.length,
    [`${split}/exception_rate`]: trajectories.length + exceptions === 0 ? 0 : exceptions / (trajectories.length + exceptions),
    // Groups whose rewards are all equal give GRPO nothing to learn from (lib/trainable/monitor.ts alarms on them).
    [`${split}/flat_groups`]: multi.length === 0 ? 0 : spreads.filter((s) => s === 0).length / multi.length,
    // Rollouts whose final answer repeats another's in the same group: diversity collapsing (monitor.ts alarms).
    [`${split}/repeated_answers`]: repeatedAnswerShare(multi),
  };
  for (const [key, { total, count }] of sums) row[`${split}/${key}`] = total / count;
  return row;
}

/** A trajectory's final answer: its last choice's text and tool calls (empty without a choice). */
function finalAnswer(trajectory: Trajectory): string {
  const last = [...trajectory.messagesAndChoices].reverse().find((item) => !("role" in item));
  if (!last || "role" in last) return "";
  return `${last.message.content ?? ""}\u0000${JSON.stringify(last.message.tool_calls ?? [])}`;
}

/** Over groups of two or more, the share of trajectories whose final answer equals another's in its group. */
function repeatedAnswerShare(groups: Pick<TrajectoryGroup, "trajectories">[]): number {
  let repeated = 0, total = 0;
  for (const group of groups) {
    const counts = new Map<string, number>();
    const answers = group.trajectories.map(finalAnswer);
    for (const answer of answers) counts.set(answer, (counts.get(answer) ?? 0) + 1);
    repeated += answers.filter((answer) => counts.get(answer)! > 1).length;
    total += answers.length;
  }
  return total === 0 ? 0 : repeated / total;
}

/**
 * Writes the groups' trajectories to trajectories/{split}/{step:04d}.jsonl, one JSON line each (with its group
 * index): appended to what the file holds, or replacing it (a training step's rollouts, written again when the
 * step is retried).
 */
export function writeTrajectories(dir: string, split: string, step: number, groups: Pick<TrajectoryGroup, "trajectories">[], mode: "append" | "replace" = "append"): string {
  const folder = path.join(dir, "trajectories", split);
  fs.mkdirSync(folder, { recursive: true });
  const file = path.join(folder, `${String(step).padStart(4, "0")}.jsonl`);
  const lines = groups.flatMap((g, group) => g.trajectories.map((t) => JSON.stringify({ group, ...t.toJSON() })));
  const text = lines.length > 0 ? lines.join("\n") + "\n" : "";
  if (mode === "replace") fs.writeFileSync(file, text);
  else if (text !== "") fs.appendFileSync(file, text);
  return file;
}

export function appendHistory(dir: string, row: HistoryRow): void {
  fs.mkdirSync(dir, { recursive: true });
  fs.appendFileSync(path.join(dir, "history.jsonl"), JSON.stringify(row) + "\n");
}

export function readHistory(dir: string): HistoryRow[] {
  const file = path.join(dir, "history.jsonl");
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter((line) => line.trim() !== "").map((line, i) => {
    try {
      const row = JSON.parse(line) as HistoryRow;
      if (typeof row.step !== "number") throw new Error("no numeric step");
      return row;
    } catch (error) {
      throw new ArtError("bad_history", `${file}: line ${i + 1} is not a history row (${(error as Error).message}); fix or remove that line`);
    }
  });
}
