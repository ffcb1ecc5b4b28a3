/**
 * Validation of a chat-completions request body into the parameters the server uses, with OpenAI's error
 * conventions: a 400 `invalid_request_error` whose `param` names the offending field.
 */
import type { Message, Tool } from "../core/trajectory.ts";
import { ApiError } from "./api-error.ts";
import { compileSchema, type SchemaNode } from "./json-schema.ts";
import { ArtError } from "../core/errors.ts";
import { clipText } from "../core/text.ts";

export type ToolChoice = "none" | "auto" | "required" | { name: string };

export type ResponseFormat =
  | { type: "text" }
  | { type: "json_object" }
  | { type: "json_schema"; name: string; schema: SchemaNode };

export interface ChatRequest {
  model: string;
  messages: Message[];
  tools: Tool[];
  toolChoice: ToolChoice;
  n: number;
  temperature: number;
  topP: number;
  /** null: up to the context length. */
  maxTokens: number | null;
  stop: string[];
  /** vLLM's `ignore_eos`: end tokens do not end the completion, only max_tokens and stop strings do. */
  ignoreEos: boolean;
  seed: number | null;
  logprobs: boolean;
  topLogprobs: number;
  stream: boolean;
  includeUsage: boolean;
  responseFormat: ResponseFormat;
}

/** Accepted and ignored: they change nothing about generation here (routing, storage, bookkeeping). */
const IGNORED = new Set(["user", "metadata", "store", "service_tier", "parallel_tool_calls", "stream_options", "prompt_cache_key", "safety_identifier"]);
const ROLES = new Set(["system", "developer", "user", "assistant", "tool"]);

export function parseChatRequest(body: unknown): ChatRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw ApiError.invalid(null, "The request body must be a JSON object.");
  }
  const b = body as Record<string, unknown>;
  const known = new Set([
    "model", "messages", "tools", "tool_choice", "n", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop",
    "seed", "logprobs", "top_logprobs", "stream", "response_format", "frequency_penalty", "presence_penalty", "logit_bias",
    "ignore_eos",
  ]);
  for (const key of Object.keys(b)) {
    if (!known.has(key) && !IGNORED.has(key)) throw ApiError.invalid(key, `Unrecognized request argument supplied: ${key}`);
  }

  const model = b.model;
  if (typeof model !== "string" || model === "") throw ApiError.invalid("model", "you must provide a model parameter (a non-empty string)");

  for (const penalty of ["frequency_penalty", "presence_penalty"]) {
    const value = optionalNumber(b, penalty, -2, 2);
    if (value !== null && value !== 0) throw ApiError.invalid(penalty, `${penalty} is not supported by this server; leave it out or set it to 0.`);
  }
  if (b.logit_bias !== undefined && b.logit_bias !== null && !(isObject(b.logit_bias) && Object.keys(b.logit_bias).length === 0)) {
    throw ApiError.invalid("logit_bias", "logit_bias is not supported by this server; leave it out.");
  }

  const logprobs = optionalBoolean(b, "logprobs") ?? false;
  const topLogprobs = optionalInteger(b, "top_logprobs", 0, 20) ?? 0;
  if (topLogprobs > 0 && !logprobs) throw ApiError.invalid("top_logprobs", "top_logprobs requires logprobs to be true.");

  const maxTokens = optionalInteger(b, "max_completion_tokens", 1, Number.MAX_SAFE_INTEGER) ?? optionalInteger(b, "max_tokens", 1, Number.MAX_SAFE_INTEGER);
  const stream = optionalBoolean(b, "stream") ?? false;
  let includeUsage = false;
  if (b.stream_options !== undefined && b.stream_options !== null) {
    if (!stream) throw ApiError.invalid("stream_options", "stream_options is only allowed when stream is true.");
    if (!isObject(b.stream_options)) throw ApiError.invalid("stream_options", "stream_options must be an object.");
    includeUsage = b.stream_options.include_usage === true;
  }

  const tools = parseTools(b.tools);
  return {
    model,
    messages: parseMessages(b.messages),
    tools,
    toolChoice: parseToolChoice(b.tool_choice, tools),
    n: optionalInteger(b, "n", 1, 128) ?? 1,
    temperature: optionalNumber(b, "temperature", 0, 2) ?? 1,
    topP: optionalNumber(b, "top_p", 0, 1) ?? 1,
    maxTokens,
    stop: parseStop(b.stop),
    ignoreEos: optionalBoolean(b, "ignore_eos") ?? false,
    seed: optionalInteger(b, "seed", Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
    logprobs,
    topLogprobs,
    stream,
    includeUsage,
    responseFormat: parseResponseFormat(b.response_format),
  };
}

