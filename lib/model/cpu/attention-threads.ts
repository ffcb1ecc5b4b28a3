/**
 * Attention across threads: its units taken by the calling thread and by worker threads, each thread with its own
 * products (the system BLAS at one thread, or its own WebAssembly matmul) and elementwise kernels. A unit is one KV
 * head's query heads over a packed training segment (attention.ts: packedAttention and its backward) or over a prompt's
 * run of rows against the KV cache (CpuBackend.attention); each writes only its own columns of its own rows.
 * Attention's products are one GQA group's and too small for the BLAS to split usefully, and its softmaxes and copies
 * are not products at all, so on the calling thread alone it did not speed up with cores (docs/engine.md).
 *
 * A call places its operands where the workers can read them: an array in shared memory (a KV cache, the portable
 * products' WebAssembly memory) where it is, any other in one shared arena (a SharedArrayBuffer), copied in and, if
 * written, back. It posts the job to every ready worker, takes units itself from a shared counter until none is left
 * and waits for the workers' last ones. A unit computes the same numbers on any thread (the same code, products on one
 * BLAS thread or the WebAssembly kernel's fixed order), so results do not depend on who took which unit, nor on the
 * thread count. Workers start in the background with the first call large enough to share; until one reports ready,
 * the calling thread runs every unit. They are unref'd (the process exits without closing them), idle in their event
 * loop between jobs, and end when their backend is collected.
 */
