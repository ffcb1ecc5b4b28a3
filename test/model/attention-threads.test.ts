// The training attention across worker threads (lib/model/cpu/attention-threads.ts): a backend on three threads
// computes packedAttention and its backward with the same bits as one on one thread, its workers taking units, for
// the portable products and the system BLAS (CI installs OpenBLAS and sets ART_TEST_SYSTEM_BLAS=1, so that case
// cannot skip there); a call too small to share stays on the calling thread; a unit that fails is counted done and
// reported, so no thread waits for it.
import { describe, expect, it } from "vitest";
import type { PackedSegment } from "../../lib/model/backend.ts";
import { type AttentionJob, runAttentionUnits } from "../../lib/model/cpu/attention-threads.ts";
import { attentionUnits, KEPT_PROBABILITY_FLOATS, probabilityOffsets } from "../../lib/model/cpu/attention.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { chooseGemm, portableGemm } from "../../lib/model/cpu/gemm.ts";
import { random } from "../cuda/compare.ts";

const systemBlas = chooseGemm("auto", 1).gemm.library !== null || process.env.ART_TEST_SYSTEM_BLAS === "1";

// GQA (6 query heads over 2 KV heads) at head size 64: a segment that is a shared prompt, two completions reading it
// as their prefix, and a segment of its own, 520 rows in all (12 units, 2.9e7 multiply-adds: above the share bound).
const [heads, kvHeads, headDim] = [6, 2, 64];
const prompt = { start: 0, length: 90 };
const segments: PackedSegment[] = [{ ...prompt }, { start: 90, length: 150, prefix: prompt }, { start: 240, length: 100, prefix: prompt }, { start: 340, length: 180 }];
const rows = 520;

/** The first index where two arrays of bits differ, or -1 (a failure names it, where a diff of the arrays takes minutes). */
function firstDifference(a: Uint32Array, b: Uint32Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  return a.findIndex((bits, i) => bits !== b[i]);
}

/**
 * out, dq, dk, dv of a forward and a backward (accumulating into nonzero gradients) on `backend`, as bits; the backward
 * from the probabilities the forward kept, or (`recompute`) from none, recomputing them.
 */
function attentionBits(backend: CpuBackend, calls: readonly PackedSegment[], recompute = false): Uint32Array[] {
  const tensor = (width: number, seed: number) => backend.upload(random(rows * width, seed), [rows, width]);
  const [q, k, v, dOut] = [tensor(heads * headDim, 1), tensor(kvHeads * headDim, 2), tensor(kvHeads * headDim, 3), tensor(heads * headDim, 4)];
  const out = backend.zeros(q.shape);
  const saved = backend.packedAttention(q, k, v, calls, headDim, out);
  expect(saved.size).toBe(probabilityOffsets({ segments: calls, heads, kvHeads, headDim }).at(-1)); // small enough to keep
  const [dq, dk, dv] = [tensor(heads * headDim, 5), tensor(kvHeads * headDim, 6), tensor(kvHeads * headDim, 7)];
  backend.packedAttentionBackward(q, k, v, out, recompute ? backend.zeros([0]) : saved, calls, headDim, dOut, dq, dk, dv);
  return [out, dq, dk, dv].map((t) => new Uint32Array(backend.download(t).buffer));
}

describe.each([
  ["portable", "portable", false],
  ["system BLAS", "auto", !systemBlas],
] as const)("attention threads: %s products", (_name, blas, skip) => {
  it.skipIf(skip)("three threads give one thread's bits, the workers taking units, shared prefixes included", async () => {
    const one = new CpuBackend({ blas, threads: 1 }), three = new CpuBackend({ blas, threads: 3 });
    expect(await three.startAttentionWorkers()).toBe(2);
    const expected = attentionBits(one, segments), actual = attentionBits(three, segments);
    ["out", "dq", "dk", "dv"].forEach((name, i) => expect(firstDifference(actual[i], expected[i]), name).toBe(-1));
    expect(one.attentionUnitsOnWorkers).toBe(0);
    // 2 × 8 units; this thread takes some too, and which thread takes which changes nothing.
    expect(three.attentionUnitsOnWorkers).toBeGreaterThan(0);
    expect(three.attentionUnitsOnWorkers).toBeLessThanOrEqual(2 * attentionUnits({ segments, heads, kvHeads, headDim }));
  });

  it.skipIf(skip)("the backward from the probabilities the forward kept gives the recomputing backward's bits, on 1 and 3 threads", async () => {
    const three = new CpuBackend({ blas, threads: 3 });
    expect(await three.startAttentionWorkers()).toBe(2);
    for (const backend of [new CpuBackend({ blas, threads: 1 }), three]) {
      const [kept, recomputed] = [attentionBits(backend, segments), attentionBits(backend, segments, true)];
      ["out", "dq", "dk", "dv"].forEach((name, i) => expect(firstDifference(kept[i], recomputed[i]), name).toBe(-1));
    }
  });

  it.skipIf(skip)("a call too small to share stays on the calling thread", async () => {
    const two = new CpuBackend({ blas, threads: 2 });
    expect(await two.startAttentionWorkers()).toBe(1);
    const small = [{ start: 0, length: 20 }, { start: 20, length: 30 }];
    const one = new CpuBackend({ blas, threads: 1 });
    const [expected, actual] = [attentionBits(one, small), attentionBits(two, small)];
    expected.forEach((bits, i) => expect(firstDifference(actual[i], bits)).toBe(-1));
    expect(two.attentionUnitsOnWorkers).toBe(0);
  });
});

