/**
 * vLLM's `ignore_eos` request extra: the end token no longer ends a completion, so a completion is exactly
 * `max_tokens` long (what a benchmark needs from a model of random weights, bench/grpo-step.ts).
 */
import OpenAI from "openai";
import { afterAll, beforeAll, expect, it } from "vitest";
import type { ChatCompletionCreateParamsNonStreaming } from "openai/resources/chat/completions";
import type { Choice } from "../../lib/core/trajectory.ts";
import { IN_PROCESS_BASE_URL, ModelServer } from "../../lib/serve/model-server.ts";
import { tinyServableModel } from "./tiny-model.ts";

let server: ModelServer;
let client: OpenAI;
let eosIds: number[];

beforeAll(async () => {
  server = new ModelServer({ batcher: { numSlots: 8, maxPositions: 256 } });
  const model = await tinyServableModel();
  eosIds = [...model.tokenizer.eosTokenIds];
  server.addBaseModel("tiny-base", model);
  client = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "unused", fetch: server.fetch, maxRetries: 0 });
});

afterAll(async () => {
  await server.close();
});

// Hot sampling, so that some of the 8 choices of this seed sample an end token within 40 tokens (checked below).
const request = { model: "tiny-base", messages: [{ role: "user" as const, content: "Go on." }], n: 8, max_tokens: 40, temperature: 2, seed: 13 };

async function choices(body: ChatCompletionCreateParamsNonStreaming & { ignore_eos?: boolean }): Promise<Choice[]> {
  return (await client.chat.completions.create(body)).choices as Choice[];
}

it("samples through end tokens to max_tokens with ignore_eos, the same tokens up to there", async () => {
  const stopping = await choices(request);
  const stopped = stopping.filter((c) => c.finish_reason === "stop");
  expect(stopped.length).toBeGreaterThan(0);
  const ignoring = await choices({ ...request, ignore_eos: true });
  for (const choice of ignoring) {
    expect(choice.finish_reason).toBe("length");
    expect(choice.token_ids).toHaveLength(40);
  }
  for (const before of stopped) {
    const ids = before.token_ids!;
    expect(eosIds).toContain(ids.at(-1));
    // The same seed samples the same tokens; where the end token ended the completion, it now goes on.
    expect(ignoring[before.index].token_ids!.slice(0, ids.length)).toEqual(ids);
  }
});

it("refuses an ignore_eos that is not a boolean", async () => {
  await expect(choices({ ...request, ignore_eos: "yes" as unknown as boolean })).rejects.toMatchObject({ status: 400, param: "ignore_eos" });
});
