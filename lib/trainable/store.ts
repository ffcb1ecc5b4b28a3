/** The files of a trainable model's folder: history.jsonl rows and trajectories/{split}/{step:04d}.jsonl. */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";
import { isChoice, Trajectory, type TrajectoryGroup } from "../core/trajectory.ts";
import { equalRewards } from "../grpo/loss.ts";

/**
 * One line of history.jsonl: the step, when, and metrics named `{split}/{metric}`; or an alarm raised at the step
 * (`alarm`: its kind, `alarm_message`, `alarm_trajectories`: the file of the step's trajectories, relative to the folder).
 */
export interface HistoryRow {
  step: number;
  recorded_at: string;
  [metric: string]: number | string | boolean | null;
}

/**
 * The metrics ART logs for a split: `{split}/reward` and the mean of each numeric or boolean trajectory metric
 * (booleans count as 0/1); `{split}/reward_std_dev`, the mean over groups of more than one trajectory of the
 * population std of their rewards; `{split}/exception_rate`, the share of the groups' entries that are exceptions;
 * `{split}/flat_groups`, the share of those groups whose rewards are all equal; `{split}/trajectories`, their count;
 * and `{split}/reward_std_err`, the standard error of `{split}/reward` (rewardStdErr below). Beside them, for the monitor's alarms: `{split}/repeated_answers`, `{split}/perfect_share` and
 * `{split}/distinct_2grams` (see the functions below).
 */
/** Whether a group's rewards are all equal, exactly as groupAdvantages decides it (such a group trains nothing). */
export function flatGroup(group: Pick<TrajectoryGroup, "trajectories">): boolean {
  return equalRewards(group.trajectories.map((t) => t.reward));
}

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
    [`${split}/flat_groups`]: multi.length === 0 ? 0 : multi.filter(flatGroup).length / multi.length,
    // Rollouts whose final answer repeats another's in the same group: diversity collapsing (monitor.ts alarms).
    [`${split}/repeated_answers`]: repeatedAnswerShare(multi),
    // Rollouts at the top reward: nearly all of them, newly, with validation not rising, is a loophole's sign (monitor.ts).
    [`${split}/perfect_share`]: perfectShare(trajectories),
  };
  // Left out, not 0, when no answer has two words (one-word moves): 0 would read as a total collapse.
  const distinct = distinctBigramShare(multi);
  if (distinct !== undefined) row[`${split}/distinct_2grams`] = distinct;
  const stdErr = rewardStdErr(groups);
  if (stdErr !== undefined) row[`${split}/reward_std_err`] = stdErr;
  for (const [key, { total, count }] of sums) row[`${split}/${key}`] = total / count;
  return row;
}

/**
 * The standard error of the mean reward. Scenarios are what is sampled, and a group's trajectories share one, so it
 * is the sample std of the groups' mean rewards over the square root of their count: for loose trajectories (each its
 * own group, as validation often logs them) the usual std/√n. A single group's trajectories give their own std/√n.
 * Undefined below two trajectories. (reward_std_dev, ART's, is the spread within groups: GRPO's signal, not an error.)
 */
function rewardStdErr(groups: Pick<TrajectoryGroup, "trajectories">[]): number | undefined {
  const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
  const sampleStdErr = (values: number[]) => {
    const m = mean(values);
    return Math.sqrt(values.reduce((a, v) => a + (v - m) ** 2, 0) / (values.length - 1) / values.length);
  };
  const filled = groups.filter((g) => g.trajectories.length > 0);
  if (filled.length >= 2) return sampleStdErr(filled.map((g) => mean(g.trajectories.map((t) => t.reward))));
  const rewards = filled[0]?.trajectories.map((t) => t.reward) ?? [];
  return rewards.length >= 2 ? sampleStdErr(rewards) : undefined;
}

/**
 * A trajectory's final answer: its last choice's text, then each tool call's name and arguments (not its id: ids are
 * drawn afresh for every call, so two equal answers would never share them); empty without a choice.
 */
function finalAnswer(trajectory: Trajectory): string[] {
  const last = trajectory.messagesAndChoices.findLast(isChoice);
  if (!last) return [];
  const calls = (last.message.tool_calls ?? []).flatMap((call) => (call.type === "function" ? [call.function.name, call.function.arguments] : [call.custom.name, call.custom.input]));
  return [last.message.content ?? "", ...calls];
}

