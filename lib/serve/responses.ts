/**
 * OpenAI's Responses API (`POST /v1/responses`), which the AI SDK's default OpenAI provider and LangChain's
 * `useResponsesApi` call, served by translation: the request becomes a chat request (so every option is checked and
 * decoded exactly as /v1/chat/completions does it), and the answer becomes a response object, or its event stream.
 *
 * Covered: `input` as text or items (messages with text parts, `function_call`, `function_call_output`; reasoning
 * items are skipped), `instructions`, function `tools`, `tool_choice`, `text.format` (text, json_object,
 * json_schema), `max_output_tokens`, `temperature`, `top_p`, `stream`. The server keeps no responses, so
 * `previous_response_id` is refused: send the whole conversation as `input`.
 */
import { randomBytes } from "node:crypto";
import type { ChatCompletionChunk } from "openai/resources/chat/completions";
import type { Message, Tool } from "../core/trajectory.ts";
import { ApiError } from "./api-error.ts";
import type { ChatResponse } from "./chat.ts";
import { parseChatRequest, type ChatRequest } from "./request.ts";

/** What a response object repeats of its request. */
export interface ResponseEcho {
  id: string;
  createdAt: number;
  model: string;
  instructions: string | null;
  tools: unknown[];
  toolChoice: unknown;
  text: unknown;
  temperature: number;
  topP: number;
  maxOutputTokens: number | null;
  metadata: Record<string, unknown>;
}

type OutputText = { type: "output_text"; text: string; annotations: never[]; logprobs: never[] };
type MessageItem = { type: "message"; id: string; status: "in_progress" | "completed"; role: "assistant"; content: OutputText[] };
type FunctionCallItem = { type: "function_call"; id: string; call_id: string; name: string; arguments: string; status: "in_progress" | "completed" };
type OutputItem = MessageItem | FunctionCallItem;

/** Accepted and not acted on: storage, tracing and routing hints a local server has no use for. */
const IGNORED = new Set(["store", "parallel_tool_calls", "user", "include", "reasoning", "truncation", "service_tier", "prompt_cache_key", "safety_identifier", "stream_options"]);
const KNOWN = new Set(["model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature", "top_p", "stream", "metadata", "previous_response_id", ...IGNORED]);

const newId = (prefix: string) => `${prefix}_${randomBytes(12).toString("hex")}`;
const isObject = (value: unknown): value is Record<string, unknown> => typeof value === "object" && value !== null && !Array.isArray(value);

/** The chat request a Responses request stands for, and what its response repeats. */
export function parseResponsesRequest(body: unknown): { chat: ChatRequest; echo: ResponseEcho } {
  if (!isObject(body)) throw ApiError.invalid(null, "The body of POST /v1/responses must be a JSON object.");
  for (const key of Object.keys(body)) {
    if (!KNOWN.has(key)) throw ApiError.invalid(key, `${key} is not supported by this server's /v1/responses; leave it out.`);
  }
  if (body.previous_response_id !== undefined && body.previous_response_id !== null) {
    throw ApiError.invalid("previous_response_id", "previous_response_id is not supported: this server keeps no responses. Send the whole conversation as input.");
  }
  const instructions = typeof body.instructions === "string" ? body.instructions : null;
  if (body.instructions !== undefined && body.instructions !== null && instructions === null) throw ApiError.invalid("instructions", "instructions must be a string.");
  const messages: Message[] = [...(instructions === null ? [] : [{ role: "system" as const, content: instructions }]), ...inputMessages(body.input)];
  const tools = responseTools(body.tools);
  const chatBody: Record<string, unknown> = {
    model: body.model,
    messages,
    ...(tools.length > 0 ? { tools } : {}),
    ...(body.tool_choice === undefined ? {} : { tool_choice: chatToolChoice(body.tool_choice) }),
    ...responseFormat(body.text),
    ...(body.max_output_tokens === undefined || body.max_output_tokens === null ? {} : { max_tokens: body.max_output_tokens }),
    ...(body.temperature === undefined ? {} : { temperature: body.temperature }),
    ...(body.top_p === undefined ? {} : { top_p: body.top_p }),
    ...(body.stream === undefined ? {} : { stream: body.stream }),
  };
  const chat = parseChatRequest(chatBody);
  return {
    chat,
    echo: {
      id: newId("resp"), createdAt: Math.floor(Date.now() / 1000), model: chat.model, instructions,
      tools: Array.isArray(body.tools) ? body.tools : [], toolChoice: body.tool_choice ?? "auto", text: body.text ?? { format: { type: "text" } },
      temperature: chat.temperature, topP: chat.topP, maxOutputTokens: chat.maxTokens, metadata: isObject(body.metadata) ? body.metadata : {},
    },
  };
}

