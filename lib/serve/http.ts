/**
 * The same handler over real HTTP (node:http, which Deno also provides): each request becomes a web Request
 * whose signal aborts when the client closes the connection early, so its sequences leave the batch at once.
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Handler } from "./handler.ts";

export interface HttpServerOptions {
  /** Default 127.0.0.1 (loopback only); pass 0.0.0.0 to accept other machines (then set an api key). */
  host?: string;
  /** Default 0: any free port (read it back from `port`). */
  port?: number;
}

export interface HttpServerHandle {
  readonly host: string;
  readonly port: number;
  /** e.g. http://127.0.0.1:8000/v1, what an OpenAI client takes as baseURL. */
  readonly baseURL: string;
  close(): Promise<void>;
}

export function listen(handler: Handler, options: HttpServerOptions = {}): Promise<HttpServerHandle> {
  const host = options.host ?? "127.0.0.1";
  const server = createServer((req, res) => {
    serveOne(handler, req, res).catch((error) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: `internal error: ${String(error)}`, type: "server_error", param: null, code: null } }));
    });
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      const port = (server.address() as AddressInfo).port;
      const urlHost = host.includes(":") ? `[${host}]` : host;
      resolve({
        host,
        port,
        baseURL: `http://${urlHost}:${port}/v1`,
        close: () => new Promise<void>((done) => {
          server.closeAllConnections();
          server.close(() => done());
        }),
      });
    });
  });
}

async function serveOne(handler: Handler, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const abort = new AbortController();
  // The response closing before it finished means the client went away.
  res.on("close", () => {
    if (!res.writableFinished) abort.abort(new Error("the client closed the connection"));
  });
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (typeof value === "string") headers.set(name, value);
    else if (Array.isArray(value)) for (const v of value) headers.append(name, v);
  }
  const method = req.method ?? "GET";
  // The handler routes by path alone: a fixed origin keeps a malformed Host header from failing the request.
  const request = new Request(new URL(req.url ?? "/", "http://localhost"), {
    method,
    headers,
    // The body streams: the handler checks the key and the declared size before it reads any of it.
    body: method === "GET" || method === "HEAD" ? undefined : bodyStream(req),
    duplex: "half",
    signal: abort.signal,
  } as RequestInit);
  const response = await handler(request);
  const responseHeaders = Object.fromEntries(response.headers);
  if (!req.complete) {
    // Refused unread (401, 413, 415): a connection with a body still arriving cannot carry another request. The
    // rest is discarded rather than left unread (closing on unread data would reset the connection and could
    // lose the answer), the connection closes after the answer, and a client still sending after 10 s is cut off.
    responseHeaders.connection = "close";
    req.removeAllListeners("data");
    req.resume();
    const cutOff = setTimeout(() => req.socket.destroy(), 10_000).unref();
    req.once("end", () => clearTimeout(cutOff));
  }
  res.writeHead(response.status, responseHeaders);
  if (!response.body) {
    res.end();
    return;
  }
  const reader = response.body.getReader();
  abort.signal.addEventListener("abort", () => void reader.cancel(abort.signal.reason).catch(() => {}), { once: true });
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      res.write(value);
    }
  } catch (error) {
    if (!abort.signal.aborted) throw error;
  }
  res.end();
}

/** The request body as a web stream that reads only as fast as it is consumed (nothing is buffered ahead). */
function bodyStream(req: IncomingMessage): ReadableStream<Uint8Array> {
  req.pause();
  let cancelled = false;
  return new ReadableStream<Uint8Array>({
    start(controller) {
      req.on("data", (chunk: Buffer) => {
        controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
        if ((controller.desiredSize ?? 0) <= 0) req.pause();
      });
      req.on("end", () => cancelled || controller.close());
      req.on("error", (error) => cancelled || controller.error(error));
    },
    pull() {
      req.resume();
    },
    cancel() {
      // The rest of the body is discarded, and the connection stays readable for the answer.
      cancelled = true;
      req.removeAllListeners("data");
      req.resume();
    },
  }, { highWaterMark: 64 * 1024, size: (chunk) => chunk.byteLength });
}

