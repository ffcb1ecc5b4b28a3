/**
 * CPU engine throughput: prefill and decode tokens/s for a tiny and a ~20M-parameter checkpoint, with the ratio to
 * PyTorch on the CPU doing the same work (bench/peers/torch_cpu_engine.py: same checkpoint, same batch, same
 * lengths, greedy, KV cache) measured in the same run. art-ts runs on the system BLAS at 1 thread and at all cores,
 * each beside torch at the same count, and on the portable products; every side's BLAS is in the report (torch's as
 * the libraries mapped into its process). Prints JSON.
 *
 * The machine may be shared, so the sides are measured in alternating rounds and each keeps its best time: a burst
 * of load from elsewhere then slows one round, not one side.
 *
 * usage: node bench/cpu-engine.ts [--out bench/results/cpu-engine.json] [--quick]
 */
import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { CpuBackend } from "../lib/model/cpu/backend.ts";
import { decode } from "../lib/model/generate.ts";
import { loadTransformer } from "../lib/model/transformer.ts";
import { type Transformer } from "../lib/model/transformer.ts";
import { writeTinyCheckpoint } from "../scripts/make-tiny-checkpoint.ts";
import { openblasPins, peerEnvironment, peerPython } from "./peers/environment.ts";

interface Workload { name: "tiny" | "20m"; batch: number; promptLength: number; decodeTokens: number; repeats: number }

interface Throughput { prefillTokensPerSecond: number; decodeTokensPerSecond: number }

function deterministicPrompt(length: number, vocab: number, salt: number): number[] {
  return Array.from({ length }, (_, i) => (i * 7919 + salt * 104729 + 13) % vocab);
}

/** Best of `repeats` timings: prefill of batch × promptLength rows in one pass, then decodeTokens greedy passes. */
function measureEngine(model: Transformer, w: Workload): Throughput {
  const greedy = { temperature: 0, topP: 1, topK: 0, uniform: 0, topLogprobs: 0 };
  let bestPrefill = Infinity, bestDecode = Infinity;
  for (let r = 0; r < w.repeats + 1; r++) {
    const cache = model.createKvCache(w.batch, w.promptLength + w.decodeTokens);
    const prompts = Array.from({ length: w.batch }, (_, b) => deterministicPrompt(w.promptLength, model.config.vocabSize, b));
    let start = performance.now();
    let sampled = decode(model, cache, prompts.map((tokens, slot) => ({ slot, startPosition: 0, tokens, sample: greedy })));
    const prefill = performance.now() - start;
    start = performance.now();
    for (let t = 0; t < w.decodeTokens; t++) {
      sampled = decode(model, cache, sampled.map((s, slot) => ({ slot, startPosition: w.promptLength + t, tokens: [s!.id], sample: greedy })));
    }
    const decoding = performance.now() - start;
    cache.free();
    if (r === 0) continue; // warm-up: JIT compilation
    bestPrefill = Math.min(bestPrefill, prefill);
    bestDecode = Math.min(bestDecode, decoding);
  }
  return {
    prefillTokensPerSecond: (w.batch * w.promptLength) / (bestPrefill / 1000),
    decodeTokensPerSecond: (w.batch * w.decodeTokens) / (bestDecode / 1000),
  };
}

interface TorchThroughput extends Throughput { blas: string[]; openblasCore: string | null; threads: number; torch: string }

function measureTorch(dir: string, w: Workload, threads: number): TorchThroughput {
  const script = path.join(import.meta.dirname, "peers", "torch_cpu_engine.py");
  const args = [script, dir, String(w.batch), String(w.promptLength), String(w.decodeTokens), String(w.repeats), String(threads)];
  return JSON.parse(execFileSync(peerPython(), args, { encoding: "utf8", env: peerEnvironment(threads) }));
}

function parameterCount(model: Transformer): number {
  const w = model.weights;
  const tensors = new Set([w.embedding, w.finalNorm, w.lmHead, ...w.layers.flatMap((l) => Object.values(l).filter((t) => t !== null))]);
  return [...tensors].reduce((n, t) => n + t!.size, 0);
}

