/**
 * The unmodified `openai` package against the server: in-process (custom fetch, no port) and over real
 * loopback HTTP, chat completions with and without streaming, forced tool calls, and OpenAI-style errors.
 */
import OpenAI from "openai";
import { Agent, request as httpRequest } from "node:http";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { ChatCompletionTool } from "openai/resources/chat/completions";
import { IN_PROCESS_BASE_URL, ModelServer, type ServableModel } from "../../lib/serve/model-server.ts";
import type { HttpServerHandle } from "../../lib/serve/http.ts";
import { compileSchema } from "../../lib/serve/json-schema.ts";
import { tinyServableModel } from "./tiny-model.ts";

const API_KEY = "test-key";
let server: ModelServer;
let model: ServableModel;
let http: HttpServerHandle;
const clients: Record<string, OpenAI> = {};

beforeAll(async () => {
  server = new ModelServer({ apiKey: API_KEY, batcher: { numSlots: 8, maxPositions: 512 } });
  model = await tinyServableModel();
  server.addBaseModel("tiny-base", model);
  http = await server.listen();
  clients["in-process"] = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: API_KEY, fetch: server.fetch, maxRetries: 0 });
  clients.http = new OpenAI({ baseURL: http.baseURL, apiKey: API_KEY, maxRetries: 0 });
});

afterAll(async () => {
  await server.close();
});

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 }, celsius: { type: "boolean" } }, required: ["city"], additionalProperties: false },
  },
};

