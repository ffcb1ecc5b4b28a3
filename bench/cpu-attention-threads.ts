/**
 * The training attention on worker threads against the calling thread alone: one LoRA GRPO step (forward + backward +
 * AdamW, r 8 on all seven projections) of the 20M qwen2 config on all cores, the same backend twice
 * (`attentionWorkers` true and false), alternating rounds in one process, with the milliseconds each step spent in
 * packedAttention and its backward. The two sides' parameters after the rounds must be the same bits (the bench fails
 * otherwise): the workers change who computes a unit, not what.
 *
 * Usage: node bench/cpu-attention-threads.ts [--seqs 2] [--len 512] [--rounds 5] [--out FILE]
 * Prints one JSON object; writes it to FILE when given (bench/results/cpu-attention-threads.json).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { parseArgs } from "node:util";
import { seededRandom } from "../lib/core/random.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { CpuBackend } from "../lib/model/cpu/backend.ts";
import { PROJECTIONS } from "../lib/model/lora.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { loadTransformer } from "../lib/model/transformer.ts";
import { writeTinyCheckpoint } from "../scripts/make-tiny-checkpoint.ts";
import { openblasPins } from "./peers/environment.ts";

const { values } = parseArgs({ options: { seqs: { type: "string", default: "2" }, len: { type: "string", default: "512" }, rounds: { type: "string", default: "5" }, out: { type: "string" } } });
const [seqs, len, rounds] = [Number(values.seqs), Number(values.len), Number(values.rounds)];
const threads = os.availableParallelism();
if (threads < 2) throw new Error("cpu-attention-threads: this machine has one core; there is nothing to share");

const root = path.join(import.meta.dirname, "out", "cpu-attention-threads-20m");
writeTinyCheckpoint(root, { arch: "qwen2", size: "20m", seed: 1 });
const random = seededRandom(5);
let vocab = 0;

const sides = [true, false].map((attentionWorkers) => {
  const backend = new CpuBackend({ threads, attentionWorkers });
  const transformer = loadTransformer(root, backend);
  vocab = transformer.config.vocabSize;
  const model = new DifferentiableTransformer(transformer, { lora: { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false } });
  // Milliseconds in the attention ops, summed until read.
  const attention = { forward: 0, backward: 0 };
  const timed = <A extends unknown[], R>(fn: (...args: A) => R, key: keyof typeof attention) => (...args: A): R => {
    const start = performance.now();
    try {
      return fn(...args);
    } finally {
      attention[key] += performance.now() - start;
    }
  };
  backend.packedAttention = timed(backend.packedAttention.bind(backend), "forward");
  backend.packedAttentionBackward = timed(backend.packedAttentionBackward.bind(backend), "backward");
  return { attentionWorkers, backend, model, trainer: new Trainer(model, { microBatchSize: seqs }), attention, steps: [] as { seconds: number; forwardMs: number; backwardMs: number }[] };
});
await sides[0].backend.startAttentionWorkers();

// Prompt = first half (not trained), completion = second half; advantages alternate ±1.
const sequences = Array.from({ length: seqs }, (_, s) => {
  const tokens = Array.from({ length: len }, () => Math.floor(random() * vocab));
  return { tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= len / 2 ? 1 : 0)), logprobs: new Float32Array(len).fill(NaN), advantage: s % 2 === 0 ? 1 : -1, trajectory: s };
});
for (const side of sides) side.trainer.trainStep(sequences); // warm-up (JIT)

const loadBefore = os.loadavg();
for (let round = 0; round < rounds; round++) {
  for (const side of sides) {
    side.attention.forward = side.attention.backward = 0;
    const start = performance.now();
    side.trainer.trainStep(sequences);
    side.steps.push({ seconds: (performance.now() - start) / 1000, forwardMs: side.attention.forward, backwardMs: side.attention.backward });
  }
}
const bits = sides.map(({ backend, model }) => model.parameterTensors().map((p) => Array.from(new Uint32Array(backend.download(p.value).buffer))).flat());
if (bits[0].some((word, i) => word !== bits[1][i])) throw new Error("cpu-attention-threads: the two sides' parameters differ; the workers changed the numbers");

const best = (x: number[]) => Math.min(...x), median = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)];
const report = (side: (typeof sides)[number]) => ({
  runtime: `art-ts CPU (Node ${process.version}), ${side.backend.gemm.description}, attention ${side.attentionWorkers ? `on ${threads} threads` : "on the calling thread"}`,
  bestSecondsPerStep: best(side.steps.map((s) => s.seconds)),
  medianSecondsPerStep: median(side.steps.map((s) => s.seconds)),
  medianAttentionForwardMs: median(side.steps.map((s) => s.forwardMs)),
  medianAttentionBackwardMs: median(side.steps.map((s) => s.backwardMs)),
  tokensPerSecond: (seqs * len) / best(side.steps.map((s) => s.seconds)),
  rounds: side.steps,
});
const [workers, caller] = sides.map(report);
const result = {
  bench: "cpu-attention-threads: one LoRA GRPO step with the training attention on worker threads and on the calling thread alone",
  command: `node bench/cpu-attention-threads.ts ${process.argv.slice(2).join(" ")}`.trim(),
  model: { arch: "qwen2", size: "20m" },
  batch: { sequences: seqs, tokensPerSequence: len },
  machine: { cpus: threads, cpu: os.cpus()[0]?.model ?? "unknown", loadAverageBefore: loadBefore, loadAverageAfter: os.loadavg() },
  openblasEnvironment: openblasPins(),
  unitsOnWorkers: sides[0].backend.attentionUnitsOnWorkers,
  sameBits: true,
  workers,
  callingThread: caller,
  speedup: { step: caller.bestSecondsPerStep / workers.bestSecondsPerStep, attentionForward: caller.medianAttentionForwardMs / workers.medianAttentionForwardMs, attentionBackward: caller.medianAttentionBackwardMs / workers.medianAttentionBackwardMs },
};
console.log(JSON.stringify(result, null, 2));
if (values.out) fs.writeFileSync(values.out, JSON.stringify(result, null, 2) + "\n");
process.exit(0);
