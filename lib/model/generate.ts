/**
 * Generation over the transformer: `decode` (one forward pass over mixed prefill/decode rows, then sampling on the
 * backend) and batched `generate` built on it: every request gets a KV slot, all prompts prefill in the first pass,
 * then one decode row per unfinished request per pass. (The server's continuous batcher, lib/serve/batcher.ts,
 * runs Transformer.forward and the backend's sampling itself, with its own slot bookkeeping.)
 *
 * Reproducibility: each request draws its sampling uniforms from its own seeded generator, one per sampled token,
 * so its tokens depend on its seed and prompt only, never on its batch-mates.
 */
import { setImmediate } from "node:timers";
import { ArtError } from "../core/errors.ts";
import { seededRandom } from "../core/random.ts";
import { type KvCache, type SamplingParams, allowedTokenMask } from "./backend.ts";
import type { LayerLoras } from "./lora.ts";
import type { Transformer } from "./transformer.ts";

export interface SamplingOptions {
  /** 0 = greedy. Default 1. */
  temperature?: number;
  /** Nucleus mass in (0, 1]. Default 1 (off). */
  topP?: number;
  /** Keep only the k most likely tokens; 0 = off (default). */
  topK?: number;
  /** Same seed, same prompt → same tokens. Default: a random seed. */
  seed?: number;
}

export interface TopLogprob {
  id: number;
  logprob: number;
}

/** One sequence's share of a decode pass. */
export interface DecodeSequence {
  slot: number;
  /** Position of tokens[0]: how many tokens of this slot are already in the cache. */
  startPosition: number;
  /** Tokens to feed: a prompt (or a chunk of one) when prefilling, the last sampled token when decoding. */
  tokens: number[];
  /** Sample a token after the last fed one; null just fills the cache (e.g. a prefill chunk). */
  sample: DecodeSampling | null;
}

export interface DecodeSampling {
  temperature: number;
  topP: number;
  topK: number;
  uniform: number;
  topLogprobs: number;
  /**
   * Constrained decoding: the only ids this row may produce (the backend masks the rest before the draw, greedy pick
   * and top alternatives; the returned logprob stays the raw model's). Absent or null: every token.
   */
  allowedTokens?: ArrayLike<number> | null;
}

export interface SampledToken {
  id: number;
  /** log p(id) under the model (raw log-softmax, temperature 1). */
  logprob: number;
  topLogprobs: TopLogprob[];
}

/**
 * One forward pass over all sequences' tokens as rows of one batch, then sampling for the sequences that ask.
 * Returns one entry per sequence (null where `sample` was null).
 */
export function decode(model: Transformer, cache: KvCache, sequences: DecodeSequence[], loras?: LayerLoras[]): (SampledToken | null)[] {
  const rowCount = sequences.reduce((n, s) => n + s.tokens.length, 0);
  const ids = new Int32Array(rowCount), slots = new Int32Array(rowCount), positions = new Int32Array(rowCount);
  const sampledRows: number[] = [];
  let row = 0;
  for (const seq of sequences) {
    if (seq.tokens.length === 0) throw new ArtError("bad_decode", `decode: the sequence in slot ${seq.slot} has no tokens to feed`);
    for (let t = 0; t < seq.tokens.length; t++, row++) {
      ids[row] = seq.tokens[t];
      slots[row] = seq.slot;
      positions[row] = seq.startPosition + t;
    }
    if (seq.sample) sampledRows.push(row - 1);
  }
  const logits = model.forward(ids, { slots, positions }, cache, Int32Array.from(sampledRows), loras);
  const wanting = sequences.filter((s) => s.sample !== null);
  try {
    if (wanting.length === 0) return sequences.map(() => null);
    const top = Math.max(...wanting.map((s) => s.sample!.topLogprobs));
    const params: SamplingParams = {
      temperature: Float32Array.from(wanting, (s) => s.sample!.temperature),
      topP: Float32Array.from(wanting, (s) => s.sample!.topP),
      topK: Int32Array.from(wanting, (s) => s.sample!.topK),
      uniforms: Float32Array.from(wanting, (s) => s.sample!.uniform),
      numTopLogprobs: top,
    };
    if (wanting.some((s) => s.sample!.allowedTokens)) {
      params.allowedTokens = allowedTokenMask(logits.shape[1], wanting.map((s) => s.sample!.allowedTokens ?? null));
    }
    const result = model.backend.sample(logits, params);
    let w = 0;
    return sequences.map((seq) => {
      if (!seq.sample) return null;
      const i = w++;
      const topLogprobs: TopLogprob[] = [];
      for (let t = 0; t < seq.sample.topLogprobs; t++) {
        topLogprobs.push({ id: result.topIds[i * top + t], logprob: result.topLogprobs[i * top + t] });
      }
      return { id: result.ids[i], logprob: result.logprobs[i], topLogprobs };
    });
  } finally {
    model.backend.free(logits);
  }
}

