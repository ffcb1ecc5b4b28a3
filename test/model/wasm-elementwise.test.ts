// The WebAssembly SIMD kernels (elementwise.wat): SwiGLU and its backward against the formulas in float64, over the
// range activations take and beyond it (underflow, large |g|, zeros, NaN), on lengths that are not multiples of the
// vector or of the chunk the operands stream through; softmax, RMSNorm and RoPE against their JavaScript references.
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import { causalSoftmax, causalSoftmaxBackward } from "../../lib/model/cpu/attention.ts";
import { rmsNormRows, rmsNormRowsBackward, ropeRows, ropeTable } from "../../lib/model/cpu/kernels.ts";
import { referenceLogSumExp, referenceSamplerKernels } from "../../lib/model/cpu/sample.ts";
import { WasmElementwise } from "../../lib/model/cpu/wasm-elementwise.ts";
import { CpuBackend, type CpuBackendOptions } from "../../lib/model/cpu/backend.ts";
import { chooseGemm } from "../../lib/model/cpu/gemm.ts";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import { Trainer } from "../../lib/grpo/train.ts";
import type { TrainingSequence } from "../../lib/grpo/tokenize.ts";
import { loadTinyModel } from "./tiny-fixture.ts";

// Both modules: relaxed SIMD's fused multiply-adds (what Node, Deno and Chromium load) and the plain one beside it.
const variants = [true, false].flatMap((fusedMultiplyAdd) => {
  const kernels = WasmElementwise.create({ fusedMultiplyAdd });
  return kernels ? [{ variant: fusedMultiplyAdd ? "fused multiply-add" : "product then sum", kernels }] : [];
});
if (variants.length < 2) throw new Error("this runtime lacks WebAssembly SIMD or relaxed SIMD");

it("the default instance is the fused one where the runtime has relaxed SIMD", () => {
  expect(WasmElementwise.create()!.fusedMultiplyAdd).toBe(true);
});

const sigmoid = (g: number) => 1 / (1 + Math.exp(-g));

/** Gates spread over ±30 (activations rarely pass ±20), then the edges. */
function gates(length: number, seed: number): Float32Array {
  const rng = seededRandom(seed);
  const values = Float32Array.from({ length }, () => (rng() - 0.5) * 60);
  const edges = [0, -0, 1e-30, -1e-30, 87, -87, 88.5, -88.5, 100, -100, 1e30, -1e30, 1e-8, -1e-8, 0.5, -0.5];
  values.set(edges.slice(0, length));
  return values;
}

/** Plain values in ±3 for the other operands. */
function values(length: number, seed: number): Float32Array {
  const rng = seededRandom(seed);
  return Float32Array.from({ length }, () => (rng() - 0.5) * 6);
}

/**
 * |actual − expected| within `ulps` f32 ulps of |expected| plus 1e-35 absolute: exp below e^−87.33 ≈ 1.2e-38 is flushed
 * to 0, which moves g·σ(g) by under 1.1e-36 (its largest |g|·e^g there), times operands of at most 3.
 * Measured over 200,000 gates in ±30, both modules: ≤ 1.7 ulps forward, ≤ 2.4 backward (the polynomial, the division
 * and the products each round once); the tolerances are about twice that.
 */
function expectClose(expected: Float64Array, actual: Float32Array, ulps: number, what: string, scale = expected): void {
  for (let i = 0; i < expected.length; i++) {
    const bound = ulps * 2 ** -23 * Math.abs(scale[i]) + 1e-35;
    if (!(Math.abs(actual[i] - expected[i]) <= bound)) {
      throw new Error(`${what}[${i}]: ${actual[i]} against ${expected[i]} (bound ${bound})`);
    }
  }
}

/** Largest |a − b| / (|b| + floor) over the arrays. */
function maxRelative(a: Float32Array, b: Float32Array, floor: number): number {
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]) / (Math.abs(b[i]) + floor));
  return worst;
}

/** gate and up [rows, inter] side by side in each row: the layout of the fused gate/up product. */
function fused(gate: Float32Array, up: Float32Array, inter: number): Float32Array {
  const out = new Float32Array(2 * gate.length);
  for (let r = 0; r < gate.length / inter; r++) {
    out.set(gate.subarray(r * inter, (r + 1) * inter), 2 * r * inter);
    out.set(up.subarray(r * inter, (r + 1) * inter), (2 * r + 1) * inter);
  }
  return out;
}

