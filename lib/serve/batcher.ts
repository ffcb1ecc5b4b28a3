/**
 * Continuous batching over the transformer's forward pass: every pass runs one forward over the rows of all
 * running sequences — whole (or chunked) prompts of sequences that just joined, one token of each decoding
 * sequence — then samples one token per sequence that needs one. Sequences join between passes as KV slots
 * free up and leave as soon as they finish or their client goes away.
 *
 * Reproducibility: each sequence draws its sampling uniforms from its own generator, seeded by the request,
 * one draw per token; and a row's forward does not depend on the other rows of the batch (the kernels compute
 * rows independently). So a seeded request gives the same tokens alone or among others.
 *
 * Back-pressure: at most `maxQueued` sequences wait for a slot (beyond those a free slot will take); beyond that `submit` refuses with a 429
 * (OpenAI clients retry those with back-off), so memory stays bounded under any load.
 *
 * Weights: sequences name their LoRA (null = the base model). The transformer takes one LoRA set per forward,
 * so a pass batches the sequences of one weights choice, rotating between choices that have work.
 *
 * Shared prompts: a sequence whose prompt starts like another's (the n choices of a request, a GRPO group's
 * identical requests, a multi-turn rollout's next turn) takes the keys and values of that prefix from the slot that
 * holds them — in place when it is a free slot, by a KV-slot copy from a running sequence once that one has
 * prefilled the prefix — so a group's prompt is prefilled once.
 */
import { setImmediate } from "node:timers";
import { type Backend, type KvCache, type SampleResult, type SamplingParams, type Tensor, allowedTokenMask } from "../model/backend.ts";
import { seededRandom } from "../core/random.ts";
import type { SampledToken, TopLogprob } from "../model/generate.ts";
import type { LayerLoras } from "../model/lora.ts";
import type { Transformer } from "../model/transformer.ts";
import { ArtError } from "../core/errors.ts";
import { ApiError } from "./api-error.ts";
import type { JsonConstraint } from "./token-mask.ts";

/** The engine's sampled token; for constrained sequences `topLogprobs` lists the most likely allowed tokens. */
export type { SampledToken } from "../model/generate.ts";

export interface SequenceSpec {
  promptIds: readonly number[];
  maxTokens: number;
  /** 0 = greedy. */
  temperature: number;
  topP: number;
  /** Seeds this sequence's sampling; the same seed gives the same tokens. */
  seed: number;
  numTopLogprobs: number;
  stopTokenIds: readonly number[];
  constraint: JsonConstraint | null;
  loras: LayerLoras[] | null;
  signal?: AbortSignal;
  /** Called with each token as it is sampled; returning true ends the sequence (a stop string matched). */
  onToken?: (token: SampledToken) => boolean;
}

export type FinishReason = "stop" | "length";

export interface SequenceResult {
  tokens: SampledToken[];
  finishReason: FinishReason;
}

export interface BatcherOptions {
  /**
   * Sequences decoded at once (KV-cache slots). Default: where the backend knows its free memory (CUDA), as many as
   * `kvCacheMemory` of it holds at `maxPositions`, at most 256; else (the CPU) 32.
   */
  numSlots?: number;
  /**
   * The share of the backend's available memory (after the weights are loaded) the KV cache may take when numSlots is
   * not given; default 0.5, leaving the rest to training's activations and optimizer state in the same process.
   */
  kvCacheMemory?: number;
  /** Positions per slot: the longest prompt + completion served. */
  maxPositions?: number;
  /** Sequences that may wait for a slot before submit answers 429. */
  maxQueued?: number;
  /** Prompt tokens prefilled per pass over all joining sequences (long prompts are chunked across passes). */
  maxPrefillTokens?: number;
  /** Reuse (or copy from another slot) cached keys and values for a prompt that starts with the same ids. Default true. */
  reusePrefixes?: boolean;
}

