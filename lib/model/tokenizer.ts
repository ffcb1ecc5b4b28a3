/**
 * Tokenizers of Hugging Face checkpoints: tokenizer.json through @huggingface/tokenizers (the same
 * normalizer, pre-tokenizer, BPE and post-processor as Python's `tokenizers`), plus what transformers reads
 * beside it: tokenizer_config.json (special tokens, chat template), chat_template.jinja and
 * generation_config.json (eos ids).
 *
 * Beyond encode/decode, two things the engine and the server need and the library does not give:
 * the raw bytes of each token (constrained decoding works on bytes) and an incremental decoder that only
 * ever emits whole UTF-8 characters.
 */
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { ArtError } from "../core/errors.ts";
import type { Message } from "../core/trajectory.ts";
import { byteLevelToBytes } from "./tokenizer-bytes.ts";
import { PrefixEncodingCache, prefixReuseObstacle, type PrefixReuseJson } from "./tokenizer-prefix-cache.ts";
import { ChatTemplate, selectChatTemplates, type ChatTemplateOptions, type SpecialTokenVariables } from "./tokenizer-template.ts";

export type { ChatTemplateOptions } from "./tokenizer-template.ts";
export { parseToolCalls, type ParsedToolCall, type ParsedToolCalls } from "./tool-calls.ts";

export interface EncodeOptions {
  /** Add what the tokenizer's post-processor adds (Llama-3: BOS; Qwen: nothing). Default true, as in Python. */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions {
  skipSpecialTokens?: boolean;
  /** transformers' clean-up of spaces before punctuation; default: tokenizer_config.json's setting, else false. */
  cleanUpTokenizationSpaces?: boolean;
}

export interface StreamDecoder {
  /** The text that became complete with this token (possibly ""). */
  push(id: number): string;
  /** Whatever is still pending at the end (an incomplete UTF-8 sequence becomes U+FFFD). */
  flush(): string;
}

export interface Tokenizer {
  /** Python's len(tokenizer): BPE vocabulary + added tokens (may be below config.json's padded vocab_size). */
  readonly vocabSize: number;
  /** generation_config.json's eos_token_id (number or list), then tokenizer_config.json's eos_token. */
  readonly eosTokenIds: number[];
  readonly padTokenId: number | null;
  encode(text: string, options?: EncodeOptions): number[];
  /**
   * Ids of encodings without special tokens taken from earlier texts that started the same way, and ids encoded
   * afresh (lib/model/tokenizer-prefix-cache.ts); null for a tokenizer whose encodings cannot be reused exactly.
   */
  readonly prefixReuse: { readonly reusedIds: number; readonly encodedIds: number } | null;
  /** Ids past the vocabulary (a model's padding rows) decode to nothing, as in Python. */
  decode(ids: number[], options?: DecodeOptions): string;
  /** The raw bytes one token stands for (empty past the vocabulary). Shared between calls: do not modify. */
  tokenBytes(id: number): Uint8Array;
  /** An added token marked special (skipped by skipSpecialTokens). */
  isSpecial(id: number): boolean;
  tokenToId(token: string): number | undefined;
  idToToken(id: number): string | undefined;
  applyChatTemplate(messages: Message[], options?: ChatTemplateOptions): string;
  createStreamDecoder(options?: { skipSpecialTokens?: boolean }): StreamDecoder;
}

interface AddedTokenJson {
  id: number;
  content: string;
  special?: boolean;
}

interface TokenizerJson extends PrefixReuseJson {
  model: { type?: string; vocab?: unknown; byte_fallback?: boolean };
  decoder?: { type?: string; decoders?: { type?: string }[] } | null;
  added_tokens?: AddedTokenJson[];
}

type JsonObject = Record<string, unknown>;

const BYTE_FALLBACK_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

/** Loads the tokenizer of a checkpoint directory (tokenizer.json is required, the rest is optional). */
export async function loadTokenizer(dir: string): Promise<Tokenizer> {
  const tokenizerFile = join(dir, "tokenizer.json");
  if (!existsSync(tokenizerFile)) {
    throw new ArtError(
      "tokenizer_missing",
      `no tokenizer.json in ${dir}. art-ts reads the fast-tokenizer file that Hugging Face checkpoints ship; ` +
        `if this checkpoint only has vocab.json/merges.txt or tokenizer.model, save one with transformers' tokenizer.save_pretrained().`,
    );
  }
  const tokenizerJson = (await readJsonObject(tokenizerFile)) as unknown as TokenizerJson;
  const configFile = join(dir, "tokenizer_config.json");
  const config = (await readOptionalJsonObject(configFile)) ?? {};
  const generationFile = join(dir, "generation_config.json");
  const generationConfig = (await readOptionalJsonObject(generationFile)) ?? {};
  const jinjaPath = join(dir, "chat_template.jinja");
  const jinjaFile = existsSync(jinjaPath) ? { path: jinjaPath, text: await readFile(jinjaPath, "utf8") } : null;
  return new HfBackedTokenizer(tokenizerJson, tokenizerFile, config, configFile, generationConfig, generationFile, jinjaFile);
}

class HfBackedTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly eosTokenIds: number[];
  readonly padTokenId: number | null;

