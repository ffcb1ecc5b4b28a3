/**
 * One chat completion: the prompt through the chat template (tools in Hermes format), `n` sequences through
 * the batcher, and OpenAI's response (or its stream of chunks) built from the sampled tokens.
 *
 * Every choice carries `token_ids`, the exact ids sampled, and `logprobs.content[i]`, the logprob of `token_ids[i]`
 * (asked for or not, as ART's server: training needs them). Both include the final end-of-sequence token and any
 * tokens of a matched stop string, because training must see exactly what the model produced; `message.content`
 * shows neither. `prompt_token_ids` is the prompt as the model read it (in a stream, on each choice's first chunk).
 */
import { Buffer } from "node:buffer";
import type { ChatCompletion, ChatCompletionChunk, ChatCompletionTokenLogprob } from "openai/resources/chat/completions";
import type { Tokenizer } from "../model/tokenizer.ts";
import { parseToolCalls, TOOL_CALL_CLOSE, TOOL_CALL_OPEN } from "../model/tool-calls.ts";
import type { Choice, Message } from "../core/trajectory.ts";
import { ApiError } from "./api-error.ts";
import type { Batcher, FinishReason, SampledToken, SequenceResult } from "./batcher.ts";
import { JsonGrammar } from "./json-grammar.ts";
import { compileSchema, type SchemaNode } from "./json-schema.ts";
import type { ChatRequest } from "./request.ts";
import { JsonConstraint, tokenTrieFor } from "./token-mask.ts";
import type { LayerLoras } from "../model/lora.ts";

/** What one served model id resolves to. */
export interface ModelRoute {
  tokenizer: Tokenizer;
  batcher: Batcher;
  /** Ids that end a completion (finish_reason "stop"). */
  stopTokenIds: readonly number[];
  /** The LoRA to decode with, read per request (so a training step's new adapter is used at once); null = base. */
  loras: () => LayerLoras[] | null;
}

export interface ServeMetrics {
  requests: number;
  promptTokens: number;
  completionTokens: number;
  /** Tool-call blocks the model wrote that were not valid calls (returned as text instead). */
  malformedToolCalls: number;
  /** Requests whose client went away before the end. */
  aborted: number;
}

export type ChatChoice = Choice & { tool_call_errors?: string[] };
export type ChatResponse = ChatCompletion & { choices: ChatChoice[] };
type ChunkChoice = ChatCompletionChunk.Choice & { token_ids?: number[]; prompt_token_ids?: number[] };

const ANY_OBJECT: SchemaNode = { kind: "object", properties: new Map(), required: new Set(), additional: { kind: "any" } };

/** A prepared request: prompt ids and the per-choice machinery, ready to run. */
export class ChatCompletionRun {
  readonly id = `chatcmpl-${globalThis.crypto.randomUUID().replaceAll("-", "")}`;
  readonly created = Math.floor(Date.now() / 1000);
  readonly promptIds: number[];
  readonly maxTokens: number;
  private readonly route: ModelRoute;
  private readonly request: ChatRequest;
  private readonly metrics: ServeMetrics;
  private readonly grammar: JsonGrammar | null;
  private readonly toolsActive: boolean;

  constructor(route: ModelRoute, request: ChatRequest, metrics: ServeMetrics) {
    this.route = route;
    this.request = request;
    this.metrics = metrics;
    const { tokenizer, batcher } = route;
    const tools = request.toolChoice === "none" ? [] : request.tools;
    this.toolsActive = tools.length > 0;
    // Tokenizing is the costly part of a long prompt: refuse one that cannot fit before rendering or tokenizing it.
    const atLeast = Math.ceil(verbatimBytes(request.messages) / longestTokenBytes(tokenizer));
    if (atLeast + (request.maxTokens ?? 1) > batcher.maxPositions) {
      throw ApiError.contextLength(batcher.maxPositions, atLeast, request.maxTokens ?? 1, "at least ");
    }
    // Chat templates know system, not OpenAI's newer "developer" role, which means the same.
    const messages = request.messages.map((m): Message => (m.role === "developer" ? { role: "system", content: m.content } : m));
    const prompt = tokenizer.applyChatTemplate(messages, { tools: tools.length > 0 ? tools : undefined, addGenerationPrompt: true });
    this.promptIds = tokenizer.encode(prompt, { addSpecialTokens: false });
    const room = batcher.maxPositions - this.promptIds.length;
    if (room < 1 || (request.maxTokens !== null && request.maxTokens > room)) {
      throw ApiError.contextLength(batcher.maxPositions, this.promptIds.length, request.maxTokens ?? 1);
    }
    this.maxTokens = request.maxTokens ?? room;
    this.grammar = this.makeGrammar();
    if (this.grammar) {
      const needed = new JsonConstraint(this.grammar, tokenTrieFor(tokenizer)).minimumTokens();
      if (needed > this.maxTokens) {
        throw ApiError.invalid("max_tokens", `max_tokens ${this.maxTokens} is too small for the required output: the shortest text matching it takes ${needed} tokens.`);
      }
    }
  }

