import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { readSftConversations, TrainableModel } from "../../lib/trainable/mod.ts";
import { interruptScope, requestInterrupt } from "../../lib/core/interrupt.ts";
import { resolveTrainConfig } from "../../lib/grpo/config.ts";
import { tokenizeGroups } from "../../lib/grpo/tokenize.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-trainable-"));
const baseDir = path.join(root, "base");
const artDir = path.join(root, ".art");
const quiet = () => {};
const prompt: Message[] = [{ role: "user", content: "Say something" }];

beforeAll(() => {
  writeTinyCheckpoint(baseDir, { arch: "qwen2", seed: 3, tokenizer: true });
});
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

async function sample(client: OpenAI, model: string, seed: number): Promise<Choice> {
  const response = await client.chat.completions.create({ model, messages: prompt, max_tokens: 6, temperature: 1, seed, logprobs: true });
  return response.choices[0] as Choice;
}

/** Groups of 4 answers rewarded by how often the letter "e" appears: rewards differ, so GRPO trains. */
async function rolloutGroups(client: OpenAI, model: string, seed: number): Promise<TrajectoryGroup[]> {
  return Promise.all([0, 1].map(async (g) => new TrajectoryGroup(await Promise.all([0, 1, 2, 3].map(async (i) => {
    const choice = await sample(client, model, seed + g * 10 + i);
    const text = choice.message.content ?? "";
    return new Trajectory({ messagesAndChoices: [...prompt, choice], reward: [...text].filter((c) => c === "e").length + i * 0.1, metrics: { chars: text.length } });
  })))));
}

const logprobsOf = (choice: Choice) => choice.logprobs!.content!.map((c) => c.logprob);

