import { describe, expect, it } from "vitest";
import { join } from "node:path";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { segmentsCoverRows } from "../../lib/model/backend.ts";
import { loadCausalLM } from "../../lib/load/causal-lm.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import { groupAdvantages } from "../../lib/grpo/loss.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import type { LoraConfig } from "../../lib/model/lora.ts";
import { loadAdapter, readAdapter } from "../../lib/model/peft.ts";
import { seededRandom } from "../../lib/core/random.ts";
import { checkpointDir, normalizedAdvantages, packRows, toBatch, tokenWeights, Trainer } from "../../lib/grpo/train.ts";
import { type TrainingSequence } from "../../lib/grpo/tokenize.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { relativeError, tensorFiniteDifferences } from "../model/check.ts";
import { generate } from "../../lib/model/generate.ts";
import { toSequence } from "./sampling.ts";
import { loadTinyModel, tmpDir } from "../model/tiny-fixture.ts";

function tinyTransformer(arch: "qwen2" | "qwen3" | "llama", seed = 1, tokenizer = false) {
  const dir = tmpDir(`ckpt-${arch}-`);
  writeTinyCheckpoint(dir, { arch, seed, tokenizer });
  return { dir, transformer: loadTransformer(dir, new CpuBackend()) };
}

/** Sets every LoRA B from its index (B = 0 would leave every A gradient 0). */
function setLoraB(model: DifferentiableTransformer, value: (i: number, layer: number) => number): void {
  for (const p of model.loras) model.backend.write(p.b.tensor, Float32Array.from({ length: p.b.tensor.size }, (_, i) => value(i, p.layer)));
}

/** The trained parameters' values, as host copies. */
function parameterValues(model: DifferentiableTransformer): Float32Array[] {
  return model.parameterTensors().map((p) => model.backend.download(p.value));
}

/** A few random sequences with sampled-token masks, advantages and slightly-off old logprobs (ratios ≠ 1). */
function randomSequences(vocab: number, seed: number): TrainingSequence[] {
  const random = seededRandom(seed);
  return [0, 1, 2, 3].map((trajectory) => {
    const length = 5 + trajectory;
    const tokens = Array.from({ length }, () => Math.floor(random() * vocab));
    const trainable = Uint8Array.from(tokens, (_, t) => (t >= 2 ? 1 : 0));
    const logprobs = Float32Array.from(tokens, () => -1 - 2 * random());
    return { tokens, trainable, logprobs, advantage: trajectory % 2 === 0 ? 1.2 : -0.7, trajectory };
  });
}

