import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { captureTrajectory } from "../../lib/core/capture.ts";
import { TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { resolveTrainConfig } from "../../lib/grpo/config.ts";
import { tokenizeGroups } from "../../lib/grpo/tokenize.ts";
import { ModelServer, type ServableModel } from "../../lib/serve/model-server.ts";
import { tinyServableModel } from "../serve/tiny-model.ts";

let model: ServableModel;
let server: ModelServer;
let client: OpenAI;
beforeAll(async () => {
  model = await tinyServableModel(4);
  server = new ModelServer({ batcher: { numSlots: 8, maxPositions: 512 } });
  server.addBaseModel("tiny", model);
  client = server.openai({ maxRetries: 0 });
});
afterAll(() => server.close());

const ask = (messages: Message[], seed: number, extra: Record<string, unknown> = {}) =>
  client.chat.completions.create({ model: "tiny", messages, max_tokens: 4, seed, ...extra });

/** An agent as a framework writes it: it keeps its own copy of the conversation and re-sends it, reshaped. */
async function agent(topic: string): Promise<string[]> {
  const messages: Message[] = [{ role: "system", content: "You help." }, { role: "user", content: `Tell me about ${topic}.` }];
  const first = await ask(messages, 1);
  // Frameworks send the assistant turn back in their own shape: "" for null content, no token ids, no refusal.
  messages.push({ role: "assistant", content: first.choices[0]!.message.content ?? "" }, { role: "user", content: "More." });
  const streamed = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 4, seed: 2, stream: true });
  let text = "";
  for await (const chunk of streamed) text += chunk.choices[0]?.delta.content ?? "";
  // A sub-agent with a conversation of its own.
  const summary = await ask([{ role: "user", content: `Summarise: ${text}` }], 3);
  return [first.choices[0]!.message.content ?? "", text, summary.choices[0]!.message.content ?? ""];
}

describe("captureTrajectory", () => {
  it("turns an agent's completions into one trajectory: continued calls extend it, a sub-agent is an additional history", async () => {
    let answers: string[] = [];
    const trajectory = await captureTrajectory(async () => void (answers = await agent("tides")), { reward: 0.5, metadata: { topic: "tides" } });
    const items = trajectory.messagesAndChoices;
    expect(items.map((m) => ("role" in m ? m.role : "choice"))).toEqual(["system", "user", "choice", "user", "choice"]);
    const [first, second] = [items[2] as Choice, items[4] as Choice];
    expect([first.message.content, second.message.content]).toEqual([answers[0], answers[1]]);
    // The exact sampled ids: the second prompt holds the first answer's tokens as the engine rendered them.
    expect(first.token_ids!.length).toBeGreaterThan(0);
    expect(second.prompt_token_ids!.length).toBeGreaterThan(first.prompt_token_ids!.length);
    expect(trajectory.additionalHistories).toHaveLength(1);
    expect(trajectory.additionalHistories[0]!.messagesAndChoices.map((m) => ("role" in m ? m.role : "choice"))).toEqual(["user", "choice"]);
    expect([trajectory.reward, trajectory.metadata.topic, typeof trajectory.metrics.duration]).toEqual([0.5, "tides", "number"]);

    // It trains as it is: each history is a sequence of the engine's prompt ids and sampled ids.
    const other = await captureTrajectory(() => agent("waves"), { reward: 1 });
    const { sequences } = tokenizeGroups(model.tokenizer, [new TrajectoryGroup([trajectory, other])], resolveTrainConfig());
    const last = (other.messagesAndChoices.at(-1) as Choice);
    expect(sequences.some((s) => s.tokens.join() === [...last.prompt_token_ids!, ...last.token_ids!].join())).toBe(true);
  });

  it("keeps concurrent agents apart", async () => {
    const [a, b] = await Promise.all([
      captureTrajectory(() => ask([{ role: "user", content: "alpha" }], 5)),
      captureTrajectory(async () => {
        await ask([{ role: "user", content: "beta" }], 6);
        await ask([{ role: "user", content: "gamma" }], 7);
      }),
    ]);
    expect(a.messagesAndChoices[0]).toEqual({ role: "user", content: "alpha" });
    expect(a.additionalHistories).toHaveLength(0);
    expect([b.messagesAndChoices[0], b.additionalHistories[0]!.messagesAndChoices[0]]).toEqual([{ role: "user", content: "beta" }, { role: "user", content: "gamma" }]);
  });

  it("says how to connect an agent that made no completion through the server", async () => {
    await expect(captureTrajectory(async () => {})).rejects.toThrow(/made no chat completion through the model server in this process; give it model\.openai\(\)/);
  });
});
