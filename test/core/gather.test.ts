import { describe, expect, it } from "vitest";
import {
  ArtError,
  completionTokenCount,
  gatherTrajectories,
  gatherTrajectoryGroups,
  type GatherProgressState,
  type ProgressReporter,
  Trajectory,
  TrajectoryGroup,
} from "../../lib/core/mod.ts";

/** A reporter that keeps every state it is shown. */
class RecordingProgress implements ProgressReporter {
  updates: GatherProgressState[] = [];
  finals: GatherProgressState[] = [];
  update(state: GatherProgressState): void {
    this.updates.push(structuredClone(state));
  }
  finish(state: GatherProgressState): void {
    this.finals.push(structuredClone(state));
  }
}

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function rollout(reward: number, options: { ms?: number; tokens?: number; metrics?: Record<string, number | boolean> } = {}) {
  return async () => {
    await delay(options.ms ?? 0);
    const choice = {
      index: 0,
      finish_reason: "stop" as const,
      logprobs: null,
      message: { role: "assistant" as const, content: "ok", refusal: null },
      token_ids: Array.from({ length: options.tokens ?? 0 }, (_, i) => i),
    };
    return new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, choice], reward, metrics: options.metrics });
  };
}

function failing(message: string, ms = 0) {
  return async (): Promise<Trajectory> => {
    await delay(ms);
    throw new Error(message);
  };
}

