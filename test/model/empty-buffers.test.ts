// Backend.empty hands out storage that is not zeroed: the inference pass and the training forward take their
// buffers that way, on the promise that the op producing each writes it whole. Here every such buffer starts as NaN
// (CpuBackendOptions.emptyFill): a value read before it was written would turn the logits, the loss or a gradient
// into NaN, and they come out the very bits of the same work on a backend whose empty buffers hold whatever they held.
import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { generate } from "../../lib/model/generate.ts";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { ARCHITECTURES, fixtureBatch, loadTinyModel } from "./tiny-fixture.ts";

describe("buffers taken without zeroing are written whole before they are read", () => {
  for (const arch of ARCHITECTURES) {
    it(`${arch}: a LoRA forward and backward, kept and recomputed activations, and a generation, with NaN-filled empty buffers`, async () => {
      const { fixture, dir } = loadTinyModel(arch);
      const run = async (backend: CpuBackend, recomputeActivations: boolean) => {
        const base = loadTransformer(dir, backend);
        const lora = { rank: 2, alpha: 4, targetModules: [...PROJECTIONS], useRslora: false };
        const model = new DifferentiableTransformer(base, { lora, seed: 1, recomputeActivations });
        // Twice, so the second pass takes storage the first one gave back.
        let logprobs = new Float32Array(0);
        for (let pass = 0; pass < 2; pass++) {
          model.zeroGradients();
          const forward = model.forward(fixtureBatch(fixture));
          logprobs = forward.logprobs.slice();
          model.backward(forward, Float32Array.from(forward.logprobs, (_, i) => ((i % 3) - 1) / 4));
        }
        const gradients = model.parameterTensors().map((p) => Array.from(backend.download(p.grad)));
        const [generated] = await generate(base, [{ promptIds: [1, 2, 3], temperature: 0, topK: 0, topLogprobs: 0, maxTokens: 6, stopIds: [] }]);
        return { logprobs: Array.from(logprobs), gradients, tokens: generated!.tokenIds };
      };
      for (const recompute of [false, true]) {
        const poisoned = await run(new CpuBackend({ emptyFill: NaN }), recompute);
        expect(poisoned.logprobs.every(Number.isFinite)).toBe(true);
        expect(poisoned.gradients.flat().every(Number.isFinite)).toBe(true);
        expect(poisoned).toEqual(await run(new CpuBackend(), recompute));
      }
    });
  }
});
