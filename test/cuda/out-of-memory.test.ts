// Out of GPU memory in the middle of a training step, on the emulated device with a memory limit (no GPU needed):
// the step fails with an ArtError that names what to change, gives back everything it had allocated, changes no
// weight, and the same model then trains and generates as if nothing had happened.
import { describe, expect, it } from "vitest";
import { Trainer } from "../../lib/grpo/train.ts";
import { type TrainingSequence } from "../../lib/grpo/tokenize.ts";
import { generate } from "../../lib/model/generate.ts";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { tinyCheckpoint } from "../model/helpers.ts";
import { buildEmulator, createEmulatedBackend, findCompiler } from "./emulated-device.ts";

const compiler = findCompiler();
const indexCacheBound = 8 * 512;

const sequences = (vocab: number): TrainingSequence[] => Array.from({ length: 3 }, (_, s) => {
  const tokens = Array.from({ length: 24 }, (_, t) => (s * 31 + t * 7 + 1) % vocab);
  return { tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= 8 ? 1 : 0)), logprobs: new Float32Array(24).fill(NaN), advantage: s === 1 ? -1 : 1, trajectory: s };
});

describe.skipIf(compiler === null)("out of GPU memory during a training step (emulated device)", () => {
  for (const recompute of [false, true] as const) {
    it(`fails with the knobs named, frees what the step held, changes nothing, and trains afterwards (recomputeActivations ${recompute})`, async () => {
      const backend = createEmulatedBackend(buildEmulator(compiler!));
      const device = backend.context;
      const base = loadTransformer(tinyCheckpoint({ arch: "qwen3", seed: 5 }), backend, "bf16");
      const lora = { rank: 4, alpha: 8, targetModules: [...PROJECTIONS], useRslora: false };
      const network = new DifferentiableTransformer(base, { lora });
      const trainer = new Trainer(network, { lora, learningRate: 1e-3, recomputeActivations: recompute });
      const batch = sequences(base.config.vocabSize);
      trainer.trainStep(batch); // the optimizer's state and the backend's caches exist from here on
      const weights = () => network.parameterTensors().map((p) => Array.from(backend.download(p.value)));
      const before = weights();
      device.pool.resetPeak();
      trainer.trainStep(batch);
      const inUse = device.pool.stats().inUseBytes; // the backend's caches of index arrays included
      const stepBytes = device.pool.stats().peakReservedBytes - inUse;
      let current = weights();
      device.pool.trim();
      const held = device.outstandingBytes;
      // Budgets from nothing to a step's peak: each runs out somewhere else in the step (the last may fit, since the
      // peak counts the pool's rounding).
      const budgets = 16;
      let failures = 0;
      for (let i = 0; i < budgets; i++) {
        device.limitBytes = held + Math.floor((stepBytes * i) / budgets);
        let failure: unknown = null;
        try {
          trainer.trainStep(batch);
          current = weights();
          continue;
        } catch (error) {
          failure = error;
        }
        failures++;
        expect((failure as { code?: string }).code, `budget ${i}`).toBe("cuda_out_of_memory");
        expect((failure as Error).message).toMatch(/microBatchSize.*recomputeActivations.*numSlots/s);
        // Beyond a finished step's, only the backend's cache of small index arrays may differ: a failed step can leave
        // other arrays in it. Its 8 entries here take at most 8 × 512 bytes (the pool's size class of an array of up to
        // 128 ints), while anything a step leaked would pile up over the failures, 512 bytes or more each time.
        expect(device.pool.stats().inUseBytes - inUse, `budget ${i}`).toBeLessThanOrEqual(indexCacheBound);
        expect(weights()).toEqual(current);
      }
      expect(failures).toBeGreaterThanOrEqual(12);
      device.limitBytes = Infinity;
      expect(Number.isFinite(trainer.trainStep(batch).loss)).toBe(true);
      expect(device.pool.stats().inUseBytes - inUse).toBeLessThanOrEqual(indexCacheBound);
      expect(weights()).not.toEqual(before);
      const [result] = await generate(base, [{ promptIds: [1, 2, 3], temperature: 0, topK: 0, topLogprobs: 0, maxTokens: 3, stopIds: [] }]);
      expect(result!.tokenIds.length).toBe(3);
      backend.dispose();
    });
  }

  it("a generation that runs out fails with the same error, gives back its buffers, and the next one runs", async () => {
    const backend = createEmulatedBackend(buildEmulator(compiler!), { graphs: false });
    const device = backend.context;
    const base = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 6 }), backend, "bf16");
    const request = { promptIds: [1, 2, 3, 4, 5], temperature: 0, topK: 0, topLogprobs: 0, maxTokens: 4, stopIds: [] };
    const [expected] = await generate(base, [request]);
    device.pool.trim();
    const inUse = device.pool.stats().inUseBytes, held = device.outstandingBytes;
    let failures = 0;
    for (let budget = 0; budget < 64 * 1024; budget += 4096) {
      device.limitBytes = held + budget;
      try {
        await generate(base, [request]);
      } catch (error) {
        failures++;
        expect((error as { code?: string }).code).toBe("cuda_out_of_memory");
      }
      expect(device.pool.stats().inUseBytes - inUse, `budget ${budget}`).toBeLessThanOrEqual(indexCacheBound);
    }
    expect(failures).toBeGreaterThan(2);
    device.limitBytes = Infinity;
    const [again] = await generate(base, [request]);
    expect(again!.tokenIds).toEqual(expected!.tokenIds);
    backend.dispose();
  });
});
