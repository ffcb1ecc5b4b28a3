/**
 * Tool calls in generated text, Qwen/Hermes style: each call is a JSON object
 * `{"name": ..., "arguments": {...}}` between <tool_call> and </tool_call>. They become OpenAI tool calls
 * (arguments as a JSON string) plus the text around them.
 *
 * Generated text is untrusted: a malformed call is reported in `errors` and never thrown, so a rollout with
 * a broken call still finishes (and can be rewarded accordingly).
 */
import type { ChatCompletionMessageFunctionToolCall } from "openai/resources/chat/completions";
import { clipText } from "../core/text.ts";

export type ParsedToolCall = ChatCompletionMessageFunctionToolCall;

export interface ParsedToolCalls {
  /** The text outside the tool-call blocks (see contentAround for its whitespace when blocks were removed). */
  content: string;
  toolCalls: ParsedToolCall[];
  /** One line per block that could not be turned into a call, and per stray closing tag. */
  errors: string[];
}

export const TOOL_CALL_OPEN = "<tool_call>";
export const TOOL_CALL_CLOSE = "</tool_call>";

export function parseToolCalls(text: string): ParsedToolCalls {
  const toolCalls: ParsedToolCall[] = [];
  const errors: string[] = [];
  const outside: string[] = [];
  let cursor = 0;
  let blockNumber = 0;
  while (cursor < text.length) {
    const open = text.indexOf(TOOL_CALL_OPEN, cursor);
    const segmentEnd = open === -1 ? text.length : open;
    outside.push(reportStrayCloses(text.slice(cursor, segmentEnd), cursor, errors));
    if (open === -1) break;
    blockNumber++;
    const bodyStart = open + TOOL_CALL_OPEN.length;
    const close = text.indexOf(TOOL_CALL_CLOSE, bodyStart);
    if (close === -1) {
      errors.push(`tool call ${blockNumber}: <tool_call> at offset ${open} is never closed with </tool_call>: ${snippet(text.slice(bodyStart))}`);
      cursor = text.length;
      break;
    }
    const parsed = parseCallBody(text.slice(bodyStart, close), blockNumber);
    if (typeof parsed === "string") errors.push(parsed);
    else toolCalls.push(parsed);
    cursor = close + TOOL_CALL_CLOSE.length;
  }
  return { content: blockNumber > 0 ? contentAround(outside) : outside.join(""), toolCalls, errors };
}

/**
 * The text outside the blocks: what came before the first block loses only its trailing whitespace (a stream has
 * sent the rest of it already, so the answer must begin with exactly that), what follows is kept, blank lines at the
 * start and whitespace at the end dropped.
 */
function contentAround(outside: string[]): string {
  const head = outside[0]!.trimEnd();
  const tail = outside.slice(1).join("");
  return (head === "" ? tail.trimStart() : head + tail).trimEnd();
}

/** A call, or the error line that says why the block is not one. */
function parseCallBody(body: string, blockNumber: number): ParsedToolCall | string {
  const where = `tool call ${blockNumber}`;
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch (error) {
    return `${where}: invalid JSON (${error instanceof Error ? error.message : String(error)}): ${snippet(body.trim())}`;
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return `${where}: expected a JSON object {"name": ..., "arguments": {...}}, got ${snippet(body.trim())}`;
  }
  const { name, arguments: args } = value as { name?: unknown; arguments?: unknown };
  if (typeof name !== "string" || name.trim() === "") {
    return `${where}: missing a non-empty string "name": ${snippet(body.trim())}`;
  }
  const argumentsJson = argumentsAsJson(args);
  if (argumentsJson === null) {
    return `${where} (${name}): "arguments" must be a JSON object (or a string holding one), got ${snippet(JSON.stringify(args))}`;
  }
  return { id: newToolCallId(), type: "function", function: { name, arguments: argumentsJson } };
}

/** Missing arguments mean a call without parameters; a string is accepted when it holds a JSON object. */
function argumentsAsJson(args: unknown): string | null {
  if (args === undefined) return "{}";
  if (typeof args === "string") {
    try {
      return argumentsAsJson(JSON.parse(args));
    } catch {
      return null;
    }
  }
  if (typeof args !== "object" || args === null || Array.isArray(args)) return null;
  return JSON.stringify(args);
}

function reportStrayCloses(segment: string, offset: number, errors: string[]): string {
  let at = segment.indexOf(TOOL_CALL_CLOSE);
  while (at !== -1) {
    errors.push(`</tool_call> at offset ${offset + at} has no opening <tool_call>`);
    at = segment.indexOf(TOOL_CALL_CLOSE, at + TOOL_CALL_CLOSE.length);
  }
  return segment;
}

function newToolCallId(): string {
  return `call_${globalThis.crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;
}

function snippet(text: string): string {
  return JSON.stringify(clipText(text, 200));
}
