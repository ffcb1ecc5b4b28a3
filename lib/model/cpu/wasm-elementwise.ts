/**
 * The CPU backend's fast path for everything that is not a matrix product: SwiGLU and its backward, exponentials and
 * the sampler's log-sum-exp, attention's softmax and its backward, RMSNorm (with the residual add before it) and its
 * backward, and RoPE on the WebAssembly SIMD kernels of elementwise.wat (assembled into elementwise-wasm-bytes.ts by
 * scripts/build-wasm.ts). The formulas are kernels.ts', attention.ts' and sample.ts', with an f32 exponential four
 * lanes at a time instead of V8's Math.exp and sums in a different order, so results agree with them to a few f32 ulps
 * (test/model/wasm-elementwise.test.ts), not bit for bit: the backend uses this path except where the portable
 * products were asked for, whose bits are the references' (CpuBackendOptions.elementwise). The exception is the
 * sampler's weights (`samplingWeights`), which are sample.ts' samplingExp bit for bit, as the CUDA sampler's are.
 *
 * Operands are copied into the module's memory a chunk at a time and results copied out (a copy costs about a
 * twentieth of the arithmetic); the memory grows to the widest row it is given. Attention's score blocks can instead
 * live in the memory (`scratchView`), so the BLAS writes them and the softmax runs where they are.
 */
import { elementwiseUnfusedWasmBase64, elementwiseWasmBase64 } from "./elementwise-wasm-bytes.ts";

// The slice of the WebAssembly JS API used here (see wasm-matmul.ts).
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { readonly exports: object };
};

interface ElementwiseExports {
  memory: { readonly buffer: ArrayBuffer; grow(pages: number): number };
  exp_shifted(x: number, out: number, vectors: number, shift: number): void;
  sum_exp(x: number, vectors: number, shift: number): number;
  sampling_weights(x: number, out: number, vectors: number, max: number, inverse: number): void;
  swiglu(gate: number, up: number, out: number, e: number, vectors: number): void;
  swiglu_backward(gate: number, up: number, dOut: number, dGate: number, dUp: number, sigma: number, complement: number, vectors: number): void;
  softmax_rows(scores: number, stride: number, rows: number, lasts: number, end: number, temp: number): void;
  softmax_backward_rows(probs: number, grads: number, stride: number, rows: number, lasts: number, end: number, scale: number): void;
  rms_norm(a: number, b: number, sum: number, weight: number, out: number, rstd: number, keep: number, rows: number, d: number, eps: number): void;
  rms_norm_backward(x: number, dOut: number, dx: number, weight: number, dWeight: number, rstd: number, keep: number, rows: number, d: number): void;
  rope(x: number, table: number, rows: number, width: number, half: number): void;
}

/** Floats per operand per call of the streaming kernels: seven operands of 16 KiB stay in a core's L2. */
const CHUNK = 4096;
/** Bytes below the operands: a 16-byte temporary, then the softmax's row lengths (up to HEADER_ROWS rows). */
const HEADER_ROWS = 1020;
const HEADER = 16 + 4 * HEADER_ROWS;
const PAGE = 65536;

/**
 * Elements start .. end of the gate and up halves of a fused [rows, 2 · inter] product (element o of a half is row
 * ⌊o / inter⌋, column o mod inter) into the heap at float offsets `gate` and `up`, one copy per row piece.
 */
function gatherHalves(heap: Float32Array, gate: number, up: number, gateUp: Float32Array, inter: number, start: number, end: number): void {
  for (let o = start; o < end;) {
    const row = Math.floor(o / inter), column = o - row * inter, count = Math.min(end - o, inter - column);
    const from = 2 * row * inter + column;
    heap.set(gateUp.subarray(from, from + count), gate + o - start);
    heap.set(gateUp.subarray(from + inter, from + inter + count), up + o - start);
    o += count;
  }
}

/** Each variant's compiled module, or null where the runtime rejects it (no SIMD, or no relaxed SIMD). */
const compiled = new Map<boolean, object | null>();

function compile(fusedMultiplyAdd: boolean): object | null {
  if (!compiled.has(fusedMultiplyAdd)) {
    const base64 = fusedMultiplyAdd ? elementwiseWasmBase64 : elementwiseUnfusedWasmBase64;
    try {
      compiled.set(fusedMultiplyAdd, new WebAssembly.Module(Uint8Array.from(atob(base64), (c) => c.charCodeAt(0))));
    } catch {
      compiled.set(fusedMultiplyAdd, null);
    }
  }
  return compiled.get(fusedMultiplyAdd)!;
}

