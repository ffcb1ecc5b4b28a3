/**
 * The HTTP surface, as a function from a web `Request` to a `Response`: the in-process fetch and the node:http
 * server both call it, so they behave the same byte for byte. Routes: GET /v1/models, GET /v1/models/{id},
 * POST /v1/chat/completions and POST /v1/responses (JSON or server-sent events), and when enabled vLLM's runtime
 * LoRA endpoints POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { Buffer } from "node:buffer";
import type { ChatCompletionChunk } from "openai/resources/chat/completions";
import { ApiError, toApiError } from "./api-error.ts";
import { recordCompletion } from "../core/capture.ts";
import type { Choice } from "../core/trajectory.ts";
import { clipText } from "../core/text.ts";
import { ChatCompletionRun, type ChatResponse, type ModelRoute, type ServeMetrics } from "./chat.ts";
import { parseChatRequest, type ChatRequest } from "./request.ts";
import { parseResponsesRequest, ResponseEvents, toResponseObject } from "./responses.ts";

export interface HandlerContext {
  apiKey: string | null;
  /** Request bodies larger than this get a 413 before (or as soon as) they are read past it. */
  maxRequestBytes: number;
  modelIds(): string[];
  /** The route of a model id, or undefined when it is not served. */
  route(id: string): ModelRoute | undefined;
  metrics: ServeMetrics;
  created: number;
  /** vLLM's runtime LoRA endpoints, or null when they are off (ModelServerOptions.runtimeAdapters). */
  adapters: {
    load(request: { name: string; path: string; baseModel?: string; replace?: boolean }): void;
    unload(name: string): void;
  } | null;
}

export type Handler = (request: Request) => Promise<Response>;

export function createHandler(context: HandlerContext): Handler {
  return async (request) => {
    try {
      return await handle(context, request);
    } catch (error) {
      return errorResponse(toApiError(error));
    }
  };
}

async function handle(context: HandlerContext, request: Request): Promise<Response> {
  const url = new URL(request.url);
  const path = url.pathname.replace(/\/+$/, "");
  if (context.apiKey !== null && !sameSecret(request.headers.get("authorization") ?? "", `Bearer ${context.apiKey}`)) {
    throw new ApiError(401, "Incorrect API key provided. Pass the key the server was started with (--api-key) as the client's apiKey.", "invalid_request_error", null, "invalid_api_key");
  }
  if (path === "/v1/models" && request.method === "GET") {
    return json(200, { object: "list", data: context.modelIds().map((id) => modelObject(id, context.created)) });
  }
  if (path.startsWith("/v1/models/") && request.method === "GET") {
    let id: string;
    try {
      id = decodeURIComponent(path.slice("/v1/models/".length));
    } catch {
      throw ApiError.invalid(null, `The model id in ${JSON.stringify(clipText(url.pathname, 200))} is not valid percent-encoding.`);
    }
    if (!context.route(id)) throw modelNotFound(id);
    return json(200, modelObject(id, context.created));
  }
  if (path === "/v1/chat/completions" && request.method === "POST") return chatCompletions(context, request);
  if (path === "/v1/responses" && request.method === "POST") return responses(context, request);
  if ((path === "/v1/load_lora_adapter" || path === "/v1/unload_lora_adapter") && request.method === "POST") return runtimeAdapter(context, request, path);
  throw new ApiError(404, `Unknown request URL: ${request.method} ${url.pathname}. This server serves GET /v1/models, POST /v1/chat/completions and POST /v1/responses.`, "invalid_request_error", null, "unknown_url");
}

/**
 * vLLM's runtime LoRA endpoints: load_lora_adapter {lora_name, lora_path, base_model_name?, load_inplace?} and
 * unload_lora_adapter {lora_name}, answered as vLLM does (200 with a line of text).
 */
async function runtimeAdapter(context: HandlerContext, request: Request, path: string): Promise<Response> {
  if (!context.adapters) {
    throw new ApiError(404, `${path} is off: runtime LoRA updates load files from this machine, so they are enabled explicitly (art-ts serve --allow-runtime-lora, or new ModelServer({ runtimeAdapters: true })).`, "invalid_request_error", null, "unknown_url");
  }
  const body = await readJson(context, request, path);
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw ApiError.invalid(null, "The body must be a JSON object.");
  const field = (name: string, required: boolean): string | undefined => {
    const value = (body as Record<string, unknown>)[name];
    if (value === undefined && !required) return undefined;
    if (typeof value !== "string" || value === "") throw ApiError.invalid(name, `${name} must be a non-empty string.`);
    return value;
  };
  const name = field("lora_name", true)!;
  if (path === "/v1/unload_lora_adapter") {
    context.adapters.unload(name);
    return text(200, `Success: LoRA adapter '${name}' removed successfully.`);
  }
  const replace = (body as Record<string, unknown>).load_inplace;
  if (replace !== undefined && typeof replace !== "boolean") throw ApiError.invalid("load_inplace", "load_inplace must be a boolean.");
  context.adapters.load({ name, path: field("lora_path", true)!, baseModel: field("base_model_name", false), replace: replace === true });
  return text(200, `Success: LoRA adapter '${name}' added successfully.`);
}

/** The JSON body of a POST to `endpoint`, refused unread when it is not declared as JSON or is too large. */
async function readJson(context: HandlerContext, request: Request, endpoint: string): Promise<unknown> {
  // Anything but JSON is refused unread: a web page may post text/plain to a loopback server without a preflight.
  const contentType = request.headers.get("content-type") ?? "";
  if (!/^application\/json\s*(;|$)/i.test(contentType)) {
    throw new ApiError(415, `POST ${endpoint} takes a JSON body: send Content-Type: application/json (got ${contentType === "" ? "none" : JSON.stringify(contentType)}).`, "invalid_request_error", null, "unsupported_media_type");
  }
  const text = await readBody(request, context.maxRequestBytes);
  try {
    return JSON.parse(text);
  } catch {
    throw ApiError.invalid(null, "We could not parse the JSON body of your request. The body must be a JSON object (Content-Type: application/json).");
  }
}

