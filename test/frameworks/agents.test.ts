// Agents written with the real TypeScript frameworks against the model server: through its in-process fetch (nothing
// leaves the process; any other fetch fails the test), each captured with captureTrajectory into a trajectory that
// trains as it is, and over HTTP on loopback. The Vercel AI SDK (@ai-sdk/openai-compatible on chat completions,
// @ai-sdk/openai's default provider on the Responses API), LangChain JS (ChatOpenAI on both APIs), the OpenAI Agents
// SDK and openai-node's own helpers (parse with zod response formats, runTools). Each agent calls a tool the model is
// made to call (tool_choice required or named), gets its result back and answers.
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { tool as langchainTool } from "@langchain/core/tools";
import { ChatOpenAI } from "@langchain/openai";
import { Agent, OpenAIProvider, run, setTracingDisabled, tool as agentsTool } from "@openai/agents";
import { generateText, stepCountIs, streamText, tool as aiTool } from "ai";
import { zodFunction, zodResponseFormat } from "openai/helpers/zod";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { captureTrajectory } from "../../lib/core/capture.ts";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { resolveTrainConfig } from "../../lib/grpo/config.ts";
import { tokenizeGroups } from "../../lib/grpo/tokenize.ts";
import { IN_PROCESS_BASE_URL, ModelServer, type ServableModel } from "../../lib/serve/model-server.ts";
import { tinyServableModel } from "../serve/tiny-model.ts";

let model: ServableModel;
let server: ModelServer;
const realFetch = globalThis.fetch;
// A framework reaching for the network (token counting, telemetry) fails here instead of hanging.
const blockedFetch: typeof fetch = (input) => Promise.reject(new Error(`network fetch in a framework test: ${String(input)}`));
beforeAll(async () => {
  model = await tinyServableModel(5);
  server = new ModelServer({ batcher: { numSlots: 8, maxPositions: 1024 } });
  server.addBaseModel("tiny", model);
  globalThis.fetch = blockedFetch;
  setTracingDisabled(true);
});
afterAll(() => {
  globalThis.fetch = realFetch;
  server.close();
});

const weatherCalls: string[] = [];
const weather = (city: string) => {
  weatherCalls.push(city);
  return `It is sunny in ${city}.`;
};

/** The captured trajectory has a tool call answered by its result, and tokenizes into the engine's exact ids. */
function expectTrainable(trajectory: Trajectory): void {
  const choices = [trajectory, ...trajectory.additionalHistories]
    .flatMap((history) => history.messagesAndChoices.filter((item): item is Choice => !("role" in item)));
  // On failure, say what the agent's calls were: a rare sampled path is only diagnosable from the CI log.
  const calls = choices.map((choice) => ({ finish: choice.finish_reason, content: choice.message.content, tools: choice.message.tool_calls }));
  expect(choices.length, `captured choices: ${JSON.stringify(calls)}`).toBeGreaterThanOrEqual(2);
  const call = choices.find((choice) => choice.message.tool_calls?.length);
  expect(call?.message.tool_calls?.[0]).toMatchObject({ type: "function", function: { name: "weather" } });
  const items = trajectory.messagesAndChoices;
  expect(items.some((item) => "role" in item && item.role === "tool" && String(item.content).includes("sunny"))).toBe(true);
  expect(trajectory.tools?.map((t) => (t.type === "function" ? t.function.name : t.type))).toContain("weather");
  // Beside a copy with another reward, so the group has an advantage to train on.
  const rival = Trajectory.fromJSON({ ...trajectory.toJSON(), reward: trajectory.reward - 1 });
  const { sequences } = tokenizeGroups(model.tokenizer, [new TrajectoryGroup([trajectory, rival])], resolveTrainConfig());
  const last = choices.at(-1)!;
  expect(sequences.some((s) => s.tokens.join() === [...last.prompt_token_ids!, ...last.token_ids!].join())).toBe(true);
}