export class WasmElementwise {
  readonly #exports: ElementwiseExports;
  #floats: Float32Array;
  /** Whether the exponential's multiply-adds are relaxed SIMD's fused ones (else a product then a sum). */
  readonly fusedMultiplyAdd: boolean;

  /**
   * An instance, or null where the runtime has no WebAssembly SIMD. By default the relaxed-SIMD module where the
   * runtime compiles it, else the plain one; `fusedMultiplyAdd` asks for one (null when the runtime lacks it).
   */
  static create(options: { fusedMultiplyAdd?: boolean } = {}): WasmElementwise | null {
    for (const fused of options.fusedMultiplyAdd === undefined ? [true, false] : [options.fusedMultiplyAdd]) {
      const module = compile(fused);
      if (module) return new WasmElementwise(new WebAssembly.Instance(module).exports as unknown as ElementwiseExports, fused);
    }
    return null;
  }

  private constructor(exports: ElementwiseExports, fusedMultiplyAdd: boolean) {
    this.#exports = exports;
    this.#floats = new Float32Array(exports.memory.buffer);
    this.fusedMultiplyAdd = fusedMultiplyAdd;
  }

  /** The memory as floats, holding at least `bytes` (growing it detaches earlier views, so this takes a fresh one). */
  #memory(bytes: number): Float32Array {
    const memory = this.#exports.memory;
    if (memory.buffer.byteLength < bytes) memory.grow(Math.ceil((bytes - memory.buffer.byteLength) / PAGE));
    if (this.#floats.buffer !== memory.buffer) this.#floats = new Float32Array(memory.buffer);
    return this.#floats;
  }

  /**
   * `floats` floats of the module's memory for a caller to fill (attention's scores: the BLAS writes them, then
   * `softmaxRows` works in place). Valid until the next call of another method of this instance.
   */
  scratchView(floats: number): Float32Array {
    return new Float32Array(this.#memory(HEADER + floats * 4).buffer, HEADER, floats);
  }

  /** Byte offsets of `count` operands of `floats` floats each, after the header, in memory that holds them. */
  #layout(count: number, floats: number): number[] {
    const stride = Math.ceil(floats / 4) * 16;
    this.#memory(HEADER + count * stride);
    return Array.from({ length: count }, (_, i) => HEADER + i * stride);
  }

  /** out = exp(x − shift) elementwise, for x − shift ≤ 88 (out may be x). */
  expShifted(x: Float32Array, shift: number, out: Float32Array): void {
    this.#inPlace(x, out, (at, vectors) => this.#exports.exp_shifted(at, at, vectors, shift));
  }

