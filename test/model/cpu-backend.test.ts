// CPU kernels against plain triple loops in float64 (the independent reference for the shapes the model tests
// do not reach: odd sizes, column ranges, LoRA, log-softmax, bf16 uploads).
import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { matmulNT } from "../../lib/model/cpu/matmul.ts";
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

/** max |a − b| over max |a|. */
function maxRelativeDifference(a: Float32Array, b: Float32Array): number {
  return maxAbsDiff(a, b) / Math.max(...Array.from(a, Math.abs));
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
      matmulNT(x, w, n, k, m, part, { columnStart: 1, columnEnd: m - 1 });
      const expected = naiveXWt(x, w, n, k, m).map((v, i) => (i % m >= 1 && i % m < m - 1 ? v : 7));
      expect(maxAbsDiff(part, expected)).toBeLessThan(1e-5);
    }
  });

  it("matmulNT reads and writes rows at given strides (a head's slice of wider rows), scaled and accumulated", () => {
    const [n, k, m, pad] = [6, 5, 7, 3];
    const x = random(n * k, 11), w = random(m * k, 12), base = random(n * m, 13);
    // The same operands embedded in wider rows, starting at an offset, with garbage around them.
    const wide = (packed: Float32Array, rows: number, width: number, stride: number) => {
      const out = random(rows * stride + pad, 14);
      for (let r = 0; r < rows; r++) out.set(packed.subarray(r * width, (r + 1) * width), pad + r * stride);
      return out;
    };
    const xs = wide(x, n, k, k + 4), ws = wide(w, m, k, k + 9), outs = wide(base, n, m, m + 2);
    const untouched = outs.slice();
    matmulNT(xs.subarray(pad), ws.subarray(pad), n, k, m, outs.subarray(pad),
      { alpha: 0.5, accumulate: true, xStride: k + 4, wStride: k + 9, outStride: m + 2 });
    const product = naiveXWt(x, w, n, k, m);
    for (let i = 0; i < outs.length; i++) {
      const r = Math.floor((i - pad) / (m + 2)), c = (i - pad) % (m + 2);
      const inside = i >= pad && r < n && c < m;
      expect(outs[i]).toBeCloseTo(inside ? base[r * m + c] + 0.5 * product[r * m + c] : untouched[i], 5);
    }
  });

  it("linear adds the bias, addLoras an unmerged LoRA: x Wᵀ + b + scale (x Aᵀ) Bᵀ", () => {
    const b = new CpuBackend();
    const [n, k, m, r] = [5, 12, 7, 3];
    const x = random(n * k, 1), w = random(m * k, 2), bias = random(m, 3), a = random(r * k, 4), lb = random(m * r, 5);
    const out = b.zeros([n, m]), xs = b.upload(x, [n, k]), down = b.zeros([n, r]);
    b.linear(xs, b.upload(w, [m, k]), b.upload(bias, [m]), out);
    b.addLoras(xs, [{ lora: { a: b.upload(a, [r, k]), b: b.upload(lb, [m, r]), scale: 0.5 }, out, column: 0, down: { tensor: down, column: 0 } }]);
    const base = naiveXWt(x, w, n, k, m);
    const downExpected = naiveXWt(x, a, n, k, r);
    const up = naiveXWt(Float32Array.from(downExpected), lb, n, r, m);
    const expected = base.map((v, i) => v + bias[i % m] + 0.5 * up[i]);
    expect(maxAbsDiff(b.download(out), expected)).toBeLessThan(1e-5);
    expect(maxAbsDiff(b.download(down), downExpected)).toBeLessThan(1e-5);
  });

  it("addLoras adds into its block of columns of a wider output (the up half of gate/up) and nowhere else", () => {
    const b = new CpuBackend();
    const [n, k, m, r, width, column] = [4, 10, 6, 2, 15, 7];
    const x = random(n * k, 11), a = random(r * k, 12), lb = random(m * r, 13), before = random(n * width, 14);
    const out = b.upload(Float32Array.from(before), [n, width]);
    b.addLoras(b.upload(x, [n, k]), [{ lora: { a: b.upload(a, [r, k]), b: b.upload(lb, [m, r]), scale: 2 }, out, column }]);
    const up = naiveXWt(Float32Array.from(naiveXWt(x, a, n, k, r)), lb, n, r, m);
    const expected = Array.from(before, (v, i) => {
      const row = Math.floor(i / width), c = i % width;
      return c >= column && c < column + m ? v + 2 * up[row * m + c - column] : v;
    });
    expect(maxAbsDiff(b.download(out), expected)).toBeLessThan(1e-5);
    expect(() => b.addLoras(b.upload(x, [n, k]), [{ lora: { a: b.upload(a, [r, k]), b: b.upload(lb, [m, r]), scale: 2 }, out, column: 10 }]))
      .toThrowError("cpu backend: a LoRA of 6 outputs at column 10 does not fit an output of [4,15] for 4 rows");
  });

  // The ops that take their input's LoRAs (InputLoras) are addLoras then the op, bit for bit: the transformer hands
  // them the LoRAs a GPU folds, and the CPU's numbers must not move with that.
  it("splitColumns, swiglu and addRmsNorm with `loras` give addLoras then the op, bit for bit", () => {
    const b = new CpuBackend();
    const [n, k, r, hd] = [5, 24, 4, 8];
    const widths = [4 * hd, 2 * hd, 2 * hd], total = 8 * hd, inter = 20, d = 16;
    const x = b.upload(random(n * k, 21), [n, k]);
    const lora = (out: number, seed: number) => ({ a: b.upload(random(r * k, seed), [r, k]), b: b.upload(random(out * r, seed + 1), [out, r]), scale: 1.5 });
    const rotate = { positions: Int32Array.from([0, 3, 9, 1, 40]), invFreq: b.upload(Float32Array.from({ length: hd / 2 }, (_, j) => 1 / 100 ** (j / hd)), [hd / 2]), headDim: hd };
    const bias = b.upload(random(total, 22), [total]);
    const q = lora(widths[0], 23), v = lora(widths[2], 25), gate = lora(inter, 27), up = lora(inter, 29), o = lora(d, 31);
    const product = random(n * total, 33), gateUp = random(n * 2 * inter, 34), projected = random(n * d, 35), residual = random(n * d, 36);
    const norm = b.upload(random(d, 37), [d]);
    const results = (mode: "apart" | "folded" | "none") => {
      const folded = mode === "folded";
      const fused = b.upload(Float32Array.from(product), [n, total]), parts = widths.map((w) => b.zeros([n, w]));
      const qkv = { x, targets: [{ lora: q, out: fused, column: 0 }, { lora: v, out: fused, column: widths[0] + widths[1] }] };
      const halves = b.upload(Float32Array.from(gateUp), [n, 2 * inter]), hidden = b.zeros([n, inter]);
      const mlp = { x, targets: [{ lora: gate, out: halves, column: 0 }, { lora: up, out: halves, column: inter }] };
      const oOut = b.upload(Float32Array.from(projected), [n, d]), sum = b.upload(Float32Array.from(residual), [n, d]), normed = b.zeros([n, d]);
      const attention = { x, targets: [{ lora: o, out: oOut, column: 0 }] };
      for (const group of mode === "apart" ? [qkv, mlp, attention] : []) b.addLoras(group.x, group.targets);
      b.splitColumns(fused, bias, parts, rotate, folded ? qkv : null);
      b.swiglu(halves, hidden, folded ? mlp : null);
      b.addRmsNorm(sum, oOut, sum, norm, 1e-6, normed, null, folded ? attention : null);
      return [...parts, hidden, sum, normed].map((t) => b.download(t));
    };
    const [apart, folded, none] = [results("apart"), results("folded"), results("none")];
    folded.forEach((values, i) => {
      expect(values).toEqual(apart[i]);
      if (i !== 1) expect(values).not.toEqual(none[i]);  // every LoRA counts (k has none)
    });
  });

  it("splitColumns hands each part its columns plus its bias (q, k, v from one product)", () => {
    const b = new CpuBackend();
    const rows = 3, widths = [5, 2, 2], width = 9;
    const x = random(rows * width, 21), bias = random(width, 22);
    const outs = widths.map((w) => b.empty([rows, w]));
    b.splitColumns(b.upload(Float32Array.from(x), [rows, width]), b.upload(Float32Array.from(bias), [width]), outs);
    let start = 0;
    widths.forEach((w, j) => {
      const expected = Array.from({ length: rows * w }, (_, i) => x[Math.floor(i / w) * width + start + (i % w)] + bias[start + (i % w)]);
      expect(Array.from(b.download(outs[j]))).toEqual(expected.map((v) => Math.fround(v)));
      start += w;
    });
    const noBias = [b.empty([rows, 4]), b.empty([rows, 5])];
    b.splitColumns(b.upload(Float32Array.from(x), [rows, width]), null, noBias);
    expect(Array.from(b.download(noBias[1]))).toEqual(Array.from({ length: rows * 5 }, (_, i) => x[Math.floor(i / 5) * width + 4 + (i % 5)]));
    expect(() => b.splitColumns(b.zeros([rows, width]), null, [b.zeros([rows, 5]), b.zeros([rows, 3])]))
      .toThrowError("cpu backend: splitColumns of [3,9] into parts [[3,5], [3,3]]: the parts must have its 3 rows and together its width");
  });

  it("a view is rows of its owner: same memory, freed with it, not by itself", () => {
    const b = new CpuBackend();
    const owner = b.upload(Float32Array.from({ length: 12 }, (_, i) => i), [4, 3]);
    const middle = b.view(owner, 1, 2), last = b.view(middle, 1, 1);
    expect(middle.shape).toEqual([2, 3]);
    expect(Array.from(b.download(middle))).toEqual([3, 4, 5, 6, 7, 8]);
    expect(Array.from(b.download(last))).toEqual([6, 7, 8]);
    b.write(last, Float32Array.of(-1, -2, -3));
    expect(Array.from(b.download(owner)).slice(6, 9)).toEqual([-1, -2, -3]);
    b.free(middle);
    expect(Array.from(b.download(owner)).slice(3, 6)).toEqual([3, 4, 5]);
    expect(() => b.view(owner, 3, 2)).toThrowError("cpu backend: a view of rows 3..4 of a tensor of 4 rows ([4,3]); name rows that it has");
    b.free(owner);
    expect(() => b.download(last)).toThrowError("a freed tensor was used");
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

  it("attention equals a float64 softmax(q·kᵀ/√d)·v over each row's slot history: GQA groups, prefill blocks, chunks, mixed runs", () => {
    const numSlots = 3, maxPositions = 96;
    for (const [headDim, numKvHeads, group] of [[8, 2, 1], [64, 1, 4], [80, 2, 2]]) {
      const b = new CpuBackend();
      const numHeads = numKvHeads * group, kvWidth = numKvHeads * headDim, qWidth = numHeads * headDim;
      const cache = b.createKvCache({ numLayers: 2, numKvHeads, headDim, numSlots, maxPositions });
      // Every key and value written so far, per slot and position: the reference's view of the cache.
      const history = Array.from({ length: numSlots }, () => new Map<number, { k: Float32Array; v: Float32Array }>());
      let seed = headDim * 31 + group;
      const pass = (placement: [slot: number, position: number][]) => {
        const n = placement.length;
        const q = random(n * qWidth, ++seed).map((x) => 4 * x), k = random(n * kvWidth, ++seed), v = random(n * kvWidth, ++seed);
        placement.forEach(([slot, position], i) => history[slot].set(position, {
          k: k.subarray(i * kvWidth, (i + 1) * kvWidth), v: v.subarray(i * kvWidth, (i + 1) * kvWidth),
        }));
        const out = b.zeros([n, qWidth]);
        b.attention(b.upload(q, [n, qWidth]), b.upload(k, [n, kvWidth]), b.upload(v, [n, kvWidth]), cache, 1,
          { slots: Int32Array.from(placement, ([slot]) => slot), positions: Int32Array.from(placement, ([, p]) => p) }, out);
        const expected = new Float64Array(n * qWidth);
        placement.forEach(([slot, position], i) => {
          for (let h = 0; h < numHeads; h++) {
            const kvAt = Math.floor(h / group) * headDim, qAt = (i * numHeads + h) * headDim;
            const scores = Array.from({ length: position + 1 }, (_, t) => {
              let dot = 0;
              for (let j = 0; j < headDim; j++) dot += q[qAt + j] * history[slot].get(t)!.k[kvAt + j];
              return dot / Math.sqrt(headDim);
            });
            const max = Math.max(...scores), weights = scores.map((x) => Math.exp(x - max));
            const sum = weights.reduce((a, c) => a + c, 0);
            weights.forEach((w, t) => {
              for (let j = 0; j < headDim; j++) expected[qAt + j] += (w / sum) * history[slot].get(t)!.v[kvAt + j];
            });
          }
        });
        expect(maxAbsDiff(b.download(out), expected)).toBeLessThan(1e-5);
      };
      const range = (slot: number, from: number, to: number) =>
        Array.from({ length: to - from }, (_, i): [number, number] => [slot, from + i]);
      pass([...range(0, 0, 70), ...range(2, 0, 5)]); // prefills: 70 rows are three blocks of query rows
      // Decoding rows, a prompt continued in a chunk, and one slot's rows split in two runs by another slot's.
      pass([[2, 5], ...range(1, 0, 20), ...range(0, 70, 75), ...range(1, 20, 41), [2, 6]]);
      pass([[0, 75], [1, 41], [2, 7]]); // a decode batch
    }
  });

  // Bit for bit on the portable products; a system BLAS picks its kernels by shape, so there it holds to rounding.
  it.each(["portable", "auto"] as const)("attention (%s products) gives a row the same bits whether its prompt is prefilled whole, in chunks, or up to it with the row alone", (blas) => {
    const b = new CpuBackend({ blas });
    const [numHeads, numKvHeads, headDim, length] = [4, 2, 16, 70];
    const q = random(length * numHeads * headDim, 21).map((x) => 4 * x), k = random(length * numKvHeads * headDim, 22), v = random(length * numKvHeads * headDim, 23);
    const lastRow = (chunks: number[]) => {
      const cache = b.createKvCache({ numLayers: 1, numKvHeads, headDim, numSlots: 2, maxPositions: length });
      let out = new Float32Array(0);
      for (let i = 0; i + 1 < chunks.length; i++) {
        const [from, to] = [chunks[i], chunks[i + 1]];
        const rows = (x: Float32Array, width: number) => b.upload(x.slice(from * width, to * width), [to - from, width]);
        const o = b.zeros([to - from, numHeads * headDim]);
        b.attention(rows(q, numHeads * headDim), rows(k, numKvHeads * headDim), rows(v, numKvHeads * headDim), cache, 0,
          { slots: new Int32Array(to - from).fill(1), positions: Int32Array.from({ length: to - from }, (_, r) => from + r) }, o);
        out = b.download(o).slice(-numHeads * headDim);
      }
      return out;
    };
    const whole = lastRow([0, length]);
    // Measured with OpenBLAS: ≤ 1e-7 relative (0 for the chunkings that keep the block shapes); a masking or
    // position error is O(1).
    const same = (actual: Float32Array) => {
      if (b.gemm.library === null) expect(actual).toEqual(whole);
      else expect(maxRelativeDifference(whole, actual)).toBeLessThan(1e-6);
    };
    same(lastRow([0, 40, length]));
    same(lastRow([0, 33, 37, length]));
    same(lastRow([0, length - 1, length])); // the last prompt token fed again after a reused prefix
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

  it("freed storage comes back zeroed to the next tensor of its length; a caller's uploaded array never does", () => {
    const b = new CpuBackend();
    const made = b.zeros([3, 4]);
    b.write(made, Float32Array.from({ length: 12 }, (_, i) => i + 1));
    b.free(made);
    const again = b.zeros([4, 3]);
    expect(b.download(again)).toEqual(new Float32Array(12));
    const copied = b.copy(again); // the same length again: storage of its own, not `again`'s
    b.write(again, new Float32Array(12).fill(5));
    expect(b.download(copied)).toEqual(new Float32Array(12));

    const callers = new Float32Array(12).fill(9);
    const uploaded = b.upload(callers, [12]);
    b.free(uploaded);
    const next = b.zeros([12]);
    b.write(next, new Float32Array(12).fill(1));
    expect(callers).toEqual(new Float32Array(12).fill(9));
  });

  it("storage of a nearby length is reused too (a training batch's row count changes), as a view of exactly the length asked for", () => {
    const b = new CpuBackend();
    const rows = (n: number) => b.zeros([n, 64]);
    const first = rows(100);
    const array = (first as unknown as { data: Float32Array }).data;
    b.write(first, new Float32Array(6400).fill(3));
    b.free(first);
    // 97 rows of 64 floats are in the class of 100 rows (a sixteenth of an octave apart): the same memory, zeroed.
    const second = rows(97);
    const view = (second as unknown as { data: Float32Array }).data;
    expect(view.buffer).toBe(array.buffer);
    expect(view.length).toBe(97 * 64);
    expect(b.download(second)).toEqual(new Float32Array(97 * 64));
    b.free(second);
    // Beyond the class, new memory; the pool gave back the whole array, not the view.
    const third = rows(120);
    expect((third as unknown as { data: Float32Array }).data.buffer).not.toBe(array.buffer);
    expect((rows(100) as unknown as { data: Float32Array }).data.buffer).toBe(array.buffer);
  });