  /** The grammar the output must follow: response_format's JSON, or a forced tool call. */
  private makeGrammar(): JsonGrammar | null {
    const { responseFormat, toolChoice, tools } = this.request;
    // Fixed texts (keys, literals, tool-call tags) cost what the vocabulary writes them in, not their bytes.
    const textCost = tokenTrieFor(this.route.tokenizer).greedyTokenCount;
    // A forced call comes first: response_format shapes the answer given after the tools have run (OpenAI's order;
    // the Agents SDK sends both to an agent that must call its tool, then answer in the format).
    if (toolChoice === "required" || typeof toolChoice === "object") {
      const options: SchemaNode[] = [];
      tools.forEach((tool, i) => {
        if (tool.type !== "function" || (toolChoice !== "required" && tool.function.name !== toolChoice.name)) return;
        let parameters: SchemaNode;
        try {
          parameters = compileSchema(tool.function.parameters ?? { type: "object" });
        } catch (error) {
          throw ApiError.invalid(`tools[${i}].function.parameters`, `tool_choice ${JSON.stringify(toolChoice)} forces a call, which needs parameters this server can enforce: ${(error as Error).message}`);
        }
        // The Hermes call body: {"name": <this tool>, "arguments": <its parameters>}.
        options.push({
          kind: "object",
          properties: new Map<string, SchemaNode>([["name", { kind: "literal", texts: [JSON.stringify(tool.function.name)] }], ["arguments", parameters]]),
          required: new Set(["name", "arguments"]),
          additional: null,
        });
      });
      const root: SchemaNode = options.length === 1 ? options[0] : { kind: "anyOf", options };
      return new JsonGrammar(root, { prefix: `${TOOL_CALL_OPEN}\n`, suffix: `\n${TOOL_CALL_CLOSE}`, textCost });
    }
    if (responseFormat.type === "json_object") return new JsonGrammar(ANY_OBJECT, { textCost });
    if (responseFormat.type === "json_schema") return new JsonGrammar(responseFormat.schema, { textCost });
    return null;
  }

