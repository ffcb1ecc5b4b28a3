/**
 * The WebAssembly SIMD matmuls (matmul.wat, assembled into matmul-wasm-bytes.ts by scripts/build-wasm.ts): `matmulNT`,
 * `out = alpha · x Wᵀ (+ out)` in f32x4 register tiles, what the portable `linear` runs; and `matmulF64`, every other
 * portable product with matmul.ts's bits (float64 sums). They compute on a shared linear memory, so operands live at
 * byte offsets there, and a large product is split over worker threads (matmul-workers.ts) with the same bits as on
 * one. This class owns an instance and its memory, whose blocks an explicit allocator hands out (first fit over a
 * free list, above it a bump pointer `top`): the CPU backend keeps each linear weight and its KV caches in blocks,
 * and copies activations into the scratch space above `top` per call.
 */
import { ArtError } from "../../core/errors.ts";
import { matmulUnfusedWasmBase64, matmulWasmBase64 } from "./matmul-wasm-bytes.ts";
import type { MatmulOptions, TNStrides } from "./matmul.ts";
import { bands, checkThreadCount, MatmulWorkers, MIN_PARALLEL_MULTIPLY_ADDS, outputBlocks, type MatmulCall } from "./matmul-workers.ts";

// The slice of the WebAssembly JS API used here: TypeScript declares it only in its DOM libs, which this project's
// ES2023 + node types leave out; Node, Deno and browsers all have it.
interface WasmMemory {
  readonly buffer: ArrayBufferLike;
  grow(pages: number): number;
}
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: { env: { memory: WasmMemory } }) => { readonly exports: object };
  Memory: new (descriptor: { initial: number; maximum: number; shared: true }) => WasmMemory;
};

interface MatmulExports {
  matmulNT(x: number, w: number, out: number, n: number, k: number, m: number, ldOut: number, alpha: number, accumulate: number): void;
  linearBf16(x: number, w: number, out: number, n: number, k: number, m: number): void;
  linearF32(x: number, w: number, out: number, n: number, k: number, m: number): void;
  matmulF64(a: number, b: number, out: number, n: number, k: number, m: number, aRow: number, aCol: number, bRow: number,
    outRow: number, outCol: number, alpha: number, flags: number): void;
}

/**
 * Where matmulF64's operands sit, in elements: a(i, p) at a + i·aRow + p·aCol, b(p, j) at b + p·bRow + j, out(i, j) at
 * out + i·outRow + j·outCol.
 */
interface F64Layout {
  aRow: number;
  aCol: number;
  bRow: number;
  outRow: number;
  outCol: number;
}

/** matmulF64's flags: add to out rather than overwrite it; leftover rows (n % 4) added product by product. */
const ACCUMULATE = 1, STEPWISE = 2;

/**
 * Below this many output rows a product whose W lies outside the memory stays in JavaScript: copying a cache's keys
 * (or transposing an operand) into the memory would cost as much as a decoding row's product.
 */
const MIN_ARRAY_ROWS = 4;
/**
 * Below this many multiply-adds a decoding row's product over a cache in the memory stays in JavaScript: the call's
 * own cost (placing operands, copying the result back) is a few microseconds, what JavaScript takes for ~16K
 * (measured: the tiny demo model's decoding, 16-wide heads over tens of keys, was slower through the kernel).
 */
const MIN_ROW_MULTIPLY_ADDS = 16_384;

const PAGE_BYTES = 65536;
/**
 * When a decoding product's bands of columns go to the worker threads: 3 or 4 rows (the 4-row loop, which reads the
 * weights at 17–24 GB/s on one core and has arithmetic to share) over a weight of 2 MiB or more (waking a worker and
 * waiting for it costs about 60 µs on the 2-vCPU development machine). Measured there, the 20M model's greedy decode
 * on 2 threads against 1 (its gate, up, down and LM-head weights split): batch 3 411 → 493 tok/s, batch 4 460 → 584
 * (1 MiB: 570; 8 MiB, the LM head alone: 481); 1 or 2 rows, already at ~29 GB/s, gained nothing (238 → 238 tok/s) or
 * lost (422 → 399), so they stay on one thread.
 */