describe("Trainer: loss and gradients", () => {
  const { transformer } = loadTinyModel("qwen2");
  const config = transformer.config;

  const variants = [
    { klCoef: 0, policyLoss: "ppo", importanceSampling: "token" },
    { klCoef: 0.3, policyLoss: "ppo", importanceSampling: "token" },
    { klCoef: 0, policyLoss: "ppo", importanceSampling: "sequence" },
    { klCoef: 0, policyLoss: "ppo", importanceSampling: "geometric_average" },
  ] as const;
  // CISPO, truncated importance sampling and the KL penalty are not here: each detaches a factor, so the gradient is
  // by design not the derivative of the value; loss.test.ts checks them against PyTorch autograd with the same detach.
  for (const { klCoef, policyLoss, importanceSampling } of variants) {
    it(`GRPO gradients of the whole step match finite differences (${policyLoss}, ${importanceSampling} ratio, KL ${klCoef})`, () => {
      const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj", "down_proj"], useRslora: true }, seed: 3 });
      setLoraB(model, (i, layer) => Math.sin(i + layer));
      const trainer = new Trainer(model, { klCoef, policyLoss, importanceSampling, epsilon: 0.3, epsilonHigh: 0.3, microBatchSize: 2 });
      const sequences = randomSequences(config.vocabSize, 5);
      const { gradients, loss } = trainer.computeGradients(sequences);
      expect(Number.isFinite(loss)).toBe(true);
      expect([...gradients.keys()].length).toBe(2 * 3 * 2);
      for (const p of model.parameterTensors()) {
        const numeric = tensorFiniteDifferences(model.backend, p.value, () => trainer.computeGradients(sequences).loss);
        expect(relativeError(gradients.get(p.name)!, numeric), p.name).toBeLessThan(2e-3);
      }
    });
  }

  it("micro-batching does not change the gradients", () => {
    const sequences = randomSequences(config.vocabSize, 9);
    const grads = [1, 4].map((microBatchSize) => {
      const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["o_proj", "up_proj"], useRslora: false }, seed: 1 });
      setLoraB(model, () => 0.1);
      return new Trainer(model, { microBatchSize }).computeGradients(sequences).gradients;
    });
    for (const [name, g] of grads[0]) expect(relativeError(grads[1].get(name)!, g), name).toBeLessThan(1e-5);
  });

  it("a group's prompt stored once (packing) gives the same loss and gradients as separate sequences", () => {
    const random = seededRandom(21);
    const draw = (n: number) => Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
    const promptA = draw(5), promptB = draw(3);
    const sequence = (prompt: number[], completion: number[], advantage: number, trajectory: number): TrainingSequence => ({
      tokens: [...prompt, ...completion], trainable: Uint8Array.from([...prompt.map(() => 0), ...completion.map(() => 1)]),
      logprobs: Float32Array.from([...prompt, ...completion], () => -2 * random()), advantage, trajectory,
    });
    const sequences = [
      sequence(promptA, draw(3), 1, 0), sequence(promptB, draw(4), -1, 1), sequence(promptA, draw(2), -0.5, 2),
      sequence(promptA, draw(4), 0.7, 3), sequence(promptB, draw(2), 0.2, 4),
    ];
    const packed = toBatch(sequences, true);
    expect(packed.tokens.length).toBe(sequences.reduce((a, s) => a + s.tokens.length, 0) - 2 * (promptA.length - 1) - (promptB.length - 1));
    // Its segments (prompts stored once among them) hold every row once: packed attention writes its whole output.
    for (const batch of [packed, toBatch(sequences)]) expect(segmentsCoverRows(batch.segments, batch.tokens.length)).toBe(true);
    const results = [true, false].map((sharePrompts) => {
      const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["q_proj", "k_proj", "v_proj", "down_proj"], useRslora: false }, seed: 4 });
      setLoraB(model, (i) => Math.cos(i));
      return new Trainer(model, { sharePrompts, microBatchSize: 8 }).computeGradients(sequences);
    });
    expect(results[0].loss).toBeCloseTo(results[1].loss, 6);
    for (const [name, g] of results[1].gradients) expect(relativeError(results[0].gradients.get(name)!, g), name).toBeLessThan(1e-5);
  });

  it("packs a batch into rows as ART does: one AdamW update per row, each row's loss over its own tokens", () => {
    const lora: LoraConfig = { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj"], useRslora: false };
    // four trajectories of 7 tokens, two per shared prompt: rows of 16 hold two whole sequences each
    const random = seededRandom(4);
    const draw = (n: number) => Array.from({ length: n }, () => Math.floor(random() * config.vocabSize));
    const prompts = [draw(4), draw(4)];
    const sequences: TrainingSequence[] = [0, 1, 2, 3].map((trajectory) => {
      const tokens = [...prompts[trajectory >> 1], ...draw(3)];
      return { tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= 4 ? 1 : 0)), logprobs: Float32Array.from(tokens, () => -1 - random()),
        advantage: trajectory % 2 ? -1 : 1, trajectory };
    });
    const rows = packRows(sequences, 16, seededRandom(0 + 0)); // the trainer's shuffle: seed + step
    expect(rows.map((row) => row.map((s) => s.trajectory).sort())).toEqual(expect.arrayContaining([[0, 1], [2, 3]]));
    const fresh = () => new DifferentiableTransformer(transformer, { lora, seed: 2 });
    const packed = fresh();
    const result = new Trainer(packed, { packedSequenceLength: 16, learningRate: 1e-2 }).trainStep(sequences);
    expect(result).toMatchObject({ trained: true, gradientSteps: 2, step: 1 });
    // The same as two one-step calls on the rows in that order: every trajectory has 3 tokens, so the batch's
    // token weights are all 1 either way, and each row's loss is over its own 6 tokens.
    const manual = fresh();
    const oneByOne = new Trainer(manual, { optimizerSteps: "one", learningRate: 1e-2 });
    const steps = rows.map((row) => oneByOne.trainStep(row));
    expect(parameterValues(packed)).toEqual(parameterValues(manual));
    // Adam and clipping hide a gradient's scale from the weights: the loss and the gradient norm show it
    expect(result.loss).toBeCloseTo((steps[0].loss + steps[1].loss) / 2, 6);
    expect(result.gradNorm).toBeCloseTo((steps[0].gradNorm + steps[1].gradNorm) / 2, 6);
    // and a row's loss, by hand: CISPO's −Σ clip(ratio, 0, 5)·A·logp over the row's own 6 trained tokens
    const model = fresh();
    const logprobs = model.forward(toBatch(rows[0])).logprobs;
    let expected = 0, i = 0;
    for (const s of rows[0]) {
      for (let t = 1; t < s.tokens.length; t++) {
        if (!s.trainable[t]) continue;
        const ratio = Math.min(5, Math.exp(logprobs[i] - s.logprobs[t]));
        expected += (-ratio * s.advantage * logprobs[i++]) / 6;
      }
    }
    expect(new Trainer(model).computeGradients(rows[0]).loss).toBeCloseTo(expected, 6);
    expect(new Trainer(fresh(), { optimizerSteps: "one" }).trainStep(sequences).gradientSteps).toBe(1);
    // by default a row holds the longest sequence rounded up to 2048 tokens: all four here
    expect(new Trainer(fresh()).trainStep(sequences).gradientSteps).toBe(1);
  });

  it("normalizeAdvantages: a batch's advantages as ART's packer leaves them, mean |A|·w over the trained tokens 1", () => {
    const sequences = randomSequences(config.vocabSize, 3);
    const tokens = (s: TrainingSequence) => s.trainable.reduce((a, b) => a + b, 0);
    const normalized = normalizedAdvantages(sequences);
    const weights = tokenWeights(normalized, "grpo");
    const total = normalized.reduce((a, s) => a + tokens(s), 0);
    expect(normalized.reduce((a, s) => a + tokens(s) * Math.abs(s.advantage) * weights.get(s)!, 0) / total).toBeCloseTo(1, 12);
    expect(normalized.map((s) => Math.sign(s.advantage))).toEqual(sequences.map((s) => Math.sign(s.advantage)));
    // So a step does not see a batch-wide factor on the advantages: the same loss and the same update.
    const lora: LoraConfig = { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj"], useRslora: false };
    const [plain, scaled] = [1, 3].map((factor) => {
      const model = new DifferentiableTransformer(transformer, { lora, seed: 5 });
      setLoraB(model, (i) => 0.01 * ((i % 5) - 2));
      const step = (normalizeAdvantages: boolean) => new Trainer(model, { learningRate: 1e-2, normalizeAdvantages })
        .trainStep(sequences.map((s) => ({ ...s, advantage: s.advantage * factor })));
      return { result: step(true), values: parameterValues(model), unnormalized: step(false) };
    });
    expect(scaled.result.loss).toBeCloseTo(plain.result.loss, 6);
    scaled.values.forEach((v, i) => expect(relativeError(plain.values[i], v)).toBeLessThan(1e-6));
    // Off (the default), the advantages count as given: three times the loss.
    expect(scaled.unnormalized.loss).toBeCloseTo(3 * plain.unnormalized.loss, 5);
  });

  it("a step where every advantage is 0 trains nothing, says so, and still advances", () => {
    const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["q_proj"], useRslora: false } });
    const trainer = new Trainer(model);
    const before = parameterValues(model);
    const result = trainer.trainStep(randomSequences(config.vocabSize, 2).map((s) => ({ ...s, advantage: 0 })));
    expect(result.trained).toBe(false);
    expect(result.step).toBe(1);
    expect(result.message).toMatch(/nothing to train — every trajectory has advantage 0/);
    expect(parameterValues(model)).toEqual(before);
  });

  it("a non-finite reward refuses the step and writes nothing", () => {
    const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["q_proj"], useRslora: false } });
    const trainer = new Trainer(model);
    const before = parameterValues(model);
    const sequences = randomSequences(config.vocabSize, 2);
    sequences[1].advantage = NaN;
    expect(() => trainer.trainStep(sequences)).toThrow(/training step refused: .* advantage NaN; no weights were changed/);
    expect(trainer.step).toBe(0);
    expect(parameterValues(model)).toEqual(before);
  });

  it("KL needs LoRA (the reference is the adapter-disabled model)", () => {
    const model = new DifferentiableTransformer(transformer, { lora: null });
    expect(() => new Trainer(model, { klCoef: 0.1 })).toThrow("klCoef > 0 and klPenaltyCoef > 0 need LoRA training");
    expect(() => new Trainer(model, { klPenaltyCoef: 0.1 })).toThrow("klCoef > 0 and klPenaltyCoef > 0 need LoRA training");
  });
});

