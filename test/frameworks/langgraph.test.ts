// A LangGraph.js agent (a ReAct-style StateGraph: a model node and a tools node, looping while the model calls tools)
// on the model being trained, through LangChain's ChatOpenAI given the in-process server's fetch: captureTrajectory
// records the graph's tool-calling turns as one trajectory, tool messages included, and model.train trains on it.
// Any fetch to the network fails the test (nothing may leave the process).
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { END, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { AIMessage, HumanMessage, SystemMessage, ToolMessage } from "@langchain/core/messages";
import { tool } from "@langchain/core/tools";
import { ChatOpenAI } from "@langchain/openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { captureTrajectory } from "../../lib/core/capture.ts";
import { isChoice, TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { resolveTrainConfig } from "../../lib/grpo/config.ts";
import { tokenizeGroups } from "../../lib/grpo/tokenize.ts";
import { IN_PROCESS_BASE_URL } from "../../lib/serve/model-server.ts";
import { TrainableModel } from "../../lib/trainable/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-langgraph-"));
const realFetch = globalThis.fetch;
let model: TrainableModel;
beforeAll(async () => {
  writeTinyCheckpoint(path.join(root, "base"), { arch: "qwen2", seed: 3, tokenizer: true });
  model = await TrainableModel.load({ name: "langgraph", project: "frameworks", baseModel: path.join(root, "base"), artDir: path.join(root, ".art"), lora: { rank: 2 }, log: () => {} });
  globalThis.fetch = (input) => Promise.reject(new Error(`network fetch in a framework test: ${String(input)}`));
});
afterAll(async () => {
  globalThis.fetch = realFetch;
  await model.close();
  fs.rmSync(root, { recursive: true, force: true });
});

const lookups: string[] = [];
const lookup = tool(async ({ word }: { word: string }) => {
  lookups.push(word);
  return `"${word}" means sunny.`;
}, { name: "lookup", description: "what a word means", schema: z.object({ word: z.string().max(12) }) });

/**
 * The agent: the model node calls `lookup` (forced while no tool has answered yet: the tiny model has never seen a
 * tool), the tools node runs the calls, and the graph ends at a model turn without tool calls.
 */
function agentGraph(seed: number) {
  const llm = new ChatOpenAI({
    model: model.name, apiKey: "in-process", maxRetries: 0, maxTokens: 32, temperature: 1,
    modelKwargs: { seed }, configuration: { baseURL: IN_PROCESS_BASE_URL, fetch: model.server.fetch },
  });
  return new StateGraph(MessagesAnnotation)
    .addNode("model", async ({ messages }) => {
      const answered = messages.some((m) => ToolMessage.isInstance(m));
      return { messages: [await llm.bindTools([lookup], { tool_choice: answered ? "none" : "lookup" }).invoke(messages)] };
    })
    .addNode("tools", async ({ messages }) => {
      const last = messages.at(-1) as AIMessage;
      return { messages: await Promise.all((last.tool_calls ?? []).map((call) => lookup.invoke(call))) };
    })
    .addEdge(START, "model")
    .addConditionalEdges("model", ({ messages }) => ((messages.at(-1) as AIMessage).tool_calls?.length ? "tools" : END))
    .addEdge("tools", "model")
    .compile();
}

const run = (seed: number, reward: number) => captureTrajectory(
  () => agentGraph(seed).invoke({ messages: [new SystemMessage("Answer with the lookup tool."), new HumanMessage("What does sol mean?")] }),
  { reward },
);

describe("a LangGraph.js agent on the in-process model", () => {
  it("is captured as one trajectory of its tool-calling turns, tool messages included, and trains", async () => {
    const trajectory = await run(1, 1);
    const items = trajectory.messagesAndChoices;
    expect(trajectory.additionalHistories).toHaveLength(0);
    expect(items.map((item) => (isChoice(item) ? "choice" : item.role))).toEqual(["system", "user", "choice", "tool", "choice"]);
    const call = (items[2] as Choice).message.tool_calls?.[0];
    expect(call).toMatchObject({ type: "function", function: { name: "lookup" } });
    const toolMessage = items[3] as Message & { tool_call_id: string };
    expect(toolMessage.tool_call_id).toBe(call!.id);
    expect(String(toolMessage.content)).toBe(`"${lookups.at(-1)}" means sunny.`);
    expect(trajectory.tools?.map((t) => (t.type === "function" ? t.function.name : t.type))).toEqual(["lookup"]);

    // Beside a second run with another reward, the group has an advantage: GRPO trains on the captured choices.
    // Each choice trains in the exact context it was sampled in (the engine's prompt ids, then its sampled ids); where
    // LangChain's re-sent conversation renders differently (the tool call re-serialised, tools dropped with
    // tool_choice "none"), a new sequence starts.
    const group = new TrajectoryGroup([trajectory, await run(2, 0)]);
    const { sequences } = tokenizeGroups(model.lm.tokenizer, [group], resolveTrainConfig());
    const sampled = group.trajectories.flatMap((t) => t.messagesAndChoices.filter(isChoice)).map((c) => [...c.prompt_token_ids!, ...c.token_ids!].join());
    for (const ids of sampled) expect(sequences.some((s) => `${s.tokens.join()},`.startsWith(`${ids},`))).toBe(true);
    const result = await model.train([group], { learningRate: 1e-3 });
    expect([result.trained, result.sequences, result.skippedTrajectories]).toEqual([true, sequences.length, 0]);
    expect(result.trainedTokens).toBeGreaterThan(0);
    expect(Number.isFinite(result.loss)).toBe(true);
    expect(model.step).toBe(1);
  });
});
