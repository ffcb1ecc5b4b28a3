/**
 * Decode passes as CUDA graphs. One decode pass of a 24-layer model is ~370 kernel launches and ~170 cuBLAS calls;
 * queued one by one from JavaScript they took ~4.5 ms of host time on an H100 while the GPU needed a fraction of
 * that. A graph records the pass's work once and replays it with one launch (1.4-1.6x faster at 0.5B: docs/cuda.md).
 *
 * What a replay needs to be the same computation as the pass recorded:
 * - Inputs at fixed addresses. The pass's ids, slots and positions are the only values that change from pass to
 *   pass; they live in a buffer of the graph's own, rewritten (one upload) before each replay. Every other index
 *   array the pass uploads (attention tiles) is fixed for the graph's key and uploaded once, after the recording.
 * - The same launches. The key holds everything the host's launch decisions depend on: the owner (weights), the KV
 *   cache, the row count, the attention's key window (attentionKeyWindow: splits are planned per window) and the
 *   owner's own key (its LoRA set).
 * - Memory no one else writes. Intermediates and the logits come from an arena: a pool stacked on the main pool,
 *   used only while recording. All graphs share it, since they never run at the same time and no intermediate
 *   outlives its pass; the logits do outlive it, until the caller frees them. So a graph is replayed (or recorded)
 *   only while no arena block is handed out, and its logits block is claimed back from the arena for the caller.
 *   Otherwise the pass runs eagerly, which is always correct.
 *
 * A key is recorded the second time it is seen (a one-off shape is not worth a recording); at most `maxGraphs`
 * graphs are kept, least recently used first out. If recording, a first run or a replay ever fails, graphs are
 * switched off for the backend with a logged reason, and that pass and every later one run eagerly.
 */
import { ArtError } from "../core/errors.ts";
import type { DecodePass, KvCacheSpec, Tensor } from "../model/backend.ts";
import { attentionKeyWindow, checkRowsInCache } from "./attention-plan.ts";
import { MemoryPool } from "./memory-pool.ts";

/** An index array uploaded during a recording, written to its device copy once the recording has ended. */
export interface DeferredUpload {
  address: bigint;
  data: Int32Array;
}

/** What the graphs need of the backend and its device. */
export interface GraphHost {
  readonly pool: MemoryPool;
  upload(destination: bigint, data: Int32Array): void;
  launchGraph(graph: bigint): void;
  destroyGraph(graph: bigint): void;
  /**
   * Runs `run` with the stream captured: transient memory from `arena`, the `inputs` arrays read from their fixed
   * device addresses, any other index array uploaded after the capture (`deferred`). Ends the capture whatever
   * happens; throws what failed after releasing what it made.
   */
  record(run: () => Tensor, inputs: Map<Int32Array, bigint>, arena: MemoryPool):
    { graph: bigint; output: Tensor & { address: bigint }; deferred: DeferredUpload[] };
  /** A tensor handle for the recorded output block (a replay's logits). */
  outputTensor(shape: readonly number[], address: bigint): Tensor;
  /** The cache's identity and shape (throws for a foreign cache). */
  kvCache(cache: DecodePass["cache"]): { id: number; spec: KvCacheSpec };
}

interface Graph {
  graph: bigint;
  owner: number;
  cache: number;
  /** ids | slots | positions, int32, 3 × rows. */
  inputs: bigint;
  constants: bigint[];
  output: bigint;
  outputShape: readonly number[];
  outputBytes: number;
}

export interface DecodeGraphStats {
  /** Passes recorded into a graph (each also ran once, by its first replay). */
  recorded: number;
  replayed: number;
  /** Decode passes that ran eagerly: first sightings, or an earlier pass's logits still held. */
  eager: number;
  /** Graphs kept now. */
  graphs: number;
  /** Why graphs were switched off, or null. */
  disabled: string | null;
}

const maxGraphs = 64;
const maxRemembered = 1024;

export class DecodeGraphs {
  readonly arena: MemoryPool;
  readonly #host: GraphHost;
  readonly #log: (message: string) => void;
  /** Insertion order is recency: a replayed graph moves to the end, eviction takes the first. */
  readonly #graphs = new Map<string, Graph>();
  readonly #seen = new Set<string>();
  readonly #ownerIds = new WeakMap<object, number>();
  #nextOwner = 1;
  #stats: DecodeGraphStats = { recorded: 0, replayed: 0, eager: 0, graphs: 0, disabled: null };

  constructor(host: GraphHost, log: (message: string) => void) {
    this.#host = host;
    this.#log = log;
    // Blocks come from the main pool and stay the arena's until no graph is left. Its allocator never answers
    // null, so the arena never trims itself on out-of-memory: its cached blocks are graphs' scratch. The main
    // pool's out-of-memory error fails the recording instead, which switches graphs off and frees everything.
    this.arena = new MemoryPool({ allocate: (bytes) => host.pool.allocate(bytes), release: (address) => host.pool.free(address) });
  }

  get enabled(): boolean {
    return this.#stats.disabled === null;
  }