describe("gatherTrajectoryGroups", () => {
  it("runs all rollouts concurrently and keeps group and trajectory order", async () => {
    let running = 0;
    let peak = 0;
    const tracked = (reward: number, ms: number) => async () => {
      running++;
      peak = Math.max(peak, running);
      const t = await rollout(reward, { ms })();
      running--;
      return t;
    };
    const groups = await gatherTrajectoryGroups(
      [
        [tracked(1, 30), tracked(2, 5)],
        [tracked(3, 10), tracked(4, 20)],
      ],
      { progress: false },
    );
    expect(peak).toBe(4);
    expect(groups.map((g) => g.rewards)).toEqual([[1, 2], [3, 4]]);
  });

  it("records a failed rollout in its group when maxExceptions allows it", async () => {
    const groups = await gatherTrajectoryGroups([[rollout(1), failing("boom")], [rollout(2)]], { maxExceptions: 1, progress: false });
    expect(groups[0].rewards).toEqual([1]);
    expect(groups[0].exceptions.map((e) => e.message)).toEqual(["Error: boom"]);
  });

  it("throws a clear error naming the count and the first errors once too many rollouts fail", async () => {
    const run = gatherTrajectoryGroups([[failing("first"), failing("second", 5)], [rollout(1, { ms: 50 })]], {
      maxExceptions: 1,
      description: "train",
      progress: false,
    });
    await expect(run).rejects.toThrow(ArtError);
    await expect(run).rejects.toThrow(/train: 2 of 3 rollouts failed, more than maxExceptions allows \(1\)/);
    await expect(run).rejects.toThrow(/Error: first\n {2}- Error: second/);
  });

  it("fails fast: does not wait for slow rollouts once the limit is exceeded", async () => {
    const started = Date.now();
    const run = gatherTrajectoryGroups([[failing("boom"), rollout(1, { ms: 2000 })]], { progress: false });
    await expect(run).rejects.toThrow(/1 of 2 rollouts failed/);
    expect(Date.now() - started).toBeLessThan(1500);
  });

  it("does not run afterEach for groups that finish after the gather has failed", async () => {
    const judged: number[] = [];
    const run = gatherTrajectoryGroups([[failing("boom")], [rollout(7, { ms: 30 })]], {
      progress: false,
      afterEach: (group) => {
        judged.push(group.rewards[0]);
        return group;
      },
    });
    await expect(run).rejects.toThrow(/1 of 2 rollouts failed/);
    await delay(60);
    expect(judged).toEqual([]);
  });

  it("reads a fractional maxExceptions as a share of all rollouts", async () => {
    const four = () => [rollout(1), failing("a"), rollout(1), rollout(1)];
    await expect(gatherTrajectoryGroups([four(), four()], { maxExceptions: 0.25, progress: false })).resolves.toHaveLength(2);
    const tooMany = [[failing("a"), failing("b"), failing("c"), rollout(1)], four()];
    await expect(gatherTrajectoryGroups(tooMany, { maxExceptions: 0.25, progress: false })).rejects.toThrow(
      /3 of 8 rollouts failed, more than maxExceptions allows \(0.25 of 8 rollouts = 2\)/,
    );
  });

  it("rejects a maxExceptions that is neither a count nor a fraction", async () => {
    await expect(gatherTrajectoryGroups([], { maxExceptions: 1.5 })).rejects.toThrow(/whole count .* or a fraction between 0 and 1, got 1.5/);
    await expect(gatherTrajectoryGroups([], { maxExceptions: -1 })).rejects.toThrow(/got -1/);
  });

  it("counts a rollout that returns something other than a Trajectory as an exception", async () => {
    const bad = async () => ({ reward: 1 }) as unknown as Trajectory;
    await expect(gatherTrajectoryGroups([[bad]], { progress: false })).rejects.toThrow(/a rollout returned a plain object, not a Trajectory/);
  });

  it("drops groups whose rollouts all failed", async () => {
    const groups = await gatherTrajectoryGroups([[failing("x")], [rollout(5)]], { maxExceptions: 1, progress: false });
    expect(groups.map((g) => g.rewards)).toEqual([[5]]);
  });

  it("lets afterEach drop a group, replace it, or expand it into several", async () => {
    const groups = await gatherTrajectoryGroups([[rollout(0)], [rollout(1)], [rollout(2, { ms: 5 })]], {
      progress: false,
      afterEach: async (group) => {
        await delay(1);
        const reward = group.rewards[0];
        if (reward === 0) return null;
        if (reward === 1) return [group, new TrajectoryGroup([new Trajectory({ reward: 10 })])];
        return new TrajectoryGroup([new Trajectory({ reward: reward * 100 })]);
      },
    });
    expect(groups.map((g) => g.rewards)).toEqual([[1], [10], [200]]);
  });

  it("accepts groups already pending from TrajectoryGroup.fromRollouts and counts their exceptions", async () => {
    const pending = TrajectoryGroup.fromRollouts([rollout(1)(), failing("inner")()]);
    const progress = new RecordingProgress();
    await expect(gatherTrajectoryGroups([pending], { progress })).rejects.toThrow(/1 of 2 rollouts failed.*\n {2}- Error: inner/);
    const ok = await gatherTrajectoryGroups([TrajectoryGroup.fromRollouts([rollout(1)(), failing("inner")()]), [rollout(2)]], {
      maxExceptions: 1,
      progress,
    });
    expect(ok.map((g) => g.rewards)).toEqual([[1], [2]]);
    expect(progress.finals.at(-1)).toMatchObject({ completed: 3, total: 3, exceptions: 1 });
  });

  it("counts a pending group that rejects as one failed rollout", async () => {
    const rejected = Promise.reject(new Error("setup failed"));
    const groups = await gatherTrajectoryGroups([rejected, [rollout(1)]], { maxExceptions: 1, progress: false });
    expect(groups.map((g) => g.rewards)).toEqual([[1]]);
  });

  it("reports running metric averages, token counts and exceptions to the progress reporter", async () => {
    const progress = new RecordingProgress();
    await gatherTrajectoryGroups(
      [
        [rollout(1, { ms: 1, tokens: 3, metrics: { win: true, moves: 4 } }), rollout(0, { ms: 10, tokens: 5, metrics: { win: false } })],
        [failing("x", 20)],
      ],
      { progress, maxExceptions: 1, description: "play" },
    );
    expect(progress.updates.map((u) => u.completed)).toEqual([1, 2, 3]);
    expect(progress.updates[0]).toMatchObject({ total: 3, metrics: { reward: 1, win: 1, moves: 4 }, completionTokens: 3 });
    expect(progress.finals).toHaveLength(1);
    expect(progress.finals[0]).toMatchObject({
      description: "play",
      completed: 3,
      exceptions: 1,
      metrics: { reward: 0.5, win: 0.5, moves: 4 },
      completionTokens: 8,
    });
  });

  it("finishes the progress reporter once when the gather fails", async () => {
    const progress = new RecordingProgress();
    await expect(gatherTrajectoryGroups([[failing("x")]], { progress })).rejects.toThrow();
    expect(progress.finals).toHaveLength(1);
    expect(progress.finals[0].exceptions).toBe(1);
  });
});

describe("gatherTrajectories", () => {
  it("returns the successful trajectories in order and enforces maxExceptions", async () => {
    const trajectories = await gatherTrajectories([rollout(1, { ms: 10 }), failing("x"), rollout(2)], { maxExceptions: 1, progress: false });
    expect(trajectories.map((t) => t.reward)).toEqual([1, 2]);
    await expect(gatherTrajectories([failing("x")], { progress: false })).rejects.toThrow(/1 of 1 rollouts failed/);
  });
});

describe("completionTokenCount", () => {
  it("counts token_ids, else logprobs, across the main and additional histories", async () => {
    const t = await rollout(0, { tokens: 4 })();
    t.additionalHistories.push({
      messagesAndChoices: [
        {
          index: 0,
          finish_reason: "stop",
          message: { role: "assistant", content: "ab", refusal: null },
          logprobs: { content: [{ token: "a", logprob: -1, bytes: null, top_logprobs: [] }, { token: "b", logprob: -1, bytes: null, top_logprobs: [] }], refusal: null },
        },
      ],
    });
    expect(completionTokenCount(t)).toBe(6);
  });
});
