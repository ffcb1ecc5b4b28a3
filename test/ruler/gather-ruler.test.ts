import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { gatherTrajectoryGroups, limitConcurrency, Trajectory, type TrajectoryGroup } from "../../lib/core/mod.ts";
import { rulerScoreGroup } from "../../lib/ruler/mod.ts";
import { answer, JudgeServer, trajectoryBlocks } from "./judge-server.ts";

describe("RULER as gather's afterEach", () => {
  let server: JudgeServer;
  beforeEach(async () => {
    // Scores each trajectory by its answer's length; fails the group whose task is "poison".
    server = await JudgeServer.start((body) => {
      if (body.messages[1].content.includes("poison")) return { status: 400, error: "content policy" };
      const lengths = [...trajectoryBlocks(body).values()].map((m) => (m.at(-1) as { content: string }).content.length);
      return { content: answer(lengths.map((n) => n / 10)) };
    });
  });
  afterEach(() => server.close());

  const rollout = (task: string, reply: string) => async () =>
    new Trajectory({ messagesAndChoices: [{ role: "user", content: task }, { role: "assistant", content: reply }], reward: 1 });

  it("judges each group as it completes, a bounded number at a time, dropping groups the judge could not score", async () => {
    let inFlight = 0;
    let peak = 0;
    const judge = limitConcurrency(2, async (group: TrajectoryGroup) => {
      inFlight++;
      peak = Math.max(peak, inFlight);
      try {
        return await rulerScoreGroup(group, { judge: server.endpoint(), cache: false, swallowExceptions: true });
      } finally {
        inFlight--;
      }
    });
    const tasks = ["t1", "t2", "poison", "t3"];
    const groups = await gatherTrajectoryGroups(
      tasks.map((task) => [rollout(task, "ab"), rollout(task, "abcde")]),
      { afterEach: judge, progress: false },
    );
    expect(groups).toHaveLength(3);
    for (const group of groups) {
      expect(group.rewards).toEqual([0.2, 0.5]);
      expect(group.trajectories[0].metrics.independent_reward).toBe(1);
    }
    expect(peak).toBeLessThanOrEqual(2);
  });
});