  stats(): DecodeGraphStats {
    return { ...this.#stats, graphs: this.#graphs.size };
  }

  run(pass: DecodePass, run: () => Tensor): Tensor {
    if (!this.enabled) return run();
    const cache = this.#host.kvCache(pass.cache);
    // The attention's range checks, done here because a replay runs no op that would do them.
    const maxPosition = checkRowsInCache(cache.spec, pass.rows);
    const n = pass.ids.length;
    const key = [this.#ownerId(pass.owner), cache.id, n, attentionKeyWindow(maxPosition + 1, cache.spec.maxPositions), pass.key].join("|");
    // A logits block still handed out may be any graph's intermediate: no graph may run until it is back.
    if (this.arena.stats().inUseBytes > 0) return this.#eager(run);
    const graph = this.#graphs.get(key);
    if (graph) return this.#replay(key, graph, pass, run);
    if (!this.#seen.has(key)) {
      if (this.#seen.size >= maxRemembered) this.#seen.clear();
      this.#seen.add(key);
      return this.#eager(run);
    }
    return this.#record(key, pass, run, cache.id);
  }

  /** Drops the graphs that read this KV cache (it is being freed). */
  forgetCache(cacheId: number): void {
    this.#forget((graph) => graph.cache === cacheId);
  }

  /** Drops the graphs of this owner (its weights are being freed). */
  forgetOwner(owner: object): void {
    const id = this.#ownerIds.get(owner);
    if (id !== undefined) this.#forget((graph) => graph.owner === id);
  }

  /** Destroys every graph and gives the arena's memory back (backend dispose). */
  dispose(): void {
    this.#forget(() => true);
    this.arena.releaseAll();
  }

  #eager(run: () => Tensor): Tensor {
    this.#stats.eager++;
    return run();
  }

  #replay(key: string, graph: Graph, pass: DecodePass, run: () => Tensor): Tensor {
    if (!this.arena.claim(graph.output, graph.outputBytes)) {
      throw new ArtError("cuda_graph", "a recorded decode pass's logits block is not in the graph arena (an art-ts bug)");
    }
    this.#graphs.delete(key);
    this.#graphs.set(key, graph);
    try {
      this.#host.upload(graph.inputs, packInputs(pass));
      this.#host.launchGraph(graph.graph);
    } catch (error) {
      this.arena.free(graph.output);
      this.#disable(error, "replaying");
      return run();
    }
    this.#stats.replayed++;
    return this.#host.outputTensor(graph.outputShape, graph.output);
  }

  #record(key: string, pass: DecodePass, run: () => Tensor, cacheId: number): Tensor {
    const pool = this.#host.pool;
    const n = pass.ids.length;
    let inputs: bigint | null = null;
    let recorded: ReturnType<GraphHost["record"]>;
    try {
      inputs = pool.allocate(3 * n * 4);
      this.#host.upload(inputs, packInputs(pass));
      const addresses = new Map([[pass.ids, inputs], [pass.rows.slots, inputs + BigInt(4 * n)], [pass.rows.positions, inputs + BigInt(8 * n)]]);
      recorded = this.#host.record(run, addresses, this.arena);
    } catch (error) {
      if (inputs !== null) pool.free(inputs);
      this.#disable(error, "recording");
      return run();
    }
    const { output } = recorded;
    const graph: Graph = {
      graph: recorded.graph, owner: this.#ownerId(pass.owner), cache: cacheId, inputs,
      constants: recorded.deferred.map((upload) => upload.address), output: output.address, outputShape: output.shape,
      outputBytes: output.size * 4,
    };
    try {
      // The pass's constant index arrays, then the pass itself: recording ran nothing.
      for (const upload of recorded.deferred) this.#host.upload(upload.address, upload.data);
      this.#host.launchGraph(recorded.graph);
    } catch (error) {
      this.#destroy(graph);
      this.#disable(error, "running");
      return run();
    }
    this.#graphs.set(key, graph);
    this.#stats.recorded++;
    if (this.#graphs.size > maxGraphs) {
      const oldest = this.#graphs.keys().next().value!;
      this.#destroy(this.#graphs.get(oldest)!);
      this.#graphs.delete(oldest);
    }
    return output;
  }

  /** Graphs off for good: every graph destroyed and the arena's memory (a failed recording's too) given back. */
  #disable(error: unknown, doing: "recording" | "running" | "replaying"): void {
    const reason = error instanceof Error ? error.message : String(error);
    this.#stats.disabled = reason;
    this.#log(`art-ts cuda: CUDA graphs are off for this backend, decode passes run without them (slower): ${doing} one failed: ${reason}`);
    this.dispose();
  }

  #forget(which: (graph: Graph) => boolean): void {
    for (const [key, graph] of this.#graphs) {
      if (!which(graph)) continue;
      this.#destroy(graph);
      this.#graphs.delete(key);
    }
    // With no graph left nothing reads the arena's blocks between passes: give them back to the main pool.
    if (this.#graphs.size === 0) this.arena.trim();
  }

  #destroy(graph: Graph): void {
    // Stream-ordered: a replay still queued completes before its graph and buffers are reused.
    this.#host.destroyGraph(graph.graph);
    this.#host.pool.free(graph.inputs);
    for (const address of graph.constants) this.#host.pool.free(address);
  }

  #ownerId(owner: object): number {
    let id = this.#ownerIds.get(owner);
    if (id === undefined) this.#ownerIds.set(owner, (id = this.#nextOwner++));
    return id;
  }
}

/** ids | slots | positions of a pass, as one upload. */
function packInputs(pass: DecodePass): Int32Array {
  const n = pass.ids.length;
  const packed = new Int32Array(3 * n);
  packed.set(pass.ids, 0);
  packed.set(pass.rows.slots, n);
  packed.set(pass.rows.positions, 2 * n);
  return packed;
}
