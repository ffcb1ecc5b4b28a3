/**
 * bench/serve-mix.ts on the CPU at the tiny shape: a small seeded stream of streamed requests arriving at random, every
 * completion run to its length, and the report's numbers consistent (the GPU check runs it at a real shape).
 */
import { spawnSync } from "node:child_process";
import { expect, it } from "vitest";

const bench = (...args: string[]) => spawnSync(process.execPath, ["bench/serve-mix.ts", "--device", "cpu", "--shape", "tiny-qwen2", ...args], { encoding: "utf8" });

it("streams a seeded mix of arrivals through the batcher and reports its load", () => {
  const run = bench("--requests", "16", "--rate", "40", "--prompt", "20-200", "--generate", "4-24");
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(run.stdout);
  expect(report).toMatchObject({ benchmark: "serve-mix", shape: "tiny-qwen2", stream: { requests: 16, ratePerSecond: 40, promptTokens: [20, 200], generateTokens: [4, 24], seed: 1 } });
  expect(report.wallSeconds).toBeGreaterThan(0);
  expect(report.generatedTokensPerSecond).toBeGreaterThan(0);
  for (const key of ["timeToFirstTokenSeconds", "decodeTokensPerSecondPerRequest"]) {
    const { p50, p90, p99 } = report[key];
    expect(p50).toBeGreaterThan(0);
    expect(p50).toBeLessThanOrEqual(p90);
    expect(p90).toBeLessThanOrEqual(p99);
  }
  // Prefill and decode shared passes: more rows than passes, some of them prompt rows, never all.
  expect(report.batcher.passes).toBeGreaterThan(0);
  expect(report.batcher.rowsPerPass).toBeGreaterThan(1);
  expect(report.batcher.prefillShareOfRows).toBeGreaterThan(0);
  expect(report.batcher.prefillShareOfRows).toBeLessThan(1);
  expect(report.batcher.busy).toBeGreaterThan(0);
  expect(report.batcher.busy).toBeLessThanOrEqual(1);
}, 60_000);

it("with --whole, a fixed batch answered whole (as rollouts ask) reports each request's latency", () => {
  const run = bench("--requests", "8", "--rate", "1000000", "--prompt", "32-32", "--generate", "8-8", "--whole");
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(run.stdout);
  expect(report.stream).toMatchObject({ requests: 8, answers: "whole", promptTokens: [32, 32], generateTokens: [8, 8] });
  expect(report.generatedTokensPerSecond).toBeGreaterThan(0);
  expect(report.latencySeconds.p50).toBeGreaterThan(0);
  expect(report).not.toHaveProperty("timeToFirstTokenSeconds");
  // All eight arrive at once: after the prefill pass, every decode pass carries all of them.
  expect(report.batcher.passes).toBeLessThan(8 * 8);
}, 60_000);

it("refuses a length range it cannot use, naming the flag", () => {
  const run = bench("--prompt", "200-20");
  expect(run.status).not.toBe(0);
  expect(run.stderr).toContain("--prompt is a range of tokens like 100-2000, got 200-20");
});