const DECODE_SPLIT_ROWS = 3, DECODE_SPLIT_BYTES = 2 << 20;

/**
 * Rows of a product that matmul.wat's decoding kernels take (linearF32, linearBf16): decoding's batches, which read
 * each weight once per step and so are bound by its bytes; CpuBackend gives larger products to the BLAS.
 */
export const DECODE_MAX_ROWS = 4;
/** A 32-bit memory addresses 4 GiB: 65536 pages. */
const MAX_PAGES = 65536;

/** Each variant's compiled module and its bytes (for workers), or null where the runtime rejects it. */
const compiled = new Map<boolean, { bytes: Uint8Array; module: object } | null>();

/**
 * The module with relaxed SIMD's fused multiply-adds (`fused`) or without, or null where the runtime lacks WebAssembly
 * SIMD, shared memory or (for the fused one) relaxed SIMD. Both give the same bits: matmulF64's products of two f32
 * values are exact in float64, so fusing the add rounds once, as the separate add does; matmulNT has none.
 */
function compiledModule(fused: boolean): { bytes: Uint8Array; module: object } | null {
  if (!compiled.has(fused)) {
    const bytes = Uint8Array.from(atob(fused ? matmulWasmBase64 : matmulUnfusedWasmBase64), (c) => c.charCodeAt(0));
    try {
      compiled.set(fused, { bytes, module: new WebAssembly.Module(bytes) });
    } catch {
      compiled.set(fused, null);
    }
  }
  return compiled.get(fused)!;
}

// Workers of a collected WasmMatmul stop with it (a test suite makes hundreds of backends).
const closeWorkers = new FinalizationRegistry<MatmulWorkers>((workers) => workers.close());

export class WasmMatmul {
  readonly #exports: MatmulExports;
  readonly #memory: WasmMemory;
  readonly #bytes: Uint8Array;
  readonly #threads: number;
  #workers: MatmulWorkers | null = null;
  #closed = false;
  #heap: Float32Array;
  /**
   * Every buffer object `heap` has been over: a shared memory hands out a new one per growth, and views made before
   * stay valid, so this is how an array is known to live in the memory (a resident weight).
   */
  readonly #buffers = new WeakSet<ArrayBufferLike>();
  /** Free blocks below `top`, sorted by offset, never adjacent (released neighbours merge). */
  readonly #free: { offset: number; bytes: number }[] = [];
  readonly #blockBytes = new Map<number, number>();
  #top = 0;

  /**
   * A fresh instance with its own memory, computing large products on `threads` threads (this one and
   * `threads - 1` workers); null without WebAssembly SIMD or shared memory. By default the module with relaxed SIMD's
   * fused multiply-adds where the runtime compiles it, else the plain one; `fusedMultiplyAdd` asks for one.
   */
  static create(threads = 1, options: { fusedMultiplyAdd?: boolean } = {}): WasmMatmul | null {
    checkThreadCount(threads);
    const compiledKernel = options.fusedMultiplyAdd === undefined
      ? compiledModule(true) ?? compiledModule(false)
      : compiledModule(options.fusedMultiplyAdd);
    if (!compiledKernel) return null;
    let memory: WasmMemory;
    try {
      memory = new WebAssembly.Memory({ initial: 1, maximum: MAX_PAGES, shared: true });
    } catch {
      return null;
    }
    const exports = new WebAssembly.Instance(compiledKernel.module, { env: { memory } }).exports as unknown as MatmulExports;
    return new WasmMatmul(exports, memory, compiledKernel.bytes, threads);
  }

  private constructor(exports: MatmulExports, memory: WasmMemory, bytes: Uint8Array, threads: number) {
    this.#exports = exports;
    this.#memory = memory;
    this.#bytes = bytes;
    this.#threads = threads;
    this.#heap = new Float32Array(memory.buffer);
    this.#buffers.add(memory.buffer);
  }

  /** The memory as f32s: take this again after `ensureBytes` to reach what a growth added. */
  get heap(): Float32Array {
    if (this.#heap.buffer !== this.#memory.buffer) {
      this.#heap = new Float32Array(this.#memory.buffer);
      this.#buffers.add(this.#memory.buffer);
    }
    return this.#heap;
  }