/** A chat request's run on its model, and the recorder that adds the answer to a running captureTrajectory. */
function startRun(context: HandlerContext, chat: ChatRequest): { run: ChatCompletionRun; record: (response: ChatResponse) => void } {
  const route = context.route(chat.model);
  if (!route) throw modelNotFound(chat.model);
  const run = new ChatCompletionRun(route, chat, context.metrics);
  // Inside captureTrajectory (in-process requests only), the answered call joins the agent's trajectory.
  const record = (response: ChatResponse) => recordCompletion({ messages: chat.messages, tools: chat.tools.length > 0 ? chat.tools : undefined, choice: response.choices[0]! as Choice });
  return { run, record };
}

async function chatCompletions(context: HandlerContext, request: Request): Promise<Response> {
  const chat = parseChatRequest(await readJson(context, request, "/v1/chat/completions"));
  const { run, record } = startRun(context, chat);
  if (!chat.stream) {
    const response = await run.run(request.signal);
    record(response);
    return json(200, response);
  }
  return eventStream(request, async (send, signal) => {
    const response = await run.run(signal, (chunk: ChatCompletionChunk) => send(chunk));
    record(response);
    if (chat.includeUsage) send(run.chunk([], response.usage));
  }, (error) => toApiError(error).toJSON(), true);
}

async function responses(context: HandlerContext, request: Request): Promise<Response> {
  const { chat, echo } = parseResponsesRequest(await readJson(context, request, "/v1/responses"));
  const { run, record } = startRun(context, chat);
  if (!chat.stream) {
    const response = await run.run(request.signal);
    record(response);
    return json(200, toResponseObject(response, echo));
  }
  const events = new ResponseEvents(echo);
  return eventStream(request, async (send, signal) => {
    for (const event of events.start()) send(event);
    const response = await run.run(signal, (chunk: ChatCompletionChunk) => {
      for (const event of events.chunk(chunk)) send(event);
    });
    record(response);
    for (const event of events.finish(response)) send(event);
  }, (error) => events.error(toApiError(error)), false);
}

/**
 * Server-sent events from `produce`, which stops when the client goes away (the request's signal) or cancels the
 * body. An error after the headers went out is sent as `onError`'s event; `doneMarker` ends chat streams with [DONE].
 */
function eventStream(request: Request, produce: (send: (data: unknown) => void, signal: AbortSignal) => Promise<void>, onError: (error: unknown) => unknown, doneMarker: boolean): Response {
  const abort = new AbortController();
  const onRequestAbort = () => abort.abort(request.signal.reason);
  request.signal.addEventListener("abort", onRequestAbort, { once: true });
  const encoder = new TextEncoder();
  let cancelled = false;
  const body$ = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (data: unknown) => {
        if (abort.signal.aborted) return;
        // Responses events name themselves on the event: line too, as OpenAI sends them.
        const type = (data as { type?: unknown }).type;
        const event = !doneMarker && typeof type === "string" ? `event: ${type}\n` : "";
        controller.enqueue(encoder.encode(`${event}data: ${JSON.stringify(data)}\n\n`));
      };
      produce(send, abort.signal)
        .catch((error) => send(onError(error)))
        .finally(() => {
          request.signal.removeEventListener("abort", onRequestAbort);
          if (abort.signal.aborted) {
            // In-process there is no network to fail the body: error it so the reader's loop ends as fetch's would.
            if (!cancelled) controller.error(abort.signal.reason);
            return;
          }
          if (doneMarker) controller.enqueue(encoder.encode("data: [DONE]\n\n"));
          controller.close();
        });
    },
    cancel(reason) {
      cancelled = true;
      abort.abort(reason ?? new Error("the client cancelled the stream"));
    },
  });
  return new Response(body$, { status: 200, headers: { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" } });
}

function tooLarge(limit: number): ApiError {
  return new ApiError(413, `The request body is larger than this server's limit of ${limit} bytes (maxRequestBytes; art-ts serve --max-request-mb).`, "invalid_request_error", null, "request_too_large");
}

/** The body as text, refusing it as soon as it passes `limit` bytes (by its Content-Length, else while reading). */
async function readBody(request: Request, limit: number): Promise<string> {
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (declared > limit) throw tooLarge(limit);
  if (!request.body) return "";
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  const reader = request.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes > limit) {
      await reader.cancel().catch(() => {});
      throw tooLarge(limit);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** Compares two secrets in time that does not depend on where they first differ. */
function sameSecret(given: string, expected: string): boolean {
  const a = createHash("sha256").update(given).digest(), b = createHash("sha256").update(expected).digest();
  return timingSafeEqual(a, b);
}

function modelObject(id: string, created: number) {
  return { id, object: "model", created, owned_by: "art-ts" };
}

function modelNotFound(id: string): ApiError {
  return new ApiError(404, `The model \`${id}\` does not exist or you do not have access to it.`, "invalid_request_error", "model", "model_not_found");
}

function json(status: number, value: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(value), { status, headers: { "content-type": "application/json", ...headers } });
}

function text(status: number, body: string): Response {
  return new Response(body, { status, headers: { "content-type": "text/plain; charset=utf-8" } });
}

function errorResponse(error: ApiError): Response {
  const headers: Record<string, string> = error.status === 429 ? { "retry-after": "1" } : {};
  return json(error.status, error.toJSON(), headers);
}
