import OpenAI from "openai";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { Message } from "../../lib/core/mod.ts";
import { endpointClient, type Judge, type JudgeRequest, ruler } from "../../lib/ruler/mod.ts";
import { answer, chatCompletion, JudgeServer } from "./judge-server.ts";

const lists: Message[][] = [
  [{ role: "user", content: "q" }, { role: "assistant", content: "a" }],
  [{ role: "user", content: "q" }, { role: "assistant", content: "b" }],
];

describe("judges named provider/model", () => {
  let server: JudgeServer;
  const touched = ["OPENROUTER_BASE_URL", "OPENROUTER_API_KEY", "OPENAI_API_KEY"];
  const saved = Object.fromEntries(touched.map((name) => [name, process.env[name]]));

  beforeEach(async () => {
    server = await JudgeServer.start(() => ({ content: answer([0.2, 0.9]) }));
  });
  afterEach(async () => {
    for (const name of touched) {
      if (saved[name] === undefined) delete process.env[name];
      else process.env[name] = saved[name];
    }
    await server.close();
  });

  it("sends the model after the provider prefix, with the key from the provider's variable", async () => {
    process.env.OPENROUTER_BASE_URL = server.baseURL; // the documented override, here pointing at loopback
    process.env.OPENROUTER_API_KEY = "or-secret";
    const result = await ruler(lists, { judge: "openrouter/qwen/qwen3-32b", cache: false });
    expect(result.scores.map((s) => s.score)).toEqual([0.2, 0.9]);
    expect(server.requests[0].body.model).toBe("qwen/qwen3-32b");
    expect(server.requests[0].authorization).toBe("Bearer or-secret");
    expect(Object.keys(result.scores[0].judgeScores)).toEqual(["openrouter/qwen/qwen3-32b"]);
  });

  it("says which variable to set when the key is missing", async () => {
    delete process.env.OPENAI_API_KEY;
    await expect(ruler(lists, { judge: "openai/o4-mini", cache: false })).rejects.toThrow(
      /judge openai\/o4-mini needs an API key: set OPENAI_API_KEY or pass \{ apiKey \}/,
    );
  });

  it("gives notebooks a client for any provider/model the same way (a baseline, a teacher, a generator)", async () => {
    process.env.OPENROUTER_BASE_URL = server.baseURL;
    process.env.OPENROUTER_API_KEY = "or-secret";
    const { client, model } = endpointClient("openrouter/qwen/qwen3-32b");
    expect(model).toBe("qwen/qwen3-32b");
    await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }] });
    expect(server.requests[0].authorization).toBe("Bearer or-secret");
    delete process.env.OPENAI_API_KEY;
    expect(() => endpointClient("openai/gpt-4.1")).toThrow(/openai\/gpt-4.1: set OPENAI_API_KEY to the provider's API key/);
    expect(() => endpointClient("gpt-4.1")).toThrow(/"gpt-4.1" has no known provider prefix/);
    expect(endpointClient("vllm/served").client.apiKey).toBe("none");
  });

  it("rejects an unknown provider prefix, a malformed judge and bad options, naming what to do", async () => {
    await expect(ruler(lists, { judge: "o4-mini", cache: false })).rejects.toThrow(/no known provider prefix \(openai, openrouter.*pass \{ model, baseURL, apiKey \}/);
    await expect(ruler(lists, { judge: { baseURL: "x" } as never, cache: false })).rejects.toThrow(/a judge must be a name like "openai\/o4-mini"/);
    await expect(ruler(lists, { judge: [], cache: false })).rejects.toThrow(/no judge given/);
    const judge = { model: "m", baseURL: "http://127.0.0.1:9/v1", apiKey: "k" };
    await expect(ruler(lists, { judge, maxAnswerAttempts: 0 })).rejects.toThrow(/maxAnswerAttempts must be a positive integer, got 0/);
    await expect(ruler(lists, { judge, timeoutSeconds: 0 })).rejects.toThrow(/timeoutSeconds must be positive, got 0/);
    const twice = [{ name: "a", description: "x" }, { name: "a", description: "y" }];
    await expect(ruler(lists, { judge, subScores: twice })).rejects.toThrow(/sub-score names must be distinct non-empty strings, got \["a","a"\]/);
  });
});

describe("judges in process", () => {
  it("accepts { client, model }: an OpenAI client on a custom fetch, as an in-process art-ts model provides", async () => {
    const bodies: Record<string, unknown>[] = [];
    const client = new OpenAI({
      apiKey: "local",
      baseURL: "http://art-ts.invalid/v1",
      fetch: async (_url, init) => {
        const body = JSON.parse(String(init?.body)) as Record<string, unknown>;
        bodies.push(body);
        return new Response(JSON.stringify(chatCompletion(String(body.model), answer([0.6, 0.3]))), { headers: { "content-type": "application/json" } });
      },
    });
    const result = await ruler(lists, { judge: { client, model: "my-agent" }, cache: false });
    expect(result.scores.map((s) => s.score)).toEqual([0.6, 0.3]);
    expect(bodies[0]).toMatchObject({ model: "my-agent", response_format: { type: "json_schema", json_schema: { name: "ruler_scores", strict: true } } });
  });

  it("accepts any object implementing Judge", async () => {
    const seen: JudgeRequest[] = [];
    const judge: Judge = {
      name: "rule-based",
      cacheKey: "rule-based-v1",
      complete: async (request) => {
        seen.push(request);
        return answer([1, 0]);
      },
    };
    const result = await ruler(lists, { judge, cache: false, timeoutSeconds: 9 });
    expect(result.scores.map((s) => s.score)).toEqual([1, 0]);
    expect(seen[0].timeoutSeconds).toBe(9);
    expect(seen[0].schema).toHaveProperty("required", ["scores"]);
  });
});
