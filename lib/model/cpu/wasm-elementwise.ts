/**
 * SwiGLU, its backward and shifted exponentials on the WebAssembly SIMD kernels of elementwise.wat (assembled into
 * elementwise-wasm-bytes.ts by scripts/build-wasm.ts): the same formulas as kernels.ts `swigluRows` /
 * `swigluRowsBackward` and the target logprobs' softmax terms, with an f32 exponential four lanes at a time instead
 * of V8's Math.exp. The operands stream
 * through fixed scratch blocks of the module's memory, a chunk at a time, so it stays one 64 KiB page that lives in
 * cache. Results agree with the float64 formulas to a few f32 ulps (test/model/wasm-elementwise.test.ts).
 */
import { elementwiseWasmBase64 } from "./elementwise-wasm-bytes.ts";

// The slice of the WebAssembly JS API used here (see wasm-matmul.ts).
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { readonly exports: object };
};

interface ElementwiseExports {
  memory: { readonly buffer: ArrayBuffer };
  swiglu(gate: number, up: number, out: number, vectors: number): void;
  swiglu_backward(gate: number, up: number, dOut: number, dGate: number, dUp: number, vectors: number): void;
  exp_shifted(x: number, out: number, vectors: number, shift: number): void;
}

/** Floats per operand per chunk: five operands of 8 KiB fill most of the one page. */
const CHUNK = 2048;

let compiled: object | null | undefined;

export class WasmElementwise {
  readonly #exports: ElementwiseExports;
  /** Scratch blocks, one per operand slot, CHUNK floats each. */
  readonly #slots: Float32Array[];

  /** An instance, or null where the runtime has no WebAssembly SIMD. */
  static create(): WasmElementwise | null {
    if (compiled === undefined) {
      try {
        compiled = new WebAssembly.Module(Uint8Array.from(atob(elementwiseWasmBase64), (c) => c.charCodeAt(0)));
      } catch {
        compiled = null;
      }
    }
    return compiled ? new WasmElementwise(new WebAssembly.Instance(compiled).exports as unknown as ElementwiseExports) : null;
  }

  private constructor(exports: ElementwiseExports) {
    this.#exports = exports;
    this.#slots = Array.from({ length: 5 }, (_, i) => new Float32Array(exports.memory.buffer, i * CHUNK * 4, CHUNK));
  }

  /** out = exp(x − shift) elementwise, for x − shift ≤ 88 (out may be x). */
  expShifted(x: Float32Array, shift: number, out: Float32Array): void {
    const [input, output] = this.#slots;
    for (let start = 0; start < x.length; start += CHUNK) {
      const end = Math.min(x.length, start + CHUNK), count = end - start;
      input.set(x.subarray(start, end));
      this.#exports.exp_shifted(input.byteOffset, output.byteOffset, Math.ceil(count / 4), shift);
      out.set(output.subarray(0, count), start);
    }
  }

  /** out = silu(gate) · up, elementwise. */
  swiglu(gate: Float32Array, up: Float32Array, out: Float32Array): void {
    const [g, u, o] = this.#slots;
    for (let start = 0; start < gate.length; start += CHUNK) {
      const end = Math.min(gate.length, start + CHUNK), count = end - start;
      g.set(gate.subarray(start, end));
      u.set(up.subarray(start, end));
      this.#exports.swiglu(g.byteOffset, u.byteOffset, o.byteOffset, Math.ceil(count / 4));
      out.set(o.subarray(0, count), start);
    }
  }

  /** Backward of swiglu: dUp += dOut · silu(gate); dGate += dOut · up · silu'(gate). */
  swigluBackward(gate: Float32Array, up: Float32Array, dOut: Float32Array, dGate: Float32Array, dUp: Float32Array): void {
    const [g, u, d, dg, du] = this.#slots;
    for (let start = 0; start < gate.length; start += CHUNK) {
      const end = Math.min(gate.length, start + CHUNK), count = end - start;
      g.set(gate.subarray(start, end));
      u.set(up.subarray(start, end));
      d.set(dOut.subarray(start, end));
      dg.set(dGate.subarray(start, end));
      du.set(dUp.subarray(start, end));
      this.#exports.swiglu_backward(g.byteOffset, u.byteOffset, d.byteOffset, dg.byteOffset, du.byteOffset, Math.ceil(count / 4));
      dGate.set(dg.subarray(0, count), start);
      dUp.set(du.subarray(0, count), start);
    }
  }
}
