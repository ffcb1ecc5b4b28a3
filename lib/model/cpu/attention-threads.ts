/**
 * The training attention across threads: packedAttention's units (attention.ts: a segment's query heads of one KV
 * head, each writing only its own columns of its own rows) taken by the calling thread and by worker threads, each
 * with its own products (the system BLAS at one thread, or its own WebAssembly matmul) and elementwise kernels.
 * Attention's products are one head's and too small for the BLAS to split usefully, and its softmaxes and copies are
 * not products at all, so on the calling thread alone it did not speed up with cores (docs/engine.md, Threads).
 *
 * A call copies its operands into one shared arena (a SharedArrayBuffer: the backend's tensors are ordinary
 * arrays), posts the job to every ready worker, takes units itself from a shared counter until none is left, waits
 * for the workers' last ones, and copies the outputs back. A unit computes the same numbers on any thread (the same
 * code, products on one BLAS thread or the WebAssembly kernel's fixed order), so results do not depend on who took
 * which unit, nor on the thread count. Workers start in the background with the first call large enough to share;
 * until one reports ready, the calling thread runs every unit as before. They are unref'd (the process exits without
 * closing them), idle in their event loop between jobs, and end when their backend is collected.
 */
import { Worker } from "node:worker_threads";
import { ArtError } from "../../core/errors.ts";
import {
  attentionMultiplyAdds, attentionUnits, packedAttentionBackwardUnit, packedAttentionUnit, type PackedAttentionShape, prefixGradients,
  scatterPrefixGradients,
} from "./attention.ts";
import { applyBlasThreads, type Gemm } from "./gemm.ts";
import { MIN_PARALLEL_MULTIPLY_ADDS } from "./matmul-workers.ts";
import type { WasmElementwise } from "./wasm-elementwise.ts";

/** What a worker is started with: how to make its products and elementwise kernels like its backend's. */
export interface AttentionWorkerData {
  /** The system BLAS's path, or null for the portable products. */
  library: string | null;
  /** Portable products on the WebAssembly kernel (else the JavaScript reference's). */
  wasm: boolean;
  /** The elementwise kernels' module (fused multiply-adds or not), or null for the JavaScript references. */
  elementwise: { fusedMultiplyAdd: boolean } | null;
  /** Int32 words, one per worker: 1 once it is ready, -1 if it failed to start. */
  ready: SharedArrayBuffer;
  index: number;
}

/** An operand's place in the arena: offset and length, in floats. */
type Slot = readonly [number, number];

/** One call's work, as posted to the workers. */
export interface AttentionJob {
  kind: "forward" | "backward";
  shape: PackedAttentionShape;
  arena: SharedArrayBuffer;
  /** forward: q, k, v, out; backward: q, k, v, dOut, dq, dk, dv. */
  slots: Record<string, Slot>;
  /** backward: each segment with a prefix, its key and value gradients' slots. */
  prefixes: ({ keys: Slot; values: Slot } | null)[];
  /** Int32 words: the next unit to take, the units done, a failure flag. */
  control: SharedArrayBuffer;
}

const NEXT = 0, DONE = 1, FAILED = 2;

/**
 * Takes units of `job` until none is left, computing each with `gemm` and `fast`: what the calling thread and every
 * worker run. Returns how many units this thread computed and the first error it met; a unit that throws is counted
 * done (with the failure flag set), so no thread waits for it.
 */
export function runAttentionUnits(job: AttentionJob, gemm: Gemm, fast: WasmElementwise | null): { units: number; error: unknown } {
  const words = new Int32Array(job.control);
  const view = ([offset, length]: Slot) => new Float32Array(job.arena, offset * 4, length);
  const total = attentionUnits(job.shape);
  const { slots, shape } = job;
  const run = job.kind === "forward"
    ? ((q, k, v, out) => (unit: number) => packedAttentionUnit(gemm, fast, shape, unit, q, k, v, out))(view(slots.q), view(slots.k), view(slots.v), view(slots.out))
    : ((arrays) => (unit: number) => packedAttentionBackwardUnit(gemm, fast, shape, unit, arrays))({
      q: view(slots.q), k: view(slots.k), v: view(slots.v), dOut: view(slots.dOut), dq: view(slots.dq), dk: view(slots.dk), dv: view(slots.dv),
      prefixes: job.prefixes.map((prefix) => prefix && { keys: view(prefix.keys), values: view(prefix.values) }),
    });
  let units = 0, error: unknown = null;
  for (let unit = Atomics.add(words, NEXT, 1); unit < total; unit = Atomics.add(words, NEXT, 1)) {
    try {
      run(unit);
    } catch (thrown) {
      error ??= thrown;
      Atomics.store(words, FAILED, 1);
    }
    units++;
    if (Atomics.add(words, DONE, 1) + 1 === total) Atomics.notify(words, DONE);
  }
  return { units, error };
}

/** The worker's module: the same file name beside this one (.ts from the sources, .js from the build). */
function workerUrl(): URL {
  return new URL(import.meta.url.endsWith(".ts") ? "./attention-worker.ts" : "./attention-worker.js", import.meta.url);
}

export class AttentionThreads {
  readonly #data: Omit<AttentionWorkerData, "index">;
  readonly #ready: Int32Array;
  readonly #count: number;
  readonly #warn: (message: string) => void;
  #workers: Worker[] | null = null;
  #arena = new SharedArrayBuffer(0);
  #closed = false;
  /** Units computed by the workers so far (a diagnostic: the bench and tests read it). */
  unitsOnWorkers = 0;