/** Over groups of two or more, the share of trajectories whose final answer equals another's in its group. */
function repeatedAnswerShare(groups: Pick<TrajectoryGroup, "trajectories">[]): number {
  let repeated = 0, total = 0;
  for (const group of groups) {
    const counts = new Map<string, number>();
    const answers = group.trajectories.map((t) => JSON.stringify(finalAnswer(t)));
    for (const answer of answers) counts.set(answer, (counts.get(answer) ?? 0) + 1);
    repeated += answers.filter((answer) => counts.get(answer)! > 1).length;
    total += answers.length;
  }
  return total === 0 ? 0 : repeated / total;
}

/** Rewards equal to the top one count as equal within this (sums of fractions such as 0.7 + 0.2 + 0.1 miss 1 slightly). */
const REWARD_TOLERANCE = 1e-9;

/**
 * The share of trajectories whose reward is the most the reward can be. That maximum is not known in general, so a
 * trajectory counts as perfect when its reward equals the highest of the split's trajectories and that highest is
 * at least 1: ART's rewards mostly lie in [0, 1], where 1 is the maximum; a split whose best is below 1 has no
 * perfect score (0). For a reward that can exceed 1 this is the share at the split's top score once that is 1 or more.
 */
function perfectShare(trajectories: readonly Trajectory[]): number {
  const top = trajectories.reduce((best, t) => Math.max(best, t.reward), -Infinity);
  if (!(top >= 1 - REWARD_TOLERANCE)) return 0;
  return trajectories.filter((t) => t.reward >= top - REWARD_TOLERANCE).length / trajectories.length;
}

/**
 * Over groups of two or more whose final answers hold any word bigram, the mean of distinct bigrams ÷ all bigrams
 * across the group's answers (words: runs of letters and digits, lower-cased; bigrams do not cross answers).
 * 1 when no pair of words repeats; 1 / (group size) when every answer is the same. Undefined without such a group.
 */
function distinctBigramShare(groups: Pick<TrajectoryGroup, "trajectories">[]): number | undefined {
  const shares = groups.flatMap((group) => {
    const bigrams = group.trajectories.flatMap((t) => {
      const words = finalAnswer(t).join("\n").toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
      return words.slice(1).map((word, i) => `${words[i]} ${word}`);
    });
    return bigrams.length === 0 ? [] : [new Set(bigrams).size / bigrams.length];
  });
  return shares.length === 0 ? undefined : shares.reduce((a, b) => a + b, 0) / shares.length;
}

/**
 * Writes the groups' trajectories to trajectories/{split}/{step:04d}.jsonl, one JSON line each (with its group
 * index): appended to what the file holds, or replacing it (a training step's rollouts, written again when the
 * step is retried).
 */
export function writeTrajectories(dir: string, split: string, step: number, groups: Pick<TrajectoryGroup, "trajectories">[], mode: "append" | "replace" = "append"): string {
  const file = trajectoriesFile(dir, split, step);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const lines = groups.flatMap((g, group) => g.trajectories.map((t) => JSON.stringify({ group, ...t.toJSON() })));
  const text = lines.length > 0 ? lines.join("\n") + "\n" : "";
  if (mode === "replace") fs.writeFileSync(file, text);
  else if (text !== "") fs.appendFileSync(file, text);
  return file;
}

/** Where writeTrajectories keeps a split's trajectories of a step. */
export function trajectoriesFile(dir: string, split: string, step: number): string {
  return path.join(dir, "trajectories", split, `${String(step).padStart(4, "0")}.jsonl`);
}

/** The trajectories writeTrajectories kept for a split's step, in the order written; none when it kept none. */
export function readTrajectories(dir: string, split: string, step: number): Trajectory[] {
  const file = trajectoriesFile(dir, split, step);
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter((line) => line.trim() !== "").map((line, i) => {
    try {
      return Trajectory.fromJSON(JSON.parse(line) as Record<string, unknown>);
    } catch (error) {
      throw new ArtError("bad_trajectories", `${file}: line ${i + 1} is not a trajectory (${(error as Error).message}); fix or remove that line`);
    }
  });
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
