/**
 * Baselines and validation on a schedule: evaluating a policy on scenarios with a rollout, a baseline's history row
 * beside the trained model's, validate() on its schedule with its mode in the row, the standard error every split's
 * reward carries, and the budget rule counting training steps only (validation rows are not steps).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { TrainableModel, metricSeries, stopDecision, summarizeGroups, type EvaluationContext, type HistoryRow } from "../../lib/trainable/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-evaluation-"));
const baseDir = path.join(root, "base");
const artDir = path.join(root, ".art");
const quiet = () => {};
const prompt: Message[] = [{ role: "user", content: "Say something" }];

beforeAll(() => writeTinyCheckpoint(baseDir, { arch: "qwen2", seed: 3, tokenizer: true }));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

const load = (name: string) => TrainableModel.load({ name, project: "evaluation", baseModel: baseDir, artDir, lora: { rank: 2 }, log: quiet });

/** One training step's groups: sampled answers rewarded by their "e"s, so the rewards differ and GRPO trains. */
async function trainingGroups(client: OpenAI, model: string, seed: number): Promise<TrajectoryGroup[]> {
  return Promise.all([0, 1].map(async (g) => new TrajectoryGroup(await Promise.all([0, 1, 2].map(async (i) => {
    const response = await client.chat.completions.create({ model, messages: prompt, max_tokens: 4, temperature: 1, seed: seed + g * 10 + i, logprobs: true });
    const choice = response.choices[0] as Choice;
    return new Trajectory({ messagesAndChoices: [...prompt, choice], reward: [...(choice.message.content ?? "")].filter((c) => c === "e").length + i * 0.1 });
  })))));
}

/** A scripted player: its reward is the scenario's number, its metrics say how it was asked to play. */
const scripted = async (scenario: number, context: EvaluationContext) =>
  new Trajectory({ reward: scenario, metrics: { greedy: context.mode === "greedy", repeat: context.repeat } }).finish();

const sampleStdErr = (values: number[]) => {
  const mean = values.reduce((a, b) => a + b, 0) / values.length;
  return Math.sqrt(values.reduce((a, v) => a + (v - mean) ** 2, 0) / (values.length - 1) / values.length);
};

describe("the standard error of a split's reward", () => {
  it("is logged from the groups' means: loose trajectories give std/√n, groups of a scenario count once", () => {
    const loose = [0, 1, 1, 0.5].map((reward) => ({ trajectories: [new Trajectory({ reward })], exceptions: [] }));
    expect(summarizeGroups("val", loose)["val/reward_std_err"]).toBeCloseTo(sampleStdErr([0, 1, 1, 0.5]), 12);
    // ART's reward_std_dev is the spread within groups: 0 for loose trajectories, which is no error bar.
    expect(summarizeGroups("val", loose)["val/reward_std_dev"]).toBe(0);
    const grouped = [new TrajectoryGroup([0, 1].map((reward) => new Trajectory({ reward }))), new TrajectoryGroup([1, 1].map((reward) => new Trajectory({ reward })))];
    expect(summarizeGroups("train", grouped)["train/reward_std_err"]).toBeCloseTo(sampleStdErr([0.5, 1]), 12);
    expect(summarizeGroups("train", [grouped[0]!])["train/reward_std_err"]).toBeCloseTo(sampleStdErr([0, 1]), 12);
    expect(summarizeGroups("val", [loose[0]!])["val/reward_std_err"]).toBeUndefined();
  });

  it("is what the monitor reads, for baselines too, with the older rows' reward_std_dev/√n as the fallback", () => {
    const rows: HistoryRow[] = [
      { step: 0, recorded_at: "", "val/reward": 0.5, "val/reward_std_err": 0.08, "val/reward_std_dev": 0, "val/trajectories": 64 },
      { step: 1, recorded_at: "", "val/reward": 0.6, "val/reward_std_dev": 0.4, "val/trajectories": 16 },
      { step: 1, recorded_at: "", "baseline/scripted/reward": 0.7, "baseline/scripted/reward_std_err": 0.05 },
    ];
    expect(metricSeries(rows, "val/reward").map((p) => p.stdErr)).toEqual([0.08, 0.1]);
    expect(metricSeries(rows, "baseline/scripted/reward")).toEqual([{ step: 1, value: 0.7, stdErr: 0.05 }]);
  });
});

