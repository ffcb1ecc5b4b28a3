/**
 * The synthetic inbox as an MCP server: ART·E's search_emails and read_email over one user's mail, for the MCP·RL
 * notebook and tests to train against a real MCP server process offline. Run as a program, never imported:
 *
 *   node lib/envs/arte/mcp-server.ts [--seed 1] [--emails 3000] [--inbox ADDRESS] [--http PORT]
 *
 * Stdio by default (MCP messages on stdin/stdout, nothing else written there); `--http PORT` serves Streamable HTTP
 * at http://127.0.0.1:PORT/mcp instead (stateless: each request stands alone) and prints that URL on stderr.
 * `inboxMcpServer()` (./mcp.ts) builds the command line for the runtime it runs in.
 */
import { createServer } from "node:http";
import process from "node:process";
import { parseArgs } from "node:util";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { EmailDatabase } from "./database.ts";
import { generateInbox } from "./inbox.ts";
import { INBOX_MCP_TOOLS } from "./mcp.ts";
import { InboxTools } from "./tools.ts";

const { values } = parseArgs({ options: { seed: { type: "string", default: "1" }, emails: { type: "string", default: "3000" }, inbox: { type: "string" }, http: { type: "string" } } });
const inbox = generateInbox({ seed: Number(values.seed), emails: Number(values.emails) });
const address = values.inbox ?? inbox.users[0]!;
if (!inbox.users.includes(address)) {
  console.error(`inbox MCP server: ${address} has no inbox here; the users are ${inbox.users.join(", ")}`);
  process.exit(2);
}
const db = new EmailDatabase();
db.insert(inbox.emails);
// All of the user's mail is visible: the server has no question date, so its "today" is after the last email.
const tools = new InboxTools(db, address, "9999-12-31");
const listed = INBOX_MCP_TOOLS.map((t) => t.function.name);

function server(): Server {
  const mcp = new Server({ name: "art-ts-inbox", version: "1" }, {
    capabilities: { tools: {} },
    instructions: `The mailbox of ${address}, at a company called Northwind Energy: search it and read its emails.`,
  });
  mcp.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: INBOX_MCP_TOOLS.map((t) => ({ name: t.function.name, description: t.function.description, inputSchema: t.function.parameters as { type: "object" } })),
  }));
  mcp.setRequestHandler(CallToolRequestSchema, (request) => {
    // InboxTools also answers return_final_answer, which this server does not list: only the listed tools run.
    const text = listed.includes(request.params.name)
      ? tools.call(request.params.name, JSON.stringify(request.params.arguments ?? {}))
      : `Error: unknown tool ${JSON.stringify(request.params.name)}. The tools are ${listed.join(", ")}.`;
    return { content: [{ type: "text", text }], isError: text.startsWith("Error:") };
  });
  return mcp;
}

if (values.http === undefined) {
  await server().connect(new StdioServerTransport());
} else {
  const http = createServer(async (req, res) => {
    if (new URL(req.url ?? "/", "http://localhost").pathname !== "/mcp") return void res.writeHead(404).end();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on("close", () => void transport.close());
    try {
      await server().connect(transport);
      await transport.handleRequest(req, res);
    } catch (error) {
      // One bad request must not end the server for every other client.
      console.error(`inbox MCP server: ${error instanceof Error ? error.message : String(error)}`);
      if (!res.headersSent) res.writeHead(500).end();
    }
  });
  http.listen(Number(values.http), "127.0.0.1", () => {
    const bound = http.address();
    console.error(`inbox MCP server: http://127.0.0.1:${typeof bound === "object" && bound !== null ? bound.port : values.http}/mcp`);
  });
}
