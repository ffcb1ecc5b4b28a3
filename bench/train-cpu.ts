/**
 * CPU LoRA training step throughput: forward + backward + AdamW over one batch, tokens/s, beside PyTorch doing the
 * same step (bench/peers/torch_train_step.py: same checkpoint, same tokens, same loss, same optimiser) in the same run.
 *
 * Usage: node bench/train-cpu.ts [--size tiny|20m] [--seqs N] [--len T] [--rounds R] [--out FILE]
 * Prints one JSON object and writes it to FILE (default bench/results/train-cpu.json).
 */
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { PROJECTIONS } from "../lib/model/lora.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { seededRandom } from "../lib/core/random.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { type TrainingSequence } from "../lib/grpo/tokenize.ts";
import { CpuBackend } from "../lib/model/cpu/backend.ts";
import { loadTransformer } from "../lib/model/transformer.ts";
import { writeTinyCheckpoint } from "../scripts/make-tiny-checkpoint.ts";
import { openblasPins, peerEnvironment, peerPython } from "./peers/environment.ts";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : fallback;
}

const size = arg("size", "20m") as "tiny" | "20m";
const seqs = Number(arg("seqs", "2"));
const len = Number(arg("len", "64"));
const rounds = Number(arg("rounds", "3"));
const rank = 8, alpha = 16;

const root = path.join(import.meta.dirname, "out", `train-cpu-${size}`);
writeTinyCheckpoint(root, { arch: "qwen2", size, seed: 1 });
const cores = os.availableParallelism();

// art-ts on the system BLAS at 1 thread and at all cores (each beside torch at the same count), and on the portable
// products (on 1 thread and on all cores), each side with its own copy of the model and trainer.
const system = new CpuBackend({ blas: "auto", threads: 1 }).gemm.library;
const sides = [
  ...(system ? [{ name: "artTs1Thread", blas: system, threads: 1 }, { name: `artTs${cores}Threads`, blas: system, threads: cores }] : []),
  { name: "artTsPortable", blas: "portable", threads: 1 },
  ...(cores > 1 ? [{ name: `artTsPortable${cores}Threads`, blas: "portable", threads: cores }] : []),
];
const backends = sides.map((side) => new CpuBackend({ blas: side.blas, threads: side.threads }));
const transformers = backends.map((backend) => loadTransformer(root, backend));
const config = transformers[0].config;
const vocab = config.vocabSize;

// Prompt = first half (not trained), completion = second half (trained); advantages alternate ±1.
const random = seededRandom(5);
const sequences: TrainingSequence[] = Array.from({ length: seqs }, (_, s) => {
  const tokens = Array.from({ length: len }, () => Math.floor(random() * vocab));
  return {
    tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= len / 2 ? 1 : 0)),
    logprobs: new Float32Array(len).fill(NaN), advantage: s % 2 === 0 ? 1 : -1, trajectory: s,
  };
});

const trainers = transformers.map((transformer) => {
  const model = new DifferentiableTransformer(transformer, { lora: { rank, alpha, targetModules: [...PROJECTIONS], useRslora: false } });
  const trainer = new Trainer(model, { microBatchSize: seqs });
  trainer.trainStep(sequences); // warm-up (JIT)
  return trainer;
});

const batchFile = path.join(root, "batch.json");
fs.writeFileSync(batchFile, JSON.stringify({
  rank, alpha, tokens: sequences.map((s) => s.tokens), trainable: sequences.map((s) => Array.from(s.trainable)),
  advantages: sequences.map((s) => s.advantage),
}));
interface PeerRun { stepSeconds: number[]; blas: string[]; openblasCore: string | null; threads: number; torch: string }
const peer = (threads: number): PeerRun => JSON.parse(execFileSync(peerPython(),
  [path.join(import.meta.dirname, "peers", "torch_train_step.py"), root, batchFile, "1", String(threads)], { encoding: "utf8", env: peerEnvironment(threads) }));

// Alternating rounds (each art-ts side, torch 1 thread, torch all threads) so a busy machine slows every side alike;
// the best round of each side is reported (the least disturbed), with the median beside it.
const loadBefore = os.loadavg();
const times = { artTs: sides.map(() => [] as number[]), torch1: [] as number[], torchAll: [] as number[] };
let torchInfo: PeerRun | null = null;
for (let round = 0; round < rounds; round++) {
  trainers.forEach((trainer, i) => {
    const start = performance.now();
    trainer.trainStep(sequences);
    times.artTs[i].push((performance.now() - start) / 1000);
  });
  torchInfo = peer(1);
  times.torch1.push(...torchInfo.stepSeconds);
  times.torchAll.push(...peer(cores).stepSeconds);
}
const summary = (name: string, seconds: number[]) => {
  const sorted = [...seconds].sort((a, b) => a - b);
  const best = sorted[0];
  return { runtime: name, bestSecondsPerStep: best, medianSecondsPerStep: sorted[Math.floor(sorted.length / 2)], tokensPerSecond: (seqs * len) / best, rounds: seconds };
};
const ours = sides.map((side, i) => summary(`art-ts CPU (Node ${process.version}), ${backends[i].gemm.description}`, times.artTs[i]));
const torchOne = summary(`pytorch ${torchInfo?.torch} (CPU, 1 thread)`, times.torch1);
const torchAll = summary(`pytorch ${torchInfo?.torch} (CPU, ${cores} threads)`, times.torchAll);

const result = {
  bench: "train-cpu: one LoRA GRPO step (forward + backward + AdamW), tokens/s",
  command: `node bench/train-cpu.ts ${process.argv.slice(2).join(" ")}`.trim(),
  model: { arch: "qwen2", size, ...Object.fromEntries(["hiddenSize", "numLayers", "numHeads", "numKvHeads", "intermediateSize", "vocabSize"].map((k) => [k, (config as unknown as Record<string, number>)[k]])) },
  batch: { sequences: seqs, tokensPerSequence: len, lora: { rank, alpha, targets: "all 7 projections" } },
  machine: { cpus: cores, cpu: os.cpus()[0]?.model ?? "unknown", loadAverageBefore: loadBefore, loadAverageAfter: os.loadavg() },
  torchBlas: torchInfo?.blas,
  torchOpenblasCore: torchInfo?.openblasCore,
  openblasEnvironment: openblasPins(),
  artTs: Object.fromEntries(sides.map((side, i) => [side.name, ours[i]])),
  peers: [torchOne, torchAll],
  // Each art-ts side against torch on the same number of threads.
  ratioToTorchSameThreads: Object.fromEntries(sides.map((side, i) =>
    [side.name, ours[i].tokensPerSecond / (side.threads === 1 ? torchOne : torchAll).tokensPerSecond])),
};
console.log(JSON.stringify(result, null, 2));
const out = arg("out", path.join(import.meta.dirname, "results", "train-cpu.json"));
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify(result, null, 2) + "\n");
