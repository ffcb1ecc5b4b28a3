/**
 * What plays an environment: a function from the conversation so far (and the game state, which scripted
 * policies read and model policies ignore) to the assistant's reply. A model returns a Choice (its sampled
 * tokens, which training needs); a scripted policy may return plain text.
 */
import { isChoice, type Choice, type Message, type MessageOrChoice } from "../core/trajectory.ts";

export type PolicyReply = string | Choice;

export type GamePolicy<State> = (messages: Message[], state: State) => PolicyReply | Promise<PolicyReply>;

/** The reply as it goes into a trajectory: a Choice stays a Choice, text becomes an assistant message. */
export function replyItem(reply: PolicyReply): MessageOrChoice {
  return typeof reply === "string" ? { role: "assistant", content: reply } : reply;
}

export function replyText(reply: PolicyReply): string {
  if (typeof reply === "string") return reply;
  return isChoice(reply) ? (reply.message.content ?? "") : "";
}

/** Reasoning models wrap their thoughts in <think>…</think>; moves are parsed from what follows. */
export function withoutThinking(text: string): string {
  return text.replace(/<think>[\s\S]*?<\/think>/g, "").trim();
}

/**
 * Whether a policy's error says the conversation no longer fits the model's context: the OpenAI error code (art-ts's
 * server, OpenAI) or, from servers that send no code (vLLM), a 400 whose message says so. A game that outgrows the
 * context can end there, scored as it stands, instead of losing the whole rollout.
 */
export function isContextLengthError(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return false;
  const { code, status, message } = error as { code?: unknown; status?: unknown; message?: unknown };
  return code === "context_length_exceeded" || (status === 400 && typeof message === "string" && /maximum context length/i.test(message));
}

/**
 * The policy's reply, or, when its request failed because the conversation no longer fits the model's context, why
 * (for the trajectory's log): a game or tool episode ends there, scored as it stands. Every other error propagates.
 */
export async function askPolicy<State>(policy: GamePolicy<State>, messages: Message[], state: State): Promise<{ reply: PolicyReply } | { outgrown: string }> {
  try {
    return { reply: await policy(messages, state) };
  } catch (error) {
    if (!isContextLengthError(error)) throw error;
    return { outgrown: `the conversation outgrew the model's context (${(error as Error).message})` };
  }
}