  /** out = kernel(x) elementwise, a chunk at a time copied into the memory, worked on in place there, copied out. */
  #inPlace(x: Float32Array, out: Float32Array, kernel: (at: number, vectors: number) => void): void {
    const [input] = this.#layout(1, Math.min(CHUNK, x.length));
    const heap = this.#floats;
    for (let start = 0; start < x.length; start += CHUNK) {
      const end = Math.min(x.length, start + CHUNK), count = end - start;
      heap.set(x.subarray(start, end), input / 4);
      kernel(input, Math.ceil(count / 4));
      out.set(heap.subarray(input / 4, input / 4 + count), start);
    }
  }

  /** ln Σ exp(row): the row's max, then its shifted exponentials summed in f64 (sample.ts referenceLogSumExp). */
  logSumExp(row: Float32Array): number {
    let max = -Infinity;
    for (let i = 0; i < row.length; i++) if (row[i] > max) max = row[i];
    const [input] = this.#layout(1, Math.min(CHUNK, row.length) + 4);
    const heap = this.#floats;
    let sum = 0;
    for (let start = 0; start < row.length; start += CHUNK) {
      const end = Math.min(row.length, start + CHUNK), count = end - start, vectors = Math.ceil(count / 4);
      heap.set(row.subarray(start, end), input / 4);
      heap.fill(-Infinity, input / 4 + count, input / 4 + vectors * 4);
      sum += this.#exports.sum_exp(input, vectors, max);
    }
    return max + Math.log(sum);
  }

  /**
   * The sampler's weights, out = samplingExp(f32((row − max) · inverseTemperature)) elementwise: sample.ts'
   * reference bit for bit (unlike the other kernels here), four lanes at a time where the reference emulates f32
   * arithmetic in float64 (about 25 ns an element there). For row ≤ max, the reference's domain.
   */
  samplingWeights(row: Float32Array, max: number, inverseTemperature: number, out: Float32Array): void {
    this.#inPlace(row, out, (at, vectors) => this.#exports.sampling_weights(at, at, vectors, max, inverseTemperature));
  }

  /** out = silu(gate) · up over the fused [rows, 2 · inter] gate/up product (kernels.ts swigluRows). */
  swiglu(gateUp: Float32Array, out: Float32Array, inter: number): void {
    const [g, u, o, e] = this.#layout(4, Math.min(CHUNK, out.length));
    const heap = this.#floats;
    for (let start = 0; start < out.length; start += CHUNK) {
      const end = Math.min(out.length, start + CHUNK), count = end - start;
      gatherHalves(heap, g / 4, u / 4, gateUp, inter, start, end);
      this.#exports.swiglu(g, u, o, e, Math.ceil(count / 4));
      out.set(heap.subarray(o / 4, o / 4 + count), start);
    }
  }

  /** Backward of swiglu: dUp += dOut · silu(gate); dGate += dOut · up · silu'(gate). */
  swigluBackward(gateUp: Float32Array, dOut: Float32Array, dGate: Float32Array, dUp: Float32Array, inter: number): void {
    const [g, u, d, dg, du, sigma, complement] = this.#layout(7, Math.min(CHUNK, dOut.length));
    const heap = this.#floats;
    for (let start = 0; start < dOut.length; start += CHUNK) {
      const end = Math.min(dOut.length, start + CHUNK), count = end - start;
      gatherHalves(heap, g / 4, u / 4, gateUp, inter, start, end);
      heap.set(dOut.subarray(start, end), d / 4);
      heap.set(dGate.subarray(start, end), dg / 4);
      heap.set(dUp.subarray(start, end), du / 4);
      this.#exports.swiglu_backward(g, u, d, dg, du, sigma, complement, Math.ceil(count / 4));
      dGate.set(heap.subarray(dg / 4, dg / 4 + count), start);
      dUp.set(heap.subarray(du / 4, du / 4 + count), start);
    }
  }

  /** Each row's last key into the header, where the softmax kernels read them (after any growth of the memory). */
  #writeLasts(lasts: Int32Array, what: string): void {
    if (lasts.length > HEADER_ROWS) throw new RangeError(`${what}: ${lasts.length} rows in one call; at most ${HEADER_ROWS}`);
    new Int32Array(this.#floats.buffer, 16, lasts.length).set(lasts);
  }

  /**
   * attention.ts causalSoftmax over a block: row r (at `at + r·stride` of `scores`) becomes the softmax of its keys
   * 0..lasts[r], zero from there up to `end`. In place when `scores` is a `scratchView`, else through a copy.
   */
  softmaxRows(scores: Float32Array, at: number, stride: number, lasts: Int32Array, end: number): void {
    const rows = lasts.length;
    const inPlace = scores.buffer === this.#exports.memory.buffer;
    const block = inPlace ? scores.byteOffset + at * 4 : this.#layout(1, rows * end)[0];
    const heap = this.#floats;
    this.#writeLasts(lasts, "softmaxRows");
    if (!inPlace) for (let r = 0; r < rows; r++) heap.set(scores.subarray(at + r * stride, at + r * stride + end), block / 4 + r * end);
    this.#exports.softmax_rows(block, inPlace ? stride : end, rows, 16, end, 0);
    if (!inPlace) for (let r = 0; r < rows; r++) scores.set(heap.subarray(block / 4 + r * end, block / 4 + (r + 1) * end), at + r * stride);
  }

  /**
   * attention.ts causalSoftmaxBackward over a block: row r of `grads` (dP at `at + r·stride`, with the probabilities P
   * at the same place in `probs`) becomes dS = P·(dP − Σ P·dP)·scale over keys 0..lasts[r], zero from there up to `end`.
   */
  softmaxBackwardRows(probs: Float32Array, grads: Float32Array, at: number, stride: number, lasts: Int32Array, end: number, scale: number): void {
    const rows = lasts.length;
    const [p, g] = this.#layout(2, rows * end);
    const heap = this.#floats;
    this.#writeLasts(lasts, "softmaxBackwardRows");
    for (let r = 0; r < rows; r++) {
      heap.set(probs.subarray(at + r * stride, at + r * stride + end), p / 4 + r * end);
      heap.set(grads.subarray(at + r * stride, at + r * stride + end), g / 4 + r * end);
    }
    this.#exports.softmax_backward_rows(p, g, end, rows, 16, end, scale);
    for (let r = 0; r < rows; r++) grads.set(heap.subarray(g / 4 + r * end, g / 4 + (r + 1) * end), at + r * stride);
  }

  /**
   * kernels.ts rmsNormRows over rows of weight.length (a multiple of 4; false otherwise, for the caller's reference
   * path), keeping each row's 1/rms in `rstd`. With `addend`, the rows are `x + addend.values`, written to
   * `addend.sum` first. `out` may be `x` or the sum.
   */
  rmsNorm(x: Float32Array, weight: Float32Array, eps: number, out: Float32Array, rstd: Float32Array | null,
    addend: { values: Float32Array; sum: Float32Array } | null = null): boolean {
    const d = weight.length;
    if (d % 4 !== 0) return false;
    const rowsPerChunk = Math.max(1, Math.floor(CHUNK / d)), rows = x.length / d;
    const [w, a, b, sum, o, s] = this.#layout(6, rowsPerChunk * d);
    const heap = this.#floats;
    heap.set(weight, w / 4);
    for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
      const count = Math.min(rowsPerChunk, rows - r0), from = r0 * d, to = from + count * d;
      heap.set(x.subarray(from, to), a / 4);
      if (addend) heap.set(addend.values.subarray(from, to), b / 4);
      this.#exports.rms_norm(a, addend ? b : 0, sum, w, o, s, rstd ? 1 : 0, count, d, eps);
      if (addend) addend.sum.set(heap.subarray(sum / 4, sum / 4 + count * d), from);
      out.set(heap.subarray(o / 4, o / 4 + count * d), from);
      if (rstd) rstd.set(heap.subarray(s / 4, s / 4 + count), r0);
    }
    return true;
  }

  /**
   * kernels.ts rmsNormRowsBackward: dx += the rows' input gradients, dWeight (when given) += the weight's. False where
   * the width is not a multiple of 4 (the caller's reference path).
   */
  rmsNormBackward(x: Float32Array, weight: Float32Array, rstd: Float32Array, dOut: Float32Array, dx: Float32Array,
    dWeight: Float32Array | null): boolean {
    const d = weight.length;
    if (d % 4 !== 0) return false;
    const rowsPerChunk = Math.max(1, Math.floor(CHUNK / d)), rows = x.length / d;
    const [w, dw, xs, g, dxs, s] = this.#layout(6, rowsPerChunk * d);
    const heap = this.#floats;
    heap.set(weight, w / 4);
    if (dWeight) heap.set(dWeight, dw / 4);
    for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
      const count = Math.min(rowsPerChunk, rows - r0), from = r0 * d, to = from + count * d;
      heap.set(x.subarray(from, to), xs / 4);
      heap.set(dOut.subarray(from, to), g / 4);
      heap.set(dx.subarray(from, to), dxs / 4);
      heap.set(rstd.subarray(r0, r0 + count), s / 4);
      this.#exports.rms_norm_backward(xs, g, dxs, w, dw, s, dWeight ? 1 : 0, count, d);
      dx.set(heap.subarray(dxs / 4, dxs / 4 + count * d), from);
    }
    if (dWeight) dWeight.set(heap.subarray(dw / 4, dw / 4 + d));
    return true;
  }

  /**
   * kernels.ts ropeRows with its angles already in `table` (ropeTable: per row, cos then sign·sin of half angles):
   * x's rows of `rowWidth` rotate in place. False where half is not a multiple of 4 (the caller's reference path).
   */
  rope(x: Float32Array, rowWidth: number, table: Float32Array, half: number): boolean {
    if (half % 4 !== 0) return false;
    const rows = x.length / rowWidth;
    const rowsPerChunk = Math.max(1, Math.floor(CHUNK / rowWidth));
    const [values, angles] = this.#layout(2, Math.max(rowsPerChunk * rowWidth, rowsPerChunk * 2 * half));
    const heap = this.#floats;
    for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
      const count = Math.min(rowsPerChunk, rows - r0);
      heap.set(x.subarray(r0 * rowWidth, (r0 + count) * rowWidth), values / 4);
      heap.set(table.subarray(r0 * 2 * half, (r0 + count) * 2 * half), angles / 4);
      this.#exports.rope(values, angles, count, rowWidth, half);
      x.set(heap.subarray(values / 4, values / 4 + count * rowWidth), r0 * rowWidth);
    }
    return true;
  }
}