describe.each(variants)("WASM SIMD kernels, $variant", ({ kernels }) => {
  describe("WASM SIMD SwiGLU", () => {
    it("swiglu matches g·σ(g)·up within 4 ulps, on every length modulo 4, rows across chunk boundaries and rows longer than a chunk", () => {
      for (const [rows, inter] of [[1, 1], [2, 1], [1, 3], [4, 1], [1, 5], [1, 17], [1, 2047], [2, 1024], [3, 683], [1, 5000], [5, 1000], [3, 4099]]) {
        const length = rows * inter;
        const gate = gates(length, length), up = values(length, length + 1);
        const out = new Float32Array(length).fill(Number.NaN);
        kernels.swiglu(fused(gate, up, inter), out, inter);
        expectClose(Float64Array.from(gate, (g, i) => g * sigmoid(g) * up[i]), out, 4, `swiglu ${rows} × ${inter}`);
      }
    });

    it("the backward adds dOut·silu(g) to dUp and dOut·up·silu'(g) to dGate within 5 ulps", () => {
      const inter = 1367, length = 3 * inter; // rows across chunk boundaries
      const gate = gates(length, 7), up = values(length, 8), dOut = values(length, 9), gateUp = fused(gate, up, inter);
      const dGate = new Float32Array(length), dUp = new Float32Array(length);
      kernels.swigluBackward(gateUp, dOut, dGate, dUp, inter);
      const s = Float64Array.from(gate, sigmoid);
      expectClose(Float64Array.from(gate, (g, i) => dOut[i] * g * s[i]), dUp, 5, "dUp");
      // 1 + g·(1 − σ) crosses zero near g = −1.28, where any f32 evaluation loses relative digits: there the error
      // is bounded by the size of its terms, |1| + |g·(1 − σ)|, not by the result.
      expectClose(Float64Array.from(gate, (g, i) => dOut[i] * up[i] * s[i] * (1 + g * (1 - s[i]))), dGate, 5, "dGate",
        Float64Array.from(gate, (g, i) => dOut[i] * up[i] * s[i] * (1 + Math.abs(g * (1 - s[i])))));
      // Accumulating: a second pass adds the same values again, and x + x = 2x exactly.
      const [dGate1, dUp1] = [dGate.slice(), dUp.slice()];
      kernels.swigluBackward(gateUp, dOut, dGate, dUp, inter);
      expect(dGate).toEqual(dGate1.map((v) => 2 * v));
      expect(dUp).toEqual(dUp1.map((v) => 2 * v));
    });

    it("exp(x − shift) matches Math.exp within 2 ulps from the flush threshold to 88, NaN stays NaN", () => {
      const rng = seededRandom(5);
      const x = Float32Array.from({ length: 10_001 }, () => (rng() - 0.5) * 200);
      x.set([Number.NaN, Number.NEGATIVE_INFINITY, 0, 88, -87.3, -87.4, 1e-7], 0);
      const out = new Float32Array(x.length);
      kernels.expShifted(x, 0.5, out); // shift 0.5: x − shift stays ≤ 88 up to x = 88.5, beyond it overflow is allowed
      // Measured over a million points: ≤ 0.7 ulps; 0 below e^−87.33 (flushed, not subnormal).
      expect(Number.isNaN(out[0])).toBe(true);
      expect(out[1]).toBe(0);
      x.forEach((v, i) => {
        if (i === 0 || v - 0.5 > 88) return;
        const expected = Math.exp(Math.fround(v - 0.5)); // the kernel subtracts in f32, as the caller's f32 logits would
        if (Math.fround(v - 0.5) < Math.fround(-87.33)) expect(out[i]).toBe(0);
        else expect(Math.abs(out[i] - expected), `exp(${v} − 0.5)`).toBeLessThanOrEqual(2 * 2 ** -23 * expected);
      });
      const inPlace = x.slice(1, 7);
      kernels.expShifted(inPlace, 0.5, inPlace);
      expect(inPlace).toEqual(out.slice(1, 7));
    });

    it("NaN stays NaN and infinities give silu's limits", () => {
      const gate = Float32Array.of(Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, 3);
      const out = new Float32Array(4);
      kernels.swiglu(fused(gate, Float32Array.of(1, 1, 1, Number.NaN), 4), out, 4);
      expect(Number.isNaN(out[0])).toBe(true);
      expect(out[1]).toBe(Number.POSITIVE_INFINITY);
      expect(Object.is(out[2], -0) || Number.isNaN(out[2])).toBe(true); // −∞ · 0: IEEE gives NaN, the limit is 0
      expect(Number.isNaN(out[3])).toBe(true);
    });
  });

  describe("WASM SIMD softmax, RMSNorm and RoPE against their references", () => {
    it("softmaxRows: every row's keys up to its last, zeros to the block's end, in place in scratch memory or through a copy", () => {
      const rng = seededRandom(11);
      // A block of 37 rows (a partial group of 4 at every offset), 2 keys up to 131, rows 140 apart.
      const stride = 140, lasts = Int32Array.from({ length: 37 }, (_, r) => (r * 7 + 1) % 131), end = 131;
      const scores = Float32Array.from({ length: 3 + 37 * stride }, () => (rng() - 0.5) * 40);
      const expected = scores.slice();
      for (let r = 0; r < lasts.length; r++) causalSoftmax(expected, 3 + r * stride, lasts[r], end);
      const copied = scores.slice();
      kernels.softmaxRows(copied, 3, stride, lasts, end);
      const view = kernels.scratchView(scores.length);
      view.set(scores);
      kernels.softmaxRows(view, 3, stride, lasts, end);
      for (const actual of [copied, view]) {
        for (let r = 0; r < lasts.length; r++) {
          const row = actual.subarray(3 + r * stride, 3 + (r + 1) * stride), input = scores.subarray(3 + r * stride);
          const max = Math.max(...input.subarray(0, lasts[r] + 1));
          for (let s = 0; s <= lasts[r]; s++) {
            // The kernel subtracts the max in f32 (an error of |x − max|·2⁻²⁴ in the exponent, hence relative in the
            // result), then its exponential and the scaling round a little more: measured ≤ 2.9·2⁻²⁴ relative beyond the first
            // over 200 such blocks; the bound allows 6.
            const expect_ = expected[3 + r * stride + s], bound = (6 * 2 ** -24 + Math.abs(input[s] - max) * 2 ** -24) * expect_ + 1e-37;
            expect(Math.abs(row[s] - expect_), `row ${r} key ${s}`).toBeLessThanOrEqual(bound);
          }
          expect(row.subarray(lasts[r] + 1, end).every((p) => p === 0)).toBe(true);
          // Past `end` nothing is touched (the next row's or the caller's values).
          expect(row.subarray(end)).toEqual(scores.subarray(3 + r * stride + end, 3 + (r + 1) * stride));
        }
      }
      expect(copied.subarray(0, 3)).toEqual(scores.subarray(0, 3));
    });

    it("softmaxBackwardRows matches causalSoftmaxBackward, zeros to the block's end, nothing past it", () => {
      const rng = seededRandom(14);
      const stride = 140, lasts = Int32Array.from({ length: 37 }, (_, r) => (r * 7 + 1) % 131), end = 131;
      const probs = Float32Array.from({ length: 3 + 37 * stride }, () => rng());
      const grads = Float32Array.from({ length: probs.length }, () => (rng() - 0.5) * 4);
      const expected = grads.slice(), actual = grads.slice();
      for (let r = 0; r < lasts.length; r++) causalSoftmaxBackward(probs, expected, 3 + r * stride, lasts[r], end, 0.125);
      kernels.softmaxBackwardRows(probs, actual, 3, stride, lasts, end, 0.125);
      for (let r = 0; r < lasts.length; r++) {
        const at = 3 + r * stride;
        let weighted = 0, size = 0;
        for (let s = 0; s <= lasts[r]; s++) {
          weighted += probs[at + s] * grads[at + s];
          size = Math.max(size, Math.abs(grads[at + s]));
        }
        for (let s = 0; s <= lasts[r]; s++) {
          // f32 arithmetic after an f64 sum: within a few ulps of the terms P·(|dP| + |Σ P·dP|)·scale (measured ≤ 2.7
          // units of 2⁻²⁴ over 200 blocks; 4 allowed).
          const bound = 4 * 2 ** -24 * probs[at + s] * (size + Math.abs(weighted)) * 0.125;
          expect(Math.abs(actual[at + s] - expected[at + s]), `row ${r} key ${s}`).toBeLessThanOrEqual(bound);
        }
        expect(actual.subarray(at + lasts[r] + 1, at + end).every((g) => g === 0)).toBe(true);
        expect(actual.subarray(at + end, at + stride)).toEqual(grads.subarray(at + end, at + stride));
      }
    });

    it("logSumExp matches the sampler's float64 reference on rows of any length, ±∞ and NaN as it gives them", () => {
      const rng = seededRandom(15);
      for (const length of [1, 3, 4097, 8192, 10_001]) {
        const row = Float32Array.from({ length }, () => (rng() - 0.5) * 60);
        // exp's ≤ 2 ulps and the f32 subtraction of the max, relative in a sum of positive terms, then the logarithm.
        expect(Math.abs(kernels.logSumExp(row) - referenceLogSumExp(row))).toBeLessThan(1e-6 * (1 + Math.abs(referenceLogSumExp(row))));
      }
      for (const edge of [[0, Number.POSITIVE_INFINITY, 1], [Number.NEGATIVE_INFINITY, Number.NEGATIVE_INFINITY], [0, Number.NaN, 2]]) {
        const row = Float32Array.from(edge);
        expect(kernels.logSumExp(row)).toBe(referenceLogSumExp(row));
      }
    });

    it("samplingWeights gives the sampler's weights bit for bit (samplingExp, the CUDA kernel's), edges included", () => {
      const rng = seededRandom(16);
      const max = 3.25;
      // Logits spread from the max down past the −125·ln 2 cut at T = 1, then the cut itself at several temperatures,
      // equal to the max, one ulp under it, −∞, and a row long enough to stream through several chunks.
      const spread = Float32Array.from({ length: 10_003 }, () => max - rng() ** 3 * 120);
      const cut = max - 125 * Math.LN2;
      const edges = Float32Array.from([max, Math.fround(max - 2 ** -22), cut, Math.fround(cut + 1e-5), Math.fround(cut - 1e-5),
        max - 86.5, max - 87.5, max - 1e-30, Number.NEGATIVE_INFINITY, 0, -200]);
      for (const row of [spread, edges]) {
        for (const temperature of [1, 0.7, 1.3, 0.05, 20]) {
          const inverse = Math.fround(1 / temperature);
          const expected = new Float32Array(row.length), actual = new Float32Array(row.length);
          referenceSamplerKernels.samplingWeights(row, max, inverse, expected);
          kernels.samplingWeights(row, max, inverse, actual);
          expect(new Uint32Array(actual.buffer)).toEqual(new Uint32Array(expected.buffer));
        }
      }
      // The f32 arguments from −0 down to −87 (every 2^14th bit pattern): the polynomial's and 2^k's whole range;
      // then arguments whose t = v·log2 e is exactly a half (k = floor(t + 1/2) rounds those up, as the reference does).
      const bits = Uint32Array.from({ length: 0x42ae0000 / 2 ** 14 + 1 }, (_, i) => 0x80000000 + i * 2 ** 14);
      const halves = Array.from({ length: 120 }, (_, i) => -i - 0.5).flatMap((half) => {
        const near = Math.fround(half / 1.44269502162933349609375);
        const around = new Float32Array(new Uint32Array(Array.from({ length: 65 }, (_, d) => new Uint32Array(new Float32Array([near]).buffer)[0] + d - 32)).buffer);
        return [...around].filter((v) => Math.fround(v * 1.44269502162933349609375) === half);
      });
      expect(halves.length).toBeGreaterThan(100);
      const sweep = Float32Array.from([...new Float32Array(bits.buffer), ...halves]);
      const expected = new Float32Array(sweep.length), actual = new Float32Array(sweep.length);
      referenceSamplerKernels.samplingWeights(sweep, 0, 1, expected);
      kernels.samplingWeights(sweep, 0, 1, actual);
      expect(new Uint32Array(actual.buffer)).toEqual(new Uint32Array(expected.buffer));
    });

    it("rmsNorm matches rmsNormRows (rstd included), alone and after the residual add, rows wider than a chunk too", () => {
      const rng = seededRandom(12);
      for (const d of [8, 384, 5000]) {
        const rows = 13;
        const x = Float32Array.from({ length: rows * d }, () => (rng() - 0.5) * 8);
        const b = Float32Array.from({ length: rows * d }, () => (rng() - 0.5) * 8);
        const weight = Float32Array.from({ length: d }, () => rng() + 0.5);
        const expectedSum = Float32Array.from(x, (v, i) => v + b[i]);
        const expected = new Float32Array(rows * d), expectedRstd = new Float32Array(rows);
        rmsNormRows(expectedSum, weight, 1e-6, expected, expectedRstd);
        const out = new Float32Array(rows * d), rstd = new Float32Array(rows), sum = new Float32Array(rows * d);
        expect(kernels.rmsNorm(x, weight, 1e-6, out, rstd, { values: b, sum })).toBe(true);
        expect(sum).toEqual(expectedSum);
        // Only the order of the f64 sum of squares differs: measured equal over 50 blocks of 16 rows of 384; 2 ulps allowed.
        expect(maxRelative(rstd, expectedRstd, 0)).toBeLessThan(2.5e-7);
        expect(maxRelative(out, expected, 1e-6)).toBeLessThan(2.5e-7);
        const inPlace = expectedSum.slice();
        expect(kernels.rmsNorm(inPlace, weight, 1e-6, inPlace, null)).toBe(true);
        expect(maxRelative(inPlace, expected, 1e-6)).toBeLessThan(2.5e-7);
      }
      expect(kernels.rmsNorm(new Float32Array(6), new Float32Array(6), 1e-6, new Float32Array(6), null)).toBe(false);
    });

    it("rmsNormBackward adds rmsNormRowsBackward's dx and dWeight, rows wider than a chunk too", () => {
      const rng = seededRandom(14);
      for (const d of [8, 384, 5000]) {
        const rows = 13;
        const x = Float32Array.from({ length: rows * d }, () => (rng() - 0.5) * 8);
        const dOut = Float32Array.from({ length: rows * d }, () => (rng() - 0.5) * 2);
        const weight = Float32Array.from({ length: d }, () => rng() + 0.5), rstd = new Float32Array(rows);
        rmsNormRows(x, weight, 1e-6, new Float32Array(rows * d), rstd);
        const dx = Float32Array.from({ length: rows * d }, () => rng() - 0.5), dWeight = Float32Array.from({ length: d }, () => rng() - 0.5);
        const [dxStart, expectedDx, expectedDWeight] = [dx.slice(), dx.slice(), dWeight.slice()];
        rmsNormRowsBackward(x, weight, rstd, dOut, expectedDx, expectedDWeight);
        expect(kernels.rmsNormBackward(x, weight, rstd, dOut, dx, dWeight)).toBe(true);
        // The kernel rounds x̂ and each product to f32 where the reference keeps them in f64. Measured over 60 blocks:
        // dx within 7.7e-8 of the size of its terms (|dx before| + |s·dOut·w| + 1), dWeight within 6.7e-7 of
        // |dWeight| + 1 (13 rows accumulated in f32); bounds about twice that.
        for (let i = 0; i < dx.length; i++) {
          const scale = Math.abs(dxStart[i]) + Math.abs(rstd[Math.floor(i / d)] * dOut[i] * weight[i % d]) + 1;
          expect(Math.abs(dx[i] - expectedDx[i]), `dx[${i}]`).toBeLessThan(1.5e-7 * scale);
        }
        for (let j = 0; j < d; j++) expect(Math.abs(dWeight[j] - expectedDWeight[j]), `dWeight[${j}]`).toBeLessThan(1.5e-6 * (Math.abs(expectedDWeight[j]) + 1));
        const dxAlone = new Float32Array(rows * d), referenceAlone = new Float32Array(rows * d);
        rmsNormRowsBackward(x, weight, rstd, dOut, referenceAlone, null);
        expect(kernels.rmsNormBackward(x, weight, rstd, dOut, dxAlone, null)).toBe(true);
        expect(maxRelative(dxAlone, referenceAlone, 1)).toBeLessThan(1.5e-7);
      }
      expect(kernels.rmsNormBackward(new Float32Array(6), new Float32Array(6), new Float32Array(1), new Float32Array(6), new Float32Array(6), null))
        .toBe(false);
    });

    it("rope matches ropeRows forwards and backwards (sign −1 undoes it)", () => {
      const rng = seededRandom(13);
      const headDim = 64, rowWidth = 6 * headDim, rows = 50;
      const invFreq = Float32Array.from({ length: headDim / 2 }, (_, j) => 1 / 10000 ** ((2 * j) / headDim));
      const positions = Int32Array.from({ length: rows }, (_, i) => i * 37);
      const x = Float32Array.from({ length: rows * rowWidth }, () => (rng() - 0.5) * 4);
      const expected = x.slice(), actual = x.slice();
      const table = ropeTable(positions, invFreq, 1);
      ropeRows(expected, rowWidth, table, headDim);
      expect(kernels.rope(actual, rowWidth, table, headDim / 2)).toBe(true);
      // Two f32 products and a sum each rounded, against the reference's one rounding: measured ≤ 1.2e-7 of |x| + 1.
      expect(maxRelative(actual, expected, 1)).toBeLessThan(5e-7);
      expect(kernels.rope(actual, rowWidth, ropeTable(positions, invFreq, -1), headDim / 2)).toBe(true);
      expect(maxRelative(actual, x, 1)).toBeLessThan(1e-6);
      expect(kernels.rope(actual, 6 * 6, ropeTable(positions, invFreq.subarray(0, 3), 1), 3)).toBe(false);
    });
  });
});