export interface GenerateRequest extends SamplingOptions {
  promptIds: number[];
  /** Most tokens to generate. Default 256. */
  maxTokens?: number;
  /** Ids that end generation (included in tokenIds). Default: the model's eos ids. */
  stopIds?: number[];
  /** Strings that end generation; the text is cut before the stop string. Needs a tokenizer. */
  stop?: string[];
  /** Alternatives to return per generated token, with logprobs. Default 0. */
  topLogprobs?: number;
  /** Streaming: called once per generated token, in order; `text` is the newly final text (stop strings held back). */
  onToken?: (token: GeneratedToken) => void;
  /** Ends this request after its current token (finishReason "abort"); the rest of the batch goes on. */
  signal?: AbortSignal;
}

export interface GeneratedToken extends SampledToken {
  text: string;
}

export interface GenerateResult {
  tokenIds: number[];
  logprobs: number[];
  topLogprobs: TopLogprob[][];
  /** Decoded text (special tokens skipped); "" without a tokenizer. */
  text: string;
  finishReason: "stop" | "length" | "abort";
}

/** What generation needs of a tokenizer: incremental decoding (the Tokenizer of ./tokenizer.ts has it). */
export interface StreamDecoding {
  createStreamDecoder(options?: { skipSpecialTokens?: boolean }): { push(id: number): string; flush(): string };
}

export interface GenerateOptions {
  tokenizer?: StreamDecoding;
  /** Default stop ids for requests that name none. */
  eosTokenIds?: number[];
  loras?: LayerLoras[];
}

function checkSampling(r: GenerateRequest, index: number): void {
  const bad = (what: string) => {
    throw new ArtError("bad_sampling", `generate: request ${index} has ${what}`);
  };
  if (r.temperature !== undefined && !(r.temperature >= 0 && Number.isFinite(r.temperature))) bad(`temperature ${r.temperature}; use a finite number >= 0 (0 = greedy)`);
  if (r.topP !== undefined && !(r.topP > 0 && r.topP <= 1)) bad(`topP ${r.topP}; use a number in (0, 1]`);
  if (r.topK !== undefined && !(Number.isInteger(r.topK) && r.topK >= 0)) bad(`topK ${r.topK}; use an integer >= 0 (0 = off)`);
  if (r.maxTokens !== undefined && !(Number.isInteger(r.maxTokens) && r.maxTokens >= 1)) bad(`maxTokens ${r.maxTokens}; use an integer >= 1`);
  if (r.topLogprobs !== undefined && !(Number.isInteger(r.topLogprobs) && r.topLogprobs >= 0)) bad(`topLogprobs ${r.topLogprobs}; use an integer >= 0`);
}

/** Per-request state while generating. */
class Sequence {
  readonly result: GenerateResult = { tokenIds: [], logprobs: [], topLogprobs: [], text: "", finishReason: "length" };
  done = false;
  private emitted = 0;
  private readonly nextUniform: () => number;
  private readonly decoder: ReturnType<StreamDecoding["createStreamDecoder"]> | null;
  private readonly holdBack: number;
  readonly request: GenerateRequest;
  readonly stopIds: Set<number>;
  readonly maxTokens: number;