  private readonly hf: HfTokenizer;
  private readonly idToTokenTable: (string | undefined)[];
  private readonly addedTokens = new Map<number, AddedTokenJson>();
  private readonly byteLevel: boolean;
  private readonly byteFallback: boolean;
  private readonly bytesCache: (Uint8Array | undefined)[];
  private readonly cleanUpDefault: boolean;
  private readonly templates: { default: ChatTemplate | null; toolUse: ChatTemplate | null };
  private readonly specialTokenVariables: SpecialTokenVariables;
  private readonly tokenizerFile: string;
  /** Null when the tokenizer's added tokens or pre-tokenizer make a reused prefix inexact (see the module). */
  private readonly prefixCache: PrefixEncodingCache | null;

  constructor(
    json: TokenizerJson,
    tokenizerFile: string,
    config: JsonObject,
    configFile: string,
    generationConfig: JsonObject,
    generationFile: string,
    jinjaFile: { path: string; text: string } | null,
  ) {
    this.tokenizerFile = tokenizerFile;
    if (typeof json.model !== "object" || json.model === null || typeof json.model.vocab !== "object" || json.model.vocab === null) {
      throw new ArtError("tokenizer_invalid", `${tokenizerFile} has no "model" with a "vocab"; is it a Hugging Face tokenizer.json?`);
    }
    try {
      this.hf = new HfTokenizer({ added_tokens: [], decoder: null, normalizer: null, pre_tokenizer: null, post_processor: null, ...json }, config);
    } catch (error) {
      throw new ArtError("tokenizer_invalid", `${tokenizerFile} could not be loaded: ${error instanceof Error ? error.message : String(error)}`, { cause: error });
    }

    this.idToTokenTable = [];
    for (const [token, id] of Object.entries(json.model.vocab as Record<string, number>)) this.idToTokenTable[id] = token;
    for (const added of json.added_tokens ?? []) {
      this.addedTokens.set(added.id, added);
      this.idToTokenTable[added.id] = added.content;
    }
    this.vocabSize = this.idToTokenTable.length;
    this.bytesCache = new Array(this.vocabSize);

    const decoders = json.decoder?.type === "Sequence" ? (json.decoder.decoders ?? []) : json.decoder ? [json.decoder] : [];
    this.byteLevel = decoders.some((d) => d.type === "ByteLevel");
    this.byteFallback = json.model.byte_fallback === true;
    this.cleanUpDefault = config.clean_up_tokenization_spaces === true;

    this.specialTokenVariables = {};
    for (const name of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const content = tokenContent(config[name]);
      if (content !== null) this.specialTokenVariables[name] = content;
    }
    this.eosTokenIds = this.collectEosIds(config, configFile, generationConfig, generationFile);
    this.padTokenId = this.resolvePadId(config, configFile, generationConfig);
    this.templates = selectChatTemplates(config.chat_template, configFile, jinjaFile);
    this.prefixCache = prefixReuseObstacle(json) === null
      ? new PrefixEncodingCache((text) => this.hf.encode(text, { add_special_tokens: false }).ids, json.added_tokens ?? [])
      : null;
  }

  get prefixReuse(): { reusedIds: number; encodedIds: number } | null {
    return this.prefixCache ? { ...this.prefixCache.stats } : null;
  }

