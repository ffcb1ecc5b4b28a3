// LoRA training step throughput of the CUDA backend on random weights of real model shapes (bench/cuda-shapes.json):
// one GRPO step (forward, backward, AdamW) per batch of `sequences` × `tokens`, tokens/s, the memory pool's peaks (held
// and in use: the latter is what the peer's torch.cuda.max_memory_allocated counts),
// model FLOPs utilisation and where the GPU time goes, beside the PEFT peer (bench/peers/hf_train_step.py) measured
// in the same run when given with --peer.
//
// Usage: node bench/cuda-train.ts [--peer hf-train.json] [--roofline roofline.json]
//        [--shapes qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b] [--batches 8x1024,2x4096] [--steps 3] [--micro 8]
//        [--recompute]   (default: recomputeActivations "auto"; --recompute recomputes every layer)
//        [--optimizer-steps one|packed_rows]
// A step is the peer's: one forward and backward over the whole batch and one AdamW update (optimizerSteps "one";
// the bench refuses a step that made another number of updates). `--optimizer-steps packed_rows` measures the
// trainer's default instead, ART's local backend's: the batch packed into rows of 2,048 tokens (4,096 for 4,096-token
// sequences) with an update per row, so 8 × 1024 is four passes and four updates, work the peer does not do.
// Each sequence is distinct random tokens; the second half of each is trained, advantages alternate +1 / -1 (the
// peer's loss). LoRA rank 8, alpha 16, all seven projections. The best of `steps` timed steps after one warm-up; then
// one more step through the per-op profile (bench/cuda-profile.ts), untimed.
//
// Model FLOPs per step (what MFU counts, the same for the peer): 4 × the layers' matrix parameters per token (the
// forward and the input gradient of every projection; the frozen base has no weight gradients), 4 × the LM head's
// per trained token (the loss needs logits of those rows only), and attention's 12 × layers × heads × head_dim ×
// the mean keys a token sees (QKᵀ and PV forward, four products backward). LoRA's own products (rank 8: about 1% of
// a projection's) and the elementwise work are not counted. MFU divides by the roofline's measured bf16 GEMM TFLOP/s.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { seededRandom } from "../lib/core/random.ts";
import type { ModelConfig } from "../lib/model/config.ts";
import { PROJECTIONS } from "../lib/model/lora.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { type TrainingSequence } from "../lib/grpo/tokenize.ts";
import { createCudaBackend } from "../lib/cuda/mod.ts";
import { Transformer } from "../lib/model/transformer.ts";
import { profileBackend } from "./cuda-profile.ts";
import { randomWeights, shapeConfig } from "./cuda-random-model.ts";

const { values } = parseArgs({ options: {
  peer: { type: "string" }, roofline: { type: "string" },
  shapes: { type: "string", default: "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b" },
  batches: { type: "string", default: "8x1024,2x4096" }, steps: { type: "string", default: "3" },
  micro: { type: "string", default: "8" }, recompute: { type: "boolean", default: false },
  "optimizer-steps": { type: "string", default: "one" },
} });
const optimizerSteps = values["optimizer-steps"];
if (optimizerSteps !== "one" && optimizerSteps !== "packed_rows") throw new Error(`--optimizer-steps ${optimizerSteps}: expected one or packed_rows`);
const steps = Number(values.steps);
const batches = values.batches!.split(",").map((batch) => batch.split("x").map(Number) as [number, number]);
type PeerResult = { tokensPerSecond?: number; peakMemoryBytes?: number; error?: string };
const peer = values.peer ? JSON.parse(readFileSync(values.peer, "utf8")) as { results: Record<string, PeerResult> } : null;
const gemmTflops = values.roofline ? (JSON.parse(readFileSync(values.roofline, "utf8")) as { bf16MatmulTflops: number }).bf16MatmulTflops : null;
const lora = { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false };

/** Model FLOPs of one step (see the header). */
function stepFlops(c: ModelConfig, sequences: number, tokens: number): number {
  const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter, numLayers: layers } = c;
  const layerMatrices = layers * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * inter);
  const trained = sequences * (tokens - tokens / 2);
  const meanKeys = (tokens + 1) / 2;
  return sequences * tokens * (4 * layerMatrices + 12 * layers * h * hd * meanKeys) + trained * 4 * c.vocabSize * d;
}

