/**
 * The WebAssembly SIMD matmul (matmul.wat, assembled into matmul-wasm-bytes.ts by scripts/build-wasm.ts): the same
 * `out = alpha · x Wᵀ (+ out)` as kernels.ts `matmulNT`, f32x4 register-tiled. It computes on a shared linear memory,
 * so operands live at byte offsets there, and a large product is split over worker threads (matmul-workers.ts) with
 * the same bits as on one. This class owns an instance and its memory, whose blocks an explicit allocator hands out
 * (first fit over a free list, above it a bump pointer `top`): the CPU backend keeps each linear weight in a block
 * and copies activations into the scratch space above `top` per call.
 */
import { ArtError } from "../../core/errors.ts";
import { matmulWasmBase64 } from "./matmul-wasm-bytes.ts";
import { checkThreadCount, MatmulWorkers, MIN_PARALLEL_MULTIPLY_ADDS, outputBlocks, type MatmulCall } from "./matmul-workers.ts";

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
  matmulNNAccumulate(a: number, b: number, out: number, n: number, k: number, m: number, ldB: number, ldOut: number): void;
}

const PAGE_BYTES = 65536;
/** A 32-bit memory addresses 4 GiB: 65536 pages. */
const MAX_PAGES = 65536;

let compiled: { bytes: Uint8Array; module: object } | null | undefined;

/** The compiled module and its bytes (for workers), or null where the runtime has no WebAssembly SIMD or shared memory. */
function compiledModule(): { bytes: Uint8Array; module: object } | null {
  if (compiled === undefined) {
    const bytes = Uint8Array.from(atob(matmulWasmBase64), (c) => c.charCodeAt(0));
    try {
      compiled = { bytes, module: new WebAssembly.Module(bytes) };
    } catch {
      compiled = null;
    }
  }
  return compiled;
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
  /** Free blocks below `top`, sorted by offset, never adjacent (released neighbours merge). */
  readonly #free: { offset: number; bytes: number }[] = [];
  readonly #blockBytes = new Map<number, number>();
  #top = 0;

  /**
   * A fresh instance with its own memory, computing large products on `threads` threads (this one and
   * `threads - 1` workers); null without WebAssembly SIMD or shared memory.
   */
  static create(threads = 1): WasmMatmul | null {
    checkThreadCount(threads);
    const compiledKernel = compiledModule();
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
  }

  /** The memory as f32s: take this again after `ensureBytes` to reach what a growth added. */
  get heap(): Float32Array {
    if (this.#heap.buffer !== this.#memory.buffer) this.#heap = new Float32Array(this.#memory.buffer);
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
      args: [x + b.row * k * 4, w + b.column * k * 4, out + (b.row * m + b.column) * 4, b.rows, k, b.columns, m, alpha, accumulate ? 1 : 0],
    }));
  }

  /**
   * out[n, m] += a[n, k] · b[k, m] with a, b, out at these byte offsets: bit for bit the JavaScript
   * `matmulNNAccumulate` (matmul.ts), which it replaces for the portable products' backward.
   */
  matmulNNAccumulate(a: number, b: number, out: number, n: number, k: number, m: number): void {
    this.#checkOperands([[a, n * k], [b, k * m], [out, n * m]], `WASM matmulNNAccumulate operands at ${a}, ${b}, ${out} (n=${n}, k=${k}, m=${m})`);
    this.#run(n, k, m, (block) => ({
      kernel: "nn",
      args: [a + block.row * k * 4, b + block.column * 4, out + (block.row * m + block.column) * 4, block.rows, k, block.columns, m, m],
    }));
  }

  /**
   * out[n, m] += a[n, k] · b[k, m] for arrays outside the memory: copied into its scratch space above `top`, the
   * product taken there, out copied back. False when the memory cannot hold them (the caller then runs the reference).
   */
  nnAccumulateArrays(out: Float32Array, a: Float32Array, b: Float32Array, n: number, k: number, m: number): boolean {
    return this.#inScratch([a.subarray(0, n * k), b.subarray(0, k * m)], out.subarray(0, n * m), true,
      ([aAt, bAt], outAt) => this.matmulNNAccumulate(aAt!, bAt!, outAt, n, k, m));
  }

  /**
   * out[n, m] = x[n, k] · Wᵀ with W already in the memory at byte offset `w` (a resident weight) and x, out arrays
   * outside it, copied through the scratch space. False when the memory cannot hold them.
   */
  linearArrays(x: Float32Array, w: number, out: Float32Array, n: number, k: number, m: number): boolean {
    return this.#inScratch([x.subarray(0, n * k)], out.subarray(0, n * m), false, ([xAt], outAt) => this.matmulNT(xAt!, w, outAt, n, k, m));
  }

  /**
   * Places `inputs` one after another in the scratch space above `top`, then `out` (its values copied in only when
   * the product `accumulate`s into it), runs `compute` on their byte offsets and copies `out` back; false, with
   * nothing run, when the memory cannot grow to hold them.
   */
  #inScratch(inputs: Float32Array[], out: Float32Array, accumulate: boolean, compute: (inputsAt: number[], outAt: number) => void): boolean {
    const inputsAt: number[] = [];
    let outAt = this.#top;
    for (const input of inputs) {
      inputsAt.push(outAt);
      outAt += input.length * 4;
    }
    if (!this.ensureBytes(outAt + out.length * 4)) return false;
    const heap = this.heap;
    inputs.forEach((input, i) => heap.set(input, inputsAt[i]! / 4));
    if (accumulate) heap.set(out, outAt / 4);
    compute(inputsAt, outAt);
    out.set(heap.subarray(outAt / 4, outAt / 4 + out.length));
    return true;
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
    const calls = outputBlocks(n, k, m, 1 + (workers?.ready ?? 0)).map(call);
    const own = (c: MatmulCall) => {
      if (c.kernel === "nt") this.#exports.matmulNT(...c.args);
      else this.#exports.matmulNNAccumulate(...c.args);
    };
    if (calls.length === 1) own(calls[0]!);
    else workers!.run(calls, own);
  }
}
