/**
 * Worker threads for the WebAssembly matmul: each runs its own instance of the module on the same shared memory,
 * so a product (`x Wᵀ` in f32, or one of the float64-summed ones) is split into blocks of its output and every
 * thread computes one, with no copies. The caller's thread computes a block too and then waits (Atomics.wait; the
 * backend's API is synchronous). Every output is one dot product in the kernel's fixed order, whichever tile or
 * thread computes it, so the result is the same bits on any number of threads.
 *
 * Workers start in the background on the first large product; until one reports ready, products run on the calling
 * thread alone, so a worker that never starts costs nothing but its share. They are unref'd (the process exits
 * without closing them) and idle in Atomics.wait, and end when their WasmMatmul is closed or collected.
 * `node:worker_threads` serves Node, tslab and Deno alike (Deno's own Worker would keep the process alive).
 */
import { Worker } from "node:worker_threads";
import { ArtError } from "../../core/errors.ts";

/** Throws ArtError("bad_cpu_threads") unless `threads` is a whole number of at least 1 (the BLAS's or these threads). */
export function checkThreadCount(threads: number): void {
  if (!Number.isInteger(threads) || threads < 1) throw new ArtError("bad_cpu_threads", `${threads} is not a positive whole number of threads`);
}

/**
 * One kernel call: its integer arguments in order with alpha taken out (alpha is a float64 for "f64", rounded to f32
 * by the call for "nt", unused by the decoding kernels). "nt" is matmulNT's x, w, out, n, k, m, ldOut, accumulate
 * (0/1); "f64" is matmulF64's a, b, out, n, k, m, aRow, aCol, bRow, outRow, outCol, flags; "linearF32" and
 * "linearBf16" are the decoding kernels' x, w, out, n, k, m.
 */
export interface MatmulCall {
  kernel: MatmulKernel;
  ints: readonly number[];
  alpha: number;
}

/**
 * Below this many multiply-adds a product stays on one thread: waking a worker and waiting for it costs about 60 µs
 * on the 2-vCPU development machine, what ~1M multiply-adds take there, so a split starts to pay at about twice that.
 */
export const MIN_PARALLEL_MULTIPLY_ADDS = 2 << 20;

/** The kernels a worker runs, by the number its slot holds. */
const KERNELS = ["nt", "f64", "linearF32", "linearBf16"] as const;
export type MatmulKernel = (typeof KERNELS)[number];

/** Blocks of an [n, m] output for `parts` threads: bands of rows where there are rows enough, else of columns. */
export function outputBlocks(n: number, k: number, m: number, parts: number): { row: number; rows: number; column: number; columns: number }[] {
  if (parts > 1 && n * k * m >= MIN_PARALLEL_MULTIPLY_ADDS) {
    // Bands of a multiple of 4 rows (or columns) keep the kernel on its 4 × 2 (or 1 × 4) tiles; the bits would be
    // the same on any band, only slower on the leftover tiles.
    if (n >= 8 * parts) return bands(n, parts).map(([row, rows]) => ({ row, rows, column: 0, columns: m }));
    if (m >= 8 * parts) return bands(m, parts).map(([column, columns]) => ({ row: 0, rows: n, column, columns }));
  }
  return [{ row: 0, rows: n, column: 0, columns: m }];
}

/** `length` cut into at most `parts` bands of a multiple of 4 (the last ragged): [start, size] each. */
export function bands(length: number, parts: number): [number, number][] {
  const size = Math.ceil(length / parts / 4) * 4;
  const result: [number, number][] = [];
  for (let start = 0; start < length; start += size) result.push([start, Math.min(size, length - start)]);
  return result;
}

// The control block (Int32 words of a SharedArrayBuffer): the count of blocks still running, an error flag, then a
// slot per worker: its job generation (the word it waits on; -1 tells it to stop), ready (1, or -1 if it failed to
// start), which kernel (its index in KERNELS), a word of padding, alpha as a float64 (two words, 8-byte aligned: HEADER and
// SLOT are even), the call's integer arguments.
const PENDING = 0, FAILED = 1, HEADER = 2;
const GENERATION = 0, READY = 1, KERNEL = 2, ALPHA = 4, ARGUMENTS = 6, SLOT = ARGUMENTS + 12;