  /** Runs all choices; `onChunk` (streaming) receives chunks as tokens arrive. */
  async run(signal: AbortSignal | undefined, onChunk?: (chunk: ChatCompletionChunk) => void): Promise<ChatResponse> {
    const { request, route } = this;
    const seed = request.seed ?? Math.floor(Math.random() * 2 ** 32);
    const trie = this.grammar ? tokenTrieFor(route.tokenizer) : null;
    const firstConstraint = this.grammar && trie ? new JsonConstraint(this.grammar, trie) : null;
    const loras = route.loras();
    const builders = Array.from({ length: request.n }, (_, index) => new ChoiceBuilder(index, route.tokenizer, request, this.toolsActive));
    if (onChunk) {
      for (const b of builders) {
        onChunk(this.chunk([{ index: b.index, delta: { role: "assistant", content: "" }, finish_reason: null, logprobs: null, prompt_token_ids: [...this.promptIds] }]));
      }
    }
    this.metrics.requests++;
    // The choices stand or fall together: when one is refused (429) or fails, the others leave the batch at once
    // instead of decoding to max_tokens for nobody (the openai client retries 429s, which would feed the overload).
    const together = new AbortController();
    const abandon = () => together.abort(signal?.reason);
    signal?.addEventListener("abort", abandon, { once: true });
    let results: SequenceResult[];
    try {
      results = await Promise.all(builders.map((builder, index) =>
        route.batcher.submit({
          promptIds: this.promptIds,
          maxTokens: this.maxTokens,
          temperature: request.temperature,
          topP: request.topP,
          seed: seed + index,
          numTopLogprobs: request.logprobs ? request.topLogprobs : 0,
          stopTokenIds: request.ignoreEos ? [] : route.stopTokenIds,
          constraint: firstConstraint ? (index === 0 ? firstConstraint : firstConstraint.fork()) : null,
          loras,
          signal: together.signal,
          onToken: (token) => {
            const stop = builder.push(token);
            if (onChunk) onChunk(this.chunk([builder.deltaChunk(token)]));
            return stop;
          },
        }).catch((error: unknown) => {
          together.abort(error);
          throw error;
        })
      ));
    } catch (error) {
      if (signal?.aborted) this.metrics.aborted++;
      throw error;
    } finally {
      signal?.removeEventListener("abort", abandon);
    }
    const choices = builders.map((builder, i) => ({ ...builder.finish(results[i].finishReason, this.metrics), prompt_token_ids: [...this.promptIds] }));
    if (onChunk) {
      for (const c of choices) {
        const remaining = builders[c.index].unsentContent(c);
        if (remaining) onChunk(this.chunk([{ index: c.index, delta: { content: remaining }, finish_reason: null, logprobs: null }]));
        // As OpenAI streams them: each call opens with its id and name, its arguments follow in their own delta, and
        // the finish comes last in a chunk of its own (openai-node's stream() emits a call's "done" events only then).
        for (const [i, call] of (c.message.tool_calls ?? []).entries()) {
          if (call.type !== "function") continue;
          onChunk(this.chunk([{ index: c.index, delta: { tool_calls: [{ index: i, id: call.id, type: "function", function: { name: call.function.name, arguments: "" } }] }, finish_reason: null, logprobs: null }]));
          onChunk(this.chunk([{ index: c.index, delta: { tool_calls: [{ index: i, function: { arguments: call.function.arguments } }] }, finish_reason: null, logprobs: null }]));
        }
        onChunk(this.chunk([{ index: c.index, delta: {}, finish_reason: c.finish_reason, logprobs: null }]));
      }
    }
    const completionTokens = results.reduce((sum, r) => sum + r.tokens.length, 0);
    this.metrics.promptTokens += this.promptIds.length;
    this.metrics.completionTokens += completionTokens;
    return {
      id: this.id,
      object: "chat.completion",
      created: this.created,
      model: request.model,
      choices,
      usage: { prompt_tokens: this.promptIds.length, completion_tokens: completionTokens, total_tokens: this.promptIds.length + completionTokens },
    };
  }

  chunk(choices: ChunkChoice[], usage?: ChatCompletion["usage"]): ChatCompletionChunk {
    const chunk: ChatCompletionChunk = { id: this.id, object: "chat.completion.chunk", created: this.created, model: this.request.model, choices };
    if (usage) chunk.usage = usage;
    return chunk;
  }
}

/** Accumulates one choice: decoded text, stop strings, what was streamed, the final message. */
export class ChoiceBuilder {
  readonly index: number;
  private readonly tokenizer: Tokenizer;
  private readonly request: ChatRequest;
  private readonly toolsActive: boolean;
  private readonly decoder;
  private text = "";
  private sent = 0;
  private stopped = false;
  private readonly tokens: SampledToken[] = [];
  private readonly holdBack: string[];

  constructor(index: number, tokenizer: Tokenizer, request: ChatRequest, toolsActive: boolean) {
    this.index = index;
    this.tokenizer = tokenizer;
    this.request = request;
    this.toolsActive = toolsActive;
    this.decoder = tokenizer.createStreamDecoder({ skipSpecialTokens: true });
    // Text that might be the start of a stop string or a tool call is not streamed until it is decided.
    this.holdBack = [...request.stop, ...(toolsActive ? [TOOL_CALL_OPEN] : [])];
  }

  /** Adds a token; true when a stop string ended the text. */
  push(token: SampledToken): boolean {
    this.tokens.push(token);
    if (this.stopped) return true;
    const before = this.text.length;
    this.text += this.decoder.push(token.id);
    for (const stop of this.request.stop) {
      // No stop string was in the text before this token, so one now ends in what it added: searching only there
      // keeps a long answer's checks linear in its length, not quadratic.
      const at = this.text.indexOf(stop, Math.max(0, before - stop.length + 1));
      if (at >= 0) {
        this.text = this.text.slice(0, at);
        this.stopped = true;
      }
    }
    return this.stopped;
  }

  /** The stream chunk for the token just pushed: the text that is now certain, the token id, its logprobs. */
  deltaChunk(token: SampledToken): ChunkChoice {
    const content = this.releasable();
    this.sent += content.length;
    return {
      index: this.index,
      delta: { content },
      finish_reason: null,
      logprobs: { content: [this.logprobEntry(token)], refusal: null },
      token_ids: [token.id],
    };
  }