describe("PEFT adapters", () => {
  it("save → load gives identical logits in the engine and through loadCausalLM, and the training model's base pass matches the engine", async () => {
    const { dir: checkpoint, transformer } = tinyTransformer("qwen3", 1, true);
    const model = new DifferentiableTransformer(transformer, { lora: { rank: 4, alpha: 8, targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], useRslora: false }, seed: 2 });
    setLoraB(model, (i) => 0.05 * Math.cos(i));
    const dir = tmpDir("adapter-");
    model.saveAdapter(dir, "tiny-qwen3");
    const ids = [5, 17, 200, 3, 42, 9];
    const live = logitsWith(transformer, model.engineLoras(), ids);
    const loaded = logitsWith(transformer, loadAdapter(dir, transformer), ids);
    expect(loaded).toEqual(live);
    // the same adapter through the public loader: the default LoRA of logits() (and of generate/decode)
    const lm = await loadCausalLM(checkpoint, { device: "cpu", adapter: dir });
    expect(await lm.logits(ids)).toEqual(live);
    // the adapter really changes the model, and the training forward agrees with the engine's forward
    expect(relativeError(live, sequenceLogits(transformer, ids))).toBeGreaterThan(1e-3);
    const targets = Int32Array.from(ids, (_, i) => ids[(i + 1) % ids.length]);
    const batch = { tokens: Int32Array.from(ids), positions: Int32Array.from(ids, (_, i) => i), segments: [{ start: 0, length: ids.length }], targets };
    const trained = model.forward(batch, { keepActivations: false }).logprobs;
    const vocab = transformer.config.vocabSize;
    const engineLogprobs = ids.map((_, row) => {
      const z = live.subarray(row * vocab, (row + 1) * vocab);
      const max = Math.max(...z);
      return z[targets[row]] - max - Math.log(z.reduce((a, v) => a + Math.exp(v - max), 0));
    });
    expect(relativeError(trained, engineLogprobs)).toBeLessThan(1e-5);
    const reread = readAdapter(dir, transformer.config);
    expect(reread.lora).toEqual({ rank: 4, alpha: 8, useRslora: false, targetModules: model.lora!.targetModules });
  });

  it("refuses an adapter made for another model, naming the tensor and both shapes", () => {
    const { transformer: qwen3 } = tinyTransformer("qwen3");
    const { transformer: llama } = tinyTransformer("llama");
    const model = new DifferentiableTransformer(qwen3, { lora: { rank: 2, alpha: 4, targetModules: ["k_proj"], useRslora: false } });
    const dir = tmpDir("adapter-");
    model.saveAdapter(dir);
    expect(() => readAdapter(dir, llama.config)).toThrow(
      '"base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight" has shape [32,2] but this model (r=2) needs [8,2]; the adapter was trained for another model or rank',
    );
    expect(() => readAdapter(tmpDir("empty-"), llama.config)).toThrow(/adapter_config.json: missing/);
  });
});