describe("agent frameworks against the in-process server", () => {
  it("Vercel AI SDK, @ai-sdk/openai-compatible (chat completions): a tool loop captured and trainable", async () => {
    const provider = createOpenAICompatible({ name: "art-ts", baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch });
    let text = "";
    const trajectory = await captureTrajectory(async () => {
      const result = await generateText({
        model: provider.chatModel("tiny"),
        system: "Answer with the weather tool.",
        prompt: "Weather in Paris?",
        tools: { weather: aiTool({ description: "the weather in a city", inputSchema: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) }) },
        // The first step must call the tool; the second answers from its result.
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
        stopWhen: stepCountIs(2),
        maxOutputTokens: 64,
        seed: 1,
      });
      text = result.text;
    }, { reward: 1 });
    expect(typeof text).toBe("string");
    expectTrainable(trajectory);
  });

  it("Vercel AI SDK streamText (chat completions, streamed): the same tool loop, captured from the stream", async () => {
    const provider = createOpenAICompatible({ name: "art-ts", baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch });
    const trajectory = await captureTrajectory(async () => {
      const result = streamText({
        model: provider.chatModel("tiny"),
        prompt: "Weather in Quito?",
        tools: { weather: aiTool({ description: "the weather in a city", inputSchema: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) }) },
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
        stopWhen: stepCountIs(2),
        maxOutputTokens: 64,
      });
      const parts: string[] = [];
      for await (const part of result.fullStream) parts.push(part.type);
      expect(parts).toContain("tool-call");
      expect(parts).toContain("tool-result");
    }, { reward: 1 });
    expectTrainable(trajectory);
  });

  it("Vercel AI SDK, @ai-sdk/openai's default provider (the Responses API): text and a tool call", async () => {
    const openai = createOpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch });
    const trajectory = await captureTrajectory(async () => {
      const result = await generateText({
        model: openai("tiny"),
        prompt: "Weather in Oslo?",
        tools: { weather: aiTool({ description: "the weather in a city", inputSchema: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) }) },
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
        stopWhen: stepCountIs(2),
        maxOutputTokens: 64,
      });
      expect(result.steps[0]!.toolCalls[0]!.toolName).toBe("weather");
    }, { reward: 0 });
    expectTrainable(trajectory);
  });

  // The call is forced by naming the tool: LangChain's Responses path leaves tool_choice "required" out of its request.
  it.each([false, true])("LangChain JS ChatOpenAI (useResponsesApi %s): bindTools with a forced call, then the tool's answer", async (useResponsesApi) => {
    const llm = new ChatOpenAI({ model: "tiny", apiKey: "local", maxRetries: 0, maxTokens: 64, useResponsesApi, configuration: { baseURL: IN_PROCESS_BASE_URL, fetch: server.fetch } });
    const weatherTool = langchainTool(async ({ city }: { city: string }) => weather(city),
      { name: "weather", description: "the weather in a city", schema: z.object({ city: z.string().max(12) }) });
    const trajectory = await captureTrajectory(async () => {
      const messages: Parameters<typeof llm.invoke>[0] = [["system", "Answer with the weather tool."], ["human", "Weather in Rome?"]];
      const called = await llm.bindTools([weatherTool], { tool_choice: "weather" }).invoke(messages);
      expect(called.tool_calls?.[0]?.name).toBe("weather");
      const result = await weatherTool.invoke(called.tool_calls![0]!);
      await llm.bindTools([weatherTool]).invoke([...messages, called, result]);
    }, { reward: 0.5 });
    expectTrainable(trajectory);
  });

  it("openai-node's helpers: parse with zod response formats (literals, bounded integers, enums, recursion), runTools", async () => {
    const client = server.openai({ maxRetries: 0 });
    const Forecast = z.object({ kind: z.literal("forecast"), day: z.number().int().min(1).max(7), sky: z.enum(["sun", "rain"]) });
    const parsed = await client.chat.completions.parse({
      model: "tiny", messages: [{ role: "user", content: "Forecast?" }], max_tokens: 64, seed: 3,
      response_format: zodResponseFormat(Forecast, "forecast"),
    });
    expect(Forecast.parse(parsed.choices[0]!.message.parsed)).toMatchObject({ kind: "forecast" });
    // A recursive schema (z.lazy: zodResponseFormat writes it with definitions and $ref) closes within max_tokens.
    type Chain = { v: number; next: Chain | null };
    const Chain: z.ZodType<Chain> = z.lazy(() => z.object({ v: z.number().int().min(0).max(9), next: Chain.nullable() }));
    const chain = await client.chat.completions.parse({
      model: "tiny", messages: [{ role: "user", content: "A chain?" }], max_tokens: 96, seed: 5,
      response_format: zodResponseFormat(z.object({ head: Chain }), "chain"),
    });
    expect(chain.choices[0]!.finish_reason).toBe("stop");
    // Formats as zod writes them (format + its pattern), checked by zod itself.
    const Contact = z.object({ who: z.email(), id: z.uuid(), at: z.iso.datetime(), code: z.string().regex(/^[a-z]{3}$/) });
    const contact = await client.chat.completions.parse({
      model: "tiny", messages: [{ role: "user", content: "Contact?" }], max_tokens: 200, seed: 6, response_format: zodResponseFormat(Contact, "contact"),
    });
    expect(Contact.safeParse(contact.choices[0]!.message.parsed).success).toBe(true);
    expect(z.object({ head: Chain }).parse(chain.choices[0]!.message.parsed)).toHaveProperty("head");

    const trajectory = await captureTrajectory(async () => {
      const runner = client.chat.completions.runTools({
        model: "tiny", messages: [{ role: "user", content: "Weather in Bern?" }], max_tokens: 64, seed: 4,
        tools: [zodFunction({ name: "weather", parameters: z.object({ city: z.string().max(12) }), function: ({ city }) => weather(city) })],
        tool_choice: "required",
      }, { maxChatCompletions: 2 });
      await runner.done().catch(() => undefined); // the second completion may call again: the runner stops at its limit
    }, { reward: 1 });
    expectTrainable(trajectory);
  });

  it("over HTTP on loopback too: the AI SDK, LangChain and the Agents SDK run their tool loops against server.listen()", async () => {
    const http = await server.listen({ port: 0 });
    // Loopback only: anything else still fails.
    const loopbackFetch: typeof fetch = (input, init) =>
      String(input instanceof Request ? input.url : input).startsWith(http.baseURL) ? realFetch(input, init) : Promise.reject(new Error(`network fetch: ${String(input)}`));
    globalThis.fetch = loopbackFetch;
    try {
      const before = weatherCalls.length;
      const provider = createOpenAICompatible({ name: "art-ts", baseURL: http.baseURL, apiKey: "local" });
      const result = await generateText({
        model: provider.chatModel("tiny"), prompt: "Weather in Kyiv?", maxOutputTokens: 64, stopWhen: stepCountIs(2),
        tools: { weather: aiTool({ description: "the weather in a city", inputSchema: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) }) },
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? "required" : "none" }),
      });
      expect(result.steps[0]!.toolCalls[0]!.toolName).toBe("weather");

      const llm = new ChatOpenAI({ model: "tiny", apiKey: "local", maxRetries: 0, maxTokens: 64, configuration: { baseURL: http.baseURL } });
      const weatherTool = langchainTool(async ({ city }: { city: string }) => weather(city),
        { name: "weather", description: "the weather in a city", schema: z.object({ city: z.string().max(12) }) });
      const called = await llm.bindTools([weatherTool], { tool_choice: "required" }).invoke([["human", "Weather in Lyon?"]]);
      await weatherTool.invoke(called.tool_calls![0]!);

      const agentsProvider = new OpenAIProvider({ baseURL: http.baseURL, apiKey: "local", useResponses: false });
      const agent = new Agent({
        name: "weather agent", instructions: "Answer with the weather tool.", model: await agentsProvider.getModel("tiny"),
        modelSettings: { toolChoice: "required", maxTokens: 64, providerData: { seed: 2 } }, resetToolChoice: true,
        tools: [agentsTool({ name: "weather", description: "the weather in a city", parameters: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) })],
      });
      expect(typeof (await run(agent, "Weather in Accra?", { maxTurns: 3 })).finalOutput).toBe("string");
      expect(weatherCalls.length).toBe(before + 3);
    } finally {
      globalThis.fetch = blockedFetch;
      await http.close();
    }
  });

  it("OpenAI Agents SDK: an Agent with a function tool, run to its final output", async () => {
    const provider = new OpenAIProvider({ useResponses: false, openAIClient: server.openai({ maxRetries: 0 }) as never });
    const agent = new Agent({
      name: "weather agent",
      instructions: "Answer with the weather tool.",
      model: await provider.getModel("tiny"),
      // Seeded like the other frameworks' requests, so the sampled path is the same on every run.
      modelSettings: { toolChoice: "required", maxTokens: 64, providerData: { seed: 2 } },
      // After its tool ran once, the agent must answer: required again would loop until maxTurns.
      resetToolChoice: true,
      tools: [agentsTool({ name: "weather", description: "the weather in a city", parameters: z.object({ city: z.string().max(12) }), execute: async ({ city }) => weather(city) })],
    });
    const callsBefore = weatherCalls.length;
    const trajectory = await captureTrajectory(async () => {
      const result = await run(agent, "Weather in Lima?", { maxTurns: 3 });
      expect(typeof result.finalOutput).toBe("string");
    }, { reward: 1 });
    expectTrainable(trajectory);
    expect(weatherCalls.length).toBe(callsBefore + 1);
  });
});