  get byteLength(): number {
    return this.#memory.buffer.byteLength;
  }

  /** Threads a large product runs on: this one and the workers. */
  get threads(): number {
    return this.#threads;
  }

  /** Blocks of products computed by worker threads so far (0 on one thread). */
  get blocksOnWorkers(): number {
    return this.#workers?.blocksOnWorkers ?? 0;
  }

  /**
   * Starts the worker threads now (they otherwise start on the first large product) and resolves with how many are
   * ready once all are, or after `timeoutMs`. Products never wait for workers; this is for benchmarks and tests.
   */
  async startWorkers(timeoutMs = 10_000): Promise<number> {
    const workers = this.#startedWorkers();
    if (!workers) return 0;
    const deadline = Date.now() + timeoutMs;
    while (workers.ready < this.#threads - 1 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 2));
    return workers.ready;
  }

  /** Stops the worker threads for good; products then run on this thread. */
  close(): void {
    this.#closed = true;
    closeWorkers.unregister(this);
    this.#workers?.close();
    this.#workers = null;
  }

  #startedWorkers(): MatmulWorkers | null {
    if (this.#threads > 1 && !this.#workers && !this.#closed) {
      this.#workers = new MatmulWorkers(this.#bytes, this.#memory, this.#threads - 1);
      closeWorkers.register(this, this.#workers, this);
    }
    return this.#workers;
  }

  /** The end of the highest allocated block: scratch space starts here. */
  get top(): number {
    return this.#top;
  }

  /** A 16-byte-aligned block of `bytes`, or null when the memory cannot grow to hold it (past 4 GiB). */
  allocate(bytes: number): number | null {
    const size = Math.max(16, Math.ceil(bytes / 16) * 16); // never empty: each block has its own offset
    const index = this.#free.findIndex((block) => block.bytes >= size);
    let offset: number;
    if (index >= 0) {
      const block = this.#free[index];
      offset = block.offset;
      if (block.bytes === size) this.#free.splice(index, 1);
      else Object.assign(block, { offset: offset + size, bytes: block.bytes - size });
    } else {
      if (!this.ensureBytes(this.#top + size)) return null;
      offset = this.#top;
      this.#top += size;
    }
    this.#blockBytes.set(offset, size);
    return offset;
  }

  /** Gives a block from `allocate` back. */
  release(offset: number): void {
    const bytes = this.#blockBytes.get(offset);
    if (bytes === undefined) throw new ArtError("bad_wasm_block", `no WASM block was allocated at ${offset} (released twice?)`);
    this.#blockBytes.delete(offset);
    let index = this.#free.findIndex((block) => block.offset > offset);
    if (index < 0) index = this.#free.length;
    this.#free.splice(index, 0, { offset, bytes });
    // Merge with the following block, then the preceding one, so free space never fragments into neighbours.
    const next = this.#free[index + 1];
    if (next && offset + bytes === next.offset) {
      this.#free[index].bytes += next.bytes;
      this.#free.splice(index + 1, 1);
    }
    const previous = this.#free[index - 1];
    if (previous && previous.offset + previous.bytes === offset) {
      previous.bytes += this.#free[index].bytes;
      this.#free.splice(index, 1);
      index--;
    }
    // Free space at the top goes back to the bump pointer (the memory itself never shrinks).
    const last = this.#free[this.#free.length - 1];
    if (last.offset + last.bytes === this.#top) {
      this.#top = last.offset;
      this.#free.pop();
    }
  }

  /** Grows the memory to hold at least `bytes`; false when that is past 4 GiB or the runtime refuses. */
  ensureBytes(bytes: number): boolean {
    const pages = Math.ceil(bytes / PAGE_BYTES);
    const current = this.#memory.buffer.byteLength / PAGE_BYTES;
    if (pages <= current) return true;
    if (pages > MAX_PAGES) return false;
    try {
      this.#memory.grow(pages - current);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * out[n, m] = (accumulate ? out : 0) + alpha · x[n, k] · w[m, k]ᵀ with x, w, out at these byte offsets (multiples
   * of 4, ranges inside the memory: the kernel would trap, not read past it).
   */
  matmulNT(x: number, w: number, out: number, n: number, k: number, m: number, alpha = 1, accumulate = false): void {
    this.#checkOperands([[x, n * k], [w, m * k], [out, n * m]], `WASM matmul operands at ${x}, ${w}, ${out} (n=${n}, k=${k}, m=${m})`);
    this.#run(n, k, m, (b) => ({
      kernel: "nt",
      ints: [x + b.row * k * 4, w + b.column * k * 4, out + (b.row * m + b.column) * 4, b.rows, k, b.columns, m, accumulate ? 1 : 0],
      alpha,
    }));
  }

  /**
   * out(i, j) = alpha · Σ_p a(i, p) · b(p, j) (+ out(i, j) with `accumulate`) for i < n, j < m, p < k, each sum in
   * float64 in p order (matmul.wat): with a, b, out at these byte offsets and `layout`'s strides, the bits of
   * matmul.ts's products. `stepwise` gives the leftover rows matmulNNAccumulate's and matmulTNAccumulate's arithmetic
   * (alpha 1, accumulating, out contiguous along j).
   */
  matmulF64(a: number, b: number, out: number, n: number, k: number, m: number, layout: F64Layout, alpha: number, accumulate: boolean, stepwise = false): void {
    const { aRow, aCol, bRow, outRow, outCol } = layout;
    if (stepwise && (alpha !== 1 || !accumulate || outCol !== 1)) {
      throw new ArtError("bad_matmul_operands", "stepwise leftover rows need alpha 1, accumulation and out contiguous along its columns");
    }
    // Each operand's extent in elements: from its first to one past its last.
    const extent = (at: number, rows: number, rowStride: number, columns: number, columnStride: number) =>
      [at, rows * columns === 0 ? 0 : (rows - 1) * rowStride + (columns - 1) * columnStride + 1] as [number, number];
    this.#checkOperands([extent(a, n, aRow, k, aCol), extent(b, k, bRow, m, 1), extent(out, n, outRow, m, outCol)],
      `WASM matmulF64 operands at ${a}, ${b}, ${out} (n=${n}, k=${k}, m=${m})`);
    const flags = (accumulate ? ACCUMULATE : 0) | (stepwise ? STEPWISE : 0);
    this.#run(n, k, m, (block) => ({
      kernel: "f64",
      ints: [a + block.row * aRow * 4, b + block.column * 4, out + (block.row * outRow + block.column * outCol) * 4, block.rows, k, block.columns,
        aRow, aCol, bRow, outRow, outCol, flags],
      alpha,
    }));
  }

  /**
   * matmul.ts `matmulNT` (options as there), bit for bit, through the memory: the smaller operand is transposed into it
   * (W when x has more rows, else x, with the product written transposed), the other copied, or W used where it lies
   * when it already lives there (a KV cache in the memory). False, with nothing done, for fewer than 4 rows of x with
   * W outside the memory (decoding: copying a cache's keys in would cost as much as the product) or a small product,
   * or when the memory cannot hold them.
   */
  ntArrays(x: Float32Array, w: Float32Array, n: number, k: number, m: number, out: Float32Array, options: MatmulOptions = {}): boolean {
    const { alpha = 1, accumulate = false, columnStart = 0, columnEnd = m, xStride = k, wStride = k, outStride = m } = options;
    const columns = columnEnd - columnStart, wHere = this.#lives(w, (columnEnd - 1) * wStride + k);
    if ((n < MIN_ARRAY_ROWS && (!wHere || n * k * columns < MIN_ROW_MULTIPLY_ADDS)) || columns <= 0) return false;
    const transposeW = n >= columns && !wHere;
    const at = this.#scratch([n * k, wHere ? 0 : columns * k, n * columns]);
    if (!at) return false;
    const [xAt, wAt, outAt] = at, heap = this.heap;
    const wFirst = columnStart * wStride;
    if (accumulate) copyRows(out.subarray(columnStart), outStride, heap, outAt! / 4, columns, n, columns);
    if (transposeW) {
      // out(i, o) = Σ_j x(i, j) · Wᵀ(j, o): x copied as it is, W transposed.
      copyRows(x, xStride, heap, xAt! / 4, k, n, k);
      transposeInto(w.subarray(wFirst), wStride, heap, wAt! / 4, columns, k);
      this.matmulF64(xAt!, wAt!, outAt!, n, k, columns, { aRow: k, aCol: 1, bRow: columns, outRow: columns, outCol: 1 }, alpha, accumulate);
    } else {
      // outᵀ(o, i) = Σ_j W(o, j) · xᵀ(j, i): W copied as it is (or read where it lies), x transposed, the result
      // stored transposed.
      if (!wHere) copyRows(w.subarray(wFirst), wStride, heap, wAt! / 4, k, columns, k);
      transposeInto(x, xStride, heap, xAt! / 4, n, k);
      const [wOffset, wRow] = wHere ? [w.byteOffset + wFirst * 4, wStride] : [wAt!, k];
      this.matmulF64(wOffset, xAt!, outAt!, columns, k, n, { aRow: wRow, aCol: 1, bRow: n, outRow: 1, outCol: columns }, alpha, accumulate);
    }
    copyRowsBack(heap, outAt! / 4, columns, out.subarray(columnStart), outStride, n, columns);
    return true;
  }

  /**
   * matmul.ts `weightedRowSum` (out[j] = Σ_t weights[t] · rows[t · stride + j], a decoding row's p·v) bit for bit,
   * for `rows` that live in the memory (a KV cache there: read in place); false otherwise, for a small one, or when the
   * memory cannot hold the rest.
   */
  weightedRowSumArrays(weights: Float32Array, rows: Float32Array, count: number, width: number, stride: number, out: Float32Array): boolean {
    if (!this.#lives(rows, (count - 1) * stride + width) || count * width < MIN_ROW_MULTIPLY_ADDS) return false;
    const at = this.#scratch([count, width]);
    if (!at) return false;
    const [weightsAt, outAt] = at, heap = this.heap;
    heap.set(weights.subarray(0, count), weightsAt! / 4);
    this.matmulF64(weightsAt!, rows.byteOffset, outAt!, 1, count, width, { aRow: count, aCol: 1, bRow: stride, outRow: width, outCol: 1 }, 1, false);
    out.set(heap.subarray(outAt! / 4, outAt! / 4 + width));
    return true;
  }

  /**
   * matmul.ts `matmulNNAccumulate` (out[n, m] += a[n, k] · b[k, m]) bit for bit through the memory; b is used where
   * it lies when it already lives there (a resident weight), else copied. False when the memory cannot hold them.
   */
  nnAccumulateArrays(out: Float32Array, a: Float32Array, b: Float32Array, n: number, k: number, m: number): boolean {
    const bHere = this.#lives(b, k * m);
    const at = this.#scratch([n * k, bHere ? 0 : k * m, n * m]);
    if (!at) return false;
    const [aAt, bCopyAt, outAt] = at, heap = this.heap;
    heap.set(a.subarray(0, n * k), aAt! / 4);
    if (!bHere) heap.set(b.subarray(0, k * m), bCopyAt! / 4);
    heap.set(out.subarray(0, n * m), outAt! / 4);
    this.matmulF64(aAt!, bHere ? b.byteOffset : bCopyAt!, outAt!, n, k, m, { aRow: k, aCol: 1, bRow: m, outRow: m, outCol: 1 }, 1, true, true);
    out.set(heap.subarray(outAt! / 4, outAt! / 4 + n * m));
    return true;
  }

  /**
   * matmul.ts `matmulTNAccumulate` (out[m, k] += a[n, m]ᵀ · b[n, k], strides as there) bit for bit through the
   * memory. False when the memory cannot hold them.
   */
  tnAccumulateArrays(out: Float32Array, a: Float32Array, b: Float32Array, n: number, m: number, k: number, strides: TNStrides = {}): boolean {
    const { aStride = m, bStride = k, outStride = k } = strides;
    const at = this.#scratch([n * m, n * k, m * k]);
    if (!at) return false;
    const [aAt, bAt, outAt] = at, heap = this.heap;
    copyRows(a, aStride, heap, aAt! / 4, m, n, m);
    copyRows(b, bStride, heap, bAt! / 4, k, n, k);
    copyRows(out, outStride, heap, outAt! / 4, k, m, k);
    this.matmulF64(aAt!, bAt!, outAt!, m, n, k, { aRow: 1, aCol: m, bRow: k, outRow: k, outCol: 1 }, 1, true, true);
    copyRowsBack(heap, outAt! / 4, k, out, outStride, m, k);
    return true;
  }

  /**
   * out[n, m] = x[n, k] · Wᵀ with W already in the memory at byte offset `w` (a resident weight) and x, out arrays
   * outside it, copied through the scratch space. False when the memory cannot hold them.
   */
  linearArrays(x: Float32Array, w: number, out: Float32Array, n: number, k: number, m: number): boolean {
    const at = this.#scratch([n * k, n * m]);
    if (!at) return false;
    const [xAt, outAt] = at, heap = this.heap;
    heap.set(x.subarray(0, n * k), xAt! / 4);
    this.matmulNT(xAt!, w, outAt!, n, k, m);
    out.set(heap.subarray(outAt! / 4, outAt! / 4 + n * m));
    return true;
  }

  /**
   * A matrix's values, already bf16-rounded (each f32's low 16 bits zero), stored in the memory as bf16 for
   * `decodeLinearArrays`: the byte offset of its block (give it back with `release`), or null when the memory cannot
   * hold it.
   */
  residentBf16(values: Float32Array): number | null {
    const offset = this.allocate(values.length * 2);
    if (offset === null) return null;
    const high = new Uint16Array(values.buffer, values.byteOffset, values.length * 2);
    const into = new Uint16Array(this.heap.buffer, offset, values.length);
    for (let i = 0; i < values.length; i++) into[i] = high[2 * i + 1]; // little-endian: an f32's high half is its second u16
    return offset;
  }

  /**
   * out[n, m] = x[n, k] · Wᵀ for a decoding product of n ≤ 4 rows, with W in the memory at byte offset `w`, stored as
   * `weights`: "f32" (a resident weight) or "bf16" (`residentBf16`); x and out are arrays outside the memory, copied
   * through the scratch space; k must be a multiple of 8. False when the memory cannot hold them. f32 multiply-adds in
   * matmul.wat's order (linearF32, linearBf16), not the JavaScript reference's bits: the system-BLAS backend's
   * decoding uses it, whose products are the library's anyway.
   */
  decodeLinearArrays(x: Float32Array, w: number, weights: "f32" | "bf16", out: Float32Array, n: number, k: number, m: number): boolean {
    if (!(n >= 1 && n <= DECODE_MAX_ROWS) || k % 8 !== 0) {
      throw new ArtError("bad_matmul_operands", `decodeLinear: ${n} rows of ${k} (1 to ${DECODE_MAX_ROWS} rows, k a multiple of 8)`);
    }
    const weightBytes = weights === "f32" ? 4 : 2;
    this.#checkOperands([[w, (m * k * weightBytes) / 4]], `WASM ${weights} weight at ${w} (k=${k}, m=${m})`);
    // Bands of columns, one a thread, each written packed ([n, its columns]) into its own block of the scratch space.
    const workers = n >= DECODE_SPLIT_ROWS && m * k * weightBytes >= DECODE_SPLIT_BYTES ? this.#startedWorkers() : null;
    const columnBands = bands(m, 1 + (workers?.ready ?? 0));
    const at = this.#scratch([n * k, ...columnBands.map(([, columns]) => n * columns)]);
    if (!at) return false;
    const [xAt, ...outAt] = at, heap = this.heap;
    heap.set(x.subarray(0, n * k), xAt! / 4);
    this.#runCalls(workers, columnBands.map(([column, columns], band) => ({
      kernel: weights === "f32" ? "linearF32" : "linearBf16", ints: [xAt!, w + column * k * weightBytes, outAt[band]!, n, k, columns], alpha: 1,
    })));
    columnBands.forEach(([column, columns], band) => {
      for (let r = 0; r < n; r++) out.set(heap.subarray(outAt[band]! / 4 + r * columns, outAt[band]! / 4 + (r + 1) * columns), r * m + column);
    });
    return true;
  }

  /**
   * Whether `array` is a view of this memory (a resident weight, a KV cache) holding at least `extent` values: a
   * product then reads it where it lies, and the kernel never reaches past it.
   */
  #lives(array: Float32Array, extent: number): boolean {
    return this.#buffers.has(array.buffer) && array.length >= extent;
  }

  /**
   * Byte offsets of blocks of these many floats, one after another in the scratch space above `top` (16-byte
   * aligned), valid until the next product; null when the memory cannot grow to hold them.
   */
  #scratch(floats: number[]): number[] | null {
    const offsets: number[] = [];
    let end = this.#top;
    for (const count of floats) {
      offsets.push(end);
      end += Math.ceil(count / 4) * 16;
    }
    return this.ensureBytes(end) ? offsets : null;
  }

  #checkOperands(operands: [number, number][], what: string): void {
    for (const [at, count] of operands) {
      if (at & 3 || at + count * 4 > this.byteLength) {
        throw new ArtError("bad_matmul_operands", `${what} are misaligned or reach past the ${this.byteLength}-byte memory: place them with ensureBytes first`);
      }
    }
  }

  /** Runs the blocks of an [n, m] output (each made into a call by `call`) on this thread and the ready workers. */
  #run(n: number, k: number, m: number, call: (block: { row: number; rows: number; column: number; columns: number }) => MatmulCall): void {
    const workers = n * k * m >= MIN_PARALLEL_MULTIPLY_ADDS ? this.#startedWorkers() : null;
    this.#runCalls(workers, outputBlocks(n, k, m, 1 + (workers?.ready ?? 0)).map(call));
  }

  /** Runs calls[0] on this thread and the rest on `workers` (at most as many as are ready). */
  #runCalls(workers: MatmulWorkers | null, calls: MatmulCall[]): void {
    const own = ({ kernel, ints: i, alpha }: MatmulCall) => {
      if (kernel === "nt") this.#exports.matmulNT(i[0]!, i[1]!, i[2]!, i[3]!, i[4]!, i[5]!, i[6]!, alpha, i[7]!);
      else if (kernel === "f64") this.#exports.matmulF64(i[0]!, i[1]!, i[2]!, i[3]!, i[4]!, i[5]!, i[6]!, i[7]!, i[8]!, i[9]!, i[10]!, alpha, i[11]!);
      else this.#exports[kernel](i[0]!, i[1]!, i[2]!, i[3]!, i[4]!, i[5]!);
    };
    if (calls.length === 1) own(calls[0]!);
    else workers!.run(calls, own);
  }
}