  /**
   * Up to `count` workers making their products and kernels as `data` says; none starts before the first call that
   * would share its units. A worker that fails is never used: `warn` (default console.warn) hears of the first failure.
   */
  constructor(count: number, data: Omit<AttentionWorkerData, "index" | "ready">, warn: (message: string) => void = console.warn) {
    this.#count = count;
    this.#ready = new Int32Array(new SharedArrayBuffer(4 * count));
    this.#data = { ...data, ready: this.#ready.buffer as SharedArrayBuffer };
    this.#warn = warn;
  }

  /** How many workers are ready to take units. */
  get ready(): number {
    let ready = 0;
    for (let i = 0; i < this.#count; i++) if (Atomics.load(this.#ready, i) === 1) ready++;
    return ready;
  }

  /**
   * packedAttention (kind "forward": q, k, v, out) or its backward (q, k, v, dOut, dq, dk, dv) over `shape`, across
   * the ready workers and this thread, this thread's units on `gemm` (one BLAS thread) and `fast`. Returns false,
   * having computed nothing, when the call is too small to share or no worker is ready yet (the caller computes it
   * alone); starts the workers the first time a call is large enough.
   */
  run(kind: AttentionJob["kind"], shape: PackedAttentionShape, operands: Record<string, Float32Array>, gemm: Gemm, fast: WasmElementwise | null): boolean {
    if (this.#closed) throw new ArtError("attention_threads_closed", "the CPU attention's worker threads were closed; make a new CpuBackend");
    if (attentionUnits(shape) < 2 || attentionMultiplyAdds(shape) < MIN_PARALLEL_MULTIPLY_ADDS) return false;
    this.#workers ??= this.#spawn();
    const ready = this.#workers.filter((_, i) => Atomics.load(this.#ready, i) === 1);
    if (ready.length === 0) return false;

    // The arena: every operand (the outputs too, which accumulate), then each prefix segment's gradients, zeroed.
    let floats = 0;
    const place = (length: number): Slot => {
      const slot: Slot = [floats, length];
      floats += length;
      return slot;
    };
    const slots = Object.fromEntries(Object.entries(operands).map(([name, values]) => [name, place(values.length)]));
    const prefixes = kind === "backward" ? prefixGradients(shape, place) : [];
    if (this.#arena.byteLength < floats * 4) this.#arena = new SharedArrayBuffer(Math.ceil(floats * 1.25) * 4);
    const job: AttentionJob = { kind, shape, arena: this.#arena, slots, prefixes, control: new SharedArrayBuffer(12) };
    const view = ([offset, length]: Slot) => new Float32Array(job.arena, offset * 4, length);
    for (const [name, values] of Object.entries(operands)) view(slots[name]).set(values);
    for (const prefix of prefixes) if (prefix) [prefix.keys, prefix.values].forEach((slot) => view(slot).fill(0));

    // The workers' products run at one BLAS thread, as this thread's do (a product split across the library's own
    // threads from two callers at once would contend for them).
    if (gemm.library) applyBlasThreads(gemm.library, 1);
    for (const worker of ready) worker.postMessage(job);
    const own = runAttentionUnits(job, gemm, fast);
    const words = new Int32Array(job.control), total = attentionUnits(shape);
    for (let done = Atomics.load(words, DONE); done < total; done = Atomics.load(words, DONE)) Atomics.wait(words, DONE, done);
    this.unitsOnWorkers += total - own.units;
    if (own.error) throw own.error;
    if (Atomics.load(words, FAILED) !== 0) {
      throw new ArtError("attention_worker_failed", "a CPU attention worker thread failed mid-call; set ART_CPU_THREADS=1 to compute on one thread, and report it");
    }
    if (kind === "backward") {
      scatterPrefixGradients(shape, prefixes.map((prefix) => prefix && { keys: view(prefix.keys), values: view(prefix.values) }), view(slots.dk), view(slots.dv));
    }
    for (const name of kind === "forward" ? ["out"] : ["dq", "dk", "dv"]) operands[name].set(view(slots[name]));
    return true;
  }

  /**
   * Starts the workers now (they otherwise start with the first call large enough to share) and resolves with how
   * many are ready once each is ready or has failed, or after `timeoutMs`. Calls never wait for workers; this is for
   * benchmarks and tests.
   */
  async start(timeoutMs = 10_000): Promise<number> {
    if (this.#closed) return 0;
    this.#workers ??= this.#spawn();
    const deadline = Date.now() + timeoutMs;
    const starting = () => this.#ready.some((state) => state === 0);
    while (starting() && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 2));
    return this.ready;
  }

  #spawn(): Worker[] {
    const workers: Worker[] = [];
    let warned = false;
    for (let index = 0; index < this.#count; index++) {
      const worker = new Worker(workerUrl(), { execArgv: [], workerData: { ...this.#data, index } satisfies AttentionWorkerData });
      // The error is not the caller's: attention goes on, on the threads that did start.
      worker.on("error", (error) => {
        Atomics.store(this.#ready, index, -1);
        if (this.#closed || warned) return;
        warned = true;
        this.#warn(`art-ts: an attention worker thread failed (${error instanceof Error ? error.message : String(error)}); ` +
          `the training attention runs on the threads that started, fewer than the ${this.#count + 1} asked for (ART_CPU_THREADS)`);
      });
      worker.unref();
      workers.push(worker);
    }
    return workers;
  }

  /** Stops the workers. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const worker of this.#workers ?? []) void worker.terminate();
  }
}
