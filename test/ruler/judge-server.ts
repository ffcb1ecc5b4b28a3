/**
 * A real HTTP server on loopback speaking just enough of OpenAI's chat completions API to stand in for an
 * external judge. Each test scripts its replies; the server records every request body it received.
 */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";

export interface ChatRequestBody {
  model: string;
  messages: { role: string; content: string }[];
  response_format?: { type: string; json_schema?: { name: string; strict?: boolean; schema: Record<string, unknown> } };
  temperature?: number;
  [key: string]: unknown;
}

export interface RecordedRequest {
  body: ChatRequestBody;
  authorization: string | undefined;
}

/**
 * What the server does with one request: answer with content, send an error status, never answer, send a raw body,
 * or send the headers and then one byte of body every 50 ms, never finishing.
 */
export type Reply = { content: string | null } | { status: number; error: string } | { hang: true } | { raw: string } | { trickle: true };

export type ReplyScript = (body: ChatRequestBody, requestIndex: number) => Reply;

export class JudgeServer {
  readonly requests: RecordedRequest[] = [];
  private readonly server: Server;
  script: ReplyScript;

  private constructor(server: Server, script: ReplyScript) {
    this.server = server;
    this.script = script;
  }

  static async start(script: ReplyScript): Promise<JudgeServer> {
    const server = createServer();
    const judge = new JudgeServer(server, script);
    server.on("request", async (request, response) => {
      const body = JSON.parse(await readBody(request)) as ChatRequestBody;
      const index = judge.requests.push({ body, authorization: request.headers.authorization }) - 1;
      const reply = judge.script(body, index);
      if ("hang" in reply) return;
      if ("trickle" in reply) {
        response.writeHead(200, { "content-type": "application/json" });
        response.write("{");
        const drip = setInterval(() => response.write(" "), 50);
        response.on("close", () => clearInterval(drip));
        return;
      }
      if ("raw" in reply) {
        response.writeHead(200, { "content-type": "application/json" });
        response.end(reply.raw);
        return;
      }
      if ("status" in reply) {
        response.writeHead(reply.status, { "content-type": "application/json" });
        response.end(JSON.stringify({ error: { message: reply.error, type: "test_error", code: null } }));
        return;
      }
      response.writeHead(200, { "content-type": "application/json" });
      response.end(JSON.stringify(chatCompletion(body.model, reply.content)));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return judge;
  }

  get baseURL(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
  }

  endpoint(model = "judge-model") {
    return { model, baseURL: this.baseURL, apiKey: "test-key" };
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

function readBody(request: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    request.on("data", (chunk: Buffer) => chunks.push(chunk));
    request.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    request.on("error", reject);
  });
}

export function chatCompletion(model: string, content: string | null) {
  return {
    id: "chatcmpl-test",
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, message: { role: "assistant", content, refusal: null }, finish_reason: "stop", logprobs: null }],
    usage: { prompt_tokens: 10, completion_tokens: 10, total_tokens: 20 },
  };
}

/** The trajectory blocks of a judge prompt, by id, as the JSON the prompt holds. */
export function trajectoryBlocks(body: ChatRequestBody): Map<number, unknown[]> {
  const user = body.messages.find((m) => m.role === "user")!.content;
  const blocks = new Map<number, unknown[]>();
  for (const match of user.matchAll(/<trajectory id="(\d+)">\n(.*)\n<\/trajectory>/g)) blocks.set(Number(match[1]), JSON.parse(match[2]));
  return blocks;
}

/** A well-formed answer giving these scores to trajectories 1..n. */
export function answer(scores: number[], explain = (id: number) => `reason ${id}`): string {
  return JSON.stringify({ scores: scores.map((score, i) => ({ trajectory_id: String(i + 1), explanation: explain(i + 1), score })) });
}
