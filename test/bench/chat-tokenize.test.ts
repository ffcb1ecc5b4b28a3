/**
 * bench/chat-tokenize.ts: the GRPO step bench's chat requests tokenized whole and through the reused prefixes. The
 * bench itself fails when a reused encoding differs from the whole one or a prompt misses its workload's length; here,
 * that it runs and reports what the cache reused (deterministic: which prefixes are cached does not depend on time).
 */
import { spawnSync } from "node:child_process";
import { expect, it } from "vitest";

it("tokenizes a 2048-like step's requests both ways with the same ids and reports the reused share", () => {
  const run = spawnSync(process.execPath, ["bench/chat-tokenize.ts", "--workloads", "2048", "--steps", "1"], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const report = JSON.parse(run.stdout);
  const result = report.results["2048"];
  expect(result.requestsPerStep).toBe(8 * 8 * 8);
  for (const key of ["wholeMsPerRequest", "artTsMsPerRequest", "renderMsPerRequest"]) expect(result[key]).toBeGreaterThan(0);
  // Every later turn reuses all but its last turn's tokens; the first turns reuse the system prompt of the step before.
  expect(result.reusedShare).toBeGreaterThan(0.8);
}, 120_000);