function main(argv: string[]): void {
  const quick = argv.includes("--quick");
  const outIndex = argv.indexOf("--out");
  const cores = os.availableParallelism();
  const workloads: Workload[] = [
    // Repeats: enough that one busy moment of a shared machine does not decide a side's best time (a tiny pass takes
    // about a millisecond, a 20M batch-4 pass a tenth of a second).
    { name: "tiny", batch: 4, promptLength: 64, decodeTokens: 32, repeats: 20 },
    { name: "20m", batch: 4, promptLength: 64, decodeTokens: 16, repeats: 5 },
    // A long prompt (an ART·E research prompt runs to about a thousand tokens): attention's share of prefill grows.
    { name: "20m", batch: 1, promptLength: 1024, decodeTokens: 16, repeats: 1 },
  ];
  // art-ts on the system BLAS at 1 thread and at all cores (each beside torch at the same count), the same at 1 thread
  // with the weights loaded as bf16 (the option that halves decoding's weight bytes; its numbers are the bf16-rounded
  // model's, torch's the f32 one's), and on the portable products (on 1 thread and on all cores) for what a machine
  // without a BLAS gets.
  const system = new CpuBackend({ blas: "auto", threads: 1 }).gemm.library;
  const sides: { name: string; blas: string; threads: number; dtype: "f32" | "bf16" }[] = [
    ...(system ? [{ name: "artTs1Thread", blas: system, threads: 1, dtype: "f32" as const }, { name: `artTs${cores}Threads`, blas: system, threads: cores, dtype: "f32" as const },
      { name: "artTs1ThreadBf16Weights", blas: system, threads: 1, dtype: "bf16" as const }] : []),
    { name: "artTsPortable", blas: "portable", threads: 1, dtype: "f32" },
    ...(cores > 1 ? [{ name: `artTsPortable${cores}Threads`, blas: "portable", threads: cores, dtype: "f32" as const }] : []),
  ];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "art-bench-"));
  const results = [];
  let torch: { version: string; blas: string[]; openblasCore: string | null } | null = null;
  try {
    for (const w of workloads) {
      const dir = path.join(tmp, w.name);
      writeTinyCheckpoint(dir, { arch: "qwen2", size: w.name, seed: 1 });
      const backends = sides.map((side) => new CpuBackend({ blas: side.blas, threads: side.threads }));
      const models = backends.map((backend, i) => loadTransformer(dir, backend, sides[i].dtype));
      const rounds = Array.from({ length: quick ? 1 : 3 }, () => ({
        engine: models.map((model) => measureEngine(model, w)),
        torch1: measureTorch(dir, w, 1),
        torchAll: measureTorch(dir, w, cores),
      }));
      const best = (pick: (r: (typeof rounds)[number]) => Throughput): Throughput => ({
        prefillTokensPerSecond: Math.max(...rounds.map((r) => pick(r).prefillTokensPerSecond)),
        decodeTokensPerSecond: Math.max(...rounds.map((r) => pick(r).decodeTokensPerSecond)),
      });
      const engines = sides.map((_, i) => best((r) => r.engine[i]));
      const torch1 = best((r) => r.torch1), torchAll = best((r) => r.torchAll);
      const ratio = (a: Throughput, b: Throughput) => ({
        prefill: round(a.prefillTokensPerSecond / b.prefillTokensPerSecond),
        decode: round(a.decodeTokensPerSecond / b.decodeTokensPerSecond),
      });
      const sameThreads = (i: number) => (sides[i].threads === 1 ? torch1 : torchAll);
      results.push({
        parameters: parameterCount(models[0]), ...w,
        ...Object.fromEntries(sides.map((side, i) => [side.name, { ...roundAll(engines[i]), products: backends[i].gemm.description, weights: side.dtype }])),
        torch1Thread: { ...roundAll(torch1), threads: rounds[0].torch1.threads },
        [`torch${cores}Threads`]: { ...roundAll(torchAll), threads: rounds[0].torchAll.threads },
        ratioToTorchSameThreads: Object.fromEntries(sides.map((side, i) => [side.name, ratio(engines[i], sameThreads(i))])),
      });
      for (const model of models) model.free();
      torch = { version: rounds[0].torch1.torch, blas: rounds[0].torch1.blas, openblasCore: rounds[0].torch1.openblasCore };
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  const report = {
    benchmark: "cpu-engine", command: `node bench/cpu-engine.ts${quick ? " --quick" : ""}`,
    machine: `${os.cpus()[0]?.model ?? "cpu"} × ${cores}`, node: process.version,
    loadAverageAtEnd: os.loadavg().map((l) => Number(l.toFixed(2))),
    openblasEnvironment: openblasPins(),
    note: "tokens/s = best over rounds of best-of-repeats after one warm-up; ratio = art-ts / torch at the same thread count " +
      "(each portable side too). Each side's products are named in the results.",
    torch,
    results,
  };
  const json = JSON.stringify(report, null, 2);
  console.log(json);
  if (outIndex >= 0) fs.writeFileSync(argv[outIndex + 1], `${json}\n`);
}

function round(x: number): number {
  return Number(x.toPrecision(3));
}

function roundAll(t: Throughput): Throughput {
  return { prefillTokensPerSecond: round(t.prefillTokensPerSecond), decodeTokensPerSecond: round(t.decodeTokensPerSecond) };
}

main(process.argv.slice(2));
