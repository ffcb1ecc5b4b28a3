import { describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/mod.ts";

const choice: Choice = {
  index: 0,
  finish_reason: "tool_calls",
  logprobs: null,
  message: {
    role: "assistant",
    content: null,
    refusal: null,
    tool_calls: [{ id: "c1", type: "function", function: { name: "move", arguments: '{"to":"A1"}' } }],
  },
  token_ids: [1, 2, 3],
};

describe("Trajectory", () => {
  it("turns sampled choices back into assistant messages with their tool calls", () => {
    const t = new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, choice] });
    const messages = t.messages();
    expect(messages[0]).toEqual({ role: "user", content: "go" });
    expect(messages[1]).toEqual({ role: "assistant", content: "", tool_calls: choice.message.tool_calls });
  });

  it("round-trips through JSON, keeping the sampled token ids", () => {
    const t = new Trajectory({ messagesAndChoices: [choice], reward: 0.5, metrics: { win: true }, logs: ["x"], startTime: Date.now() - 1234 }).finish();
    const back = Trajectory.fromJSON(JSON.parse(JSON.stringify(t)));
    expect(back.reward).toBe(0.5);
    expect(back.metrics.win).toBe(true);
    expect((back.messagesAndChoices[0] as Choice).token_ids).toEqual([1, 2, 3]);
    expect([back.startTime, back.endTime]).toEqual([t.startTime, t.endTime]);
  });

  it("measures duration from startTime, which a trajectory built after its rollout passes", () => {
    const started = Date.now() - 2500;
    const built = new Trajectory({ reward: 1, startTime: started }).finish();
    expect(built.metrics.duration).toBeGreaterThanOrEqual(2.5);
    expect(built.metrics.duration).toBeLessThan(60);
    expect(new Trajectory().finish().metrics.duration).toBeLessThan(1);
    expect(() => new Trajectory({ startTime: Number.NaN })).toThrow(/startTime must be a time in ms since the epoch/);
  });
});

describe("TrajectoryGroup", () => {
  it("refuses an item that is not a Trajectory, naming it, instead of failing later with a TypeError", async () => {
    expect(() => new TrajectoryGroup([new Trajectory(), { reward: 1, messagesAndChoices: [] } as never])).toThrow(
      /TrajectoryGroup: item 2 is a plain object, not a Trajectory; build each one with new Trajectory/);
    const group = await TrajectoryGroup.fromRollouts([Promise.resolve({ reward: 1 } as never), Promise.resolve(new Trajectory({ reward: 0 }))]);
    expect(group.rewards).toEqual([0]);
    expect(group.exceptions.map((e) => e.message)).toEqual(["TypeError: a rollout returned a plain object, not a Trajectory"]);
  });
});

describe("TrajectoryGroup.fromRollouts", () => {
  it("keeps a throwing rollout as an exception of the group", async () => {
    const group = await TrajectoryGroup.fromRollouts([
      Promise.resolve(new Trajectory({ reward: 1 })),
      Promise.reject(new Error("env crashed")),
      () => Promise.resolve(new Trajectory({ reward: 0 })),
    ]);
    expect(group.rewards).toEqual([1, 0]);
    expect(group.exceptions.map((e) => e.message)).toEqual(["Error: env crashed"]);
  });
});
