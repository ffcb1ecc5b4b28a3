/**
 * The synthetic inbox as an MCP server (./mcp-server.ts): its tools, and the command that starts it from the runtime
 * this code runs in (Node, or Deno inside its Jupyter kernel), so a notebook can `connectMcp(inboxMcpServer())` in
 * either kernel.
 */
import process from "node:process";
import { fileURLToPath } from "node:url";
import type { McpServerSpec } from "../mcp.ts";
import { ARTE_TOOLS } from "./tools.ts";

/** ART·E's search and read tools; the final answer is the MCP rollout's own complete_task. */
export const INBOX_MCP_TOOLS = ARTE_TOOLS.flatMap((t) => (t.type === "function" && t.function.name !== "return_final_answer" ? [t] : []));

export interface InboxMcpOptions {
  /** generateInbox's seed and size; defaults 1 and 3000. */
  seed?: number;
  emails?: number;
  /** Whose mailbox; default the first user's. */
  inbox?: string;
}

/** The stdio command line of the inbox MCP server, for connectMcp(). */
export function inboxMcpServer(options: InboxMcpOptions = {}): McpServerSpec {
  // lib/ runs as .ts (Deno, Node's type stripping) or compiled in dist/ as .js: the server sits beside this file either way.
  const script = fileURLToPath(new URL(`./mcp-server${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url));
  const flags = [
    ...(options.seed === undefined ? [] : ["--seed", String(options.seed)]),
    ...(options.emails === undefined ? [] : ["--emails", String(options.emails)]),
    ...(options.inbox === undefined ? [] : ["--inbox", options.inbox]),
  ];
  const deno = (globalThis as { Deno?: { execPath(): string } }).Deno;
  if (deno !== undefined) return { command: deno.execPath(), args: ["run", "--quiet", "--allow-read", "--allow-env", "--allow-sys", script, ...flags] };
  return { command: process.execPath, args: [script, ...flags] };
}