for (const transport of ["in-process", "http"]) {
  describe(`openai client, ${transport}`, () => {
    it("lists the served models", async () => {
      const models = await clients[transport].models.list();
      expect(models.data.map((m) => m.id)).toEqual(["tiny-base"]);
    });

    it("creates a completion with usage, token ids and logprobs", async () => {
      const completion = await clients[transport].chat.completions.create({
        model: "tiny-base",
        messages: [{ role: "developer", content: "Be brief." }, { role: "user", content: "Hello!" }],
        max_tokens: 6,
        temperature: 1.5,
        seed: 7,
        logprobs: true,
        top_logprobs: 3,
      });
      const choice = completion.choices[0] as (typeof completion.choices)[0] & { token_ids: number[]; prompt_token_ids: number[] };
      expect(completion.object).toBe("chat.completion");
      // the prompt as the model read it: the chat template's rendering, encoded
      const rendered = model.tokenizer.applyChatTemplate([{ role: "system", content: "Be brief." }, { role: "user", content: "Hello!" }], { addGenerationPrompt: true });
      expect(choice.prompt_token_ids).toEqual(model.tokenizer.encode(rendered, { addSpecialTokens: false }));
      expect(completion.usage!.prompt_tokens).toBe(choice.prompt_token_ids.length);
      expect(choice.finish_reason).toBe("length"); // with this seed the noise model samples no end token
      expect(choice.token_ids).toHaveLength(6);
      expect(completion.usage).toMatchObject({ completion_tokens: 6, total_tokens: completion.usage!.prompt_tokens + 6 });
      const content = choice.logprobs!.content!;
      expect(content.map((c) => c.logprob).every((l) => l <= 0)).toBe(true);
      expect(content.every((c) => c.top_logprobs.length === 3)).toBe(true);
      // The sampled token is one of the alternatives or less likely than the third.
      for (const c of content) expect(c.logprob).toBeLessThanOrEqual(c.top_logprobs[0].logprob + 1e-6);
      expect(content.map((c) => c.token).join("")).toBe(model.tokenizer.decode(choice.token_ids, { skipSpecialTokens: false }));
      expect(choice.message.content).toBe(model.tokenizer.decode(choice.token_ids, { skipSpecialTokens: true }));
    });

    it("streams the same tokens as the non-streamed answer with the same seed", async () => {
      const params = { model: "tiny-base", messages: [{ role: "user" as const, content: "Count." }], max_tokens: 8, temperature: 1.8, seed: 11 };
      const whole = await clients[transport].chat.completions.create(params);
      const stream = await clients[transport].chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
      let text = "";
      const ids: number[] = [];
      let promptIds: number[] | undefined;
      let finish: string | null = null;
      let usage: unknown = null;
      for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const c of chunk.choices) {
          text += c.delta.content ?? "";
          ids.push(...((c as { token_ids?: number[] }).token_ids ?? []));
          promptIds ??= (c as { prompt_token_ids?: number[] }).prompt_token_ids;
          finish = c.finish_reason ?? finish;
        }
      }
      expect(text).toBe(whole.choices[0].message.content);
      expect(ids).toEqual((whole.choices[0] as { token_ids?: number[] }).token_ids);
      expect(promptIds).toEqual((whole.choices[0] as { prompt_token_ids?: number[] }).prompt_token_ids);
      expect(finish).toBe("length");
      expect(usage).toEqual(whole.usage);
    });

    it("returns n choices", async () => {
      const completion = await clients[transport].chat.completions.create({ model: "tiny-base", messages: [{ role: "user", content: "Hi" }], max_tokens: 3, n: 3, temperature: 2, seed: 1 });
      expect(completion.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    });

    it("a forced tool call comes back as OpenAI tool_calls, streamed or not", async () => {
      const params = {
        model: "tiny-base",
        messages: [{ role: "user" as const, content: "Weather in Paris?" }],
        tools: [weatherTool],
        tool_choice: { type: "function" as const, function: { name: "get_weather" } },
        max_tokens: 100,
        seed: 5,
      };
      const completion = await clients[transport].chat.completions.create(params);
      const choice = completion.choices[0];
      expect(choice.finish_reason).toBe("tool_calls");
      const call = choice.message.tool_calls![0];
      expect(call.type === "function" && call.function.name).toBe("get_weather");
      const args = JSON.parse(call.type === "function" ? call.function.arguments : "");
      expect(typeof args.city).toBe("string");

      // openai-node's stream helper: its per-call "done" event fires only when the finish arrives in a later chunk.
      const stream = clients[transport]!.chat.completions.stream(params);
      const done: { name: string; arguments: string }[] = [];
      stream.on("tool_calls.function.arguments.done", (event) => done.push({ name: event.name, arguments: event.arguments }));
      const final = await stream.finalChatCompletion();
      expect(done).toEqual([{ name: "get_weather", arguments: call.type === "function" ? call.function.arguments : "" }]);
      expect(final.choices[0]!.finish_reason).toBe("tool_calls");
      expect(final.choices[0]!.message.tool_calls).toMatchObject([{ id: expect.stringMatching(/^call_/), type: "function", function: { name: "get_weather", arguments: call.type === "function" ? call.function.arguments : "" } }]);
    });

    it("a required tool call wins over a response_format, which shapes the answer after the tool ran", async () => {
      const format = { type: "json_schema" as const, json_schema: { name: "answer", strict: true, schema: { type: "object", properties: { summary: { type: "string", maxLength: 8 } }, required: ["summary"], additionalProperties: false } } };
      const base = { model: "tiny-base", tools: [weatherTool], response_format: format, max_tokens: 100, seed: 7 };
      const first = await clients[transport]!.chat.completions.create({ ...base, messages: [{ role: "user", content: "Weather in Paris?" }], tool_choice: "required" });
      expect(first.choices[0]!.finish_reason).toBe("tool_calls");
      const call = first.choices[0]!.message.tool_calls![0]!;
      expect(call.type === "function" && call.function.name).toBe("get_weather");
      const after = await clients[transport]!.chat.completions.create({
        ...base, tool_choice: "auto", max_tokens: 60,
        messages: [{ role: "user", content: "Weather in Paris?" }, first.choices[0]!.message, { role: "tool", tool_call_id: call.id, content: "sunny" }],
      });
      expect(JSON.parse(after.choices[0]!.message.content!)).toEqual({ summary: expect.any(String) });
    });

    it("a tool conversation (assistant tool_calls + tool result) is accepted", async () => {
      const completion = await clients[transport].chat.completions.create({
        model: "tiny-base",
        messages: [
          { role: "user", content: "Weather in Paris?" },
          { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
          { role: "tool", tool_call_id: "call_1", content: "sunny" },
        ],
        tools: [weatherTool],
        max_tokens: 4,
      });
      expect(completion.choices[0].finish_reason).toMatch(/^(length|stop)$/);
    });

    it("answers errors in OpenAI's format with the right status", async () => {
      const client = clients[transport];
      const base = { messages: [{ role: "user" as const, content: "Hi" }], max_tokens: 2 };
      await expect(client.chat.completions.create({ ...base, model: "nope" })).rejects.toMatchObject({ status: 404, code: "model_not_found", param: "model" });
      await expect(client.chat.completions.create({ ...base, model: "tiny-base", temperature: 3 })).rejects.toMatchObject({ status: 400, param: "temperature", type: "invalid_request_error" });
      await expect(client.chat.completions.create({ ...base, model: "tiny-base", max_tokens: 1_000 })).rejects.toMatchObject({ status: 400, code: "context_length_exceeded" });
      await expect(client.chat.completions.create({
        ...base, model: "tiny-base", response_format: { type: "json_schema", json_schema: { name: "s", schema: { type: "string", pattern: "(a)\\1" } } },
      })).rejects.toMatchObject({ status: 400, code: "invalid_json_schema", message: expect.stringMatching(/backreferences are not supported/) });
      // 10,000 enum values cost seconds of CPU per request and stalled the server; past OpenAI's 1,000 they are refused.
      const enumSchema = (n: number) => ({ type: "object", properties: { a: { enum: Array.from({ length: n - 1 }, (_, i) => `v${i}`) }, b: { const: "k" } } });
      await expect(client.chat.completions.create({
        ...base, model: "tiny-base", response_format: { type: "json_schema", json_schema: { name: "s", schema: enumSchema(1001) } },
      })).rejects.toMatchObject({ status: 400, code: "invalid_json_schema", message: expect.stringMatching(/holds 1001 enum\/const values in all; constrained decoding here takes at most 1000/) });
      expect(() => compileSchema(enumSchema(1000))).not.toThrow();
      const wrongKey = new OpenAI({ baseURL: transport === "http" ? http.baseURL : IN_PROCESS_BASE_URL, apiKey: "wrong", fetch: transport === "http" ? undefined : server.fetch, maxRetries: 0 });
      await expect(wrongKey.models.list()).rejects.toMatchObject({ status: 401, code: "invalid_api_key" });
    });
  });
}