/** `rows` rows of `width` floats, `stride` apart in `from`, packed `packed` apart into `heap` from float `at`. */
function copyRows(from: Float32Array, stride: number, heap: Float32Array, at: number, packed: number, rows: number, width: number): void {
  if (stride === width && packed === width) {
    heap.set(from.subarray(0, rows * width), at);
    return;
  }
  for (let r = 0; r < rows; r++) heap.set(from.subarray(r * stride, r * stride + width), at + r * packed);
}

/** copyRows' inverse: packed rows in `heap` back to rows `stride` apart in `to`. */
function copyRowsBack(heap: Float32Array, at: number, packed: number, to: Float32Array, stride: number, rows: number, width: number): void {
  if (stride === width && packed === width) {
    to.set(heap.subarray(at, at + rows * width));
    return;
  }
  for (let r = 0; r < rows; r++) to.set(heap.subarray(at + r * packed, at + r * packed + width), r * stride);
}

/** [rows, width] rows `stride` apart in `from`, transposed into `heap` from float `at` as [width, rows]. */
function transposeInto(from: Float32Array, stride: number, heap: Float32Array, at: number, rows: number, width: number): void {
  for (let r = 0; r < rows; r++) {
    const source = r * stride;
    for (let j = 0; j < width; j++) heap[at + j * rows + r] = from[source + j];
  }
}
