// The training attention across worker threads (lib/model/cpu/attention-threads.ts): a backend on three threads
// computes packedAttention and its backward with the same bits as one on one thread, its workers taking units, for
// the portable products and the system BLAS (CI installs OpenBLAS and sets ART_TEST_SYSTEM_BLAS=1, so that case
// cannot skip there); a call too small to share stays on the calling thread; a unit that fails is counted done and
// reported, so no thread waits for it.
import { describe, expect, it } from "vitest";
import type { PackedSegment } from "../../lib/model/backend.ts";
import { type AttentionJob, runAttentionUnits } from "../../lib/model/cpu/attention-threads.ts";
import { attentionUnits } from "../../lib/model/cpu/attention.ts";
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

/** out, dq, dk, dv of a forward and a backward (accumulating into nonzero gradients) on `backend`, as bits. */
function attentionBits(backend: CpuBackend, calls: readonly PackedSegment[]): Uint32Array[] {
  const tensor = (width: number, seed: number) => backend.upload(random(rows * width, seed), [rows, width]);
  const [q, k, v, dOut] = [tensor(heads * headDim, 1), tensor(kvHeads * headDim, 2), tensor(kvHeads * headDim, 3), tensor(heads * headDim, 4)];
  const out = backend.zeros(q.shape);
  const saved = backend.packedAttention(q, k, v, calls, headDim, out);
  const [dq, dk, dv] = [tensor(heads * headDim, 5), tensor(kvHeads * headDim, 6), tensor(kvHeads * headDim, 7)];
  backend.packedAttentionBackward(q, k, v, out, saved, calls, headDim, dOut, dq, dk, dv);
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
    ["out", "dq", "dk", "dv"].forEach((name, i) => expect(actual[i], name).toEqual(expected[i]));
    expect(one.attentionUnitsOnWorkers).toBe(0);
    // 2 × 8 units; this thread takes some too, and which thread takes which changes nothing.
    expect(three.attentionUnitsOnWorkers).toBeGreaterThan(0);
    expect(three.attentionUnitsOnWorkers).toBeLessThanOrEqual(2 * attentionUnits({ segments, heads, kvHeads, headDim }));
  });

  it.skipIf(skip)("a call too small to share stays on the calling thread", async () => {
    const two = new CpuBackend({ blas, threads: 2 });
    expect(await two.startAttentionWorkers()).toBe(1);
    const small = [{ start: 0, length: 20 }, { start: 20, length: 30 }];
    const one = new CpuBackend({ blas, threads: 1 });
    expect(attentionBits(two, small)).toEqual(attentionBits(one, small));
    expect(two.attentionUnitsOnWorkers).toBe(0);
  });
});

it("attentionWorkers: false keeps the attention on the calling thread; anything but a boolean is refused", async () => {
  const alone = new CpuBackend({ blas: "portable", threads: 3, attentionWorkers: false });
  expect(await alone.startAttentionWorkers()).toBe(0);
  expect(attentionBits(alone, segments)).toEqual(attentionBits(new CpuBackend({ blas: "portable", threads: 1 }), segments));
  expect(alone.attentionUnitsOnWorkers).toBe(0);
  expect(() => new CpuBackend({ attentionWorkers: "no" as never })).toThrow(/attentionWorkers must be true or false, got "no"/);
});

it("a unit that throws is counted done and reported, and the other units still run", () => {
  const shape = { segments: [{ start: 0, length: 8 }, { start: 8, length: 8 }], heads: 2, kvHeads: 2, headDim: 4 };
  const arena = new SharedArrayBuffer(4 * 16 * 8 * 4);
  const slots = { q: [0, 128], k: [128, 128], v: [256, 128], out: [384, 128] } as const;
  const job: AttentionJob = { kind: "forward", shape, arena, slots, prefixes: [], control: new SharedArrayBuffer(12) };
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
