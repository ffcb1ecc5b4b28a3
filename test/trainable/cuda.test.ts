// TrainableModel on the GPU: rollouts and LoRA training share the CUDA engine's weights and adapter tensors.
// Runs only with ART_TEST_GPU=1 on a machine with CUDA; elsewhere it skips and says why.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { TrainableModel } from "../../lib/trainable/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { cudaAvailable, gpuSkipReason } from "../cuda/gpu.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-trainable-cuda-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
const prompt: Message[] = [{ role: "user", content: "Say something" }];

describe.skipIf(!cudaAvailable)(`TrainableModel on CUDA${gpuSkipReason ? ` (${gpuSkipReason})` : ""}`, () => {
  it("trains the adapter the server samples with, checkpoints it and resumes", async () => {
    const baseDir = path.join(root, "base"), artDir = path.join(root, ".art");
    writeTinyCheckpoint(baseDir, { arch: "qwen2", seed: 3, tokenizer: true });
    const options = { name: "agent-1", project: "proj", baseModel: baseDir, artDir, device: "cuda" as const, lora: { rank: 4, alpha: 8 }, log: () => {} };
    const model = await TrainableModel.load(options);
    expect(model.lm.backend.name).toBe("cuda");
    const client = model.openai();
    const sample = async (seed: number) => (await client.chat.completions.create({
      model: "agent-1", messages: prompt, max_tokens: 6, temperature: 1, seed, logprobs: true })).choices[0] as Choice;
    const logprobs = (choice: Choice) => choice.logprobs!.content!.map((c) => c.logprob);
    const before = await sample(42);
    const groups = await Promise.all([0, 1].map(async (g) => new TrajectoryGroup(await Promise.all([0, 1, 2, 3].map(async (i) => {
      const choice = await sample(100 + g * 10 + i);
      return new Trajectory({ messagesAndChoices: [...prompt, choice], reward: [...(choice.message.content ?? "")].filter((c) => c === "e").length + i * 0.1 });
    })))));
    const result = await model.train(groups, { learningRate: 5e-2 });
    expect(result.trained).toBe(true);
    expect(Number.isFinite(result.loss)).toBe(true);
    expect(logprobs(await sample(42))).not.toEqual(logprobs(before));
    const trained = model.network.parameterTensors().map((p) => model.network.backend.download(p.value));
    await model.close();
    const resumed = await TrainableModel.load(options);
    expect(resumed.step).toBe(1);
    resumed.network.parameterTensors().forEach((p, i) => expect(resumed.network.backend.download(p.value)).toEqual(trained[i]));
    await resumed.close();
  });
});
