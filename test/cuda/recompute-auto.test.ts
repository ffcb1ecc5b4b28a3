// recomputeActivations "auto" on the CUDA backend's host logic (the recording device: every allocation, no
// arithmetic), under device memory limits: wherever recomputing every layer fits, "auto" fits too, keeping as many
// layers as it can. On an H100 the rule before (twice a layer's tensor bytes free) ran a 7B shape's 8 x 1024-token
// step out of memory in its backward; here it fails at 7B widths with twelve layers.
import { describe, expect, it } from "vitest";
import { CudaBackend } from "../../lib/cuda/backend.ts";
import { parseConfig } from "../../lib/model/config.ts";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import type { TensorStore } from "../../lib/model/safetensors.ts";
import { DifferentiableTransformer, type RecomputeActivations, type SequenceBatch } from "../../lib/model/training.ts";
import { loadWeights, Transformer } from "../../lib/model/transformer.ts";
import { RecordingDevice } from "./recording-device.ts";

// Qwen2.5-7B's layer widths (at smaller ones the rule's fixed margin hides its layer terms), a small vocabulary (it
// only sizes the logits block) and twelve layers. No arithmetic runs; what costs time is loading: the stacked q/k/v
// and gate/up weights are put together in 7 GB of fresh host memory, whose first touch alone took ~45 s on the
// 2-core development VMs (their page faults are slow), so the test gets three minutes.
const config = parseConfig({
  architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", vocab_size: 4096, hidden_size: 3584, intermediate_size: 18944,
  num_hidden_layers: 12, num_attention_heads: 28, num_key_value_heads: 4, max_position_embeddings: 4096, rope_theta: 1e6,
  rms_norm_eps: 1e-6, tie_word_embeddings: true,
}, "recompute-auto test");
const zeros: TensorStore = {
  names: () => [], info: () => undefined, readF32: (_name, shape = []) => new Float32Array(shape.reduce((a, b) => a * b, 1)), close: () => {},
};
const lora = { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false };

/** `sequences` sequences of `length` tokens, packed, each scoring its second half. */
function batchOf(sequences: number, length: number): SequenceBatch {
  const n = sequences * length;
  return {
    tokens: Int32Array.from({ length: n }, (_, i) => (i * 37) % config.vocabSize),
    positions: Int32Array.from({ length: n }, (_, i) => i % length),
    segments: Array.from({ length: sequences }, (_, s) => ({ start: s * length, length })),
    targets: Int32Array.from({ length: n }, (_, i) => (i % length >= length / 2 ? (i * 11) % config.vocabSize : -1)),
  };
}

describe("recomputeActivations \"auto\" under a device memory limit (recording device)", () => {
  it("trains wherever recomputing every layer does, and keeps the layers that fit", () => {
    const device = new RecordingDevice();
    const backend = new CudaBackend(device, device.gemm(), RecordingDevice.kernels());
    const base = new Transformer(backend, config, loadWeights(backend, config, zeros, "bf16"));
    const batch = batchOf(8, 1024);
    const dLogprobs = new Float32Array(batch.targets.filter((t) => t >= 0).length).fill(1);
    // A first step fills the backend's caches of index arrays; what stays allocated after it is the baseline.
    const warm = new DifferentiableTransformer(base, { lora });
    warm.backward(warm.forward(batch), dLogprobs);
    warm.free();
    device.pool.trim();
    const weights = device.outstandingBytes;
    /** One forward and backward with `limit` bytes of device memory beyond the weights: the layers kept, or null when out of memory. */
    const step = (recompute: RecomputeActivations, limit: number): boolean[] | null => {
      device.limitBytes = weights + limit;
      const model = new DifferentiableTransformer(base, { lora });
      model.recomputeActivations = recompute;
      try {
        const pass = model.forward(batch);
        const kept = pass.layers.map((layer) => layer.acts !== null);
        model.backward(pass, dLogprobs);
        return kept;
      } catch (error) {
        expect((error as Error).message).toMatch(/out of GPU memory/);
        return null;
      } finally {
        model.free();
        device.limitBytes = Infinity;
        device.pool.trim();
        // Everything the step held went back (the backend's small caches of index arrays may grow).
        expect(device.outstandingBytes - weights).toBeLessThan(1 << 20);
      }
    };
    const peakOf = (recompute: RecomputeActivations) => {
      device.pool.resetPeak();
      expect(step(recompute, Infinity)).not.toBeNull();
      return device.pool.stats().peakReservedBytes - weights;
    };
    const [allRecomputed, allKept] = [peakOf(true), peakOf(false)];
    expect(allKept).toBeGreaterThan(2 * allRecomputed); // the sweep below spans both regimes
    // From where only recomputing everything fits to where keeping everything fits with room to spare (the rule's
    // reserve and margin).
    const top = 1.5 * allKept;
    const counts = new Set<number>();
    for (let limit = allRecomputed; limit <= top; limit += (top - allRecomputed) / 24) {
      const kept = step("auto", limit);
      expect(kept, `"auto" with ${limit} bytes free, where recomputing every layer fits in ${allRecomputed}`).not.toBeNull();
      counts.add(kept!.filter(Boolean).length);
      // The earliest layers are the ones kept.
      expect(kept!.indexOf(false) === -1 || kept!.slice(kept!.indexOf(false)).every((k) => !k)).toBe(true);
    }
    expect(counts.has(0) && counts.has(config.numLayers) && counts.size > config.numLayers / 2).toBe(true);
    base.free();
    backend.dispose();
  }, 180_000);
});