/** `input` as chat messages: consecutive function calls join the assistant turn they belong to. */
function inputMessages(input: unknown): Message[] {
  if (typeof input === "string") return [{ role: "user", content: input }];
  if (!Array.isArray(input) || input.length === 0) throw ApiError.invalid("input", "input must be a string or a non-empty array of input items.");
  const messages: Message[] = [];
  input.forEach((item, i) => {
    const param = `input[${i}]`;
    if (!isObject(item)) throw ApiError.invalid(param, `${param} must be an object.`);
    const type = item.type ?? "message";
    if (type === "reasoning") return;
    if (type === "message") {
      const role = item.role;
      if (role !== "user" && role !== "system" && role !== "developer" && role !== "assistant") {
        throw ApiError.invalid(`${param}.role`, `${param}.role must be user, system, developer or assistant.`);
      }
      messages.push({ role, content: itemText(item.content, `${param}.content`) } as Message);
    } else if (type === "function_call") {
      const { call_id: callId, name, arguments: args } = item;
      if (typeof callId !== "string" || typeof name !== "string" || typeof args !== "string") {
        throw ApiError.invalid(param, `${param} (function_call) needs string call_id, name and arguments.`);
      }
      const call = { id: callId, type: "function" as const, function: { name, arguments: args } };
      const last = messages.at(-1);
      if (last?.role === "assistant") last.tool_calls = [...(last.tool_calls ?? []), call];
      else messages.push({ role: "assistant", content: "", tool_calls: [call] });
    } else if (type === "function_call_output") {
      if (typeof item.call_id !== "string") throw ApiError.invalid(`${param}.call_id`, `${param}.call_id must be a string.`);
      messages.push({ role: "tool", tool_call_id: item.call_id, content: typeof item.output === "string" ? item.output : JSON.stringify(item.output) });
    } else {
      throw ApiError.invalid(`${param}.type`, `${param} has type ${JSON.stringify(type)}; this server takes message, function_call, function_call_output and reasoning items.`);
    }
  });
  return messages;
}

function itemText(content: unknown, param: string): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw ApiError.invalid(param, `${param} must be a string or an array of text parts.`);
  return content.map((part, j) => {
    if (isObject(part) && (part.type === "input_text" || part.type === "output_text" || part.type === "text") && typeof part.text === "string") return part.text;
    throw ApiError.invalid(`${param}[${j}]`, `${param}[${j}] must be a text part (input_text or output_text); this server serves text-only models.`);
  }).join("");
}

function responseTools(value: unknown): Tool[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw ApiError.invalid("tools", "tools must be an array of function tools.");
  return value.map((tool, i) => {
    if (!isObject(tool) || tool.type !== "function") throw ApiError.invalid(`tools[${i}]`, `tools[${i}] must be {type: "function", name, parameters}; this server runs function tools only.`);
    return { type: "function", function: { name: tool.name, ...(tool.description === undefined ? {} : { description: tool.description }), ...(tool.parameters === undefined ? {} : { parameters: tool.parameters }) } } as Tool;
  });
}

function chatToolChoice(choice: unknown): unknown {
  if (isObject(choice) && choice.type === "function") return { type: "function", function: { name: choice.name } };
  return choice;
}

function responseFormat(text: unknown): Record<string, unknown> {
  if (text === undefined || text === null) return {};
  const format = isObject(text) ? text.format : undefined;
  if (format === undefined) return {};
  if (!isObject(format)) throw ApiError.invalid("text.format", "text.format must be an object.");
  if (format.type === "text") return {};
  if (format.type === "json_object") return { response_format: { type: "json_object" } };
  if (format.type === "json_schema") return { response_format: { type: "json_schema", json_schema: { name: format.name, schema: format.schema, strict: format.strict } } };
  throw ApiError.invalid("text.format.type", `text.format.type must be text, json_object or json_schema, got ${JSON.stringify(format.type)}.`);
}

/** A response object around `output`. */
function responseObject(echo: ResponseEcho, status: "in_progress" | "completed" | "incomplete", output: OutputItem[], usage: ChatResponse["usage"] | null) {
  return {
    id: echo.id, object: "response", created_at: echo.createdAt, status, error: null,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: echo.instructions, max_output_tokens: echo.maxOutputTokens, model: echo.model, output,
    parallel_tool_calls: true, previous_response_id: null, temperature: echo.temperature, top_p: echo.topP,
    text: echo.text, tool_choice: echo.toolChoice, tools: echo.tools, metadata: echo.metadata, store: false,
    usage: usage === null || usage === undefined ? null : {
      input_tokens: usage.prompt_tokens, input_tokens_details: { cached_tokens: 0 },
      output_tokens: usage.completion_tokens, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: usage.total_tokens,
    },
  };
}

