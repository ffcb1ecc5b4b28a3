// CPU kernels against plain triple loops in float64 (the independent reference for the shapes the model tests
// do not reach: odd sizes, column ranges, LoRA, log-softmax, bf16 uploads).
import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { matmulNT } from "../../lib/model/cpu/kernels.ts";
import { f32ToBf16 } from "../../lib/model/safetensors.ts";
import { maxAbsDiff } from "./helpers.ts";
import { probeKvSlotCopy } from "./kv-copy-probe.ts";

function random(length: number, seed: number): Float32Array {
  let s = seed;
  return Float32Array.from({ length }, () => {
    s = (s * 1103515245 + 12345) % 2147483648;
    return s / 2147483648 - 0.5;
  });
}

function naiveXWt(x: Float32Array, w: Float32Array, n: number, k: number, m: number): Float64Array {
  const out = new Float64Array(n * m);
  for (let i = 0; i < n; i++) for (let o = 0; o < m; o++) {
    let s = 0;
    for (let j = 0; j < k; j++) s += x[i * k + j] * w[o * k + j];
    out[i * m + o] = s;
  }
  return out;
}

describe("CPU kernels", () => {
  it("matmulNT matches the naive product for every tile remainder and a column range", () => {
    for (const [n, k, m] of [[1, 5, 1], [3, 7, 5], [4, 16, 2], [37, 9, 11], [70, 33, 6]]) {
      const x = random(n * k, n + k), w = random(m * k, m * 3);
      const out = new Float32Array(n * m);
      matmulNT(x, w, n, k, m, out);
      expect(maxAbsDiff(out, naiveXWt(x, w, n, k, m))).toBeLessThan(1e-5);
      const part = new Float32Array(n * m).fill(7);
      matmulNT(x, w, n, k, m, part, 1, false, 1, m - 1);
      const expected = naiveXWt(x, w, n, k, m).map((v, i) => (i % m >= 1 && i % m < m - 1 ? v : 7));
      expect(maxAbsDiff(part, expected)).toBeLessThan(1e-5);
    }
  });

  it("linear adds the bias and an unmerged LoRA: x Wᵀ + b + scale (x Aᵀ) Bᵀ", () => {
    const b = new CpuBackend();
    const [n, k, m, r] = [5, 12, 7, 3];
    const x = random(n * k, 1), w = random(m * k, 2), bias = random(m, 3), a = random(r * k, 4), lb = random(m * r, 5);
    const out = b.zeros([n, m]);
    b.linear(b.upload(x, [n, k]), b.upload(w, [m, k]), b.upload(bias, [m]), out,
      { a: b.upload(a, [r, k]), b: b.upload(lb, [m, r]), scale: 0.5 });
    const base = naiveXWt(x, w, n, k, m);
    const down = naiveXWt(x, a, n, k, r);
    const up = naiveXWt(Float32Array.from(down), lb, n, r, m);
    const expected = base.map((v, i) => v + bias[i % m] + 0.5 * up[i]);
    expect(maxAbsDiff(b.download(out), expected)).toBeLessThan(1e-5);
  });

  it("logSoftmax rows sum to one in probability; bf16 uploads hold bf16 values", () => {
    const b = new CpuBackend();
    const logits = b.upload(Float32Array.of(1, 2, 3, -50, 0, 50), [2, 3]);
    const out = b.zeros([2, 3]);
    b.logSoftmax(logits, out);
    const lp = b.download(out);
    expect(Math.exp(lp[0]) + Math.exp(lp[1]) + Math.exp(lp[2])).toBeCloseTo(1, 6);
    expect(lp[5]).toBeCloseTo(0, 6);
    expect(lp[2] - lp[1]).toBeCloseTo(1, 6);
    const rounded = b.download(b.upload(Float32Array.of(1 + 2 ** -10, 3.14159), [2], "bf16"));
    expect(Array.from(rounded, (v) => f32ToBf16(v) << 16 === new Uint32Array(Float32Array.of(v).buffer)[0])).toEqual([true, true]);
    expect(rounded[0]).toBe(1);
  });

  it("copyKvSlot: the target attends like keys and values written there directly; other slots and later positions keep theirs", () => {
    const probe = probeKvSlotCopy(new CpuBackend(), { numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 8 },
      { sourceLength: 9, otherLength: 5, targetLength: 13, numPositions: 6 });
    expect(probe.copied).toEqual(probe.direct);
    expect(probe.targetRow).toEqual(probe.sourceRow);
    // Not vacuous: the slots' probe rows differ from each other.
    expect(probe.copied[0].slice(0, 8)).not.toEqual(probe.copied[0].slice(16, 24));
  });

  it("copyKvSlot refuses a slot outside the cache, the same slot twice, and more positions than a slot holds", () => {
    const b = new CpuBackend();
    const cache = b.createKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2, numSlots: 2, maxPositions: 4 });
    expect(() => b.copyKvSlot(cache, 0, 2, 1)).toThrow("copyKvSlot: target slot 2 does not exist; the KV cache has slots 0..1");
    expect(() => b.copyKvSlot(cache, -1, 1, 1)).toThrow("copyKvSlot: source slot -1 does not exist; the KV cache has slots 0..1");
    expect(() => b.copyKvSlot(cache, 1, 1, 1)).toThrow("copyKvSlot: source and target are both slot 1; copy between two different slots");
    expect(() => b.copyKvSlot(cache, 0, 1, 5)).toThrow("copyKvSlot: cannot copy 5 positions; a slot holds 0..4 positions");
    expect(() => b.copyKvSlot(cache, 0, 1, 1.5)).toThrow("copyKvSlot: cannot copy 1.5 positions");
  });

  it("shape and range errors name the op", () => {
    const b = new CpuBackend();
    expect(() => b.upload(new Float32Array(5), [2, 3])).toThrow("cpu backend: 5 values cannot fill shape [2,3]");
    expect(() => b.linear(b.zeros([2, 5]), b.zeros([3, 4]), null, b.zeros([2, 3])))
      .toThrow("cpu backend: linear input has 10 elements ([2,5]), not a multiple of 4");
    expect(() => b.embedding(b.zeros([10, 4]), Int32Array.of(3, 10), b.zeros([2, 4])))
      .toThrow("token id 10 is outside the vocabulary (0..9)");
    const cache = b.createKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2, numSlots: 1, maxPositions: 4 });
    const q = b.zeros([1, 2]);
    expect(() => b.attention(q, q, q, cache, 0, { slots: Int32Array.of(0), positions: Int32Array.of(4) }, b.zeros([1, 2])))
      .toThrow("row 0 names slot 0 position 4; the KV cache has 1 slots of 4 positions");
    const t = b.zeros([2]);
    b.free(t);
    expect(() => b.download(t)).toThrow("a freed tensor was used");
  });
});
