/**
 * From a checkpoint directory or Hugging Face id to a model on a device: the device choice (CUDA when it works,
 * else the CPU, saying why), config.json, weights on that backend, the tokenizer, and the low-level CausalLM API
 * (logits, generate, streaming, decode passes for continuous batching). This sits above the engine (lib/model) and
 * the CUDA backend (lib/cuda), which know nothing of each other's choice.
 */
import { ArtError } from "../core/errors.ts";
import type { Message, Tool } from "../core/trajectory.ts";
import { createCudaBackend, cudaAvailability } from "../cuda/availability.ts";
import type { Backend, DType, KvCache } from "../model/backend.ts";
import type { ModelConfig } from "../model/config.ts";
import { CpuBackend } from "../model/cpu/backend.ts";
import {
  type DecodeSequence, type GenerateRequest, type GenerateResult, type GeneratedToken, type SampledToken, decode, generate,
} from "../model/generate.ts";
import type { LayerLoras } from "../model/lora.ts";
import { loadAdapter } from "../model/peft.ts";
import { resolveModelDir } from "../model/resolve.ts";
import { type Tokenizer, loadTokenizer } from "../model/tokenizer.ts";
import { type Transformer, loadTransformer, sequenceLogits } from "../model/transformer.ts";

export type Device = "cpu" | "cuda" | "auto";

export interface LoadOptions {
  /** "auto" picks CUDA when it is available, else the CPU (saying why). Default "auto". */
  device?: Device;
  /** How weights are stored on the backend. Default "bf16" on CUDA (half the bytes per decode pass), "f32" on the CPU. */
  dtype?: DType;
  /** A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors), applied unmerged to every call. */
  adapter?: string;
  /** Called with human-readable notes (the device chosen and why). Default: console.info. */
  log?: (message: string) => void;
}

/** A request to CausalLM.generate: a prompt as text (encoded with special tokens), token ids, or chat messages. */
export type CausalLMRequest = Omit<GenerateRequest, "promptIds"> &
  ({ prompt: string | number[] } | { messages: Message[]; tools?: Tool[] });

export interface CausalLM {
  config: ModelConfig;
  tokenizer: Tokenizer;
  backend: Backend;
  /** The transformer itself (weights, forward, KV caches), for decode passes and training. */
  model: Transformer;
  /** The LoRA of the `adapter` option (the default of every call below), or null. */
  adapter: LayerLoras[] | null;
  /** Logits of every position, [ids.length × vocab] row-major. */
  logits(ids: number[]): Promise<Float32Array>;
  /** Batched generation; stop ids default to the tokenizer's and config's eos ids. */
  generate(requests: CausalLMRequest[], options?: { loras?: LayerLoras[] }): Promise<GenerateResult[]>;
  /** One request's tokens as they are generated. */
  stream(request: CausalLMRequest): AsyncIterable<GeneratedToken>;
  /** Continuous batching: a KV cache of `numSlots` sequences, then `decode` passes over mixed prefill/decode rows. */
  createKvCache(numSlots: number, maxPositions: number): KvCache;
  decode(cache: KvCache, sequences: DecodeSequence[], loras?: LayerLoras[]): (SampledToken | null)[];
  /** Releases backend memory (weights). */
  free(): void;
}

function chooseBackend(device: Device, log: (message: string) => void): { backend: Backend; weights: DType } {
  if (device !== "cpu" && device !== "cuda" && device !== "auto") {
    throw new ArtError("bad_device", `device must be "cpu", "cuda" or "auto", got ${JSON.stringify(device)}`);
  }
  if (device === "auto") {
    const cuda = cudaAvailability();
    if (!cuda.ok) log(`art-ts: running on the CPU because ${cuda.reason}`);
    device = cuda.ok ? "cuda" : "cpu";
  }
  // createCudaBackend throws an ArtError with the reason when the GPU cannot be used.
  return device === "cuda" ? { backend: createCudaBackend({ log }), weights: "bf16" } : { backend: new CpuBackend(), weights: "f32" };
}

/** Loads a checkpoint (local directory or cached Hugging Face id) with its tokenizer onto a backend. */
export async function loadCausalLM(pathOrId: string, options: LoadOptions = {}): Promise<CausalLM> {
  const dir = resolveModelDir(pathOrId);
  const { backend, weights } = chooseBackend(options.device ?? "auto", options.log ?? console.info);
  const tokenizer = await loadTokenizer(dir);
  const model = loadTransformer(dir, backend, options.dtype ?? weights);
  const config = model.config;
  if (tokenizer.vocabSize > config.vocabSize) {
    model.free();
    throw new ArtError(
      "vocab_mismatch",
      `${dir}: tokenizer.json has ${tokenizer.vocabSize} tokens but config.json's vocab_size is ${config.vocabSize}; they must belong to the same model`,
    );
  }
  // A PEFT adapter stays unmerged: it is the default LoRA of every call, and the base weights stay shareable.
  let adapter: LayerLoras[] | undefined;
  try {
    adapter = options.adapter === undefined ? undefined : loadAdapter(options.adapter, model);
  } catch (error) {
    model.free();
    throw error;
  }
  const eosTokenIds = [...new Set([...tokenizer.eosTokenIds, ...config.eosTokenIds])];
  const promptIds = (request: CausalLMRequest): number[] => {
    if ("messages" in request) {
      const text = tokenizer.applyChatTemplate(request.messages, { tools: request.tools, addGenerationPrompt: true });
      return tokenizer.encode(text, { addSpecialTokens: false });
    }
    return typeof request.prompt === "string" ? tokenizer.encode(request.prompt) : request.prompt;
  };
  const run = (requests: CausalLMRequest[], loras?: LayerLoras[]) =>
    generate(model, requests.map((r) => ({ ...r, promptIds: promptIds(r) })), { tokenizer, eosTokenIds, loras: loras ?? adapter });

  return {
    config, tokenizer, backend, model, adapter: adapter ?? null,
    logits: async (ids) => sequenceLogits(model, ids, adapter),
    generate: (requests, generateOptions) => run(requests, generateOptions?.loras),
    stream: (request) => streamTokens((onToken, signal) => run([{ ...request, onToken, signal }])),
    createKvCache: (numSlots, maxPositions) => model.createKvCache(numSlots, maxPositions),
    decode: (cache, sequences, loras) => decode(model, cache, sequences, loras ?? adapter),
    free: () => model.free(),
  };
}

/**
 * Turns a callback-streaming generation into an async iterator (tokens queue until the consumer takes them).
 * A consumer that stops early (break) aborts the generation.
 */
async function* streamTokens(
  start: (onToken: (token: GeneratedToken) => void, signal: AbortSignal) => Promise<unknown>,
): AsyncIterable<GeneratedToken> {
  const abort = new AbortController();
  const queue: GeneratedToken[] = [];
  let wake: (() => void) | null = null;
  let finished = false;
  let failure: unknown = null;
  start((token) => {
    queue.push(token);
    wake?.();
  }, abort.signal).then(
    () => { finished = true; wake?.(); },
    (error) => { failure = error; finished = true; wake?.(); },
  );
  try {
    while (true) {
      if (queue.length > 0) {
        yield queue.shift()!;
        continue;
      }
      if (finished) break;
      await new Promise<void>((resolve) => (wake = resolve));
      wake = null;
    }
  } finally {
    abort.abort();
  }
  if (failure) throw failure;
}