/** The output items of a chat answer: its text as a message (when there is text), then one item per tool call. */
function outputItems(response: ChatResponse): OutputItem[] {
  const { message } = response.choices[0]!;
  const items: OutputItem[] = [];
  if (message.content) items.push({ type: "message", id: newId("msg"), status: "completed", role: "assistant", content: [{ type: "output_text", text: message.content, annotations: [], logprobs: [] }] });
  for (const call of message.tool_calls ?? []) {
    if (call.type === "function") items.push({ type: "function_call", id: newId("fc"), call_id: call.id, name: call.function.name, arguments: call.function.arguments, status: "completed" });
  }
  return items;
}

const statusOf = (response: ChatResponse) => (response.choices[0]!.finish_reason === "length" ? "incomplete" : "completed");

export function toResponseObject(response: ChatResponse, echo: ResponseEcho) {
  return responseObject(echo, statusOf(response), outputItems(response), response.usage ?? null);
}

/**
 * The event stream of a response, from the chat run's chunks: the text streams as output_text deltas of a message
 * item as it is sampled; tool calls, decided at the end, follow as function_call items; response.completed closes.
 */
export class ResponseEvents {
  private readonly echo: ResponseEcho;
  private sequence = 0;
  private readonly output: OutputItem[] = [];
  private message: MessageItem | null = null;

  constructor(echo: ResponseEcho) {
    this.echo = echo;
  }

  start(): object[] {
    const shell = responseObject(this.echo, "in_progress", [], null);
    return [this.event("response.created", { response: shell }), this.event("response.in_progress", { response: shell })];
  }

  chunk(chunk: ChatCompletionChunk): object[] {
    const events: object[] = [];
    for (const choice of chunk.choices) {
      if (choice.index !== 0) continue;
      const delta = choice.delta.content ?? "";
      if (delta !== "") {
        if (this.message === null) events.push(...this.openMessage());
        const part = this.message!.content[0]!;
        part.text += delta;
        events.push(this.event("response.output_text.delta", { item_id: this.message!.id, output_index: this.output.indexOf(this.message!), content_index: 0, delta, logprobs: [] }));
      }
      for (const call of choice.delta.tool_calls ?? []) {
        if (call.id !== undefined) {
          events.push(...this.closeMessage());
          const item: FunctionCallItem = { type: "function_call", id: newId("fc"), call_id: call.id, name: call.function?.name ?? "", arguments: "", status: "in_progress" };
          this.output.push(item);
          events.push(this.event("response.output_item.added", { output_index: this.output.length - 1, item: { ...item } }));
        }
        const item = this.output.at(-1);
        const args = call.function?.arguments ?? "";
        if (item?.type === "function_call" && args !== "") {
          item.arguments += args;
          events.push(this.event("response.function_call_arguments.delta", { item_id: item.id, output_index: this.output.length - 1, delta: args }));
        }
      }
    }
    return events;
  }

  finish(response: ChatResponse): object[] {
    const events = this.closeMessage();
    this.output.forEach((item, index) => {
      if (item.type !== "function_call" || item.status === "completed") return;
      item.status = "completed";
      events.push(this.event("response.function_call_arguments.done", { item_id: item.id, output_index: index, name: item.name, arguments: item.arguments }));
      events.push(this.event("response.output_item.done", { output_index: index, item: { ...item } }));
    });
    events.push(this.event("response.completed", { response: responseObject(this.echo, statusOf(response), this.output, response.usage ?? null) }));
    return events;
  }

  error(error: ApiError): object {
    return this.event("error", { code: error.code, message: error.message, param: error.param });
  }

  private openMessage(): object[] {
    this.message = { type: "message", id: newId("msg"), status: "in_progress", role: "assistant", content: [] };
    this.output.push(this.message);
    const index = this.output.length - 1;
    const part: OutputText = { type: "output_text", text: "", annotations: [], logprobs: [] };
    const events = [this.event("response.output_item.added", { output_index: index, item: structuredClone(this.message) })];
    this.message.content.push(part);
    events.push(this.event("response.content_part.added", { item_id: this.message.id, output_index: index, content_index: 0, part: { ...part } }));
    return events;
  }

  private closeMessage(): object[] {
    const message = this.message;
    if (message === null || message.status === "completed") return [];
    message.status = "completed";
    const index = this.output.indexOf(message);
    const part = message.content[0]!;
    return [
      this.event("response.output_text.done", { item_id: message.id, output_index: index, content_index: 0, text: part.text, logprobs: [] }),
      this.event("response.content_part.done", { item_id: message.id, output_index: index, content_index: 0, part: { ...part } }),
      this.event("response.output_item.done", { output_index: index, item: structuredClone(message) }),
    ];
  }

  private event(type: string, fields: Record<string, unknown>): object {
    return { type, sequence_number: this.sequence++, ...fields };
  }
}