function parseMessages(value: unknown): Message[] {
  if (!Array.isArray(value)) throw ApiError.invalid("messages", "messages must be an array of chat messages.");
  if (value.length === 0) throw ApiError.invalid("messages", "messages must contain at least one message.");
  value.forEach((message, i) => {
    const param = `messages[${i}]`;
    if (!isObject(message)) throw ApiError.invalid(param, `${param} must be an object with a role.`);
    if (typeof message.role !== "string" || !ROLES.has(message.role)) {
      throw ApiError.invalid(`${param}.role`, `Invalid value for '${param}.role': expected one of system, developer, user, assistant, tool; got ${JSON.stringify(message.role)}.`);
    }
    const content = message.content;
    const hasToolCalls = message.role === "assistant" && Array.isArray(message.tool_calls) && message.tool_calls.length > 0;
    if (content === undefined || content === null) {
      if (!hasToolCalls) throw ApiError.invalid(`${param}.content`, `${param}.content is required for a ${message.role} message.`);
    } else if (Array.isArray(content)) {
      content.forEach((part, j) => {
        if (!isObject(part) || part.type !== "text" || typeof part.text !== "string") {
          throw ApiError.invalid(`${param}.content[${j}]`, `${param}.content[${j}] must be a text part {type: "text", text}; this server serves text-only models.`);
        }
      });
    } else if (typeof content !== "string") {
      throw ApiError.invalid(`${param}.content`, `${param}.content must be a string or an array of text parts.`);
    }
    if (message.role === "tool" && typeof message.tool_call_id !== "string") {
      throw ApiError.invalid(`${param}.tool_call_id`, `${param}.tool_call_id is required for a tool message (the id of the call it answers).`);
    }
    if (message.tool_calls !== undefined && message.tool_calls !== null) {
      if (message.role !== "assistant" || !Array.isArray(message.tool_calls)) {
        throw ApiError.invalid(`${param}.tool_calls`, `${param}.tool_calls must be an array, on an assistant message.`);
      }
      message.tool_calls.forEach((call: unknown, j: number) => {
        const fn = isObject(call) ? call.function : undefined;
        if (!isObject(fn) || typeof fn.name !== "string" || typeof fn.arguments !== "string") {
          throw ApiError.invalid(`${param}.tool_calls[${j}]`, `${param}.tool_calls[${j}] must be {id, type: "function", function: {name, arguments (a JSON string)}}.`);
        }
      });
    }
  });
  return value as Message[];
}

function parseTools(value: unknown): Tool[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw ApiError.invalid("tools", "tools must be an array of function tools.");
  value.forEach((tool, i) => {
    const fn = isObject(tool) ? tool.function : undefined;
    if (!isObject(tool) || tool.type !== "function" || !isObject(fn) || typeof fn.name !== "string" || fn.name === "") {
      throw ApiError.invalid(`tools[${i}]`, `tools[${i}] must be {type: "function", function: {name, description?, parameters?}}.`);
    }
    // OpenAI's rule for function names; it also keeps markup such as </tool_call> out of the prompt's tool list.
    if (!/^[A-Za-z0-9_-]{1,64}$/.test(fn.name)) {
      throw ApiError.invalid(`tools[${i}].function.name`, `tools[${i}].function.name must be 1 to 64 letters, digits, underscores or dashes, got ${JSON.stringify(clipText(fn.name, 80))}.`);
    }
    if (fn.parameters !== undefined && !isObject(fn.parameters)) throw ApiError.invalid(`tools[${i}].function.parameters`, `tools[${i}].function.parameters must be a JSON Schema object.`);
  });
  return value as Tool[];
}

