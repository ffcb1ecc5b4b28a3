/**
 * bench/cpu-sampler.ts, bench/cpu-threads.ts and bench/cpu-attention-threads.ts run and report what they claim. The
 * sampler bench itself fails when a side draws other ids than the reference; the threads bench (its per-product part:
 * the demo runs take minutes) reports, for each product, the thread count the Gemm now gives it, which must follow
 * gemm.ts's bound; the attention-threads bench fails when its two sides' parameters differ.
 */
import { spawnSync } from "node:child_process";
import * as os from "node:os";
import { describe, expect, it } from "vitest";
import { chooseGemm } from "../../lib/model/cpu/gemm.ts";

const noSystemBlas = process.env.ART_TEST_SYSTEM_BLAS !== "1" && chooseGemm("auto", 1).gemm.library === null;

it("cpu-sampler: every side draws the same ids; the kernels' weights cost less than the references'", () => {
  const run = spawnSync(process.execPath, ["bench/cpu-sampler.ts", "--rounds", "1"], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const { results } = JSON.parse(run.stdout);
  expect(results.map((r: { vocab: number; topP: number }) => [r.vocab, r.topP])).toEqual([[512, 1], [512, 0.9], [151_936, 1], [151_936, 0.9]]);
  for (const r of results) for (const side of ["reference", "referenceWeightsWasmLogSumExp", "wasm"]) expect(r.nsPerEntry[side]).toBeGreaterThan(0);
}, 120_000);

describe.skipIf(noSystemBlas)("cpu-threads", () => {
  it("times each product on 1 and 2 threads and reports the bound's choice for it", () => {
    const run = spawnSync(process.execPath, ["bench/cpu-threads.ts", "--demo-runs", "0"], { encoding: "utf8" });
    expect(run.status, run.stderr).toBe(0);
    const { products, demos } = JSON.parse(run.stdout);
    expect(demos).toEqual([]);
    expect(products.length).toBe(13);
    for (const p of products) {
      expect(p.ms1Thread).toBeGreaterThan(0);
      expect(p.ms2Threads).toBeGreaterThan(0);
      expect(p.gemmThreads, `${p.rows} × ${p.depth} × ${p.columns}`).toBe(p.multiplyAdds < 2 ** 23 ? 1 : 2);
    }
  }, 120_000);
});

it.skipIf(os.availableParallelism() < 2)("cpu-attention-threads: both sides train to the same bits, the workers taking units", () => {
  const run = spawnSync(process.execPath, ["bench/cpu-attention-threads.ts", "--len", "128", "--rounds", "1"], { encoding: "utf8" });
  expect(run.status, run.stderr).toBe(0);
  const result = JSON.parse(run.stdout);
  expect(result.sameBits).toBe(true);
  expect(result.unitsOnWorkers).toBeGreaterThan(0);
  for (const side of [result.workers, result.callingThread]) expect(side.medianAttentionBackwardMs).toBeGreaterThan(0);
}, 120_000);