  constructor(request: GenerateRequest, options: GenerateOptions, index: number) {
    checkSampling(request, index);
    this.request = request;
    this.stopIds = new Set(request.stopIds ?? options.eosTokenIds ?? []);
    this.maxTokens = request.maxTokens ?? 256;
    this.nextUniform = seededRandom(request.seed ?? Math.floor(Math.random() * 2 ** 32));
    this.decoder = options.tokenizer?.createStreamDecoder({ skipSpecialTokens: true }) ?? null;
    if (request.stop?.length && !this.decoder) {
      throw new ArtError("no_tokenizer", "generate: stop strings need a tokenizer to decode text; pass options.tokenizer or use stopIds");
    }
    // Text that could still become the start of a stop string is not streamed yet.
    this.holdBack = Math.max(0, ...(request.stop ?? []).map((s) => s.length - 1));
  }

  samplingRow(): DecodeSampling {
    const r = this.request;
    return { temperature: r.temperature ?? 1, topP: r.topP ?? 1, topK: r.topK ?? 0, uniform: this.nextUniform(), topLogprobs: r.topLogprobs ?? 0 };
  }

  accept(token: SampledToken): void {
    const result = this.result;
    result.tokenIds.push(token.id);
    result.logprobs.push(token.logprob);
    result.topLogprobs.push(token.topLogprobs);
    if (this.decoder) result.text += this.decoder.push(token.id);
    if (this.stopIds.has(token.id)) this.finish("stop", true);
    else if (this.cutAtStopString()) this.finish("stop", false);
    else if (result.tokenIds.length >= this.maxTokens) this.finish("length", true);
    const releasable = this.done ? result.text.length : Math.max(this.emitted, result.text.length - this.holdBack);
    const text = result.text.slice(this.emitted, releasable);
    this.emitted = releasable;
    this.request.onToken?.({ ...token, text });
  }

  /** Before the next pass: an aborted request finishes with what it has (its stream already received every token). */
  stopIfAborted(): boolean {
    if (!this.done && this.request.signal?.aborted) this.finish("abort", false);
    return this.done;
  }

  private cutAtStopString(): boolean {
    const text = this.result.text;
    let cut = -1;
    for (const stop of this.request.stop ?? []) {
      const at = text.indexOf(stop, Math.max(0, this.emitted - stop.length));
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut < 0) return false;
    this.result.text = text.slice(0, cut);
    return true;
  }

  /** `flush`: emit bytes the decoder still holds (not after a stop string, whose text is cut). */
  private finish(reason: GenerateResult["finishReason"], flush: boolean): void {
    this.done = true;
    this.result.finishReason = reason;
    if (flush && this.decoder) this.result.text += this.decoder.flush();
  }
}

/** Batched generation: all prompts prefill in one pass, then the unfinished sequences decode together. */
export async function generate(model: Transformer, requests: GenerateRequest[], options: GenerateOptions = {}): Promise<GenerateResult[]> {
  const sequences = requests.map((r, i) => {
    if (r.promptIds.length === 0) throw new ArtError("empty_prompt", `generate: request ${i} has an empty prompt`);
    return new Sequence(r, options, i);
  });
  if (sequences.length === 0) return [];
  const limit = model.config.maxPositionEmbeddings;
  const maxPositions = Math.max(...sequences.map((s) => s.request.promptIds.length + s.maxTokens));
  if (maxPositions > limit) {
    throw new ArtError("too_long", `generate: prompt + maxTokens reaches ${maxPositions} positions; the model allows ${limit}`);
  }
  const cache = model.createKvCache(sequences.length, maxPositions);
  try {
    let batch: DecodeSequence[] = sequences.map((s, slot) => ({
      slot, startPosition: 0, tokens: s.request.promptIds, sample: s.samplingRow(),
    }));
    while (batch.length > 0) {
      const sampled = decode(model, cache, batch, options.loras);
      batch.forEach((row, i) => sequences[row.slot].accept(sampled[i]!));
      batch = batch.filter((row) => !sequences[row.slot].stopIfAborted()).map((row) => {
        const s = sequences[row.slot];
        return { slot: row.slot, startPosition: row.startPosition + row.tokens.length, tokens: [s.result.tokenIds.at(-1)!], sample: s.samplingRow() };
      });
      // Let stream consumers and other tasks run between passes.
      await new Promise((resolve) => setImmediate(resolve));
    }
    return sequences.map((s) => s.result);
  } finally {
    cache.free();
  }
}