export interface BatcherStats {
  /** Forward passes run. */
  passes: number;
  /** Rows (tokens) through those passes. */
  rows: number;
  /** Of those rows, prompt tokens (prefill; a reused prompt's last token is fed again, for its logits). */
  promptRows: number;
  /** Tokens sampled. */
  sampled: number;
  /** Prompt tokens not prefilled because a slot already held them or they were copied from another slot. */
  reusedTokens: number;
  /** Of those, prompt tokens copied from another sequence's slot (copyKvSlot). */
  copiedTokens: number;
  /**
   * Seconds with a pass in flight: from admitting its sequences until its sampled tokens are taken (on a GPU, the ids
   * back), the event loop's turn while the device computes included. Over the wall time it is how busy the engine was
   * kept; the rest is waiting for requests, or host work that no pass overlapped.
   */
  passSeconds: number;
}

interface Sequence {
  spec: SequenceSpec;
  slot: number;
  /** Prompt + sampled ids; positions below `cached` are in the KV cache. */
  ids: number[];
  cached: number;
  /** While set, the sequence waits for `from` to have cached its first `length` ids, then copies them. */
  prefixSource: { from: Sequence; length: number } | null;
  /** The weights generation its keys and values were computed with (see `resume`). */
  generation: number;
  tokens: SampledToken[];
  random: () => number;
  resolve: (result: SequenceResult) => void;
  reject: (error: unknown) => void;
  onAbort: (() => void) | null;
}

/** The most slots sized from memory: a decode pass of this many rows already keeps a GPU's bandwidth busy. */
export const MAX_MEMORY_SIZED_SLOTS = 256;