function parseToolChoice(value: unknown, tools: Tool[]): ToolChoice {
  if (value === undefined || value === null) return tools.length > 0 ? "auto" : "none";
  if (value === "none" || value === "auto" || value === "required") {
    if (value !== "none" && tools.length === 0) throw ApiError.invalid("tool_choice", `tool_choice "${value}" needs tools.`);
    return value;
  }
  const fn = isObject(value) ? value.function : undefined;
  if (isObject(value) && value.type === "function" && isObject(fn) && typeof fn.name === "string") {
    if (!tools.some((t) => t.type === "function" && t.function.name === fn.name)) {
      throw ApiError.invalid("tool_choice", `tool_choice names the function "${fn.name}", which is not in tools.`);
    }
    return { name: fn.name };
  }
  throw ApiError.invalid("tool_choice", 'tool_choice must be "none", "auto", "required" or {type: "function", function: {name}}.');
}

function parseStop(value: unknown): string[] {
  if (value === undefined || value === null) return [];
  const stops = typeof value === "string" ? [value] : value;
  if (!Array.isArray(stops) || stops.length > 4 || !stops.every((s) => typeof s === "string" && s.length > 0)) {
    throw ApiError.invalid("stop", "stop must be a non-empty string or an array of up to 4 non-empty strings.");
  }
  return stops as string[];
}

function parseResponseFormat(value: unknown): ResponseFormat {
  if (value === undefined || value === null) return { type: "text" };
  if (!isObject(value)) throw ApiError.invalid("response_format", "response_format must be an object with a type.");
  if (value.type === "text") return { type: "text" };
  if (value.type === "json_object") return { type: "json_object" };
  if (value.type === "json_schema") {
    const spec = value.json_schema;
    if (!isObject(spec) || typeof spec.name !== "string") {
      throw ApiError.invalid("response_format.json_schema", "response_format.json_schema must be {name, schema, strict?}.");
    }
    try {
      return { type: "json_schema", name: spec.name, schema: compileSchema(spec.schema ?? {}) };
    } catch (error) {
      if (error instanceof ArtError) throw new ApiError(400, `Invalid schema for response_format '${spec.name}': ${error.message}`, "invalid_request_error", "response_format", "invalid_json_schema");
      throw error;
    }
  }
  throw ApiError.invalid("response_format.type", `response_format.type must be "text", "json_object" or "json_schema", got ${JSON.stringify(value.type)}.`);
}

function optionalNumber(b: Record<string, unknown>, key: string, min: number, max: number): number | null {
  const value = b[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== "number" || !Number.isFinite(value)) {
    throw ApiError.invalid(key, `Invalid type for '${key}': expected a number, but got ${describe(value)} instead.`);
  }
  if (value < min || value > max) throw ApiError.invalid(key, `Invalid '${key}': ${value} is outside [${min}, ${max}].`);
  return value;
}

function optionalInteger(b: Record<string, unknown>, key: string, min: number, max: number): number | null {
  const value = optionalNumber(b, key, min, max);
  if (value !== null && !Number.isInteger(value)) throw ApiError.invalid(key, `Invalid type for '${key}': expected an integer, but got ${value} instead.`);
  return value;
}

function optionalBoolean(b: Record<string, unknown>, key: string): boolean | null {
  const value = b[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== "boolean") throw ApiError.invalid(key, `Invalid type for '${key}': expected a boolean, but got ${describe(value)} instead.`);
  return value;
}

function describe(value: unknown): string {
  if (Array.isArray(value)) return "an array";
  if (value === null) return "null";
  return typeof value === "string" ? "a string" : typeof value === "object" ? "an object" : `a ${typeof value}`;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
