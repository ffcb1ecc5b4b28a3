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

  it("records turns and tokens on finish() only where every sampled turn carries its ids", () => {
    const sampled = (prompt: number[] | undefined, ids: number[] | undefined, logprobs = 0): Choice => ({
      ...choice, prompt_token_ids: prompt, token_ids: ids,
      logprobs: logprobs === 0 ? null : { content: Array.from({ length: logprobs }, () => ({ token: "a", logprob: -1, bytes: null, top_logprobs: [] })), refusal: null },
    });
    // Turns of the main and additional histories; completion tokens from token_ids, else logprobs.
    const engine = new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, sampled([1, 2], [3, 4, 5])], additionalHistories: [{ messagesAndChoices: [sampled([1, 2, 3, 4], undefined, 2)] }] }).finish();
    expect(engine.metrics).toEqual({ duration: engine.metrics.duration, turns: 2, prompt_tokens: 6, completion_tokens: 5 });
    // An API's reply carries no ids: its tokens are unknown, not 0; a rollout's own counts are kept.
    const api = new Trajectory({ messagesAndChoices: [sampled([1], [2]), sampled(undefined, undefined)], metrics: { turns: 7 } }).finish();
    expect(api.metrics).toEqual({ duration: api.metrics.duration, turns: 7 });
    // A scripted rollout sampled nothing: no turns either.
    expect(new Trajectory({ messagesAndChoices: [{ role: "assistant", content: "B2" }] }).finish().metrics).toEqual({ duration: expect.any(Number) });
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
