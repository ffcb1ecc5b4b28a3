/**
 * Trajectories from agent code that knows nothing about them (ART's capture_auto_trajectory): inside
 * `captureTrajectory(async () => { ... })`, every chat completion the model server answers in-process is recorded
 * (an AsyncLocalStorage context follows the agent's awaits, in Node and in Deno), and the calls become one
 * Trajectory: a call whose messages continue an earlier call's conversation extends it; one that starts another
 * (a sub-agent, a summariser) becomes an additional history. The exact sampled Choices are kept, so training uses
 * the ids the engine sampled.
 *
 * Any framework works that can be given the server's client or fetch: `model.openai()`, the AI SDK's
 * `createOpenAI({ baseURL, fetch: model.server.fetch })`, LangChain's `configuration: { fetch }`. Requests over HTTP
 * reach the server in another context and are not recorded.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { ArtError } from "./errors.ts";
import { choiceToMessage, Trajectory, type Choice, type History, type Message, type MessageOrChoice, type Tool, type TrajectoryInit } from "./trajectory.ts";

/** One answered chat completion: the request's messages and tools, and the choice that continued them. */
export interface CapturedCompletion {
  messages: Message[];
  tools?: Tool[];
  choice: Choice;
}

const recording = new AsyncLocalStorage<CapturedCompletion[]>();

/** Called by the model server for each answered completion; records it when a capture is running here. */
export function recordCompletion(completion: CapturedCompletion): void {
  recording.getStore()?.push(completion);
}

/**
 * Runs `agent` and returns the Trajectory of the completions it made through the model server (in-process); `init`
 * sets the rest (reward, metrics, metadata). The trajectory is finished: its `duration` is the agent's run.
 */
export async function captureTrajectory(agent: () => Promise<unknown>, init: Omit<TrajectoryInit, "messagesAndChoices" | "additionalHistories" | "tools"> = {}): Promise<Trajectory> {
  const calls: CapturedCompletion[] = [];
  const startTime = Date.now();
  await recording.run(calls, agent);
  if (calls.length === 0) {
    throw new ArtError("nothing_captured", "captureTrajectory: the agent made no chat completion through the model server in this process; give it model.openai(), or the server's fetch (e.g. createOpenAI({ baseURL, fetch: model.server.fetch }))");
  }
  const [main, ...others] = conversations(calls);
  return new Trajectory({
    ...init,
    startTime,
    messagesAndChoices: main!.items,
    tools: main!.tools,
    additionalHistories: others.map(({ items, tools }): History => ({ messagesAndChoices: items, tools })),
  }).finish();
}

interface Conversation { items: MessageOrChoice[]; keys: string[]; tools?: Tool[] }

/** Groups the calls into conversations: each call extends the longest one its messages continue, else starts one. */
function conversations(calls: CapturedCompletion[]): Conversation[] {
  const found: Conversation[] = [];
  for (const { messages, tools, choice } of calls) {
    const keys = messages.map(messageKey);
    const continued = found
      .filter((c) => c.keys.length <= keys.length && c.keys.every((key, i) => key === keys[i]))
      .sort((a, b) => b.keys.length - a.keys.length)[0];
    const conversation = continued ?? { items: [], keys: [], tools };
    if (!continued) found.push(conversation);
    conversation.items.push(...messages.slice(conversation.keys.length), choice);
    conversation.keys = [...keys, messageKey(choiceToMessage(choice))];
  }
  return found;
}

/**
 * What identifies a message when a framework sends it back: role, text, tool calls and the call it answers. Frameworks
 * rewrite the shape (null or "" content, extra fields), so the comparison ignores everything else.
 */
function messageKey(message: Message): string {
  const m = message as { role: string; content?: unknown; tool_calls?: { id?: string; function?: { name?: string; arguments?: string } }[]; tool_call_id?: string };
  const text = typeof m.content === "string" ? m.content : Array.isArray(m.content) ? m.content.map((p: { text?: string }) => p.text ?? "").join("") : "";
  const calls = (m.tool_calls ?? []).map((c) => [c.id, c.function?.name, canonicalJson(c.function?.arguments)]);
  return JSON.stringify([m.role === "developer" ? "system" : m.role, text.trim(), calls, m.tool_call_id ?? null]);
}

/** Arguments as compact JSON, whatever spacing the framework re-serialised them with. */
function canonicalJson(text: string | undefined): string | undefined {
  try {
    return text === undefined ? undefined : JSON.stringify(JSON.parse(text));
  } catch {
    return text;
  }
}