describe.each([
  ["portable", "portable", false],
  ["system BLAS", "auto", !systemBlas],
] as const)("attention threads over the KV cache: %s products", (_name, blas, skip) => {
  it.skipIf(skip)("a pass of two prompts (one after a cached prefix) and a decoding row gives one thread's bits, the prompts' units on workers", async () => {
    const spec = { numLayers: 1, numKvHeads: kvHeads, headDim, numSlots: 3, maxPositions: 400 };
    // Slot 0: a 300-token prompt; slot 1: 40 cached positions, then 200 more; slot 2: one decoding row at position 9.
    const slots = Int32Array.from([...Array(300).fill(0), ...Array(200).fill(1), 2]);
    const positions = Int32Array.from([...Array.from({ length: 300 }, (_, i) => i), ...Array.from({ length: 200 }, (_, i) => 40 + i), 9]);
    const outputs = await Promise.all([1, 3].map(async (threads) => {
      const backend = new CpuBackend({ blas, threads });
      expect(await backend.startAttentionWorkers()).toBe(threads - 1);
      const cache = backend.createKvCache(spec);
      const tensor = (rowCount: number, width: number, seed: number) => backend.upload(random(rowCount * width, seed), [rowCount, width]);
      // The earlier positions of slots 1 and 2, then the pass.
      const earlier = { slots: Int32Array.from([...Array(40).fill(1), ...Array(9).fill(2)]), positions: Int32Array.from([...Array.from({ length: 40 }, (_, i) => i), ...Array.from({ length: 9 }, (_, i) => i)]) };
      backend.attention(tensor(49, heads * headDim, 8), tensor(49, kvHeads * headDim, 9), tensor(49, kvHeads * headDim, 10), cache, 0, earlier, backend.zeros([49, heads * headDim]));
      const out = backend.zeros([501, heads * headDim]);
      backend.attention(tensor(501, heads * headDim, 11), tensor(501, kvHeads * headDim, 12), tensor(501, kvHeads * headDim, 13), cache, 0, { slots, positions }, out);
      return { bits: new Uint32Array(backend.download(out).buffer), onWorkers: backend.attentionUnitsOnWorkers };
    }));
    expect(firstDifference(outputs[1].bits, outputs[0].bits)).toBe(-1);
    expect(outputs[0].onWorkers).toBe(0);
    expect(outputs[1].onWorkers).toBeGreaterThan(0);
  });
});

it("attentionWorkers: false keeps the attention on the calling thread; anything but a boolean is refused", async () => {
  const alone = new CpuBackend({ blas: "portable", threads: 3, attentionWorkers: false });
  expect(await alone.startAttentionWorkers()).toBe(0);
  const expected = attentionBits(new CpuBackend({ blas: "portable", threads: 1 }), segments);
  attentionBits(alone, segments).forEach((bits, i) => expect(firstDifference(bits, expected[i])).toBe(-1));
  expect(alone.attentionUnitsOnWorkers).toBe(0);
  expect(() => new CpuBackend({ attentionWorkers: "no" as never })).toThrow(/attentionWorkers must be true or false, got "no"/);
});

it("an attention whose probabilities would pass KEPT_PROBABILITY_FLOATS keeps none (the backward recomputes them)", () => {
  const backend = new CpuBackend({ blas: "portable", threads: 1 });
  // One 1,200-row segment: 6 heads × 1,200² probabilities, past the bound.
  const long = [{ start: 0, length: 1200 }], shape = { segments: long, heads, kvHeads, headDim };
  expect(probabilityOffsets(shape).at(-1)).toBeGreaterThan(KEPT_PROBABILITY_FLOATS);
  const tensor = (width: number, seed: number) => backend.upload(random(1200 * width, seed), [1200, width]);
  const saved = backend.packedAttention(tensor(heads * headDim, 1), tensor(kvHeads * headDim, 2), tensor(kvHeads * headDim, 3), long, headDim,
    backend.zeros([1200, heads * headDim]));
  expect(saved.size).toBe(0);
});

it("a unit that throws is counted done and reported, and the other units still run", () => {
  const shape = { segments: [{ start: 0, length: 8 }, { start: 8, length: 8 }], heads: 2, kvHeads: 2, headDim: 4 };
  const buffer = new SharedArrayBuffer(4 * 16 * 8 * 4);
  const slots = { q: { buffer, offset: 0, length: 128 }, k: { buffer, offset: 128, length: 128 }, v: { buffer, offset: 256, length: 128 }, out: { buffer, offset: 384, length: 128 } };
  const job: AttentionJob = { kind: "forward", shape, slots, control: new SharedArrayBuffer(12) };
  let calls = 0;
  const failing = {
    ...portableGemm(1),
    nt: () => {
      if (++calls === 2) throw new Error("unit failed");
    },
  };
  const { units, error } = runAttentionUnits(job, failing, null);
  expect(units).toBe(4);
  expect((error as Error).message).toBe("unit failed");
  expect(Array.from(new Int32Array(job.control))).toEqual([4 + 1, 4, 1]); // next unit (one past the end), done, failed
  // A unit's forward is two products (scores, then p·v); unit 0's second threw, and the three others ran both.
  expect(calls).toBe(8);
});