import { Worker } from "node:worker_threads";
import { ArtError } from "../../core/errors.ts";
import {
  attendKvHead, attentionMultiplyAdds, attentionUnits, GroupScratch, packedAttentionBackwardUnit, packedAttentionUnit, type PackedAttentionShape,
  prefixGradients, scatterPrefixGradients,
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

/** Where an operand lies in shared memory: its buffer, and its offset and length in floats. */
interface Slot {
  buffer: SharedArrayBuffer;
  offset: number;
  length: number;
}

/** Heads of an attention over the KV cache. */
export interface HeadShape {
  heads: number;
  kvHeads: number;
  headDim: number;
}

/** A prompt's run of rows over the KV cache: q and out rows from `row`, seeing keys 0..positions[r] of the slot's. */
export interface CacheRun<Keys = Float32Array> {
  row: number;
  positions: Int32Array;
  /** Keys the run's last row sees: `keys` and `values` hold runKeys rows of kvHeads·headDim. */
  runKeys: number;
  keys: Keys;
  values: Keys;
}

/** One call's work, as posted to the workers. */
export type AttentionJob = {
  /** forward: q, k, v, out (and probs, where kept); backward: q, k, v, dOut, dq, dk, dv (and probs); cache: q, out. */
  slots: Record<string, Slot>;
  /** Int32 words: the next unit to take, the units done, a failure flag. */
  control: SharedArrayBuffer;
} & (
  | { kind: "forward"; shape: PackedAttentionShape }
  /** Each segment with a prefix, its key and value gradients' slots. */
  | { kind: "backward"; shape: PackedAttentionShape; prefixes: ({ keys: Slot; values: Slot } | null)[] }
  | { kind: "cache"; shape: HeadShape; runs: CacheRun<Slot>[] }
);

const NEXT = 0, DONE = 1, FAILED = 2;

function unitCount(job: AttentionJob): number {
  return job.kind === "cache" ? job.runs.length * job.shape.kvHeads : attentionUnits(job.shape);
}

function view({ buffer, offset, length }: Slot): Float32Array {
  return new Float32Array(buffer, offset * 4, length);
}

/** Unit `unit` of a job's work, as a function of the unit's number. */
function unitWork(job: AttentionJob, gemm: Gemm, fast: WasmElementwise | null): (unit: number) => void {
  const { slots } = job;
  if (job.kind === "forward") {
    const [q, k, v, out] = [slots.q, slots.k, slots.v, slots.out].map(view), probs = slots.probs ? view(slots.probs) : null;
    return (unit) => packedAttentionUnit(gemm, fast, job.shape, unit, q, k, v, out, probs);
  }
  if (job.kind === "backward") {
    const arrays = {
      q: view(slots.q), k: view(slots.k), v: view(slots.v), probs: slots.probs ? view(slots.probs) : null, dOut: view(slots.dOut), dq: view(slots.dq),
      dk: view(slots.dk), dv: view(slots.dv), prefixes: job.prefixes.map((prefix) => prefix && { keys: view(prefix.keys), values: view(prefix.values) }),
    };
    return (unit) => packedAttentionBackwardUnit(gemm, fast, job.shape, unit, arrays);
  }
  const { heads, kvHeads, headDim } = job.shape, qStride = heads * headDim, q = view(slots.q), out = view(slots.out);
  return (unit) => {
    const run = job.runs[Math.floor(unit / kvHeads)];
    const scratch = { valuesT: new Float32Array(headDim * run.runKeys), group: new GroupScratch() };
    attendKvHead(gemm, fast, scratch, unit % kvHeads, out.subarray(run.row * qStride), q.subarray(run.row * qStride), view(run.keys), view(run.values),
      run.positions, run.runKeys, heads, kvHeads, headDim);
  };
}

/**
 * Takes units of `job` until none is left, computing each with `gemm` and `fast`: what the calling thread and every
 * worker run. Returns how many units this thread computed and the first error it met; a unit that throws is counted
 * done (with the failure flag set), so no thread waits for it.
 */
export function runAttentionUnits(job: AttentionJob, gemm: Gemm, fast: WasmElementwise | null): { units: number; error: unknown } {
  const words = new Int32Array(job.control);
  const total = unitCount(job);
  const run = unitWork(job, gemm, fast);
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
   * packedAttention (kind "forward": q, k, v, out, and probs where it keeps them) or its backward (q, k, v, dOut, dq,
   * dk, dv, and the kept probs) over `shape`, across
   * the ready workers and this thread, this thread's units on `gemm` (one BLAS thread) and `fast`. Returns false,
   * having computed nothing, when the call is too small to share or no worker is ready yet (the caller computes it
   * alone); starts the workers the first time a call is large enough.
   */
  run(kind: "forward" | "backward", shape: PackedAttentionShape, operands: Record<string, Float32Array>, gemm: Gemm, fast: WasmElementwise | null): boolean {
    if (!this.#worthSharing(attentionUnits(shape), attentionMultiplyAdds(shape))) return false;
    const outputs = kind === "forward" ? ["out", "probs"] : ["dq", "dk", "dv"];
    const placed = this.#place(operands, kind === "backward" ? prefixGradients(shape, (length) => length) : []);
    const { slots, zeroed: prefixes } = placed;
    const job: AttentionJob = kind === "forward"
      ? { kind, shape, slots, control: new SharedArrayBuffer(12) }
      : { kind, shape, slots, prefixes, control: new SharedArrayBuffer(12) };
    this.#share(job, gemm, fast);
    if (job.kind === "backward") {
      scatterPrefixGradients(shape, job.prefixes.map((prefix) => prefix && { keys: view(prefix.keys), values: view(prefix.values) }),
        view(slots.dk), view(slots.dv));
    }
    placed.copyBack(outputs);
    return true;
  }

  /**
   * The prompts' runs of CpuBackend.attention (q rows from each run's `row`, their keys and values in the KV cache)
   * across the ready workers and this thread, writing `out`'s rows of every run. Returns false, having computed
   * nothing, as `run` does.
   */
  runCache(shape: HeadShape, runs: readonly CacheRun[], q: Float32Array, out: Float32Array, gemm: Gemm, fast: WasmElementwise | null): boolean {
    let multiplyAdds = 0;
    for (const run of runs) multiplyAdds += 2 * run.positions.length * run.runKeys * shape.heads * shape.headDim;
    if (!this.#worthSharing(runs.length * shape.kvHeads, multiplyAdds)) return false;
    const keys = runs.flatMap((run, i) => [[`keys${i}`, run.keys], [`values${i}`, run.values]] as const);
    const placed = this.#place({ q, out, ...Object.fromEntries(keys) }, []);
    const { slots } = placed;
    this.#share({
      kind: "cache", shape, slots: { q: slots.q, out: slots.out }, control: new SharedArrayBuffer(12),
      runs: runs.map((run, i) => ({ row: run.row, positions: run.positions, runKeys: run.runKeys, keys: slots[`keys${i}`], values: slots[`values${i}`] })),
    }, gemm, fast);
    placed.copyBack(["out"]);
    return true;
  }

  /** Whether a call of these units and multiply-adds is shared; starts the workers the first time one would be. */
  #worthSharing(units: number, multiplyAdds: number): boolean {
    if (this.#closed) throw new ArtError("attention_threads_closed", "the CPU attention's worker threads were closed; make a new CpuBackend");
    if (units < 2 || multiplyAdds < MIN_PARALLEL_MULTIPLY_ADDS) return false;
    this.#workers ??= this.#spawn();
    return this.ready > 0;
  }

  /**
   * Slots for `operands` (in place where in shared memory, else copied into the arena) and zeroed blocks of the arena
   * of the lengths in `zeroed`; `copyBack` copies the named operands that were copied in back to their arrays.
   */
  #place(operands: Record<string, Float32Array>, zeroed: readonly ({ keys: number; values: number } | null)[]) {
    let floats = 0;
    const take = (length: number): Omit<Slot, "buffer"> => ({ offset: (floats += length) - length, length });
    // Each operand's block of the arena, or null where it is in shared memory already.
    const entries = Object.entries(operands).map(([name, values]) =>
      ({ name, values, at: values.buffer instanceof SharedArrayBuffer ? null : take(values.length) }));
    const blocks = zeroed.map((pair) => pair && { keys: take(pair.keys), values: take(pair.values) });
    if (this.#arena.byteLength < floats * 4) this.#arena = new SharedArrayBuffer(Math.ceil(floats * 1.25) * 4);
    const arena = this.#arena;
    const slots: Record<string, Slot> = {};
    for (const { name, values, at } of entries) {
      slots[name] = at ? { buffer: arena, ...at } : { buffer: values.buffer as SharedArrayBuffer, offset: values.byteOffset / 4, length: values.length };
      if (at) view(slots[name]).set(values);
    }
    const zeroedSlot = (block: Omit<Slot, "buffer">): Slot => {
      const slot = { buffer: arena, ...block };
      view(slot).fill(0);
      return slot;
    };
    return {
      slots,
      zeroed: blocks.map((block) => block && { keys: zeroedSlot(block.keys), values: zeroedSlot(block.values) }),
      copyBack: (names: readonly string[]) => {
        for (const { name, values, at } of entries) if (at && names.includes(name)) values.set(view(slots[name]));
      },
    };
  }

  /** Posts `job` to the ready workers, takes units on this thread, waits for the rest; throws what a unit threw. */
  #share(job: AttentionJob, gemm: Gemm, fast: WasmElementwise | null): void {
    // The workers' products run at one BLAS thread, as this thread's do (a product split across the library's own
    // threads from two callers at once would contend for them).
    if (gemm.library) applyBlasThreads(gemm.library, 1);
    for (const [i, worker] of this.#workers!.entries()) if (Atomics.load(this.#ready, i) === 1) worker.postMessage(job);
    const own = runAttentionUnits(job, gemm, fast);
    const words = new Int32Array(job.control), total = unitCount(job);
    for (let done = Atomics.load(words, DONE); done < total; done = Atomics.load(words, DONE)) Atomics.wait(words, DONE, done);
    this.unitsOnWorkers += total - own.units;
    if (own.error) throw own.error;
    if (Atomics.load(words, FAILED) !== 0) {
      throw new ArtError("attention_worker_failed", "a CPU attention worker thread failed mid-call; set ART_CPU_THREADS=1 to compute on one thread, and report it");
    }
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
          `attention runs on the threads that started, fewer than the ${this.#count + 1} asked for (ART_CPU_THREADS)`);
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
