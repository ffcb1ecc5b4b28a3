/**
 * CPU engine throughput: prefill and decode tokens/s for a tiny and a ~20M-parameter checkpoint, with the ratio to
 * PyTorch on the CPU doing the same work (bench/peers/torch_cpu_engine.py: same checkpoint, same batch, same
 * lengths, greedy, KV cache) measured in the same run. Prints JSON.
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

function measureTorch(dir: string, w: Workload, threads: number): Throughput {
  const script = path.join(import.meta.dirname, "peers", "torch_cpu_engine.py");
  const args = [script, dir, String(w.batch), String(w.promptLength), String(w.decodeTokens), String(w.repeats), String(threads)];
  return JSON.parse(execFileSync("/usr/bin/python3", args, { encoding: "utf8" }));
}

function parameterCount(model: Transformer): number {
  const w = model.weights;
  const tensors = new Set([w.embedding, w.finalNorm, w.lmHead, ...w.layers.flatMap((l) => Object.values(l).filter((t) => t !== null))]);
  return [...tensors].reduce((n, t) => n + t!.size, 0);
}

function main(argv: string[]): void {
  const quick = argv.includes("--quick");
  const outIndex = argv.indexOf("--out");
  const workloads: Workload[] = [
    { name: "tiny", batch: 4, promptLength: 64, decodeTokens: 32, repeats: 2 },
    { name: "20m", batch: 4, promptLength: 64, decodeTokens: 16, repeats: 2 },
    // A long prompt (an ART·E research prompt runs to about a thousand tokens): attention's share of prefill grows.
    { name: "20m", batch: 1, promptLength: 1024, decodeTokens: 16, repeats: 1 },
  ];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "art-bench-"));
  const results = [];
  try {
    for (const w of workloads) {
      const dir = path.join(tmp, w.name);
      writeTinyCheckpoint(dir, { arch: "qwen2", size: w.name, seed: 1 });
      const model = loadTransformer(dir, new CpuBackend());
      const rounds = Array.from({ length: quick ? 1 : 3 }, () => ({
        engine: measureEngine(model, w),
        torch1: measureTorch(dir, w, 1),
        torchAll: measureTorch(dir, w, os.availableParallelism()),
      }));
      const best = (pick: (r: (typeof rounds)[number]) => Throughput): Throughput => ({
        prefillTokensPerSecond: Math.max(...rounds.map((r) => pick(r).prefillTokensPerSecond)),
        decodeTokensPerSecond: Math.max(...rounds.map((r) => pick(r).decodeTokensPerSecond)),
      });
      const engine = best((r) => r.engine), torch1 = best((r) => r.torch1), torchAll = best((r) => r.torchAll);
      const ratio = (a: Throughput, b: Throughput) => ({
        prefill: round(a.prefillTokensPerSecond / b.prefillTokensPerSecond),
        decode: round(a.decodeTokensPerSecond / b.decodeTokensPerSecond),
      });
      results.push({
        parameters: parameterCount(model), ...w,
        artTs: roundAll(engine),
        torch1Thread: roundAll(torch1),
        [`torch${os.availableParallelism()}Threads`]: roundAll(torchAll),
        ratioToTorch1Thread: ratio(engine, torch1),
        ratioToTorchAllThreads: ratio(engine, torchAll),
      });
      model.free();
    }
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  const report = {
    benchmark: "cpu-engine", command: `node bench/cpu-engine.ts${quick ? " --quick" : ""}`,
    machine: `${os.cpus()[0]?.model ?? "cpu"} × ${os.availableParallelism()}`, node: process.version,
    loadAverageAtEnd: os.loadavg().map((l) => Number(l.toFixed(2))),
    note: "art-ts CPU backend is single-threaded; tokens/s = best over rounds of best-of-repeats after one warm-up; " +
      "ratio = art-ts / torch. Debian's torch 1.13 is built with the generic (reference) BLAS.",
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
