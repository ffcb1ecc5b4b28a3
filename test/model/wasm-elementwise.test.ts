// SwiGLU and its backward on the WebAssembly SIMD kernels (elementwise.wat) against the formulas in float64, over the
// range activations take and beyond it (underflow, large |g|, zeros, NaN), on lengths that are not multiples of the
// vector or of the chunk the operands stream through.
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import { WasmElementwise } from "../../lib/model/cpu/wasm-elementwise.ts";

const kernels = WasmElementwise.create();
if (!kernels) throw new Error("this runtime has no WebAssembly SIMD");

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
 * Measured over 200,000 gates in ±30: ≤ 2.1 ulps forward, ≤ 2.3 backward (the polynomial, the division and the
 * products each round once); the tolerances are about twice that.
 */
function expectClose(expected: Float64Array, actual: Float32Array, ulps: number, what: string, scale = expected): void {
  for (let i = 0; i < expected.length; i++) {
    const bound = ulps * 2 ** -23 * Math.abs(scale[i]) + 1e-35;
    if (!(Math.abs(actual[i] - expected[i]) <= bound)) {
      throw new Error(`${what}[${i}]: ${actual[i]} against ${expected[i]} (bound ${bound})`);
    }
  }
}

describe("WASM SIMD SwiGLU", () => {
  it("swiglu matches g·σ(g)·up within 4 ulps, on every length modulo 4 and across chunk boundaries", () => {
    for (const length of [1, 2, 3, 4, 5, 17, 2047, 2048, 2049, 5000]) {
      const gate = gates(length, length), up = values(length, length + 1);
      const out = new Float32Array(length).fill(Number.NaN);
      kernels.swiglu(gate, up, out);
      expectClose(Float64Array.from(gate, (g, i) => g * sigmoid(g) * up[i]), out, 4, `swiglu length ${length}`);
    }
  });

  it("the backward adds dOut·silu(g) to dUp and dOut·up·silu'(g) to dGate within 5 ulps", () => {
    const length = 4099;
    const gate = gates(length, 7), up = values(length, 8), dOut = values(length, 9);
    const dGate = new Float32Array(length), dUp = new Float32Array(length);
    kernels.swigluBackward(gate, up, dOut, dGate, dUp);
    const s = Float64Array.from(gate, sigmoid);
    expectClose(Float64Array.from(gate, (g, i) => dOut[i] * g * s[i]), dUp, 5, "dUp");
    // 1 + g·(1 − σ) crosses zero near g = −1.28, where any f32 evaluation loses relative digits: there the error
    // is bounded by the size of its terms, |1| + |g·(1 − σ)|, not by the result.
    expectClose(Float64Array.from(gate, (g, i) => dOut[i] * up[i] * s[i] * (1 + g * (1 - s[i]))), dGate, 5, "dGate",
      Float64Array.from(gate, (g, i) => dOut[i] * up[i] * s[i] * (1 + Math.abs(g * (1 - s[i])))));
    // Accumulating: a second pass adds the same values again, and x + x = 2x exactly.
    const [dGate1, dUp1] = [dGate.slice(), dUp.slice()];
    kernels.swigluBackward(gate, up, dOut, dGate, dUp);
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
    kernels.swiglu(gate, Float32Array.of(1, 1, 1, Number.NaN), out);
    expect(Number.isNaN(out[0])).toBe(true);
    expect(out[1]).toBe(Number.POSITIVE_INFINITY);
    expect(Object.is(out[2], -0) || Number.isNaN(out[2])).toBe(true); // −∞ · 0: IEEE gives NaN, the limit is 0
    expect(Number.isNaN(out[3])).toBe(true);
  });
});
