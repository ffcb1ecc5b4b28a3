/**
 * Chat templates: the checkpoint's own Jinja template, rendered with @huggingface/jinja the way
 * transformers' `apply_chat_template` renders it (same variables, same `tojson`).
 *
 * OpenAI-shaped messages are brought into the shape templates are written for before rendering:
 * assistant tool-call arguments arrive as JSON strings but templates print them with `tojson`, so they
 * are parsed into objects (vLLM does the same); text content parts are joined; a null content becomes "".
 */
import { Template } from "@huggingface/jinja";
import { ArtError } from "../core/errors.ts";
import type { Message, Tool } from "../core/trajectory.ts";
import { clipText } from "../core/text.ts";

export interface ChatTemplateOptions {
  tools?: Tool[];
  addGenerationPrompt?: boolean;
  /** Any other variable the template reads, under the template's own name (e.g. `enable_thinking: false`). */
  [extra: string]: unknown;
}

/** A template source and where it came from (named in every error). */
export interface ChatTemplateSource {
  template: string;
  origin: string;
}

/** Special-token strings a template may use (`bos_token`, `eos_token`, ...), as transformers passes them. */
export type SpecialTokenVariables = Record<string, string>;

export class ChatTemplate {
  readonly source: ChatTemplateSource;
  private parsed: Template | undefined;

  constructor(source: ChatTemplateSource) {
    this.source = source;
  }

  render(messages: Message[], options: ChatTemplateOptions, specialTokens: SpecialTokenVariables): string {
    const { tools, addGenerationPrompt, ...extra } = options;
    if (tools !== undefined && !Array.isArray(tools)) {
      throw new ArtError("chat_invalid_tools", `applyChatTemplate: tools must be an array of OpenAI function tools, got ${describe(tools)}`);
    }
    const context: Record<string, unknown> = {
      ...specialTokens,
      ...extra,
      messages: normalizeMessages(messages),
      tools: tools && tools.length > 0 ? tools : null,
      add_generation_prompt: addGenerationPrompt ?? false,
    };
    const template = this.parse();
    try {
      return template.render(context);
    } catch (error) {
      // Includes the template's own raise_exception("...") messages, e.g. about roles that must alternate.
      throw new ArtError(
        "chat_template_render",
        `rendering the chat template from ${this.source.origin} failed: ${errorText(error)}. ` +
          `Check that the messages have the roles and fields this template expects.`,
        { cause: error },
      );
    }
  }

  private parse(): Template {
    if (this.parsed) return this.parsed;
    try {
      this.parsed = new Template(this.source.template);
    } catch (error) {
      throw new ArtError(
        "chat_template_syntax",
        `the chat template from ${this.source.origin} could not be parsed: ${errorText(error)}. ` +
          `Fix the template or put a corrected one in chat_template.jinja beside tokenizer.json.`,
        { cause: error },
      );
    }
    return this.parsed;
  }
}

/**
 * Picks the template transformers would use: `chat_template.jinja` beside the tokenizer wins over
 * tokenizer_config.json; a config may hold named templates, of which "tool_use" serves calls with tools.
 */
export function selectChatTemplates(
  configTemplate: unknown,
  configFile: string,
  jinjaFile: { path: string; text: string } | null,
): { default: ChatTemplate | null; toolUse: ChatTemplate | null } {
  if (jinjaFile) {
    const template = new ChatTemplate({ template: jinjaFile.text, origin: jinjaFile.path });
    return { default: template, toolUse: null };
  }
  if (configTemplate === undefined || configTemplate === null) return { default: null, toolUse: null };
  if (typeof configTemplate === "string") {
    return { default: new ChatTemplate({ template: configTemplate, origin: `${configFile} (chat_template)` }), toolUse: null };
  }
  if (Array.isArray(configTemplate)) {
    const named = new Map<string, ChatTemplate>();
    for (const entry of configTemplate) {
      const { name, template } = (entry ?? {}) as { name?: unknown; template?: unknown };
      if (typeof name !== "string" || typeof template !== "string") {
        throw new ArtError("tokenizer_config_invalid", `${configFile}: each entry of chat_template must be {"name": string, "template": string}, got ${describe(entry)}`);
      }
      named.set(name, new ChatTemplate({ template, origin: `${configFile} (chat_template "${name}")` }));
    }
    return { default: named.get("default") ?? null, toolUse: named.get("tool_use") ?? null };
  }
  throw new ArtError("tokenizer_config_invalid", `${configFile}: chat_template must be a string or a list of named templates, got ${describe(configTemplate)}`);
}

/** Brings OpenAI chat messages into the shape chat templates expect (see the file comment). */
export function normalizeMessages(messages: Message[]): Record<string, unknown>[] {
  if (!Array.isArray(messages)) {
    throw new ArtError("chat_invalid_message", `applyChatTemplate: messages must be an array of chat messages, got ${describe(messages)}`);
  }
  return messages.map((message, index) => {
    if (typeof message !== "object" || message === null || typeof (message as { role?: unknown }).role !== "string") {
      throw new ArtError("chat_invalid_message", `applyChatTemplate: message ${index} must be an object with a string "role", got ${describe(message)}`);
    }
    const normalized: Record<string, unknown> = { ...message, content: contentText(message, index) };
    if ("tool_calls" in message && message.tool_calls !== undefined && message.tool_calls !== null) {
      normalized.tool_calls = normalizeToolCalls(message.tool_calls, index);
    }
    return normalized;
  });
}

function contentText(message: Message, index: number): string {
  const content: unknown = message.content;
  if (content === undefined || content === null) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part, partIndex) => {
        const { type, text } = (part ?? {}) as { type?: unknown; text?: unknown };
        if (type === "text" && typeof text === "string") return text;
        throw new ArtError(
          "chat_invalid_message",
          `applyChatTemplate: message ${index} (${message.role}) content part ${partIndex} is ${describe(type)}; only text parts are supported by text-only chat templates`,
        );
      })
      .join("\n");
  }
  throw new ArtError("chat_invalid_message", `applyChatTemplate: message ${index} (${message.role}) content must be a string or a list of text parts, got ${describe(content)}`);
}

function normalizeToolCalls(toolCalls: unknown, messageIndex: number): unknown[] {
  if (!Array.isArray(toolCalls)) {
    throw new ArtError("chat_invalid_message", `applyChatTemplate: message ${messageIndex} tool_calls must be an array, got ${describe(toolCalls)}`);
  }
  return toolCalls.map((call, callIndex) => {
    const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
    if (typeof fn !== "object" || fn === null || typeof fn.name !== "string") {
      throw new ArtError(
        "chat_invalid_message",
        `applyChatTemplate: message ${messageIndex} tool_calls[${callIndex}] must look like {id, type: "function", function: {name, arguments}}, got ${describe(call)}`,
      );
    }
    if (typeof fn.arguments !== "string") return call;
    let parsed: unknown;
    try {
      parsed = JSON.parse(fn.arguments);
    } catch (error) {
      throw new ArtError(
        "chat_invalid_tool_arguments",
        `applyChatTemplate: message ${messageIndex} tool_calls[${callIndex}] (${fn.name}) has arguments that are not valid JSON ` +
          `(${errorText(error)}): ${snippet(fn.arguments)}. Chat templates print arguments as a JSON object; fix or drop this tool call.`,
      );
    }
    return { ...(call as object), function: { ...fn, arguments: parsed } };
  });
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function snippet(text: string): string {
  return JSON.stringify(clipText(text, 120));
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return snippet(JSON.stringify(value) ?? String(value));
  return typeof value === "string" ? snippet(value) : `${typeof value} ${String(value)}`;
}