describe("evaluation and baselines", () => {
  it("plays every scenario `repeats` times in the mode asked, one group per scenario", async () => {
    const model = await load("evaluated");
    const groups = await model.evaluate([0.2, 0.8], scripted, { repeats: 3, mode: "greedy", progress: false });
    expect(groups.map((g) => g.trajectories.map((t) => t.reward))).toEqual([[0.2, 0.2, 0.2], [0.8, 0.8, 0.8]]);
    expect(groups[0]!.trajectories.map((t) => t.metrics)).toMatchObject([{ greedy: true, repeat: 0 }, { greedy: true, repeat: 1 }, { greedy: true, repeat: 2 }]);
    expect((await model.evaluate([1], scripted, { progress: false }))[0]!.trajectories[0]!.metrics.greedy).toBe(false);
    await expect(model.evaluate([], scripted)).rejects.toThrow(/no scenarios to evaluate on/);
    await expect(model.evaluate([1], scripted, { repeats: 0 })).rejects.toThrow(/repeats must be a whole number .* got 0/);
    await expect(model.evaluate([1], scripted, { mode: "hot" as never })).rejects.toThrow(/mode must be "sampled" .* or "greedy" .* got "hot"/);
    await model.close();
  });

  it("logs a baseline beside the trained model's rows, kept apart from validation and from the step count", async () => {
    const model = await load("with-baselines");
    const groups = await model.evaluate([0, 1, 1, 0], scripted, { progress: false });
    const row = model.logBaseline("scripted", groups, { mode: "greedy" });
    expect(row).toMatchObject({ step: 0, "baseline/scripted/reward": 0.5, "baseline/scripted/trajectories": 4, "baseline/scripted/greedy": 1 });
    expect(row["baseline/scripted/reward_std_err"]).toBeCloseTo(sampleStdErr([0, 1, 1, 0]), 12);
    expect(row.training_step).toBeUndefined(); // no checkpoint of this model
    expect(fs.readFileSync(path.join(model.dir, "trajectories", "baseline", "scripted", "0000.jsonl"), "utf8").trim().split("\n")).toHaveLength(4);
    expect(model.history().filter((r) => "baseline/scripted/reward" in r)).toHaveLength(1);
    expect(metricSeries(model.history(), "val/reward")).toEqual([]);
    expect(() => model.logBaseline("../up", groups)).toThrow(/baseline name must be a non-empty name of letters.*"\.\.\/up"/);
    expect(() => model.logBaseline("scripted", groups, { mode: "sampled" })).toThrow(/"baseline\/scripted" holds greedy evaluations .* logBaseline\("scripted-sampled", \.\.\.\)/);
    await model.close();
  });
});

describe("validation on a schedule", () => {
  it("validates every N steps (the base model's step 0 too) with its mode in the row, once per step, and keeps the best", async () => {
    const model = await load("scheduled");
    const client = model.openai();
    // The model's quality at each step, as validation sees it: checkpoint 2 is better than 4.
    const quality = [0.3, 0.9, 0.6, 0.1, 0.2, 0.5];
    const rollout = async (scenario: number, context: EvaluationContext) => scripted(quality[model.step]! * scenario, context);
    const validated: number[] = [];
    for (let step = 0; step < 5; step++) {
      const validation = await model.validate({ every: 2, scenarios: [1, 1, 0.5], rollout, mode: "greedy", progress: false, keepBest: true });
      if (validation !== null) {
        validated.push(validation.step);
        expect(validation.row).toMatchObject({ step, training_step: step, "val/greedy": 1, "val/trajectories": 3 });
        expect(validation.row["val/reward"]).toBeCloseTo(quality[step]! * 2.5 / 3, 12);
        expect(validation.groups.flatMap((g) => g.trajectories.map((t) => t.metrics.greedy))).toEqual([true, true, true]);
      }
      await model.train(await trainingGroups(client, model.name, step * 7), { learningRate: 5e-2 });
    }
    expect(validated).toEqual([0, 2, 4]);
    expect(model.step).toBe(5);
    // Each validation pruned to the best (checkpoint 2; step 0 is the base model, which has none) and the latest then.
    expect(model.checkpoints()).toEqual([2, 4, 5]);
    // After the loop, every: 1 validates the last checkpoint; called again at the same step, nothing is repeated.
    const last = await model.validate({ every: 1, scenarios: [1], rollout, mode: "greedy", progress: false });
    expect(last?.step).toBe(5);
    expect(await model.validate({ every: 1, scenarios: [1], rollout, mode: "greedy", progress: false })).toBeNull();
    expect(model.history().filter((r) => typeof r["val/reward"] === "number").map((r) => r.step)).toEqual([0, 2, 4, 5]);
    // A sampled validation beside greedy ones is refused before any rollout; under its own split it is logged.
    let played = 0;
    const counting = async (scenario: number, context: EvaluationContext) => (played++, scripted(scenario, context));
    await expect(model.validate({ every: 1, split: "val2", scenarios: [1], rollout: counting, mode: "greedy", progress: false })).resolves.not.toBeNull();
    await expect(model.validate({ every: 1, split: "val2", scenarios: [1], rollout: counting, progress: false })).resolves.toBeNull(); // step 5 has a val2 row
    await model.train(await trainingGroups(client, model.name, 99), { learningRate: 5e-2 });
    played = 0;
    await expect(model.validate({ every: 1, split: "val2", scenarios: [1], rollout: counting, progress: false })).rejects.toThrow(/"val2" holds greedy evaluations .* \{ split: "val2_sampled" \}/);
    expect(played).toBe(0);
    expect((await model.validate({ every: 1, split: "val2_sampled", scenarios: [1], rollout: counting, progress: false }))!.row["val2_sampled/greedy"]).toBe(0);
    await expect(model.validate({ every: 0, scenarios: [1], rollout })).rejects.toThrow(/every must be a whole number of steps, 1 or more .* got 0/);
    await expect(model.validate({ every: 1, split: "a/b", scenarios: [1], rollout })).rejects.toThrow(/split must be a non-empty name/);
    await model.close();
  });

  it("budget counts training steps, not the validation rows logged between them", () => {
    const rows: HistoryRow[] = [];
    for (let step = 0; step < 4; step++) {
      rows.push({ step, recorded_at: "", training_step: step, "val/reward": 0.5 }); // what log() writes
      rows.push({ step, recorded_at: "", training_step: step + 1, "train/reward": 0.5 }); // what train() writes
    }
    expect(stopDecision(rows, [{ kind: "budget", steps: 5 }])).toEqual({ stop: false, reason: "go on: budget: steps 4/5" });
    expect(stopDecision(rows, [{ kind: "budget", steps: 4 }]).stop).toBe(true);
  });
});