// The worker's program, evaluated as CommonJS by node:worker_threads (Deno runs it too; the worker gets no execArgv,
// since --input-type=module would make it ESM). It only waits, calls the kernel with its slot's arguments, and counts
// down PENDING.
const WORKER_SOURCE = `
const { workerData } = require("node:worker_threads");
const { bytes, memory, control, base } = workerData;
const words = new Int32Array(control), doubles = new Float64Array(control);
let kernels;
try {
  kernels = new WebAssembly.Instance(new WebAssembly.Module(bytes), { env: { memory } }).exports;
} catch (error) {
  Atomics.store(words, base + ${READY}, -1);
  throw error;
}
Atomics.store(words, base + ${READY}, 1);
for (let seen = 0; ;) {
  Atomics.wait(words, base + ${GENERATION}, seen);
  const generation = Atomics.load(words, base + ${GENERATION});
  if (generation < 0) break;
  if (generation === seen) continue;
  seen = generation;
  const a = base + ${ARGUMENTS}, alpha = doubles[(base + ${ALPHA}) / 2];
  try {
    const kernel = words[base + ${KERNEL}];
    if (kernel === 0) {
      kernels.matmulNT(words[a], words[a + 1], words[a + 2], words[a + 3], words[a + 4], words[a + 5], words[a + 6], alpha, words[a + 7]);
    } else if (kernel === 1) {
      kernels.matmulF64(words[a], words[a + 1], words[a + 2], words[a + 3], words[a + 4], words[a + 5], words[a + 6], words[a + 7],
        words[a + 8], words[a + 9], words[a + 10], alpha, words[a + 11]);
    } else {
      (kernel === 2 ? kernels.linearF32 : kernels.linearBf16)(words[a], words[a + 1], words[a + 2], words[a + 3], words[a + 4], words[a + 5]);
    }
  } catch {
    Atomics.store(words, ${FAILED}, 1);
  }
  if (Atomics.sub(words, ${PENDING}, 1) === 1) Atomics.notify(words, ${PENDING});
}
`;

export class MatmulWorkers {
  readonly #words: Int32Array;
  readonly #doubles: Float64Array;
  readonly #workers: Worker[] = [];
  #generation = 0;
  #closed = false;
  /** Blocks computed by the workers so far (a diagnostic: the bench and tests read it). */
  blocksOnWorkers = 0;

  /**
   * `count` workers over `memory`, each instantiating the module from `bytes`; they start in the background. A worker
   * that fails is never used: `warn` (default console.warn) hears of the first failure, since products then run on
   * fewer threads than asked for.
   */
  constructor(bytes: Uint8Array, memory: object, count: number, warn: (message: string) => void = console.warn) {
    const control = new SharedArrayBuffer((HEADER + count * SLOT) * 4);
    this.#words = new Int32Array(control);
    this.#doubles = new Float64Array(control);
    let warned = false;
    for (let i = 0; i < count; i++) {
      const worker = new Worker(WORKER_SOURCE, { eval: true, execArgv: [], workerData: { bytes, memory, control, base: HEADER + i * SLOT } });
      // The error is not the caller's: the products go on, on the threads that did start.
      worker.on("error", (error) => {
        Atomics.store(this.#words, HEADER + i * SLOT + READY, -1);
        if (this.#closed || warned) return;
        warned = true;
        warn(`art-ts: a matrix-product worker thread failed (${error instanceof Error ? error.message : String(error)}); ` +
          `the portable products run on the threads that started, fewer than the ${count + 1} asked for (ART_CPU_THREADS)`);
      });
      worker.unref();
      this.#workers.push(worker);
    }
  }

  /** How many workers are ready to take a block. */
  get ready(): number {
    let ready = 0;
    for (let i = 0; i < this.#workers.length; i++) if (Atomics.load(this.#words, HEADER + i * SLOT + READY) === 1) ready++;
    return ready;
  }

  /** Runs calls[0] through `own` on this thread and the rest on ready workers (at most `ready` of them), then waits. */
  run(calls: readonly MatmulCall[], own: (call: MatmulCall) => void): void {
    if (this.#closed) throw new ArtError("matmul_workers_closed", "the WASM matmul's worker threads were closed; make a new CpuBackend");
    const words = this.#words;
    const slots: number[] = [];
    for (let i = 0; i < this.#workers.length && slots.length < calls.length - 1; i++) {
      if (Atomics.load(words, HEADER + i * SLOT + READY) === 1) slots.push(HEADER + i * SLOT);
    }
    if (slots.length !== calls.length - 1) throw new ArtError("matmul_workers_busy", `${calls.length - 1} blocks for ${slots.length} ready workers`);
    Atomics.store(words, PENDING, slots.length);
    this.#generation++;
    slots.forEach((slot, i) => {
      const { kernel, ints, alpha } = calls[i + 1]!;
      words[slot + KERNEL] = KERNELS.indexOf(kernel);
      this.#doubles[(slot + ALPHA) / 2] = alpha;
      // Offsets past 2 GiB wrap to negative: the same i32 bits.
      ints.forEach((value, a) => (words[slot + ARGUMENTS + a] = value));
      Atomics.store(words, slot + GENERATION, this.#generation);
      Atomics.notify(words, slot + GENERATION);
    });
    own(calls[0]!);
    for (let pending = Atomics.load(words, PENDING); pending !== 0; pending = Atomics.load(words, PENDING)) {
      Atomics.wait(words, PENDING, pending);
    }
    this.blocksOnWorkers += slots.length;
    if (Atomics.exchange(words, FAILED, 0) !== 0) {
      throw new ArtError("matmul_worker_failed", "a WASM matmul worker thread failed mid-product; set ART_CPU_THREADS=1 to compute on one thread, and report it");
    }
  }

  /** Stops the workers (each leaves its wait loop; terminate also ends one still starting). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (let i = 0; i < this.#workers.length; i++) {
      Atomics.store(this.#words, HEADER + i * SLOT + GENERATION, -1);
      Atomics.notify(this.#words, HEADER + i * SLOT + GENERATION);
      void this.#workers[i]!.terminate();
    }
  }
}
