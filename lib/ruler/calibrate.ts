/**
 * Checking a judge before trusting it: over groups whose trajectories already carry an independent reward
 * (a win, a test pass, a reference answer), how well do RULER's scores rank them the same way?
 */
import { limitConcurrency } from "../core/concurrency.ts";
import { ArtError } from "../core/errors.ts";
import type { TrajectoryGroup } from "../core/trajectory.ts";
import { type RulerOptions, rulerScoreGroup } from "./ruler.ts";
import { kendallTau, mean, spearman } from "./stats.ts";

export interface GroupCalibration {
  rulerScores: number[];
  rewards: number[];
  /** NaN when either side is constant within the group (nothing to rank). */
  spearman: number;
  kendall: number;
}

export interface CalibrationReport {
  groups: number;
  trajectories: number;
  /** Mean within-group correlation over the groups where it is defined: RULER is relative, so this is the one to watch. */
  spearman: number;
  kendall: number;
  /** Groups that entered the means above. */
  rankedGroups: number;
  /** Correlation over all trajectories pooled (mixes groups of different difficulty; for reference). */
  pooledSpearman: number;
  pooledKendall: number;
  perGroup: GroupCalibration[];
}

/**
 * Judges each group (their current rewards are the independent reward) and reports the rank correlation
 * between RULER scores and those rewards. Groups are judged `concurrency` at a time (default 4).
 */
export async function calibrateRuler(groups: TrajectoryGroup[], options: RulerOptions & { concurrency?: number }): Promise<CalibrationReport> {
  const judge = limitConcurrency(options.concurrency ?? 4, (group: TrajectoryGroup) => rulerScoreGroup(group, { ...options, swallowExceptions: false }));
  const judged = await Promise.all(groups.map((group) => judge(group)));
  return calibrationReport(judged.map((group) => group!));
}

/** The same report for groups rulerScoreGroup has already judged (reads metrics.independent_reward and ruler_score). */
export function calibrationReport(judgedGroups: TrajectoryGroup[]): CalibrationReport {
  const perGroup = judgedGroups.map((group): GroupCalibration => {
    const rulerScores: number[] = [];
    const rewards: number[] = [];
    for (const t of group.trajectories) {
      const { ruler_score: score, independent_reward: reward } = t.metrics;
      if (typeof score !== "number" || typeof reward !== "number") {
        throw new ArtError("ruler_calibration", "RULER calibration: a trajectory lacks metrics.ruler_score or metrics.independent_reward; judge the groups with rulerScoreGroup first.");
      }
      rulerScores.push(score);
      rewards.push(reward);
    }
    return { rulerScores, rewards, spearman: spearman(rulerScores, rewards), kendall: kendallTau(rulerScores, rewards) };
  });
  const ranked = perGroup.filter((g) => Number.isFinite(g.spearman));
  const allScores = perGroup.flatMap((g) => g.rulerScores);
  const allRewards = perGroup.flatMap((g) => g.rewards);
  return {
    groups: perGroup.length,
    trajectories: allScores.length,
    spearman: ranked.length > 0 ? mean(ranked.map((g) => g.spearman)) : NaN,
    kendall: ranked.length > 0 ? mean(ranked.map((g) => g.kendall)) : NaN,
    rankedGroups: ranked.length,
    pooledSpearman: spearman(allScores, allRewards),
    pooledKendall: kendallTau(allScores, allRewards),
    perGroup,
  };
}
