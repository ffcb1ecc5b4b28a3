/**
 * MCP servers as environments (ART's MCP·RL): connect to any Model Context Protocol server over stdio or HTTP with
 * the reference SDK (`@modelcontextprotocol/sdk`, loaded on first use so art-ts does not depend on it), hand its tools
 * to the model as OpenAI function tools, run the model's calls through the server, and generate training tasks from
 * the tool list. The reward comes from RULER: a generated task has no reference answer.
 *
 * The client is typed by the few methods used here (`McpClient`), so a Client made by hand with the SDK works too.
 */
import type OpenAI from "openai";
import { ArtError } from "../core/errors.ts";
import { Trajectory, type Tool } from "../core/trajectory.ts";
import { clipText } from "../core/text.ts";
import type { GamePolicy } from "./policy.ts";
import { parseToolArguments, playToolEpisode } from "./tool-episode.ts";

/** A tool as an MCP server lists it. */
export interface McpToolInfo {
  name: string;
  description?: string;
  inputSchema: { type: "object"; properties?: Record<string, unknown>; required?: string[]; [key: string]: unknown };
}

/** What a tool call returns: MCP content blocks, and whether the tool reported an error. */
export interface McpCallResult {
  content?: unknown;
  isError?: unknown;
  structuredContent?: unknown;
  [key: string]: unknown;
}

/** The parts of the SDK's Client that art-ts uses. */
export interface McpClient {
  listTools(params?: { cursor?: string }): Promise<{ tools: McpToolInfo[]; nextCursor?: string }>;
  callTool(params: { name: string; arguments?: Record<string, unknown> }): Promise<McpCallResult>;
  close(): Promise<void>;
}

/** How to reach a server: a command that speaks MCP on its stdin/stdout, or a Streamable HTTP endpoint. */
export type McpServerSpec =
  | { command: string; args?: string[]; env?: Record<string, string>; cwd?: string }
  | { url: string; headers?: Record<string, string> };

/** OpenAI function names allow [A-Za-z0-9_-], at most 64; MCP names may hold dots or slashes. */
function functionName(mcpName: string): string {
  return mcpName.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64);
}

/** Every tool the server lists (all pages), as OpenAI function tools; names outside OpenAI's alphabet get `_`. */
export async function mcpTools(client: McpClient): Promise<{ tools: Tool[]; mcpNames: Map<string, string> }> {
  const listed: McpToolInfo[] = [];
  let cursor: string | undefined;
  do {
    const page = await client.listTools(cursor === undefined ? undefined : { cursor });
    listed.push(...page.tools);
    cursor = page.nextCursor;
  } while (cursor !== undefined);
  const mcpNames = new Map<string, string>();
  const tools = listed.map((tool): Tool => {
    const name = functionName(tool.name);
    if (mcpNames.has(name)) throw new ArtError("mcp_tool_names", `MCP tools ${JSON.stringify(mcpNames.get(name))} and ${JSON.stringify(tool.name)} both become the function name ${name}; rename one on the server`);
    mcpNames.set(name, tool.name);
    return { type: "function", function: { name, description: tool.description ?? "", parameters: { ...tool.inputSchema, type: "object" } } };
  });
  return { tools, mcpNames };
}

/** An MCP result's content as the text of a tool message: text blocks as they are, other blocks named. */
export function mcpResultText(result: McpCallResult): string {
  const blocks = Array.isArray(result.content) ? (result.content as Record<string, unknown>[]) : [];
  const parts = blocks.map((block) => {
    if (block.type === "text" && typeof block.text === "string") return block.text;
    if (block.type === "resource" && typeof (block.resource as { text?: unknown })?.text === "string") return (block.resource as { text: string }).text;
    if (block.type === "resource_link") return `[resource ${String(block.uri)}]`;
    return `[${String(block.type)} content]`;
  });
  if (parts.length === 0 && result.structuredContent !== undefined) parts.push(JSON.stringify(result.structuredContent));
  const text = parts.join("\n");
  return result.isError === true ? (text.startsWith("Error:") ? text : `Error: ${text}`) : text;
}

/**
 * Runs one function call from the model on the server: `args` is the JSON string the model produced. Never throws:
 * bad JSON, a tool error or a failed request come back as "Error: ..." text the agent can read, as a tool result must.
 */
export async function callMcpTool(client: McpClient, name: string, args: string): Promise<string> {
  const parsed = parseToolArguments(name, args);
  if (typeof parsed === "string") return parsed;
  try {
    return mcpResultText(await client.callTool({ name, arguments: parsed }));
  } catch (error) {
    return `Error: ${name} failed: ${error instanceof Error ? error.message : String(error)}`;
  }
}

/** The SDK, loaded when first needed; a clear error when it is not installed. */
async function sdk() {
  try {
    const [{ Client }, { StdioClientTransport }, { StreamableHTTPClientTransport }] = await Promise.all([
      import("@modelcontextprotocol/sdk/client/index.js"),
      import("@modelcontextprotocol/sdk/client/stdio.js"),
      import("@modelcontextprotocol/sdk/client/streamableHttp.js"),
    ]);
    return { Client, StdioClientTransport, StreamableHTTPClientTransport };
  } catch (error) {
    throw new ArtError("mcp_sdk_missing", `connecting to an MCP server needs the MCP SDK: npm install @modelcontextprotocol/sdk (${(error as Error).message})`);
  }
}

