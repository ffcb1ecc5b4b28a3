import { readFileSync } from "node:fs";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup } from "../../lib/core/mod.ts";
import { calibrateRuler, calibrationReport, kendallTau, spearman } from "../../lib/ruler/mod.ts";
import { answer, JudgeServer, trajectoryBlocks } from "./judge-server.ts";

interface Case { x: number[]; y: number[]; spearman: number; kendall: number }
const cases = JSON.parse(readFileSync(new URL("./fixtures/rank-correlation.json", import.meta.url), "utf8")) as Case[];

describe("rank correlations", () => {
  it("match SciPy's spearmanr and kendalltau (tau-b), ties included", () => {
    for (const c of cases) {
      expect(spearman(c.x, c.y)).toBeCloseTo(c.spearman, 12);
      expect(kendallTau(c.x, c.y)).toBeCloseTo(c.kendall, 12);
    }
  });

  it("are NaN when one side is constant, and refuse unpaired samples", () => {
    expect(spearman([1, 1, 1], [1, 2, 3])).toBeNaN();
    expect(kendallTau([1, 2, 3], [5, 5, 5])).toBeNaN();
    expect(() => spearman([1, 2], [1])).toThrow(/paired samples, got 2 and 1/);
  });
});

describe("calibrateRuler", () => {
  let server: JudgeServer;
  beforeEach(async () => {
    // The judge reads the number the agent answered; it agrees with the reward except that it swaps 2 and 3.
    server = await JudgeServer.start((body) => {
      const scoreOf: Record<string, number> = { "1": 0.1, "2": 0.6, "3": 0.4, "4": 0.9 };
      const scores = [...trajectoryBlocks(body).values()].map((m) => scoreOf[(m.at(-1) as { content: string }).content]);
      return { content: answer(scores) };
    });
  });
  afterEach(() => server.close());

  const group = (...answers: number[]) =>
    new TrajectoryGroup(answers.map((n) => new Trajectory({ messagesAndChoices: [{ role: "user", content: "pick" }, { role: "assistant", content: String(n) }], reward: n })));

  it("reports within-group and pooled rank correlation between RULER scores and the independent reward", async () => {
    const report = await calibrateRuler([group(1, 4), group(1, 2, 3, 4), group(2, 2)], { judge: server.endpoint(), cache: false });
    expect(report.groups).toBe(3);
    expect(report.trajectories).toBe(8);
    expect(report.rankedGroups).toBe(2); // the last group's rewards are all equal: nothing to rank
    expect(report.perGroup[0].spearman).toBe(1);
    expect(report.perGroup[1].spearman).toBeCloseTo(0.8, 12);
    expect(report.perGroup[1].kendall).toBeCloseTo(2 / 3, 12);
    expect(report.spearman).toBeCloseTo(0.9, 12);
    expect(report.kendall).toBeCloseTo(5 / 6, 12);
    expect(report.pooledSpearman).toBeCloseTo(spearman([0.1, 0.9, 0.1, 0.6, 0.4, 0.9, 0.6, 0.6], [1, 4, 1, 2, 3, 4, 2, 2]), 12);
  });

  it("explains what is missing when given groups that were never judged", () => {
    expect(() => calibrationReport([group(1, 2)])).toThrow(/lacks metrics.ruler_score or metrics.independent_reward; judge the groups with rulerScoreGroup first/);
  });
});