const cuda = createCudaBackend({ log: (m) => console.error(m) });
const profile = profileBackend(cuda, cuda.context);
const backend = profile.backend;
const results: Record<string, unknown> = {};
for (const name of values.shapes!.split(",")) {
  const config = shapeConfig(name);
  cuda.context.pool.resetPeak();
  const base = new Transformer(backend, config, randomWeights(cuda, config).weights);
  for (const [sequences, tokens] of batches) {
    const key = `${name} ${sequences}x${tokens}`;
    const random = seededRandom(7);
    const batch: TrainingSequence[] = Array.from({ length: sequences }, (_, s) => {
      const ids = Array.from({ length: tokens }, () => Math.floor(random() * config.vocabSize));
      return { tokens: ids, trainable: Uint8Array.from(ids, (_, t) => (t >= tokens / 2 ? 1 : 0)), logprobs: new Float32Array(tokens).fill(NaN), advantage: s % 2 === 0 ? 1 : -1, trajectory: s };
    });
    const model = new DifferentiableTransformer(base, { lora });
    const trainer = new Trainer(model, { lora, learningRate: 1e-5, microBatchSize: Number(values.micro), recomputeActivations: values.recompute ? true : "auto", optimizerSteps });
    try {
      const { gradientSteps } = trainer.trainStep(batch); // warm-up
      if (optimizerSteps === "one" && gradientSteps !== 1) throw new Error(`a step made ${gradientSteps} AdamW updates; the peer's makes one`);
      const seconds: number[] = [];
      for (let i = 0; i < steps; i++) {
        const started = performance.now();
        trainer.trainStep(batch); // ends with the gradient norm read back, so the GPU work is done
        seconds.push((performance.now() - started) / 1000);
      }
      const { peakReservedBytes, peakInUseBytes } = cuda.memoryStats().pool;
      profile.start();
      trainer.trainStep(batch);
      const ops = profile.report();
      const best = Math.min(...seconds), tokensPerSecond = (sequences * tokens) / best;
      const tflops = stepFlops(config, sequences, tokens) / best / 1e12;
      const hf = peer?.results[key];
      results[key] = {
        tokensPerSecond: Math.round(tokensPerSecond), gradientSteps, stepSeconds: seconds.map((s) => +s.toFixed(4)), peakReservedBytes, peakInUseBytes,
        modelTflops: +tflops.toFixed(1), ...(gemmTflops ? { mfu: +(tflops / gemmTflops).toFixed(3) } : {}),
        ...(hf?.tokensPerSecond ? {
          hfTokensPerSecond: hf.tokensPerSecond, ratioToHf: +(tokensPerSecond / hf.tokensPerSecond).toFixed(2), hfPeakMemoryBytes: hf.peakMemoryBytes,
          ...(gemmTflops ? { hfMfu: +(stepFlops(config, sequences, tokens) * hf.tokensPerSecond / (sequences * tokens) / 1e12 / gemmTflops).toFixed(3) } : {}),
        } : hf?.error ? { hfError: hf.error } : {}),
        profileMs: ops,
      };
    } catch (error) {
      results[key] = { error: (error as Error).message };
    }
    // Everything this batch allocated goes back, so the next one's peak is its own (besides the weights).
    model.free();
    for (const tensor of [...trainer.optimizer.m.values(), ...trainer.optimizer.v.values()]) cuda.free(tensor);
    cuda.context.pool.resetPeak();
  }
  base.free();
}
console.log(JSON.stringify({
  device: cuda.context.device.name,
  settings: {
    batches: values.batches, microBatchSize: Number(values.micro), recomputeActivations: values.recompute ? true : "auto", optimizerSteps,
    lora: "rank 8, alpha 16, all 7 projections", bf16GemmTflops: gemmTflops,
  },
  command: `node bench/cuda-train.ts ${process.argv.slice(2).join(" ")}`.trim(),
  results,
}, null, 2));
profile.dispose();
cuda.dispose();