function logitsWith(transformer: ReturnType<typeof tinyTransformer>["transformer"], loras: ReturnType<DifferentiableTransformer["engineLoras"]>, ids: number[]): Float32Array {
  const cache = transformer.createKvCache(1, ids.length);
  const logits = transformer.forward(Int32Array.from(ids), { slots: new Int32Array(ids.length), positions: Int32Array.from(ids, (_, i) => i) }, cache, null, loras);
  const host = transformer.backend.download(logits);
  cache.free();
  return host;
}

/** Toy verifiable task: reward = share of sampled tokens below 32 (1/8 of the vocabulary by chance). */
const reward = (tokens: number[]) => tokens.filter((t) => t < 32).length / tokens.length;

/** Rollouts sample with the engine's generate and the trainer's live LoRA (the arrays the optimiser updates). */
async function grpoRun(arch: "qwen3" | "llama", steps: number, checkpointAt?: { dir: string; step: number }) {
  const { transformer } = tinyTransformer(arch, 7);
  let model = new DifferentiableTransformer(transformer, { lora: { rank: 8, alpha: 16, targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], useRslora: false }, seed: 11 });
  let trainer = new Trainer(model, { learningRate: 5e-2, maxGradNorm: 1, microBatchSize: 16 });
  const prompts = [[1, 40, 41], [1, 90, 7], [1, 150, 151, 152], [1, 3, 250]];
  const meanRewards: number[] = [];
  for (let step = 0; step < steps; step++) {
    if (checkpointAt && step === checkpointAt.step) {
      trainer.saveCheckpoint(checkpointAt.dir);
      trainer = Trainer.resume(checkpointAt.dir, transformer);
      model = trainer.network;
    }
    const sequences: TrainingSequence[] = [];
    let total = 0;
    for (const [g, prompt] of prompts.entries()) {
      const requests = Array.from({ length: 8 }, (_, i) => ({ promptIds: prompt, maxTokens: 4, stopIds: [], seed: 1000 * (step + 1) + 10 * g + i }));
      const completions = await generate(transformer, requests, { loras: model.engineLoras() });
      const rewards = completions.map((c) => reward(c.tokenIds));
      total += rewards.reduce((a, b) => a + b, 0);
      groupAdvantages(rewards, true).forEach((a, i) => sequences.push(toSequence(prompt, completions[i], a, g * 8 + i)));
    }
    meanRewards.push(total / (prompts.length * 8));
    trainer.trainStep(sequences);
  }
  return { meanRewards, loras: parameterValues(model) };
}

