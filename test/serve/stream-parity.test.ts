/**
 * Streamed and non-streamed answers are the same answer: for random combinations of the request options (n,
 * temperature, top_p, max_tokens, stop, logprobs, tools and tool_choice, response_format), the chunks of a stream,
 * put together the way the openai client does, equal the non-streamed choices of the same seed.
 */
import fc from "fast-check";
import OpenAI from "openai";
import type { ChatCompletionChunk, ChatCompletionCreateParamsNonStreaming } from "openai/resources/chat/completions";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ModelServer } from "../../lib/serve/model-server.ts";
import { tinyServableModel } from "./tiny-model.ts";

let server: ModelServer;
let client: OpenAI;
beforeAll(async () => {
  server = new ModelServer({ batcher: { numSlots: 16, maxPositions: 512 } });
  server.addBaseModel("tiny", await tinyServableModel(6));
  client = server.openai({ maxRetries: 0 });
});
afterAll(() => server.close());

const tool = {
  type: "function" as const,
  function: { name: "pick", parameters: { type: "object", properties: { cell: { type: "integer" }, why: { type: "string", maxLength: 6 } }, required: ["cell"], additionalProperties: false } },
};
const schema = { type: "object", properties: { move: { enum: ["A1", "B2"] } }, required: ["move"], additionalProperties: false };

const options = fc.record({
  n: fc.constantFrom(1, 2),
  temperature: fc.constantFrom(0, 0.7, 1.3),
  top_p: fc.constantFrom(1, 0.8),
  max_tokens: fc.integer({ min: 1, max: 40 }),
  seed: fc.nat({ max: 1000 }),
  stop: fc.constantFrom(undefined, ["a"], ["</"]),
  logprobs: fc.boolean(),
  tools: fc.constantFrom("none", "auto", "required", "named"),
  format: fc.constantFrom("text", "json_schema"),
});

/** The choices of a stream as the openai client's accumulator builds them: text, tool calls, finish, token ids. */
function assemble(chunks: ChatCompletionChunk[], n: number) {
  const choices = Array.from({ length: n }, () => ({ content: "", toolCalls: [] as { id?: string; name?: string; arguments: string }[], finish: null as string | null, tokenIds: [] as number[], logprobs: [] as number[] }));
  for (const chunk of chunks) {
    for (const c of chunk.choices) {
      const choice = choices[c.index]!;
      choice.content += c.delta.content ?? "";
      for (const call of c.delta.tool_calls ?? []) {
        const slot = (choice.toolCalls[call.index] ??= { arguments: "" });
        if (call.id) slot.id = call.id;
        if (call.function?.name) slot.name = call.function.name;
        slot.arguments += call.function?.arguments ?? "";
      }
      if (c.finish_reason) choice.finish = c.finish_reason;
      choice.tokenIds.push(...((c as { token_ids?: number[] }).token_ids ?? []));
      choice.logprobs.push(...(c.logprobs?.content ?? []).map((l) => l.logprob));
    }
  }
  return choices;
}

describe("streamed and non-streamed answers", () => {
  it("agree for every combination of options", async () => {
    await fc.assert(fc.asyncProperty(options, async (o) => {
      const params: ChatCompletionCreateParamsNonStreaming = {
        model: "tiny", messages: [{ role: "user", content: "Your move on the board?" }],
        n: o.n, temperature: o.temperature, top_p: o.top_p, max_tokens: o.max_tokens, seed: o.seed, logprobs: o.logprobs,
        ...(o.stop && o.format === "text" && o.tools !== "required" && o.tools !== "named" ? { stop: o.stop } : {}),
        ...(o.tools === "none" ? {} : { tools: [tool], tool_choice: o.tools === "named" ? { type: "function", function: { name: "pick" } } : o.tools }),
        ...(o.format === "json_schema" ? { response_format: { type: "json_schema", json_schema: { name: "m", strict: true, schema } } } : {}),
      } as ChatCompletionCreateParamsNonStreaming;
      let whole: OpenAI.Chat.ChatCompletion;
      try {
        whole = await client.chat.completions.create(params);
      } catch (error) {
        // A budget too small for the required output is refused the same way streamed or not.
        await expect(client.chat.completions.create({ ...params, stream: true })).rejects.toThrow((error as Error).message);
        return;
      }
      const chunks: ChatCompletionChunk[] = [];
      for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) chunks.push(chunk);
      const streamed = assemble(chunks, o.n);
      for (const [i, choice] of whole.choices.entries()) {
        const got = streamed[i]!;
        expect(got.content, `choice ${i} content`).toBe(choice.message.content ?? "");
        expect(got.finish).toBe(choice.finish_reason);
        expect(got.tokenIds).toEqual((choice as { token_ids?: number[] }).token_ids);
        expect(got.toolCalls.map((c) => [c.name, c.arguments])).toEqual((choice.message.tool_calls ?? []).map((c) => c.type === "function" ? [c.function.name, c.function.arguments] : []));
        if (o.logprobs) expect(got.logprobs).toEqual(choice.logprobs!.content!.map((l) => l.logprob));
      }
    }), { seed: 20261125, numRuns: 60 });
  }, 120_000);
});
