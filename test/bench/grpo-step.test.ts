/**
 * bench/grpo-step.ts on the CPU at the tiny shape, one measured step of each workload at reduced sizes, beside a
 * given peer file: the JSON has every number, the token counts are the workload's exact ones, and the ratio is the
 * peer's step time over ours. The GPU run (scripts/cuda-gpu-check.sh, step grpo_bench) is the same command on CUDA, which
 * the last test runs on the kernel emulator.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { findCompiler } from "../cuda/emulated-device.ts";

interface Step { batcher: { passes: number; rowsPerPass: number; promptRows: number; passMs: number; busyShare: number }; rolloutSeconds: number; trainingSeconds: number; adapterSwapMs: number; stepSeconds: number; generatedTokensPerSecond: number;
  generatedTokens: number; trainedTokens: number; sequences: number; gradientSteps: number }
interface WorkloadResult { steps: Step[]; mean: Omit<Step, "generatedTokens" | "trainedTokens" | "sequences" | "gradientSteps" | "batcher">; peakGpuMemoryBytes: number | null; peakGpuInUseBytes: number | null;
  peer?: Record<string, unknown>; stepTimeRatio?: number }

// The reduced workloads of the command below, as bench/grpo-workloads.json sizes them otherwise.
const reduced = { groups: 2, rolloutsPerGroup: 2, turns: 2 };
const workloads = {
  "2048": { ...reduced, generatedTokens: 12, promptTokens: 272, userTokens: 60, betweenTokens: [70], tools: false },
  arte: { ...reduced, generatedTokens: 64, promptTokens: 1536, userTokens: 40, betweenTokens: [200, 600, 1000, 1400], tools: true },
};
const peerNumbers = { rolloutSeconds: 3, trainingSeconds: 2, adapterSwapMs: 500, stepSeconds: 5.5, generatedTokensPerSecond: 32 };

const dir = mkdtempSync(join(tmpdir(), "art-grpo-bench-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

it("measures a GRPO step of each workload with exact token counts, beside the peer", () => {
  const peerFile = join(dir, "peer.json"), out = join(dir, "grpo.json");
  writeFileSync(peerFile, JSON.stringify({
    device: "test", workloads,
    results: { "tiny-qwen2": { "2048": { mean: peerNumbers, peakMemoryBytes: 1e9, generation: "dynamic cache" }, arte: { error: "out of memory" } } },
  }));
  const run = spawnSync(process.execPath, ["bench/grpo-step.ts", "--device", "cpu", "--shapes", "tiny-qwen2", "--steps", "1", "--groups", "2", "--rollouts", "2",
    "--turns", "2", "--peer", peerFile, "--out", out], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(readFileSync(out, "utf8"));
  expect(report).toMatchObject({ benchmark: "grpo-step", settings: { warmupSteps: 1, measuredSteps: 1 }, peer: { file: peerFile, device: "test" } });
  expect(report.command).toContain("--shapes tiny-qwen2");
  for (const key of ["device", "machine", "commit"]) expect(report).toHaveProperty(key);
  // Trajectories: the first prompt, then for each later turn the sampled tokens and the observation, then the last turn's.
  expect(report.workloads["2048"]).toMatchObject({ ...workloads["2048"], trajectoryTokens: [272 + 12 + 70 + 12], generatedTokensPerStep: 2 * 2 * 2 * 12 });
  expect(report.workloads.arte).toMatchObject({ ...workloads.arte, trajectoryTokens: [1536 + 64 + 200 + 64, 1536 + 64 + 600 + 64], generatedTokensPerStep: 2 * 2 * 2 * 64 });

  // Slots for the most concurrent rollouts, positions for the longest trajectory.
  expect(report.results["tiny-qwen2"].kvCache).toMatchObject({ slots: 4, positions: 2264, bytes: expect.any(Number) });
  const results = report.results["tiny-qwen2"] as Record<string, WorkloadResult>;
  for (const [name, generated] of [["2048", 12], ["arte", 64]] as const) {
    const result = results[name];
    expect(result.steps).toHaveLength(1);
    const [step] = result.steps;
    // Every turn sampled exactly its tokens, and every trajectory trained as one sequence of exactly those.
    expect(step).toMatchObject({ generatedTokens: 2 * 2 * 2 * generated, trainedTokens: 2 * 2 * 2 * generated, sequences: 4 });
    for (const key of ["rolloutSeconds", "trainingSeconds", "adapterSwapMs", "stepSeconds", "generatedTokensPerSecond"] as const) expect(step[key]).toBeGreaterThan(0);
    expect(step.gradientSteps).toBeGreaterThanOrEqual(1);
    // The passes: at least one per sampled token of a rollout's turns (12 or 64, 2 turns), prefilling every prompt row once.
    expect(step.batcher.passes).toBeGreaterThanOrEqual(2 * generated);
    expect(step.batcher.promptRows).toBeGreaterThan(0);
    expect(step.batcher.busyShare).toBeGreaterThan(0);
    expect(step.batcher.busyShare).toBeLessThanOrEqual(1);
    expect(step.batcher.passMs * step.batcher.passes / 1000 / step.rolloutSeconds).toBeCloseTo(step.batcher.busyShare, 1);
    expect(step.stepSeconds).toBeCloseTo(step.rolloutSeconds + step.trainingSeconds + step.adapterSwapMs / 1000, 2);
    expect(step.generatedTokensPerSecond / (step.generatedTokens / step.rolloutSeconds)).toBeCloseTo(1, 1);
    expect(result.mean).toEqual({ rolloutSeconds: step.rolloutSeconds, trainingSeconds: step.trainingSeconds, adapterSwapMs: step.adapterSwapMs,
      stepSeconds: step.stepSeconds, generatedTokensPerSecond: step.generatedTokensPerSecond });
    expect(result.peakGpuMemoryBytes).toBeNull();
    expect(result.peakGpuInUseBytes).toBeNull();
  }
  expect(results["2048"].peer).toEqual({ ...peerNumbers, peakMemoryBytes: 1e9, generation: "dynamic cache" });
  expect(results["2048"].stepTimeRatio).toBe(+(peerNumbers.stepSeconds / results["2048"].mean.stepSeconds).toFixed(2));
  expect(results.arte.peer).toEqual({ error: "out of memory" });
  expect(results.arte).not.toHaveProperty("stepTimeRatio");
}, 60_000);

it("checks the memory workload's fit with --steps 0: its one step runs and trains, with no times to report", () => {
  const out = join(dir, "memory.json");
  const run = spawnSync(process.execPath, ["bench/grpo-step.ts", "--device", "cpu", "--shapes", "tiny-qwen2", "--workloads", "memory", "--steps", "0",
    "--rollouts", "4", "--out", out], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(readFileSync(out, "utf8"));
  // 4,096-token trajectories (4,032 of prompt and 64 sampled), the KV cache sized for them.
  expect(report.workloads.memory).toMatchObject({ rolloutsPerGroup: 4, turns: 1, trajectoryTokens: [4096], generatedTokensPerStep: 4 * 64 });
  expect(report.results["tiny-qwen2"].kvCache).toMatchObject({ slots: 4, positions: 4096 });
  expect(report.results["tiny-qwen2"].memory).toEqual({ steps: [], mean: null, peakGpuMemoryBytes: null, peakGpuInUseBytes: null });
}, 120_000);

// The GPU check's command (--device cuda) on the CUDA backend of the kernel emulator: the step runs the GPU path end to
// end (rollouts through the batcher's mixed passes, training, the pool's peak memory). The H100 check found this
// bench failing at its first gather (NaN logits in mixed passes) where the CPU run above passed.
it.skipIf(!findCompiler())("runs on the CUDA backend of the kernel emulator (--device cuda), reporting the GPU pool's peak memory", () => {
  const out = join(dir, "emulated.json");
  const run = spawnSync(process.execPath, ["--import", "./test/cuda/emulated-cuda-hooks.ts", "bench/grpo-step.ts", "--device", "cuda",
    "--shapes", "tiny-qwen2", "--workloads", "2048", "--steps", "1", "--groups", "2", "--rollouts", "2", "--turns", "2", "--out", out], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(readFileSync(out, "utf8"));
  expect(report.device).toBe("CPU emulation");
  const result = report.results["tiny-qwen2"]["2048"] as WorkloadResult;
  expect(result.steps[0]).toMatchObject({ generatedTokens: 2 * 2 * 2 * 12, trainedTokens: 2 * 2 * 2 * 12, sequences: 4 });
  // In use at most what the pool held, and both above nothing.
  expect(result.peakGpuInUseBytes).toBeGreaterThan(0);
  expect(result.peakGpuMemoryBytes).toBeGreaterThanOrEqual(result.peakGpuInUseBytes!);
}, 120_000);
