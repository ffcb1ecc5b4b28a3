// LoRA training step throughput of the CUDA backend on random weights of real model shapes (bench/cuda-shapes.json):
// one GRPO step (forward, backward, AdamW) over `seqs` × `len` tokens, tokens/s and the memory pool's peak, beside the
// PEFT peer (bench/peers/hf_train_step.py) measured in the same run when given with --peer.
//
// Usage: node bench/cuda-train.ts [--peer hf-train.json] [--shapes qwen2.5-0.5b,qwen2.5-1.5b] [--seqs 8] [--len 1024]
//        [--steps 3] [--micro 8] [--recompute]
// Each sequence is distinct random tokens; the second half of each is trained, advantages alternate +1 / -1 (the
// peer's loss). LoRA rank 8, alpha 16, all seven projections. The best of `steps` timed steps after one warm-up.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { seededRandom } from "../lib/core/random.ts";
import { PROJECTIONS } from "../lib/model/lora.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { type TrainingSequence } from "../lib/grpo/tokenize.ts";
import { createCudaBackend } from "../lib/cuda/mod.ts";
import { Transformer } from "../lib/model/transformer.ts";
import { randomWeights, shapeConfig } from "./cuda-random-model.ts";

const { values } = parseArgs({ options: {
  peer: { type: "string" }, shapes: { type: "string", default: "qwen2.5-0.5b,qwen2.5-1.5b" },
  seqs: { type: "string", default: "8" }, len: { type: "string", default: "1024" }, steps: { type: "string", default: "3" },
  micro: { type: "string", default: "8" }, recompute: { type: "boolean", default: false },
} });
const seqs = Number(values.seqs), len = Number(values.len), steps = Number(values.steps);
const peer = values.peer ? JSON.parse(readFileSync(values.peer, "utf8")) as { results: Record<string, { tokensPerSecond: number; peakMemoryBytes: number }> } : null;
const lora = { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false };

const backend = createCudaBackend({ log: (m) => console.error(m) });
const results: Record<string, unknown> = {};
backend.context.pool.resetPeak();
for (const name of values.shapes!.split(",")) {
  const config = shapeConfig(name);
  const base = new Transformer(backend, config, randomWeights(backend, config).weights);
  const random = seededRandom(7);
  const sequences: TrainingSequence[] = Array.from({ length: seqs }, (_, s) => {
    const tokens = Array.from({ length: len }, () => Math.floor(random() * config.vocabSize));
    return { tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= len / 2 ? 1 : 0)), logprobs: new Float32Array(len).fill(NaN), advantage: s % 2 === 0 ? 1 : -1, trajectory: s };
  });
  const model = new DifferentiableTransformer(base, { lora });
  const trainer = new Trainer(model, { lora, learningRate: 1e-5, microBatchSize: Number(values.micro), recomputeActivations: values.recompute });
  try {
    trainer.trainStep(sequences); // warm-up
    const seconds: number[] = [];
    for (let i = 0; i < steps; i++) {
      const started = performance.now();
      trainer.trainStep(sequences); // ends with the gradient norm read back, so the GPU work is done
      seconds.push((performance.now() - started) / 1000);
    }
    const tokensPerSecond = (seqs * len) / Math.min(...seconds);
    const peakBytes = backend.memoryStats().pool.peakReservedBytes;
    const hf = peer?.results[name];
    results[name] = {
      tokensPerSecond: Math.round(tokensPerSecond), stepSeconds: seconds.map((s) => +s.toFixed(4)), peakReservedBytes: peakBytes,
      ...(hf ? { hfTokensPerSecond: hf.tokensPerSecond, ratioToHf: +(tokensPerSecond / hf.tokensPerSecond).toFixed(2), hfPeakMemoryBytes: hf.peakMemoryBytes } : {}),
    };
  } catch (error) {
    results[name] = { error: (error as Error).message };
  }
  // Everything this shape allocated goes back, so the next shape's peak is its own.
  for (const p of model.parameterTensors()) for (const tensor of [p.value, p.grad]) backend.free(tensor);
  for (const tensor of [...trainer.optimizer.m.values(), ...trainer.optimizer.v.values()]) backend.free(tensor);
  base.free();
  backend.context.pool.resetPeak();
}
console.log(JSON.stringify({
  device: backend.context.device.name,
  settings: { sequences: seqs, tokensPerSequence: len, microBatchSize: Number(values.micro), recomputeActivations: values.recompute, lora: "rank 8, alpha 16, all 7 projections" },
  command: `node bench/cuda-train.ts ${process.argv.slice(2).join(" ")}`.trim(),
  results,
}, null, 2));
backend.dispose();