  encode(text: string, options: EncodeOptions = {}): number[] {
    if (typeof text !== "string") {
      throw new ArtError("tokenizer_invalid_input", `encode expects a string, got ${text === null ? "null" : typeof text}`);
    }
    const addSpecialTokens = options.addSpecialTokens ?? true;
    if (!addSpecialTokens && this.prefixCache) return this.prefixCache.encode(text);
    return this.hf.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  decode(ids: number[], options: DecodeOptions = {}): string {
    const known = ids.filter((id) => this.checkId(id, "decode") !== undefined);
    if (known.length === 0) return "";
    return this.hf.decode(known, {
      skip_special_tokens: options.skipSpecialTokens ?? false,
      clean_up_tokenization_spaces: options.cleanUpTokenizationSpaces ?? this.cleanUpDefault,
    });
  }

  tokenBytes(id: number): Uint8Array {
    const token = this.checkId(id, "tokenBytes");
    if (token === undefined) return new Uint8Array(0);
    const cached = this.bytesCache[id];
    if (cached) return cached;
    const bytes = this.computeTokenBytes(id, token);
    this.bytesCache[id] = bytes;
    return bytes;
  }

  isSpecial(id: number): boolean {
    return this.addedTokens.get(id)?.special === true;
  }

  tokenToId(token: string): number | undefined {
    return this.hf.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.idToTokenTable[id];
  }

  applyChatTemplate(messages: Message[], options: ChatTemplateOptions = {}): string {
    const wantsTools = Array.isArray(options.tools) && options.tools.length > 0;
    const template = (wantsTools ? this.templates.toolUse : null) ?? this.templates.default;
    if (!template) {
      throw new ArtError(
        "chat_template_missing",
        `the tokenizer in ${this.tokenizerFile.replace(/tokenizer\.json$/, "")} has no chat template (neither chat_template.jinja nor ` +
          `"chat_template" in tokenizer_config.json). Base models often have none: use an instruct checkpoint or add a template file.`,
      );
    }
    return template.render(messages, options, this.specialTokenVariables);
  }

  createStreamDecoder(options: { skipSpecialTokens?: boolean } = {}): StreamDecoder {
    const skipSpecial = options.skipSpecialTokens ?? false;
    // One streaming UTF-8 decoder holds back an incomplete character until its last byte arrives.
    const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
    return {
      push: (id: number): string => {
        if (this.checkId(id, "createStreamDecoder().push") === undefined) return "";
        if (skipSpecial && this.isSpecial(id)) return "";
        const added = this.addedTokens.get(id);
        // Added tokens are text, not bytes: like decode(), they end the byte run before them.
        if (added) return utf8.decode() + added.content;
        return utf8.decode(this.tokenBytes(id), { stream: true });
      },
      flush: (): string => utf8.decode(),
    };
  }

  /** The token string of a valid id, undefined for ids past the vocabulary (a model's padding rows). */
  private checkId(id: number, caller: string): string | undefined {
    if (!Number.isInteger(id) || id < 0) {
      throw new ArtError("tokenizer_invalid_input", `${caller}: token id ${String(id)} is not a non-negative integer`);
    }
    return this.idToTokenTable[id];
  }

  private computeTokenBytes(id: number, token: string): Uint8Array {
    if (this.addedTokens.has(id)) return new TextEncoder().encode(token);
    if (this.byteLevel) {
      const bytes = byteLevelToBytes(token);
      if (bytes) return bytes;
    }
    const fallback = this.byteFallback ? BYTE_FALLBACK_TOKEN.exec(token) : null;
    if (fallback) return Uint8Array.of(parseInt(fallback[1], 16));
    // SentencePiece-style vocabularies write a space as U+2581.
    return new TextEncoder().encode(token.replaceAll("\u2581", " "));
  }

  private collectEosIds(config: JsonObject, configFile: string, generationConfig: JsonObject, generationFile: string): number[] {
    const ids: number[] = [];
    const generationEos = generationConfig.eos_token_id;
    const fromGeneration = generationEos === undefined || generationEos === null ? [] : Array.isArray(generationEos) ? generationEos : [generationEos];
    for (const id of fromGeneration) {
      if (!Number.isInteger(id) || id < 0) {
        throw new ArtError("generation_config_invalid", `${generationFile}: eos_token_id must be a token id or a list of them, got ${JSON.stringify(generationEos)}`);
      }
      if (!ids.includes(id)) ids.push(id);
    }
    const eosToken = tokenContent(config.eos_token);
    if (eosToken !== null) {
      const id = this.hf.token_to_id(eosToken);
      if (id === undefined) {
        throw new ArtError("tokenizer_config_invalid", `${configFile}: eos_token ${JSON.stringify(eosToken)} is not in the vocabulary of tokenizer.json`);
      }
      if (!ids.includes(id)) ids.push(id);
    }
    return ids;
  }

  private resolvePadId(config: JsonObject, configFile: string, generationConfig: JsonObject): number | null {
    const padToken = tokenContent(config.pad_token);
    if (padToken !== null) {
      const id = this.hf.token_to_id(padToken);
      if (id === undefined) {
        throw new ArtError("tokenizer_config_invalid", `${configFile}: pad_token ${JSON.stringify(padToken)} is not in the vocabulary of tokenizer.json`);
      }
      return id;
    }
    const padId = generationConfig.pad_token_id;
    return Number.isInteger(padId) ? (padId as number) : null;
  }
}

/** Special tokens in tokenizer_config.json are strings or serialized AddedTokens ({"content": ...}). */
function tokenContent(value: unknown): string | null {
  if (typeof value === "string") return value;
  if (typeof value === "object" && value !== null && typeof (value as { content?: unknown }).content === "string") {
    return (value as { content: string }).content;
  }
  return null;
}

async function readJsonObject(file: string): Promise<JsonObject> {
  let value: unknown;
  try {
    value = JSON.parse(await readFile(file, "utf8"));
  } catch (error) {
    throw new ArtError("tokenizer_invalid_json", `${file} is not valid JSON (${error instanceof Error ? error.message : String(error)}); re-download the file`, { cause: error });
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ArtError("tokenizer_invalid_json", `${file} must hold a JSON object`);
  }
  return value as JsonObject;
}

async function readOptionalJsonObject(file: string): Promise<JsonObject | null> {
  return existsSync(file) ? readJsonObject(file) : null;
}