/** A connected MCP server: its tools as OpenAI tools, calls by function name, and close(). */
export class McpConnection {
  readonly client: McpClient;
  /** The server's name and version, as it announced them. */
  readonly name: string;
  readonly tools: Tool[];
  private readonly mcpNames: Map<string, string>;

  private constructor(client: McpClient, name: string, listed: { tools: Tool[]; mcpNames: Map<string, string> }) {
    this.client = client;
    this.name = name;
    this.tools = listed.tools;
    this.mcpNames = listed.mcpNames;
  }

  /** A connection over an existing client (e.g. one made with the SDK by hand), its tools listed. */
  static async over(client: McpClient, name = "mcp"): Promise<McpConnection> {
    return new McpConnection(client, name, await mcpTools(client));
  }

  /**
   * Starts or reaches the server and lists its tools. A stdio server's stderr is kept: when it fails to start, the
   * error quotes its last lines.
   */
  static async open(server: McpServerSpec): Promise<McpConnection> {
    const { Client, StdioClientTransport, StreamableHTTPClientTransport } = await sdk();
    const client = new Client({ name: "art-ts", version: "1" });
    let stderr = "";
    let transport;
    if ("url" in server) {
      transport = new StreamableHTTPClientTransport(new URL(server.url), { requestInit: { headers: server.headers ?? {} } });
    } else {
      transport = new StdioClientTransport({ command: server.command, args: server.args ?? [], env: server.env, cwd: server.cwd, stderr: "pipe" });
      transport.stderr?.on("data", (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-2000)));
    }
    const where = "url" in server ? server.url : [server.command, ...(server.args ?? [])].join(" ");
    try {
      await client.connect(transport);
    } catch (error) {
      await client.close().catch(() => undefined);
      throw new ArtError("mcp_connect", `could not connect to the MCP server ${where}: ${(error as Error).message}${stderr === "" ? "" : `\nits stderr ends with:\n${stderr.trim()}`}`);
    }
    const info = client.getServerVersion();
    try {
      return new McpConnection(client as unknown as McpClient, info === undefined ? where : `${info.name} ${info.version}`, await mcpTools(client as unknown as McpClient));
    } catch (error) {
      // A stdio server would otherwise outlive the failure, and keep the process from exiting.
      await client.close().catch(() => undefined);
      throw error;
    }
  }

  /** Runs a call the model made, by its function name; never throws (see callMcpTool). */
  call(name: string, args: string): Promise<string> {
    const mcpName = this.mcpNames.get(name);
    if (mcpName === undefined) return Promise.resolve(`Error: unknown tool ${JSON.stringify(name)}. The tools are ${[...this.mcpNames.keys()].join(", ")}.`);
    return callMcpTool(this.client, mcpName, args);
  }

  close(): Promise<void> {
    return this.client.close();
  }
}

/** Connects to an MCP server (stdio command or HTTP URL) and lists its tools; `close()` it when done. */
export function connectMcp(server: McpServerSpec): Promise<McpConnection> {
  return McpConnection.open(server);
}

/** A training task for an MCP agent: what to do, and how hard the generator thought it was (1 easy … 5 hard). */
export interface McpScenario {
  task: string;
  difficulty: number;
}

const COMPLETE_TASK = "complete_task";

/** The tool the rollout adds so the agent can say it is done: its summary is the answer RULER reads. */
export const COMPLETE_TASK_TOOL: Tool = {
  type: "function",
  function: {
    name: COMPLETE_TASK,
    description: "Call this when the task is done (or cannot be done), with a short summary of the result.",
    parameters: { type: "object", properties: { summary: { type: "string", description: "What you found or did." } }, required: ["summary"], additionalProperties: false },
  },
};

function toolList(tools: Tool[]): string {
  return tools.map((t) => (t.type === "function" ? `- ${t.function.name}: ${t.function.description ?? ""}` : "")).join("\n");
}

export interface GenerateScenariosOptions {
  /** How many tasks. */
  count: number;
  /** More guidance for the generator (the domain, what to avoid). */
  instructions?: string;
  /** Completion tokens for the generator's answer; default 150 per task. */
  maxTokens?: number;
}

/**
 * Training tasks written by an LLM from the server's tools (their names, descriptions and parameters), as ART's
 * MCP·RL does: one request with a JSON schema (`count` tasks, each with a difficulty), so art-ts's own server and
 * endpoints with structured outputs keep the answer to it.
 */