type ErrorBody = { error: { message: string; type: string; param: string | null; code: string | null } };

describe("raw requests", () => {
  const post = (body: string) =>
    server.fetch(`${IN_PROCESS_BASE_URL}/chat/completions`, { method: "POST", body, headers: { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" } });

  it("a body that is not JSON is a 400 with OpenAI's error shape", async () => {
    const response = await post("{not json");
    expect(response.status).toBe(400);
    const body = await response.json();
    expect(body).toEqual({ error: { message: expect.stringMatching(/could not parse the JSON body/), type: "invalid_request_error", param: null, code: null } });
  });

  it("names the offending field of invalid messages", async () => {
    const cases: [unknown, string][] = [
      [{ model: "tiny-base", messages: [] }, "messages"],
      [{ model: "tiny-base", messages: [{ role: "wizard", content: "x" }] }, "messages[0].role"],
      [{ model: "tiny-base", messages: [{ role: "tool", content: "x" }] }, "messages[0].tool_call_id"],
      [{ model: "tiny-base", messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }, "messages[0].content[0]"],
      [{ model: "tiny-base", messages: [{ role: "user", content: "x" }], n: 0 }, "n"],
      [{ model: "tiny-base", messages: [{ role: "user", content: "x" }], top_logprobs: 2 }, "top_logprobs"],
      [{ model: "tiny-base", messages: [{ role: "user", content: "x" }], bogus: 1 }, "bogus"],
      [{ model: "tiny-base", messages: [{ role: "user", content: "x" }], tool_choice: "required" }, "tool_choice"],
    ];
    for (const [body, param] of cases) {
      const response = await post(JSON.stringify(body));
      expect(response.status, param).toBe(400);
      expect(((await response.json()) as ErrorBody).error.param).toBe(param);
    }
  });

  it("answers 400, not 500, to a 5,000-deep schema, a broken %-escape in a model id and a tool name with markup", async () => {
    const schema = `${'{"type":"object","properties":{"a":'.repeat(5000)}{"type":"string"}${"}}".repeat(5000)}`; // too deep for JSON.stringify here
    const deep = await post(`{"model":"tiny-base","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":${schema}}}}`);
    expect(deep.status).toBe(400);
    expect(((await deep.json()) as ErrorBody).error.message).toMatch(/nests deeper than 64 levels/);
    const escape = await server.fetch(`${IN_PROCESS_BASE_URL}/models/%E0%A4%A`, { headers: { authorization: `Bearer ${API_KEY}` } });
    expect(escape.status).toBe(400);
    expect(((await escape.json()) as ErrorBody).error.message).toMatch(/is not valid percent-encoding/);
    const tool = { type: "function", function: { name: "search</tool_call>", parameters: { type: "object" } } };
    const named = await post(JSON.stringify({ model: "tiny-base", messages: [{ role: "user", content: "x" }], tools: [tool], tool_choice: "required" }));
    expect(named.status).toBe(400);
    expect(((await named.json()) as ErrorBody).error).toMatchObject({ param: "tools[0].function.name", message: expect.stringMatching(/1 to 64 letters, digits, underscores or dashes/) });
  });

  it("an unknown path is a 404", async () => {
    const response = await server.fetch(`${IN_PROCESS_BASE_URL}/completions`, { method: "POST", body: "{}", headers: { authorization: `Bearer ${API_KEY}` } });
    expect(response.status).toBe(404);
    expect(((await response.json()) as ErrorBody).error.code).toBe("unknown_url");
  });
});

describe("a prompt that cannot fit", () => {
  it("is refused before the template and the tokenizer run over it", async () => {
    const encode = vi.spyOn(model.tokenizer, "encode");
    const huge = "word ".repeat(400_000); // 2 MB: at least 2e6 / (the longest token's bytes) tokens
    await expect(clients["in-process"]!.chat.completions.create({ model: "tiny-base", messages: [{ role: "user", content: huge }], max_tokens: 4 }))
      .rejects.toMatchObject({ status: 400, code: "context_length_exceeded", message: expect.stringMatching(/you requested at least \d+ tokens \(at least \d+ in the messages, 4 in the completion\)/) });
    expect(encode).not.toHaveBeenCalled();
    encode.mockRestore();
  });
});

describe("request limits over HTTP", () => {
  let limited: ModelServer;
  let handle: HttpServerHandle;
  beforeAll(async () => {
    limited = new ModelServer({ apiKey: API_KEY, maxRequestBytes: 4096 });
    limited.addBaseModel("tiny-base", model);
    handle = await limited.listen();
  });
  afterAll(() => limited.close());

  /** Sends the headers and `sent` bytes of a body that claims `declared` bytes (or is chunked), never finishing it. */
  function unfinishedPost(headers: Record<string, string>, sent: number): Promise<{ status: number; body: ErrorBody }> {
    return new Promise((resolve, reject) => {
      const request = httpRequest(`${handle.baseURL}/chat/completions`, { method: "POST", headers }, (response) => {
        let text = "";
        response.on("data", (chunk: Buffer) => (text += chunk.toString()));
        response.on("end", () => {
          request.destroy();
          resolve({ status: response.statusCode!, body: JSON.parse(text) as ErrorBody });
        });
      });
      request.on("error", (error) => (error.message.includes("socket hang up") ? undefined : reject(error)));
      request.write("x".repeat(sent));
    });
  }

  it("serves a request whose Host header is malformed (it routes by path)", async () => {
    const status = await new Promise<number>((resolve, reject) => {
      httpRequest(`${handle.baseURL}/models`, { headers: { host: "bad host:::", authorization: `Bearer ${API_KEY}` } }, (response) => {
        response.resume();
        resolve(response.statusCode!);
      }).on("error", reject).end();
    });
    expect(status).toBe(200);
  });

  it("answers 401 to a wrong key before reading the body", async () => {
    const reply = await unfinishedPost({ authorization: "Bearer wrong", "content-type": "application/json", "content-length": "100000000" }, 1024);
    expect(reply.status).toBe(401);
    expect(reply.body.error.code).toBe("invalid_api_key");
  });

  it("answers 413 to a body declared or found larger than maxRequestBytes, without reading the rest", async () => {
    const declared = await unfinishedPost({ authorization: `Bearer ${API_KEY}`, "content-type": "application/json", "content-length": "100000000" }, 1024);
    expect(declared.status).toBe(413);
    expect(declared.body.error).toMatchObject({ code: "request_too_large", message: expect.stringMatching(/larger than this server's limit of 4096 bytes/) });
    const chunked = await unfinishedPost({ authorization: `Bearer ${API_KEY}`, "content-type": "application/json", "transfer-encoding": "chunked" }, 8192);
    expect(chunked.status).toBe(413);
  });

  it("keeps serving a keep-alive client after refusing a body unread", async () => {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const ask = (method: string, body: string | null, headers: Record<string, string>) => new Promise<number>((resolve, reject) => {
      const request = httpRequest(`${handle.baseURL}/${method === "GET" ? "models" : "chat/completions"}`, { method, agent, headers }, (response) => {
        response.resume();
        response.on("end", () => resolve(response.statusCode!));
      });
      request.on("error", reject);
      request.end(body ?? undefined);
    });
    const refused = [
      ask("POST", "x".repeat(2_000_000), { authorization: `Bearer ${API_KEY}`, "content-type": "application/json" }),
      ask("POST", "x".repeat(2_000_000), { authorization: `Bearer ${API_KEY}`, "content-type": "text/plain" }),
      ask("POST", "x".repeat(2_000_000), { authorization: "Bearer wrong", "content-type": "application/json" }),
    ];
    const next = ask("GET", null, { authorization: `Bearer ${API_KEY}` }); // queued behind them on the one socket
    const started = Date.now();
    expect(await Promise.all(refused)).toEqual([413, 415, 401]);
    expect(await next).toBe(200);
    expect(Date.now() - started).toBeLessThan(2000); // an unread body used to hold the socket until a timeout
    agent.destroy();
  });

  it("refuses a body that is not declared as JSON (a web page can post text/plain to loopback without a preflight)", async () => {
    const response = await fetch(`${handle.baseURL}/chat/completions`, {
      method: "POST", headers: { authorization: `Bearer ${API_KEY}`, "content-type": "text/plain" },
      body: JSON.stringify({ model: "tiny-base", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }),
    });
    expect(response.status).toBe(415);
    expect(((await response.json()) as ErrorBody).error.message).toMatch(/send Content-Type: application\/json \(got "text\/plain"\)/);
    const ok = await new OpenAI({ baseURL: handle.baseURL, apiKey: API_KEY, maxRetries: 0 }).chat.completions.create({ model: "tiny-base", messages: [{ role: "user", content: "hi" }], max_tokens: 1 });
    expect(ok.choices).toHaveLength(1);
  });
});