describe("learning, not just running", () => {
  it("GRPO with a verifiable toy reward raises the mean reward on a tiny model (seeded, deterministic)", async () => {
    const { meanRewards } = await grpoRun("llama", 25);
    const first = meanRewards.slice(0, 3).reduce((a, b) => a + b) / 3;
    const last = meanRewards.slice(-3).reduce((a, b) => a + b) / 3;
    const trace = `mean rewards per step: ${meanRewards.map((r) => r.toFixed(2)).join(" ")}`;
    expect(first, trace).toBeLessThan(0.15); // chance level is 1/8
    expect(last, trace).toBeGreaterThan(first + 0.4); // measured 0.05 → ~0.8 (sampling seeds offset by 7777: 0.15 → ~0.8)
  });

  it("a resumed run reproduces an uninterrupted one exactly", async () => {
    const dir = join(tmpDir("resume-"), checkpointDir("toy", "tiny", 2).replace(/^\.art\//, ""));
    const straight = await grpoRun("llama", 4);
    const resumed = await grpoRun("llama", 4, { dir, step: 2 });
    expect(resumed.meanRewards).toEqual(straight.meanRewards);
    resumed.loras.forEach((value, i) => expect(value).toEqual(straight.loras[i]));
  });

  it("a resumed full-parameter SFT run reproduces an uninterrupted one exactly", () => {
    const sequence: TrainingSequence = {
      tokens: [1, 30, 31, 60, 61, 62], trainable: Uint8Array.from([0, 0, 0, 1, 1, 1]),
      logprobs: new Float32Array(6).fill(NaN), advantage: 0, trajectory: 0,
    };
    const run = (resumeAt: number | null) => {
      const { transformer } = tinyTransformer("qwen2", 4);
      let trainer = new Trainer(new DifferentiableTransformer(transformer, { lora: null }), { lora: null, learningRate: 1e-3 });
      for (let step = 0; step < 4; step++) {
        if (step === resumeAt) {
          const dir = join(tmpDir("resume-full-"), "0002");
          trainer.saveCheckpoint(dir);
          // a fresh copy of the base weights: everything must come from the checkpoint
          trainer = Trainer.resume(dir, tinyTransformer("qwen2", 4).transformer);
        }
        trainer.sftStep([sequence]);
      }
      return parameterValues(trainer.network);
    };
    const straight = run(null);
    run(2).forEach((value, i) => expect(value).toEqual(straight[i]));
  });

  it("SFT lowers the loss on assistant tokens (full-parameter and LoRA)", () => {
    for (const lora of [null, { rank: 4, alpha: 8, targetModules: ["q_proj" as const, "v_proj" as const, "up_proj" as const, "down_proj" as const], useRslora: false }]) {
      const { transformer } = tinyTransformer("qwen3", 4);
      const model = new DifferentiableTransformer(transformer, { lora });
      const trainer = new Trainer(model, { learningRate: lora ? 1e-2 : 3e-3, maxGradNorm: 1, weightDecay: 0 });
      const answer = [60, 61, 62, 63, 64, 65];
      const sequence: TrainingSequence = {
        tokens: [1, 30, 31, ...answer], trainable: Uint8Array.from([0, 0, 0, 1, 1, 1, 1, 1, 1]),
        logprobs: new Float32Array(9).fill(NaN), advantage: 0, trajectory: 0,
      };
      const losses = Array.from({ length: 15 }, () => trainer.sftStep([sequence]).loss);
      expect(losses[14], `SFT losses ${losses.map((l) => l.toFixed(2)).join(" ")}`).toBeLessThan(losses[0] * 0.5);
    }
  });
});

describe("packRows", () => {
  const sequence = (prompt: number[], completion: number, trajectory: number): TrainingSequence => {
    const tokens = [...prompt, ...Array(completion).fill(7)];
    return { tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= prompt.length ? 1 : 0)), logprobs: new Float32Array(tokens.length), advantage: 1, trajectory };
  };
  const noShuffle = () => 0.999999; // Fisher-Yates with j = i: the order packed

  it("fills rows in order, counts a prompt the row already holds once, never splits a sequence", () => {
    const a = [1, 2, 3, 4, 5], b = [9, 9];
    // 5 + 3 = 8; then a again: 4 more rows of it are shared (all but the last prompt token) → 8 + 4 = 12 ≤ 12
    const rows = packRows([sequence(a, 3, 0), sequence(a, 3, 1), sequence(b, 5, 2), sequence(a, 20, 3)], 12, noShuffle);
    expect(rows.map((row) => row.map((s) => s.trajectory))).toEqual([[0, 1], [2], [3]]); // 7 tokens of b do not fit; 25 > 12 alone
  });

  it("shuffles the rows with the random source it is given", () => {
    const many = Array.from({ length: 6 }, (_, i) => sequence([i + 1], 9, i));
    const order = (seed: number) => packRows(many, 10, seededRandom(seed)).map((row) => row[0].trajectory);
    expect(order(1).sort()).toEqual([0, 1, 2, 3, 4, 5]);
    expect(order(1)).toEqual(order(1));
    expect([2, 3, 4, 5].some((seed) => order(seed).join() !== order(1).join())).toBe(true);
  });
});