export async function generateMcpScenarios(generator: { client: OpenAI; model: string }, tools: Tool[], options: GenerateScenariosOptions): Promise<McpScenario[]> {
  const { count } = options;
  if (!Number.isInteger(count) || count < 1) throw new ArtError("bad_config", `generateMcpScenarios: count must be an integer >= 1, got ${count}`);
  const schemas = tools.map((t) => (t.type === "function" ? { name: t.function.name, parameters: t.function.parameters } : null)).filter((t) => t !== null);
  const completion = await generator.client.chat.completions.create({
    model: generator.model,
    messages: [
      { role: "system", content: "You write training tasks for an AI agent that works only through the tools below. Each task is one realistic " +
        "request a user would make that the tools can answer or carry out, specific enough to check, varied in what it needs and in " +
        `difficulty (1 easy, 5 needs several calls).${options.instructions === undefined ? "" : ` ${options.instructions}`}\n\nTools:\n${toolList(tools)}\n\n` +
        `Parameters:\n${JSON.stringify(schemas)}` },
      { role: "user", content: `Write ${count} tasks.` },
    ],
    response_format: { type: "json_schema", json_schema: { name: "scenarios", strict: true, schema: {
      type: "object", additionalProperties: false, required: ["scenarios"],
      properties: { scenarios: { type: "array", minItems: count, maxItems: count, items: {
        type: "object", additionalProperties: false, required: ["task", "difficulty"],
        properties: { task: { type: "string", minLength: 1, maxLength: 300 }, difficulty: { type: "integer", enum: [1, 2, 3, 4, 5] } },
      } } },
    } } },
    max_tokens: options.maxTokens ?? 150 * count,
  });
  const text = completion.choices[0]?.message.content ?? "";
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new ArtError("mcp_scenarios", `the generator ${generator.model} did not answer with JSON (it may not support structured outputs; its answer starts ${JSON.stringify(clipText(text, 120))})`);
  }
  const listed = (parsed as { scenarios?: unknown }).scenarios;
  const scenarios = (Array.isArray(listed) ? listed : [])
    .filter((s): s is McpScenario => typeof s?.task === "string" && s.task.trim() !== "" && Number.isInteger(s.difficulty))
    .map((s) => ({ task: s.task.trim(), difficulty: Math.min(5, Math.max(1, s.difficulty)) }));
  if (scenarios.length === 0) throw new ArtError("mcp_scenarios", `the generator ${generator.model} wrote no usable task (each needs a non-empty "task" and an integer "difficulty"); its answer starts ${JSON.stringify(clipText(text, 120))}`);
  return scenarios;
}

export function mcpSystemPrompt(server: string, tools: Tool[]): string {
  return `You are an agent working with the tools of the MCP server ${server}:\n${toolList(tools)}\n` +
    "Use them to complete the user's task: call the tools you need, read their results, and when the task is done (or " +
    "cannot be done) call complete_task with a short summary of the result.";
}

export interface McpRolloutOptions {
  /** Assistant turns before the episode stops; default 10. */
  maxTurns?: number;
  /** Replaces the default system prompt (mcpSystemPrompt). */
  systemPrompt?: string;
}

/**
 * One task played against the server: the agent's tool calls go to the server through the connection, until it calls
 * complete_task, replies without a call, or runs out of turns. The reward stays 0 for RULER to set; metrics: turns,
 * tool_calls, tool_errors, completed, out_of_turns. The summary is logged.
 */
export async function rolloutMcp(policy: GamePolicy<McpConnection>, scenario: McpScenario, connection: McpConnection, options: McpRolloutOptions = {}): Promise<Trajectory> {
  const maxTurns = options.maxTurns ?? 10;
  if (connection.tools.some((t) => t.type === "function" && t.function.name === COMPLETE_TASK)) {
    throw new ArtError("mcp_tool_names", `the MCP server ${connection.name} has a tool named ${COMPLETE_TASK}, the name rolloutMcp gives the agent's own way to hand in the result; rename the server's tool`);
  }
  const tools = [...connection.tools, COMPLETE_TASK_TOOL];
  const trajectory = new Trajectory({
    messagesAndChoices: [
      { role: "system", content: options.systemPrompt ?? mcpSystemPrompt(connection.name, connection.tools) },
      { role: "user", content: scenario.task },
    ],
    tools,
    metadata: { env: "mcp", server: connection.name, task: scenario.task, difficulty: scenario.difficulty },
  });
  let summary: string | undefined;
  const episode = await playToolEpisode(policy, trajectory, {
    maxTurns,
    state: connection,
    done: () => summary !== undefined,
    call: (name, args) => {
      if (name !== COMPLETE_TASK) return connection.call(name, args);
      const parsed = parseToolArguments(name, args);
      if (typeof parsed === "string") return parsed;
      if (typeof parsed.summary !== "string") return 'Error: complete_task needs "summary": a string.';
      summary = parsed.summary;
      return "Task marked complete.";
    },
  });
  Object.assign(trajectory.metrics, {
    turns: episode.turns,
    tool_calls: episode.toolCalls,
    tool_errors: episode.toolErrors,
    completed: summary !== undefined,
    out_of_turns: summary === undefined && !episode.repliedWithoutCall && episode.turns >= maxTurns,
    context_exceeded: episode.contextExceeded,
  });
  if (summary !== undefined) trajectory.log(`summary: ${summary}`);
  return trajectory.finish();
}