  private releasable(): string {
    let end = this.text.length;
    if (this.toolsActive) {
      const open = this.text.indexOf(TOOL_CALL_OPEN);
      if (open >= 0) end = Math.min(end, open);
      // Whitespace before a tool call is trimmed from the final content, so it waits until text follows it.
      end = this.text.slice(0, end).trimEnd().length;
    }
    for (const marker of this.holdBack) {
      for (let k = marker.length - 1; k > 0; k--) {
        if (this.text.slice(0, end).endsWith(marker.slice(0, k))) {
          end -= k;
          break;
        }
      }
    }
    return this.text.slice(this.sent, Math.max(this.sent, end));
  }

  /** What a stream still owes at the end: the content not yet sent (tool-call text is sent as tool_calls). */
  unsentContent(choice: ChatChoice): string {
    const content = choice.message.content ?? "";
    return content.length > this.sent ? content.slice(this.sent) : "";
  }

  finish(reason: FinishReason, metrics: ServeMetrics): ChatChoice {
    if (!this.stopped) this.text += this.decoder.flush();
    let content: string | null = this.text;
    let finish: ChatChoice["finish_reason"] = reason;
    const choice: ChatChoice = {
      index: this.index,
      message: { role: "assistant", content, refusal: null },
      finish_reason: finish,
      logprobs: { content: this.tokens.map((t) => this.logprobEntry(t)), refusal: null },
      token_ids: this.tokens.map((t) => t.id),
    };
    if (this.toolsActive && this.text.includes(TOOL_CALL_OPEN)) {
      const parsed = parseToolCalls(this.text);
      if (parsed.errors.length > 0) {
        // Malformed calls come back as the text the model wrote, with the reasons; the rollout decides what it is worth.
        metrics.malformedToolCalls += parsed.errors.length;
        choice.tool_call_errors = parsed.errors;
      } else if (parsed.toolCalls.length > 0) {
        content = parsed.content === "" ? null : parsed.content;
        choice.message = { role: "assistant", content, refusal: null, tool_calls: parsed.toolCalls };
        if (finish === "stop") finish = "tool_calls";
        choice.finish_reason = finish;
      }
    }
    return choice;
  }

  private logprobEntry(token: SampledToken): ChatCompletionTokenLogprob {
    const entry = (id: number, logprob: number) => ({
      token: tokenText(this.tokenizer, id),
      logprob: Number.isFinite(logprob) ? logprob : -9999,
      bytes: Array.from(this.tokenizer.tokenBytes(id)),
    });
    return { ...entry(token.id, token.logprob), top_logprobs: token.topLogprobs.map((t) => entry(t.id, t.logprob)) };
  }
}

const tokenTexts = new WeakMap<Tokenizer, (string | undefined)[]>();

/**
 * One token decoded alone, as logprobs name it: every sampled token (and each top alternative) of every choice gets
 * an entry, and the tokenizer's decode of a single id costs several microseconds, on the thread that runs the passes.
 */
function tokenText(tokenizer: Tokenizer, id: number): string {
  let texts = tokenTexts.get(tokenizer);
  if (!texts) tokenTexts.set(tokenizer, texts = []);
  return texts[id] ??= tokenizer.decode([id], { skipSpecialTokens: false });
}

const longestTokens = new WeakMap<Tokenizer, number>();

/** The most bytes one token of the vocabulary stands for: a prompt of B bytes is at least B / this many tokens. */
function longestTokenBytes(tokenizer: Tokenizer): number {
  let longest = longestTokens.get(tokenizer);
  if (longest === undefined) {
    longest = 1;
    for (let id = 0; id < tokenizer.vocabSize; id++) longest = Math.max(longest, tokenizer.tokenBytes(id).length);
    longestTokens.set(tokenizer, longest);
  }
  return longest;
}

/**
 * Bytes of message text every chat template copies into the prompt: system, user, developer and tool contents,
 * trimmed (templates may trim; some drop an assistant turn's reasoning, so assistant text is not counted).
 */
function verbatimBytes(messages: readonly Message[]): number {
  let bytes = 0;
  for (const message of messages) {
    if (message.role === "assistant") continue;
    const content = message.content;
    const text = typeof content === "string" ? content : Array.isArray(content) ? content.map((part) => ("text" in part ? part.text : "")).join("") : "";
    bytes += Buffer.byteLength(text.trim());
  }
  return bytes;
}

