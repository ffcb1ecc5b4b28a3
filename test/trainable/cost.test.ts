/** ART·E's comparison table (accuracy, cost per 1,000 runs, latency) from trajectories whose numbers are known. */
import { describe, expect, it } from "vitest";
import { Trajectory, type Choice } from "../../lib/core/trajectory.ts";
import { costTable } from "../../lib/trainable/cost.ts";

/** An evaluation rollout with what finish() would have recorded. */
const run = (reward: number, metrics: Record<string, number | boolean>) => new Trajectory({ reward, metrics });

describe("costTable", () => {
  // An API model: prompt and completion tokens priced apart; 3 of 4 right.
  const api = {
    name: "o4-mini",
    pricePerMillionTokens: { prompt: 2, completion: 8 },
    trajectories: [
      run(1, { correct: true, prompt_tokens: 1000, completion_tokens: 100, duration: 1, turns: 2 }),
      run(1, { correct: true, prompt_tokens: 2000, completion_tokens: 300, duration: 2, turns: 4 }),
      run(0.5, { correct: false, prompt_tokens: 1000, completion_tokens: 100, duration: 3, turns: 2 }),
      run(1, { correct: true, prompt_tokens: 2000, completion_tokens: 300, duration: 4, turns: 4 }),
    ],
  };
  // The trained model at the table's price; one run recorded no tokens (it is left out of the cost, not counted as free).
  const trained = {
    name: "Qwen | trained",
    trajectories: [run(1, { correct: true, prompt_tokens: 500, completion_tokens: 500, duration: 0.5, turns: 1 }), run(0, { correct: false, duration: 1.5, turns: 3 })],
  };

  it("means each column over the runs that recorded it, and prices tokens per model", () => {
    const table = costTable([api, trained], { pricePerMillionTokens: 0.5, accuracyMetric: "correct" });
    // o4-mini: (1500 * 2 + 200 * 8) / 1e6 = 0.0046 a run, 4.6 per 1,000. Trained: 1000 * 0.5 / 1e6 * 1000 = 0.5.
    expect(table.rows[0]).toEqual({ name: "o4-mini", runs: 4, accuracy: 0.75, promptTokens: 1500, completionTokens: 200, costPer1000Runs: expect.closeTo(4.6, 10), latencySeconds: 2.5, turns: 3 });
    expect(table.rows[1]).toEqual({ name: "Qwen | trained", runs: 2, accuracy: 0.5, promptTokens: 500, completionTokens: 500, costPer1000Runs: expect.closeTo(0.5, 10), latencySeconds: 1, turns: 2 });
    // The default accuracy is the mean reward.
    expect(costTable([api]).rows[0]!.accuracy).toBeCloseTo(0.875, 10);
  });

  it("shows no cost without a price or token counts, rather than a made-up one", () => {
    expect(costTable([trained]).rows[0]!.costPer1000Runs).toBeNull();
    const untimed = costTable([{ name: "scripted", trajectories: [run(1, {})] }], { pricePerMillionTokens: 1 }).rows[0]!;
    expect([untimed.costPer1000Runs, untimed.latencySeconds, untimed.turns, untimed.promptTokens]).toEqual([null, null, null, null]);
  });

  it("renders ART·E's table as Markdown for a notebook", () => {
    const table = costTable([api, trained, { name: "scripted", trajectories: [run(1, {})] }], { pricePerMillionTokens: 0.5, accuracyMetric: "correct", currency: "€" });
    expect(table.markdown()).toBe([
      "| model | accuracy | cost / 1,000 runs | latency | turns | runs |",
      "| --- | ---: | ---: | ---: | ---: | ---: |",
      "| o4-mini | 75.0% | €4.60 | 2.5 s | 3.0 | 4 |",
      "| Qwen \\| trained | 50.0% | €0.50 | 1.0 s | 2.0 | 2 |",
      "| scripted | — | — | — | — | 1 |",
    ].join("\n"));
    expect(table.toMimeBundle()["text/markdown"]).toBe(table.markdown());
  });

  it("reads what Trajectory.finish() records from sampled Choices", () => {
    const choice = (promptIds: number, sampled: number): Choice => ({
      index: 0, finish_reason: "stop", logprobs: null, message: { role: "assistant", content: "ok", refusal: null },
      prompt_token_ids: Array.from({ length: promptIds }, (_, i) => i), token_ids: Array.from({ length: sampled }, (_, i) => i),
    });
    const t = new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, choice(10, 4), { role: "user", content: "more" }, choice(20, 6)], reward: 1 }).finish();
    const [row] = costTable([{ name: "engine", trajectories: [t] }], { pricePerMillionTokens: 1e6 / 1000 }).rows;
    expect([row!.promptTokens, row!.completionTokens, row!.turns, row!.costPer1000Runs]).toEqual([30, 10, 2, 40]);
  });
});
