/**
 * bench/cuda-train.ts, the GPU check's LoRA-step bench, on the CUDA backend of the kernel emulator at the tiny shape.
 * Its step must be the PEFT peer's (bench/peers/hf_train_step.py: one forward and backward over the batch, one AdamW
 * update): the trainer's default packs a batch into rows with an update per row, which made earlier GPU runs compare
 * four updates of art-ts with one of the peer's at 8 × 1024 tokens.
 */
import { spawnSync } from "node:child_process";
import { expect, it } from "vitest";
import { findCompiler } from "../cuda/emulated-device.ts";

interface TrainResult {
  tokensPerSecond: number; gradientSteps: number; stepSeconds: number[]; peakReservedBytes: number; peakInUseBytes: number;
  profileMs: Record<string, { ms: number; hostMs: number; calls: number }>;
}

function bench(...args: string[]): { settings: Record<string, unknown>; results: Record<string, TrainResult> } {
  const run = spawnSync(process.execPath, ["--import", "./test/cuda/emulated-cuda-hooks.ts", "bench/cuda-train.ts", "--shapes", "tiny-qwen2",
    "--steps", "1", ...args], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  return JSON.parse(run.stdout);
}

it.skipIf(!findCompiler())("times one update over the whole batch, the peer's step, and profiles it per op", () => {
  const report = bench("--batches", "3x700");
  expect(report.settings).toMatchObject({ optimizerSteps: "one", batches: "3x700" });
  const result = report.results["tiny-qwen2 3x700"];
  expect(result).toMatchObject({ gradientSteps: 1, stepSeconds: [expect.any(Number)] });
  expect(result.tokensPerSecond).toBeGreaterThan(0);
  // The pool's peaks: in use (what the peer's max_memory_allocated counts) at most what it held, both above nothing.
  expect(result.peakInUseBytes).toBeGreaterThan(0);
  expect(result.peakReservedBytes).toBeGreaterThanOrEqual(result.peakInUseBytes);
  // One pass over all 2,100 rows: each layer's packed attention runs once (the tiny model has 2 layers).
  expect(result.profileMs.packedAttention.calls).toBe(2);
  expect(result.profileMs.adamw.calls).toBe(1);
}, 120_000);

it.skipIf(!findCompiler())("measures the trainer's default instead with --optimizer-steps packed_rows: an update per 2,048-token row (two rows here)", () => {
  const report = bench("--batches", "3x700", "--optimizer-steps", "packed_rows");
  expect(report.settings).toMatchObject({ optimizerSteps: "packed_rows" });
  const result = report.results["tiny-qwen2 3x700"];
  expect(result.gradientSteps).toBe(2);
  expect(result.profileMs.packedAttention.calls).toBe(4);
  expect(result.profileMs.adamw.calls).toBe(2);
}, 120_000);