describe("TrainableModel", () => {
  it("serves base and adapter in-process, trains in place, writes ART's layout and resumes", async () => {
    const model = await TrainableModel.load({ name: "agent-1", project: "proj", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log: quiet });
    expect(model.step).toBe(0);
    const client = model.openai();
    const ids = (await client.models.list()).data.map((m) => m.id).sort();
    expect(ids).toEqual([baseDir, "agent-1", "agent-1@0"].sort());
    const modelJson = JSON.parse(fs.readFileSync(path.join(model.dir, "model.json"), "utf8"));
    expect(modelJson).toMatchObject({ name: "agent-1", project: "proj", base_model: baseDir, lora: { rank: 4, alpha: 8 } });

    // A new adapter (B = 0) answers exactly like the base model.
    const before = await sample(client, "agent-1", 42);
    const base = await sample(client, baseDir, 42);
    expect(before.token_ids).toEqual(base.token_ids);
    expect(logprobsOf(before)).toEqual(logprobsOf(base));

    const groups = await rolloutGroups(client, "agent-1", 100);
    // Training reads the prompt ids the engine recorded on each Choice, then the sampled ids.
    const sampled = groups[0].trajectories[0].messagesAndChoices[1] as Choice;
    const [sequence] = tokenizeGroups(model.lm.tokenizer, groups, resolveTrainConfig()).sequences;
    expect(sequence.tokens).toEqual([...sampled.prompt_token_ids!, ...sampled.token_ids!]);
    const result = await model.train(groups, { learningRate: 5e-2 });
    expect(result.trained).toBe(true);
    expect(model.step).toBe(1);
    expect(result.metrics.step).toBe(0);
    expect(result.metrics["train/trajectories"]).toBe(8);
    expect(result.metrics["train/reward"]).toBeCloseTo(groups.flatMap((g) => g.rewards).reduce((a, b) => a + b, 0) / 8, 10);
    expect(typeof result.metrics["train/chars"]).toBe("number");
    // ART's history fields: the loaders read step and recorded_at, the metrics as {split}/…, loss/*, time/*, throughput/*
    expect(result.metrics).toMatchObject({
      training_step: 1, "train/exception_rate": 0, "loss/num_gradient_steps": result.gradientSteps,
      "data/step_num_trajectories": 8, "data/step_num_groups_submitted": 2, "data/step_trainable_assistant_tokens": result.trainedTokens,
      "loss/train": result.loss, "loss/grad_norm": result.gradNorm, "loss/learning_rate": 5e-2, "throughput/trained_tokens": result.trainedTokens,
    });
    const spread = (rewards: number[]) => Math.sqrt(rewards.reduce((a, r) => a + (r - rewards.reduce((x, y) => x + y) / rewards.length) ** 2, 0) / rewards.length);
    expect(result.metrics["train/reward_std_dev"]).toBeCloseTo((spread(groups[0].rewards) + spread(groups[1].rewards)) / 2, 10);
    expect(result.metrics["time/step_trainer_s"]).toBeGreaterThan(0);
    expect(result.metrics["time/step_wall_s"]).toBeUndefined(); // the first call has no previous one to time from

    // The adapter the server uses is the trainer's own: the same request now has other logprobs, the base does not.
    const after = await sample(client, "agent-1", 42);
    expect(logprobsOf(after)).not.toEqual(logprobsOf(before));
    expect(logprobsOf(await sample(client, baseDir, 42))).toEqual(logprobsOf(base));

    const checkpoint = path.join(model.dir, "checkpoints", "0001");
    for (const file of ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "trainer_state.json"]) {
      expect(fs.existsSync(path.join(checkpoint, file)), file).toBe(true);
    }
    const lines = fs.readFileSync(path.join(model.dir, "trajectories", "train", "0000.jsonl"), "utf8").trim().split("\n");
    expect(lines).toHaveLength(8);
    expect(JSON.parse(lines[0]!)).toMatchObject({ group: 0, messages_and_choices: expect.any(Array) });

    const valRow = model.log([new TrajectoryGroup([new Trajectory({ reward: 0.25, metrics: { win: true } }), new Trajectory({ reward: 0.75, metrics: { win: false } })],
      { exceptions: [{ error: new Error("rollout failed"), message: "rollout failed" }] })]);
    expect(valRow).toMatchObject({ step: 1, training_step: 1, "val/reward": 0.5, "val/win": 0.5, "val/trajectories": 2, "val/reward_std_dev": 0.25, "val/exception_rate": 1 / 3 });
    expect(fs.existsSync(path.join(model.dir, "trajectories", "val", "0001.jsonl"))).toBe(true);
    expect(model.history().map((r) => r.step)).toEqual([0, 1]);
    await model.close();

    // A new TrainableModel resumes the adapter, optimizer and step from the latest checkpoint.
    const resumed = await TrainableModel.load({ name: "agent-1", project: "proj", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log: quiet });
    expect(resumed.step).toBe(1);
    const again = await sample(resumed.openai(), "agent-1", 42);
    expect(logprobsOf(again)).toEqual(logprobsOf(after));
    await resumed.close();
  });

  it("fine-tunes the same adapter on conversations (trainSft), from a JSONL file too, then trains with GRPO on it", async () => {
    const model = await TrainableModel.load({ name: "sft-agent", project: "proj", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log: quiet });
    const conversations = ["yes", "no", "maybe", "later"].map((answer, i) => ({ messages: [
      { role: "user", content: `question ${i}` }, { role: "assistant", content: "thinking" }, { role: "user", content: "and?" }, { role: "assistant", content: answer },
    ] as Message[] }));
    // every batch holds all four conversations, so the first step's loss (the untrained adapter) and the last's compare
    const result = await model.trainSft(conversations, { epochs: 12, batchSize: 4, learningRate: 2e-2, trainOn: "last" });
    expect(result.losses).toHaveLength(12);
    expect(result.losses.at(-1)!).toBeLessThan(0.5 * result.losses[0]);
    expect(result).toMatchObject({ step: 1, warnings: [] });
    expect(result.metrics).toMatchObject({ step: 0, training_step: 1, "sft/conversations": 4, "loss/num_gradient_steps": 12 });
    expect(model.checkpoints()).toEqual([1]);
    // the same adapter serves and goes on training
    const groups = await rolloutGroups(model.openai(), "sft-agent", 5);
    expect((await model.train(groups, { learningRate: 1e-2 })).step).toBe(2);
    const file = path.join(root, "sft.jsonl");
    fs.writeFileSync(file, conversations.map((c) => JSON.stringify(c)).join("\n") + "\n");
    expect((await model.trainSftFromFile(file, { batchSize: 2 })).losses).toHaveLength(2);
    fs.writeFileSync(file, JSON.stringify(conversations[0]) + "\n{not json\n");
    await expect(model.trainSftFromFile(file)).rejects.toThrow(`${file}: line 2 is not JSON`);
    await expect(model.trainSft(conversations, { batchSize: 0 })).rejects.toThrow("trainSft: batchSize must be an integer >= 1, got 0");
    expect(model.step).toBe(3);
    await model.close();
  });

  it("reads SFT conversations from JSONL (readSftConversations): tools kept, blank lines skipped, bad lines named", () => {
    const file = path.join(root, "read.jsonl");
    const tools = [{ type: "function", function: { name: "f", parameters: {} } }];
    fs.writeFileSync(file, `${JSON.stringify({ messages: prompt, tools })}\n\n${JSON.stringify({ messages: [] })}\n`);
    expect(readSftConversations(file)).toEqual([{ messages: prompt, tools }, { messages: [], tools: undefined }]);
    fs.writeFileSync(file, `${JSON.stringify({ messages: prompt })}\n{"conversation": []}\n`);
    expect(() => readSftConversations(file)).toThrow(`${file}: line 2 has no "messages" list`);
    expect(() => readSftConversations(path.join(root, "missing.jsonl"))).toThrow("missing.jsonl does not exist");
  });

  it("stores its base weights as bf16 when asked (dtype), and trains its f32 LoRA over them", async () => {
    const model = await TrainableModel.load({ name: "bf16-agent", project: "proj", baseModel: baseDir, artDir, dtype: "bf16", lora: { rank: 2 }, log: quiet });
    const layer = model.lm.model.weights.layers[0];
    expect([layer.qkv.weight.dtype, layer.gateUp.weight.dtype, layer.projections.down_proj.weight.dtype]).toEqual(["bf16", "bf16", "bf16"]);
    expect(model.network.parameterTensors().every((p) => p.value.dtype === "f32")).toBe(true);
    await model.close();
  });

  it("answers over loopback HTTP with the unmodified openai client", async () => {
    const model = await TrainableModel.load({ name: "http-agent", project: "proj", baseModel: baseDir, artDir, log: quiet });
    const server = await model.serve({ port: 0 });
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: "unused" });
    const choice = await sample(client, "http-agent", 5);
    expect(choice.token_ids!.length).toBeGreaterThan(0);
    expect(choice.token_ids).toEqual((await sample(model.openai(), "http-agent", 5)).token_ids);
    await model.close();
  });

  it("serves past checkpoints as name@step and deletes checkpoints except the latest and the best by a metric", async () => {
    const model = await TrainableModel.load({ name: "pruned", project: "proj", baseModel: baseDir, artDir, lora: { rank: 2 }, log: quiet });
    const client = model.openai();
    const valRewards = [0.1, 0.9, 0.3, 0.2];
    const liveAfter: number[][] = [logprobsOf(await sample(client, "pruned", 42))];
    for (const reward of valRewards) {
      model.log([new Trajectory({ reward })], { split: "val" });
      await model.train(await rolloutGroups(client, "pruned", model.step * 7), { learningRate: 5e-2 });
      liveAfter.push(logprobsOf(await sample(client, "pruned", 42)));
    }
    expect(model.checkpoints()).toEqual([1, 2, 3, 4]);
    // Each step changed the live adapter, and `pruned@step` answers as the live adapter did at that step.
    for (let step = 1; step <= 4; step++) expect(liveAfter[step]).not.toEqual(liveAfter[step - 1]);
    expect(model.inferenceName(2)).toBe("pruned@2");
    for (const step of [0, 2, 3]) expect(logprobsOf(await sample(client, model.inferenceName(step), 42)), `step ${step}`).toEqual(liveAfter[step]);
    expect(logprobsOf(await sample(client, "pruned@0", 42))).toEqual(logprobsOf(await sample(client, baseDir, 42)));
    expect((await client.models.list()).data.map((m) => m.id).filter((id) => id.startsWith("pruned@")).sort()).toEqual(["pruned@0", "pruned@1", "pruned@2", "pruned@3", "pruned@4"]);
    await expect(sample(client, "pruned@9", 42)).rejects.toThrow(/no checkpoint 9 under .*checkpoints of pruned: 0, 1, 2, 3, 4/);
    await expect(sample(client, "pruned@latest", 42)).rejects.toThrow(/after "@" comes a checkpoint step/);
    expect(() => model.deleteCheckpoints({ keepBestBy: "val/accuracy" })).toThrow(/"val\/accuracy" was never logged.*val\/reward/);
    // val/reward 0.9 was logged at step 1 (checkpoint 0001); the latest is 0004.
    expect(model.deleteCheckpoints({ keepBestBy: "val/reward" })).toEqual([2, 3]);
    expect(model.checkpoints()).toEqual([1, 4]);
    // a deleted checkpoint stops answering, also when it had been loaded; a kept one loads on its first request
    await expect(sample(client, "pruned@2", 42)).rejects.toThrow(/no checkpoint 2/);
    expect(logprobsOf(await sample(client, "pruned@1", 42))).toEqual(liveAfter[1]);
    await model.close();
  });

  it("deleteCheckpoints keeps the latest alone when the metric was logged only at the base model's step", async () => {
    const notes: string[] = [];
    const model = await TrainableModel.load({ name: "early-val", project: "proj", baseModel: baseDir, artDir, lora: { rank: 2 }, log: (m) => notes.push(m) });
    const client = model.openai();
    model.log([new Trajectory({ reward: 0.5 })], { split: "val" });
    for (let i = 0; i < 3; i++) await model.train(await rolloutGroups(client, "early-val", i * 7), { learningRate: 5e-2 });
    expect(model.deleteCheckpoints({ keepBestBy: "val/reward" })).toEqual([1, 2]);
    expect(model.checkpoints()).toEqual([3]);
    expect(notes.at(-1)).toMatch(/no checkpoint on disk has a "val\/reward" value yet; keeping the latest \(3\) only/);
    await model.close();
  });

  it("keeps the user's state beside the checkpoints: read, overwrite, merge", async () => {
    const options = { name: "stateful", project: "proj", baseModel: baseDir, artDir, lora: { rank: 2 }, log: quiet };
    const model = await TrainableModel.load(options);
    expect(model.readState()).toBeNull();
    model.overwriteState({ dataset: { epoch: 0, offset: 12, seen: [1, 2] }, note: "first" });
    expect(model.mergeState({ dataset: { offset: 40, seen: [3] }, best: 0.5 })).toEqual({ dataset: { epoch: 0, offset: 40, seen: [3] }, note: "first", best: 0.5 });
    await model.close();
    const resumed = await TrainableModel.load(options);
    expect(resumed.readState()).toEqual({ dataset: { epoch: 0, offset: 40, seen: [3] }, note: "first", best: 0.5 });
    expect(JSON.parse(fs.readFileSync(path.join(resumed.dir, "state.json"), "utf8"))).toEqual(resumed.readState());
    resumed.overwriteState({ only: true });
    expect(resumed.readState()).toEqual({ only: true });
    expect(() => resumed.overwriteState([1] as never)).toThrow(/model state is a JSON object.*got an array/);
    expect(() => resumed.mergeState({ score: Number.NaN })).toThrow(/state\.score is NaN, which JSON cannot hold/);
    expect(() => resumed.mergeState({ when: new Date(0) as never })).toThrow(/state\.when is Date, which JSON cannot hold/);
    expect(resumed.readState()).toEqual({ only: true }); // a refused update writes nothing
    fs.writeFileSync(path.join(resumed.dir, "state.json"), "{broken");
    expect(() => resumed.readState()).toThrow(/state\.json is not JSON .*overwriteState/);
    await resumed.close();
  });

  it("refuses bad names, a lora change at train time, and a name equal to the base id", async () => {
    await expect(TrainableModel.load({ name: "../up", project: "p", baseModel: baseDir, artDir, log: quiet }))
      .rejects.toThrow(/name must be a non-empty name of letters, digits.*"\.\.\/up"/);
    await expect(TrainableModel.load({ name: "m", project: "", baseModel: baseDir, artDir, log: quiet }))
      .rejects.toThrow(/project must be a non-empty name/);
    await expect(TrainableModel.load({ name: "same", project: "p", baseModel: "same", artDir, log: quiet }))
      .rejects.toThrow(/equals the base model's id/);
    const model = await TrainableModel.load({ name: "m", project: "p", baseModel: baseDir, artDir, log: quiet });
    expect(() => model.train([], { lora: { rank: 2 } } as never)).toThrow(/config\.lora cannot change between steps/);
    await model.close();
  });

  it("leaves the step and the adapter as they were when an interrupt stops train() before its step", async () => {
    const model = await TrainableModel.load({ name: "interrupted", project: "p", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log: quiet });
    const groups = await rolloutGroups(model.openai(), "interrupted", 7);
    const loop = interruptScope(() => "the notebook's loop"); // what a progress bar registers
    expect(requestInterrupt()).toBe(true);
    await expect(model.train(groups)).rejects.toThrow(/Interrupted \(Kernel > Interrupt\) during train\(\), before step 1/);
    loop.end();
    expect(model.step).toBe(0);
    expect(model.checkpoints()).toEqual([]);
    await model.train(groups, { learningRate: 5e-2 }); // the model stays usable
    expect(model.step).toBe(1);
    await model.close();
  });

  describe("crash safety", () => {
    const adapterOf = (model: TrainableModel) => model.network.parameterTensors().map((p) => Array.from(model.network.backend.download(p.value)));
    const load = (name: string, log: (line: string) => void = quiet) =>
      TrainableModel.load({ name, project: "crash", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log });

    it("undoes a step whose checkpoint cannot be written, and the retried step equals an undisturbed one", async () => {
      const reference = await load("undisturbed");
      const groups = await rolloutGroups(reference.openai(), "undisturbed", 31);
      await reference.train(groups, { learningRate: 5e-2 });
      const expected = adapterOf(reference);
      await reference.close();

      const model = await load("disk-trouble");
      const initial = adapterOf(model);
      const checkpoints = path.join(model.dir, "checkpoints");
      fs.mkdirSync(model.dir, { recursive: true });
      fs.writeFileSync(checkpoints, "not a folder"); // the save fails as a full or broken disk would
      await expect(model.train(groups, { learningRate: 5e-2 })).rejects.toThrow(
        /train\(\): step 1 failed while training or saving it under .*checkpoints\/0001 \(ENOTDIR: .*\); it was undone: the adapter and optimizer are as after step 0/);
      expect(model.step).toBe(0);
      expect(adapterOf(model)).toEqual(initial);
      expect(fs.existsSync(path.join(model.dir, "history.jsonl"))).toBe(false);
      expect(fs.readFileSync(path.join(model.dir, "trajectories", "train", "0000.jsonl"), "utf8").trim().split("\n")).toHaveLength(8); // the rollouts are logged

      fs.rmSync(checkpoints);
      await model.train(groups, { learningRate: 5e-2 });
      expect(adapterOf(model)).toEqual(expected); // AdamW's moments and step were put back too
      expect(model.checkpoints()).toEqual([1]);
      expect(fs.readFileSync(path.join(model.dir, "trajectories", "train", "0000.jsonl"), "utf8").trim().split("\n")).toHaveLength(8);
      await model.close();
    });

    it("removes a checkpoint whose history row cannot be written, so the step, checkpoint and row advance together", async () => {
      const model = await load("no-history");
      const groups = await rolloutGroups(model.openai(), "no-history", 41);
      fs.mkdirSync(path.join(model.dir, "history.jsonl"), { recursive: true });
      await expect(model.train(groups)).rejects.toThrow(/step 1 failed .*EISDIR/);
      expect([model.step, model.checkpoints()]).toEqual([0, []]);
      await model.close();
    });

    it("restores the history row of a step whose process died between saving the checkpoint and appending the row", async () => {
      const model = await load("killed");
      await model.train(await rolloutGroups(model.openai(), "killed", 81));
      await model.close();
      const history = path.join(model.dir, "history.jsonl");
      const row = fs.readFileSync(history, "utf8");
      expect(JSON.parse(fs.readFileSync(path.join(model.dir, "checkpoints", "0001", "history_row.json"), "utf8"))).toEqual(JSON.parse(row));
      fs.writeFileSync(history, ""); // kill -9 after the checkpoint's rename, before the append
      const lines: string[] = [];
      const resumed = await load("killed", (line) => lines.push(line));
      expect(fs.readFileSync(history, "utf8")).toBe(row);
      expect(lines.join("\n")).toMatch(/history\.jsonl lacked the row of .*0001 .*appended it from the checkpoint/);
      await resumed.close();
      await (await load("killed")).close(); // a second load finds the row there and adds nothing
      expect(fs.readFileSync(history, "utf8")).toBe(row);
    });

    it("resumes from the last complete checkpoint when the latest is damaged, and clears what crashed saves left", async () => {
      const model = await load("power-cut");
      for (const seed of [51, 61]) await model.train(await rolloutGroups(model.openai(), "power-cut", seed));
      await model.close();
      const checkpoints = path.join(model.dir, "checkpoints");
      fs.writeFileSync(path.join(checkpoints, "0002", "trainer_state.json"), ""); // what a power cut can leave
      fs.mkdirSync(path.join(checkpoints, "0003.tmp-2147483646"));              // a save cut short, its process gone
      const lines: string[] = [];
      const resumed = await load("power-cut", (line) => lines.push(line));
      expect(resumed.step).toBe(1);
      expect(resumed.checkpoints()).toEqual([1]);
      expect(lines.join("\n")).toMatch(/removed .*0003\.tmp-2147483646, left by a save that did not finish/);
      expect(lines.join("\n")).toMatch(/WARNING: checkpoint .*0002 is damaged \(.*trainer_state\.json: not a trainer state .*\); moved to .*0002\.damaged-\d+, resuming from the one before/);
      expect(fs.readdirSync(checkpoints).filter((e) => e.startsWith("0002.damaged-"))).toHaveLength(1);
      await resumed.train(await rolloutGroups(resumed.openai(), "power-cut", 71));
      expect(resumed.checkpoints()).toEqual([1, 2]);
      await resumed.close();
    });
  });

  it("logs the first step with nothing to train, and each sequence dropped as too long", async () => {
    const lines: string[] = [];
    const model = await TrainableModel.load({ name: "agent-flat", project: "proj", baseModel: baseDir, artDir, lora: { rank: 2, alpha: 4 }, log: (line) => lines.push(line) });
    const client = model.openai();
    const choices = await Promise.all([1, 2, 3, 4].map((seed) => sample(client, "agent-flat", seed)));
    const group = (rewards: number[]) => new TrajectoryGroup(choices.map((choice, i) => new Trajectory({ messagesAndChoices: [...prompt, choice], reward: rewards[i] })));
    const nothing = () => lines.filter((line) => line.includes("nothing to train")).length;
    for (const rewards of [[0.1, 0.1, 0.1, 0.1], [0.3, 0.3, 0.3, 0.3], [0, 1, 0, 1], [0.7, 0.7, 0.7, 0.7]]) await model.train([group(rewards)]);
    expect(model.step).toBe(4);
    expect(nothing()).toBe(1); // step 1 only: steps 2 and 4 go unsaid
    expect(model.history().filter((row) => row.training_step !== undefined).map((row) => row["data/step_num_groups_trainable"])).toEqual([0, 0, 1, 0]);
    expect(lines.find((line) => line.includes("nothing to train"))).toMatch(/agent-flat: step 1: nothing to train — every trajectory has advantage 0/);
    const result = await model.train([group([0, 1, 0, 1])], { maxSequenceLength: 4 });
    expect(result.trained).toBe(false);
    expect(lines.filter((line) => line.startsWith("art-ts: WARNING: agent-flat step 5:") && line.includes("longer than maxSequenceLength 4"))).toHaveLength(4);
    expect(nothing()).toBe(1);
    await model.close();
  });

  it("asks stopping rules and alarms about its own history, logging the decision", async () => {
    const lines: string[] = [];
    const model = await TrainableModel.load({ name: "monitored", project: "p", baseModel: baseDir, artDir, lora: { rank: 4, alpha: 8 }, log: (line) => lines.push(line) });
    for (const seed of [91, 92]) await model.train(await rolloutGroups(model.openai(), "monitored", seed));
    expect(model.stopDecision([{ kind: "budget", steps: 2 }])).toEqual({ stop: true, reason: "stop: budget: steps 2/2" });
    expect(lines.at(-1)).toBe("art-ts: monitored at step 2: stop: budget: steps 2/2");
    expect(model.stopDecision([{ kind: "budget", steps: 3 }]).stop).toBe(false);
    expect(model.alarms()).toEqual([]); // two steps: too few to judge
    await model.close();
  });

  it("says the model was closed, to a client made before close() and to every later call", async () => {
    const model = await TrainableModel.load({ name: "closed", project: "p", baseModel: baseDir, artDir, log: quiet });
    const client = model.openai(); // what a notebook's earlier cell holds when its last cell closed the model
    await model.close();
    await model.close(); // a second close is harmless
    const request = client.chat.completions.create({ model: "closed", messages: prompt, max_tokens: 2 });
    await expect(request).rejects.toThrow(/404 The model `closed` is no longer served: its server was closed \(model\.close\(\)\)\. Load the model again/);
    await expect(client.models.retrieve("closed")).rejects.toThrow(/no longer served/);
    expect(() => model.openai()).toThrow(/openai\(\): the model "closed" was closed .*re-run the cell that loads it/);
    expect(() => model.train([])).toThrow(/train\(\): the model "closed" was closed/);
    expect(() => model.trainSft([])).toThrow(/trainSft\(\): the model "closed" was closed/);
    expect(() => model.serve()).toThrow(/serve\(\): the model "closed" was closed/);
  });
});
