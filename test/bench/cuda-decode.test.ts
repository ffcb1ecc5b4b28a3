/**
 * bench/cuda-decode.ts, the GPU check's decode and prefill bench, on the CUDA backend of the kernel emulator at the
 * tiny shape: every figure it reports, including decoding through an unmerged LoRA on all projections (issue 17:
 * what every rollout after a GRPO run's first step samples with). That the LoRA changes what is decoded is the parity
 * suite's to check (its LoRA decode passes against the CPU engine); here, that the bench runs and reports it.
 */
import { spawnSync } from "node:child_process";
import { expect, it } from "vitest";
import { findCompiler } from "../cuda/emulated-device.ts";

it.skipIf(!findCompiler())("measures decode with graphs, eagerly and through a LoRA, prefill with its profile, on the emulator", () => {
  const run = spawnSync(process.execPath, ["--import", "./test/cuda/emulated-cuda-hooks.ts", "bench/cuda-decode.ts", "--shapes", "tiny-qwen2",
    "--batches", "1,3", "--prompt", "8", "--steps", "4", "--prefill", "2x16", "--copy-mib", "4"], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(run.stdout);
  expect(report.command).toMatch(/--copy-mib 4/);
  const result = report.results["tiny-qwen2"];
  for (const batch of ["1", "3"]) {
    const decode = result.decode[batch];
    for (const key of ["tokensPerSecond", "eagerTokensPerSecond", "loraTokensPerSecond", "rooflineTokensPerSecond", "replayTokensPerSecond"]) expect(decode[key]).toBeGreaterThan(0);
    expect(decode.hostShare).toBeCloseTo(1 - decode.tokensPerSecond / decode.replayTokensPerSecond, 2);
    expect(decode.loraCost).toBeCloseTo(1 - decode.loraTokensPerSecond / decode.tokensPerSecond, 2);
  }
  // Decode passes ran as graphs (recorded once per run, then replayed).
  expect(result.graphs.recorded).toBeGreaterThanOrEqual(4);
  expect(result.graphs.replayed).toBeGreaterThanOrEqual(4);
  expect(result.prefill["2x16"].profileMs.attention.calls).toBe(2);
}, 120_000);