const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(2)} GiB`;

/**
 * The KV-cache slots of a batcher: options.numSlots, checked against the backend's available memory where it knows
 * it, or as many as options.kvCacheMemory of that memory holds at `maxPositions` (at most MAX_MEMORY_SIZED_SLOTS);
 * 32 where the backend cannot say (the CPU). Throws an ArtError naming the options to change when none fit.
 */
export function kvCacheSlots(transformer: Transformer, maxPositions: number, options: BatcherOptions = {}): number {
  const share = options.kvCacheMemory ?? 0.5;
  if (!(share > 0 && share <= 1)) {
    throw new ArtError("bad_option", `batcher.kvCacheMemory must be a share of available memory in (0, 1], got ${share}`);
  }
  if (options.numSlots !== undefined && !(Number.isInteger(options.numSlots) && options.numSlots >= 1)) {
    throw new ArtError("bad_option", `batcher.numSlots must be a positive integer, got ${options.numSlots}`);
  }
  const available = transformer.backend.availableMemory?.();
  if (available === undefined) return options.numSlots ?? 32;
  const { numLayers, numKvHeads, headDim } = transformer.config;
  const slotBytes = transformer.backend.kvCacheBytes({ numLayers, numKvHeads, headDim, numSlots: 1, maxPositions });
  if (options.numSlots !== undefined) {
    if (options.numSlots * slotBytes > available) {
      throw new ArtError("kv_cache_memory", `a KV cache of ${options.numSlots} slots × ${maxPositions} positions takes ` +
        `${gib(options.numSlots * slotBytes)}, more than the ${gib(available)} available: lower batcher.numSlots (art-ts serve ` +
        `--slots) or batcher.maxPositions (--context), or leave numSlots out to size the cache from free memory`);
    }
    return options.numSlots;
  }
  const slots = Math.min(MAX_MEMORY_SIZED_SLOTS, Math.floor((share * available) / slotBytes));
  if (slots < 1) {
    throw new ArtError("kv_cache_memory", `one KV-cache slot of ${maxPositions} positions takes ${gib(slotBytes)}, more than ` +
      `${share} of the ${gib(available)} available: lower batcher.maxPositions (art-ts serve --context) or raise ` +
      `batcher.kvCacheMemory (--kv-memory)`);
  }
  return slots;
}

export class Batcher {
  readonly numSlots: number;
  readonly maxPositions: number;
  readonly maxQueued: number;
  readonly maxPrefillTokens: number;
  readonly stats: BatcherStats = { passes: 0, rows: 0, promptRows: 0, sampled: 0, reusedTokens: 0, copiedTokens: 0, passSeconds: 0 };

  private readonly transformer: Transformer;
  private readonly backend: Backend;
  private readonly cache: KvCache;
  private readonly queue: Sequence[] = [];
  private readonly running: Sequence[] = [];
  private readonly freeSlots: number[];
  /** What the KV cache of each free slot holds (ids at positions 0..n-1, computed with these LoRAs). */
  private readonly slotContents = new Map<number, { ids: number[]; loras: LayerLoras[] | null }>();
  private readonly reusePrefixes: boolean;
  private loop: Promise<void> | null = null;
  private paused: { resumed: Promise<void>; resume: () => void } | null = null;
  private passDone: Promise<void> = Promise.resolve();
  private lastLoras: LayerLoras[] | null | undefined = undefined;
  /** Bumped by `resume`: keys and values of an earlier generation may come from other weights. */
  private generation = 0;
  private closed = false;

  constructor(transformer: Transformer, options: BatcherOptions = {}) {
    this.transformer = transformer;
    this.backend = transformer.backend;
    this.maxPositions = Math.min(options.maxPositions ?? 4096, transformer.config.maxPositionEmbeddings);
    this.numSlots = kvCacheSlots(transformer, this.maxPositions, options);
    this.maxQueued = options.maxQueued ?? 1024;
    this.maxPrefillTokens = options.maxPrefillTokens ?? 2048;
    this.reusePrefixes = options.reusePrefixes ?? true;
    this.cache = transformer.createKvCache(this.numSlots, this.maxPositions);
    this.freeSlots = Array.from({ length: this.numSlots }, (_, i) => this.numSlots - 1 - i);
  }

  /** Sequences running or waiting. */
  get load(): { running: number; queued: number } {
    return { running: this.running.length, queued: this.queue.length };
  }

  /** Runs one sequence to its end. Rejects with ApiError 429 when the queue is full, or the signal's reason on abort. */
  submit(spec: SequenceSpec): Promise<SequenceResult> {
    if (this.closed) return Promise.reject(new ApiError(503, "the model server is closed", "server_error", null, "server_closed"));
    if (spec.promptIds.length + spec.maxTokens > this.maxPositions) {
      return Promise.reject(ApiError.contextLength(this.maxPositions, spec.promptIds.length, spec.maxTokens));
    }
    if (this.queue.length >= this.maxQueued + this.freeSlots.length) {
      return Promise.reject(new ApiError(429, `the server is at capacity (${this.running.length} running, ${this.queue.length} queued); retry later`, "rate_limit_error", null, "queue_full"));
    }
    if (spec.signal?.aborted) return Promise.reject(spec.signal.reason);
    return new Promise<SequenceResult>((resolve, reject) => {
      const sequence: Sequence = {
        spec, slot: -1, ids: [...spec.promptIds], cached: 0, prefixSource: null, generation: -1, tokens: [], random: seededRandom(spec.seed), resolve, reject, onAbort: null,
      };
      if (spec.signal) {
        sequence.onAbort = () => this.abort(sequence);
        spec.signal.addEventListener("abort", sequence.onAbort, { once: true });
      }
      this.queue.push(sequence);
      this.loop ??= this.run();
    });
  }

  /** Stops starting forward passes (e.g. to train); resolves once the pass in flight has finished. */
  async pause(): Promise<void> {
    if (!this.paused) {
      let resume!: () => void;
      const resumed = new Promise<void>((r) => (resume = r));
      this.paused = { resumed, resume };
    }
    await this.passDone;
  }

  /**
   * Goes on after pause. Kept prompt prefixes are dropped and running sequences stop being prefix sources: the
   * weights may have changed meanwhile (training).
   */
  resume(): void {
    this.slotContents.clear();
    this.generation++;
    const paused = this.paused;
    this.paused = null;
    paused?.resume();
  }

  get isPaused(): boolean {
    return this.paused !== null;
  }

  /** Refuses new work, fails what is pending, frees the KV cache once the loop has stopped. */
  async close(): Promise<void> {
    this.closed = true;
    const error = new ApiError(503, "the model server closed while this request was pending", "server_error", null, "server_closed");
    for (const sequence of [...this.queue, ...this.running]) this.finish(sequence, error);
    this.resume();
    await this.loop;
    this.cache.free();
  }

  private abort(sequence: Sequence): void {
    this.finish(sequence, sequence.spec.signal!.reason);
  }

  /**
   * Removes a sequence wherever it is, frees its slot, settles its promise. The slot remembers the ids whose keys
   * and values it holds, for a later prompt that starts the same way — unless a failed pass may have left them
   * half written (`cacheValid` false). Sequences waiting to copy a prefix from it copy what it has now, before
   * its slot can be reused.
   */
  private finish(sequence: Sequence, outcome: FinishReason | unknown, cacheValid = true): void {
    const queued = this.queue.indexOf(sequence);
    if (queued >= 0) this.queue.splice(queued, 1);
    const running = this.running.indexOf(sequence);
    if (running >= 0) {
      this.running.splice(running, 1);
      for (const waiting of this.running) {
        if (waiting.prefixSource?.from !== sequence) continue;
        if (cacheValid) this.copyPrefix(waiting);
        else waiting.prefixSource = null;
      }
      this.freeSlots.push(sequence.slot);
      if (cacheValid) this.slotContents.set(sequence.slot, { ids: sequence.ids.slice(0, sequence.cached), loras: sequence.spec.loras });
      else this.slotContents.delete(sequence.slot);
    }
    if (queued < 0 && running < 0) return; // already finished
    if (sequence.onAbort) sequence.spec.signal!.removeEventListener("abort", sequence.onAbort);
    if (outcome === "stop" || outcome === "length") sequence.resolve({ tokens: sequence.tokens, finishReason: outcome });
    else sequence.reject(outcome);
  }

  /**
   * The loop. Where the backend samples in two halves (CUDA), each pass is launched, then the event loop runs while
   * the device computes it (requests arrive, are templated and tokenized, finished ones are answered: host work that
   * would otherwise leave the GPU idle), then the pass's tokens are taken. Where a pass computes on this thread (the
   * CPU), nothing could overlap it: the event loop runs between passes, so an answer's follow-up request (a rollout's
   * next turn) joins the very next pass.
   */
  private async run(): Promise<void> {
    const overlap = this.backend.startSample !== undefined;
    // Requests submitted together (a group's rollouts) start in one pass.
    await yieldToEventLoop();
    while (this.queue.length > 0 || this.running.length > 0) {
      if (this.paused) {
        await this.paused.resumed;
        continue;
      }
      let done!: () => void;
      this.passDone = new Promise<void>((resolve) => (done = resolve));
      let launched: LaunchedPass | null = null;
      const started = performance.now();
      try {
        launched = this.launchPass();
        if (overlap) await yieldToEventLoop();
        if (launched) this.completePass(launched);
      } catch (error) {
        // A failing forward fails the sequences in it, never the server; what its slots hold may be half written.
        if (launched) for (const slot of launched.slots) this.slotContents.delete(slot);
        for (const sequence of [...this.running]) this.finish(sequence, error, false);
      } finally {
        if (launched) this.stats.passSeconds += (performance.now() - started) / 1000;
        done();
      }
      if (!overlap) await yieldToEventLoop();
    }
    // Cleared in the same turn as the last check (not in a later .finally): a sequence submitted by whoever the
    // last pass resolved must start a new loop, not join this ending one.
    this.loop = null;
  }

  /** Admits waiting sequences, queues one forward over the rows of a weights choice and the sampling of its last rows. */
  private launchPass(): LaunchedPass | null {
    while (this.freeSlots.length > 0 && this.queue.length > 0) this.admit(this.queue.shift()!);
    // Copies first, before this pass's rows advance `cached`: a source's prefix must be written by an earlier pass.
    for (const sequence of this.running) {
      const source = sequence.prefixSource;
      if (source && source.from.cached >= source.length) this.copyPrefix(sequence);
    }
    const loras = this.nextLoras();
    const ids: number[] = [], slots: number[] = [], positions: number[] = [];
    const logitRows: number[] = [];
    const sampling: Sequence[] = [];
    let prefillLeft = this.maxPrefillTokens;
    for (const sequence of this.running) {
      if (sequence.spec.loras !== loras || sequence.prefixSource) continue;
      const pending = sequence.ids.length - sequence.cached;
      const prefilling = pending > 1;
      const take = prefilling ? Math.min(pending, prefillLeft) : pending;
      if (take === 0) continue;
      if (prefilling) prefillLeft -= take;
      for (let p = sequence.cached; p < sequence.cached + take; p++) {
        ids.push(sequence.ids[p]);
        slots.push(sequence.slot);
        positions.push(p);
        if (p < sequence.spec.promptIds.length) this.stats.promptRows++;
      }
      sequence.cached += take;
      if (sequence.cached === sequence.ids.length) {
        logitRows.push(ids.length - 1);
        sampling.push(sequence);
      }
    }
    if (ids.length === 0) return null;
    const logits = this.transformer.forward(
      Int32Array.from(ids), { slots: Int32Array.from(slots), positions: Int32Array.from(positions) }, this.cache, Int32Array.from(logitRows), loras ?? undefined,
    );
    this.stats.passes++;
    this.stats.rows += ids.length;
    try {
      const sampled = sampling.length > 0 ? this.startSampling(logits, sampling) : null;
      return { logits, slots, sampling, sampled };
    } catch (error) {
      this.backend.free(logits);
      throw error;
    }
  }

  /** Takes a launched pass's tokens (waiting for the device) and frees its logits. */
  private completePass(pass: LaunchedPass): void {
    try {
      if (pass.sampled) this.advanceAll(pass.sampling, pass.sampled.numTop, pass.sampled.result());
    } finally {
      this.backend.free(pass.logits);
    }
  }

  /**
   * Gives a waiting sequence a free slot and skips the longest prefix of its prompt that is already computed (same
   * weights only): a multi-turn rollout's next prompt starts with the previous turn's prompt and answer, a group's
   * rollouts and a request's n choices share their prompt. The prefix comes from the free slot whose cached ids
   * share the most (the sequence takes that slot, nothing to copy), or, when a running sequence shares more (its
   * ids, cached or about to be prefilled), from that sequence's slot by a copy once it has cached them. At least the
   * last prompt token is fed again, for its logits. Keys and values depend only on ids and positions, so reuse gives
   * the same tokens as a fresh prefill.
   */
  private admit(sequence: Sequence): void {
    const reusable = sequence.ids.length - 1;
    // Without a prefix to reuse, the least recently freed slot: a turn that just ended keeps its prefix longest.
    let best = 0;
    let bestLength = 0;
    let source: Sequence | null = null;
    let sourceLength = 0;
    if (this.reusePrefixes) {
      this.freeSlots.forEach((slot, index) => {
        const contents = this.slotContents.get(slot);
        if (!contents || contents.loras !== sequence.spec.loras) return;
        const length = Math.min(commonPrefixLength(contents.ids, sequence.ids), reusable);
        if (length > bestLength) [best, bestLength] = [index, length];
      });
      for (const other of this.running) {
        if (other.spec.loras !== sequence.spec.loras || other.generation !== this.generation) continue;
        const length = Math.min(commonPrefixLength(other.ids, sequence.ids), reusable);
        if (length > Math.max(bestLength, sourceLength)) [source, sourceLength] = [other, length];
      }
    }
    sequence.slot = this.freeSlots.splice(best, 1)[0];
    this.slotContents.delete(sequence.slot);
    sequence.cached = bestLength;
    sequence.generation = this.generation;
    this.stats.reusedTokens += bestLength;
    if (source) sequence.prefixSource = { from: source, length: sourceLength };
    this.running.push(sequence);
  }

  /** Takes what the prefix source has cached of the shared prefix into this sequence's slot, and stops waiting. */
  private copyPrefix(sequence: Sequence): void {
    const { from, length } = sequence.prefixSource!;
    sequence.prefixSource = null;
    const count = Math.min(from.cached, length);
    if (count <= sequence.cached) return;
    this.backend.copyKvSlot(this.cache, from.slot, sequence.slot, count);
    this.stats.reusedTokens += count - sequence.cached;
    this.stats.copiedTokens += count - sequence.cached;
    sequence.cached = count;
  }

  /** The LoRA set of this pass: the one of the longest-running sequence that differs from the last pass's, if any. */
  private nextLoras(): LayerLoras[] | null {
    const choices = [...new Set(this.running.map((s) => s.spec.loras))];
    const next = choices.length > 1 ? choices.find((c) => c !== this.lastLoras)! : choices[0] ?? null;
    this.lastLoras = next;
    return next;
  }

  /** Queues the sampling of one token per sequence in `sampling` (one logits row each, in order). */
  private startSampling(logits: Tensor, sampling: Sequence[]): { numTop: number; result: () => SampleResult } {
    const n = sampling.length;
    const numTop = Math.max(...sampling.map((s) => s.spec.numTopLogprobs));
    const params: SamplingParams = {
      temperature: Float32Array.from(sampling, (s) => s.spec.temperature),
      topP: Float32Array.from(sampling, (s) => s.spec.topP),
      topK: new Int32Array(n),
      uniforms: Float32Array.from(sampling, (s) => s.random()),
      numTopLogprobs: numTop,
    };
    // Constrained rows sample on the backend under an allowed-token mask (logprobs stay the raw model's; top
    // alternatives list the most likely allowed tokens); unconstrained rows allow every token.
    if (sampling.some((s) => s.spec.constraint !== null)) {
      const allowed = sampling.map((sequence) => {
        const constraint = sequence.spec.constraint;
        if (!constraint) return null;
        try {
          return constraint.allowed(sequence.spec.maxTokens - sequence.tokens.length);
        } catch (error) {
          this.finish(sequence, error); // its row is sampled unmasked and dropped when the pass completes
          return null;
        }
      });
      params.allowedTokens = allowedTokenMask(logits.shape[1], allowed);
    }
    if (this.backend.startSample) return { numTop, result: this.backend.startSample(logits, params) };
    const result = this.backend.sample(logits, params);
    return { numTop, result: () => result };
  }

  /** Gives each sequence its sampled token; one that left meanwhile (finished, aborted) is skipped. */
  private advanceAll(sampling: Sequence[], numTop: number, result: SampleResult): void {
    this.stats.sampled += sampling.length;
    sampling.forEach((sequence, row) => {
      if (!this.running.includes(sequence)) return;
      const topLogprobs: TopLogprob[] = [];
      for (let t = 0; t < sequence.spec.numTopLogprobs; t++) {
        topLogprobs.push({ id: result.topIds[row * numTop + t], logprob: result.topLogprobs[row * numTop + t] });
      }
      const token: SampledToken = { id: result.ids[row], logprob: result.logprobs[row], topLogprobs };
      try {
        this.advance(sequence, token);
      } catch (error) {
        this.finish(sequence, error); // one sequence's failure (its callback, its constraint) is its own
      }
    });
  }

  private advance(sequence: Sequence, token: SampledToken): void {
    const { spec } = sequence;
    sequence.tokens.push(token);
    sequence.ids.push(token.id);
    spec.constraint?.accept(token.id);
    const stopString = spec.onToken?.(token) ?? false;
    if (stopString || spec.stopTokenIds.includes(token.id)) this.finish(sequence, "stop");
    else if (sequence.tokens.length >= spec.maxTokens) this.finish(sequence, "length");
  }
}

/** A pass whose forward and sampling are queued: what completing it needs. */
interface LaunchedPass {
  logits: Tensor;
  /** The KV slot of each of its rows (a slot once per row it writes). */
  slots: number[];
  sampling: Sequence[];
  sampled: { numTop: number; result: () => SampleResult } | null;
}

/** One turn of the event loop (after pending I/O callbacks). */
function yieldToEventLoop(): Promise<void> {
  return new Promise<void>((resolve) => setImmediate(resolve));
}

function commonPrefixLength(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}