// Which runs what is not a product: the references where the portable products were asked for (the same bits on every
// machine), the WebAssembly kernels otherwise, including the portable products' fallback where no system BLAS opens.
describe("CpuBackend's elementwise option", () => {
  const { dir } = loadTinyModel("qwen2");
  const ids = [1, 5, 9, 2, 7, 3, 11, 4, 8, 6, 2, 9, 13, 17, 0, 4];
  const lora = { rank: 2, alpha: 4, targetModules: [...PROJECTIONS], useRslora: false };
  const sequences: TrainingSequence[] = [0, 1].map((s) => ({ tokens: ids.map((t) => (t + 3 * s) % 20), trainable: Uint8Array.from(ids, (_, t) => (t >= 4 ? 1 : 0)),
    logprobs: new Float32Array(ids.length).fill(NaN), advantage: s === 0 ? 1 : -0.5, trajectory: s }));
  /** max |a − b| over the largest |b|: one number per tensor. */
  const relative = (a: Float32Array, b: Float32Array) => a.reduce((worst, x, i) => Math.max(worst, Math.abs(x - b[i]!)), 0) / b.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
  /** Logits of `ids` and a LoRA step's gradients (B ≠ 0, so every A gradient is nonzero) on a backend. */
  function run(options: CpuBackendOptions) {
    const transformer = loadTransformer(dir, new CpuBackend(options));
    const model = new DifferentiableTransformer(transformer, { lora, seed: 3 });
    model.loras.forEach((p, i) => transformer.backend.write(p.b.tensor, Float32Array.from({ length: p.b.tensor.size }, (_, j) => Math.sin(i + j))));
    const { gradients } = new Trainer(model, { learningRate: 1e-2, microBatchSize: 2 }).computeGradients(sequences);
    const result = { logits: sequenceLogits(transformer, ids), gradients };
    transformer.free();
    return result;
  }

  it("portable products: the references by default, the WebAssembly kernels with \"wasm\" (within float rounding of them)", () => {
    const reference = run({ blas: "portable", elementwise: "reference" }), byDefault = run({ blas: "portable" });
    expect(byDefault.logits).toEqual(reference.logits);
    for (const [name, grad] of reference.gradients) expect(byDefault.gradients.get(name), name).toEqual(grad);
    const wasm = run({ blas: "portable", elementwise: "wasm" });
    // Measured: the logits within 2.5e-7 of the largest, every gradient within 3.3e-6.
    expect(wasm.logits).not.toEqual(reference.logits);
    expect(relative(wasm.logits, reference.logits)).toBeLessThan(1e-6);
    for (const [name, grad] of reference.gradients) expect(relative(wasm.gradients.get(name)!, grad), name).toBeLessThan(1e-5);
  });

  it.skipIf(chooseGemm("auto", 1).gemm.library === null)("a system BLAS: the WebAssembly kernels by default", () => {
    const byDefault = run({ blas: "system" }), wasm = run({ blas: "system", elementwise: "wasm" }), reference = run({ blas: "system", elementwise: "reference" });
    expect(byDefault.logits).toEqual(wasm.logits);
    expect(byDefault.logits).not.toEqual(reference.logits);
  });

  it("refuses another value", () => {
    expect(() => new CpuBackend({ elementwise: "fast" as never })).toThrow(/elementwise must be "wasm" or "reference", got "fast"/);
  });
});
