/**
 * The turn loop every tool-calling environment shares (ART·E's inbox, any MCP server): ask the policy, append its
 * reply, run each tool call it made and append the results as `tool` messages, until the environment says it is done,
 * the policy replies without a tool call, the turn limit, or the conversation outgrowing the model's context (the
 * policy's request fails with a context-length error: the episode ends there, scored as it stands). Tool calls are
 * read from the Choice the policy returns (the serving layer parses the model's Hermes-style calls into
 * `message.tool_calls`). A tool never throws into the loop: its errors come back as "Error: ..." text the agent can
 * read and correct, which is what training needs.
 */
import type { Trajectory } from "../core/trajectory.ts";
import { askPolicy, replyItem, type GamePolicy } from "./policy.ts";

/**
 * A tool call's arguments, the JSON text the model produced, as an object; or the "Error: ..." text to send back
 * when it is not a JSON object (an empty string is no arguments).
 */
export function parseToolArguments(name: string, args: string): Record<string, unknown> | string {
  let parsed: unknown;
  try {
    parsed = args.trim() === "" ? {} : JSON.parse(args);
  } catch (error) {
    return `Error: the arguments of ${name} are not valid JSON (${(error as Error).message}). Send a JSON object.`;
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) return `Error: the arguments of ${name} must be a JSON object.`;
  return parsed as Record<string, unknown>;
}

export interface ToolEpisodeOptions<State> {
  /** Assistant turns before the episode stops. */
  maxTurns: number;
  /** The state the policy sees beside the messages (scripted policies read it). */
  state: State;
  /** Runs one function call: `args` is the JSON string the model produced; the result is the tool message's text. */
  call(name: string, args: string): string | Promise<string>;
  /** Whether the episode has reached its end (e.g. the final-answer tool was called); checked before each turn. */
  done(): boolean;
}

export interface ToolEpisode {
  /** Assistant turns taken. */
  turns: number;
  /** Function calls run, and how many of them came back as errors. */
  toolCalls: number;
  toolErrors: number;
  /** The episode ended because a reply had no tool call. */
  repliedWithoutCall: boolean;
  /** The episode ended because the conversation no longer fit the model's context. */
  contextExceeded: boolean;
}

/** Plays turns into `trajectory` (which holds the opening messages and the tool schemas) and says how it went. */
export async function playToolEpisode<State>(policy: GamePolicy<State>, trajectory: Trajectory, options: ToolEpisodeOptions<State>): Promise<ToolEpisode> {
  const episode: ToolEpisode = { turns: 0, toolCalls: 0, toolErrors: 0, repliedWithoutCall: false, contextExceeded: false };
  const names = (trajectory.tools ?? []).map((t) => (t.type === "function" ? t.function.name : t.custom.name));
  while (episode.turns < options.maxTurns && !options.done()) {
    const asked = await askPolicy(policy, trajectory.messages(), options.state);
    if ("outgrown" in asked) {
      episode.contextExceeded = true;
      trajectory.log(`stopped after ${episode.turns} turns: ${asked.outgrown}`);
      break;
    }
    const { reply } = asked;
    trajectory.messagesAndChoices.push(replyItem(reply));
    episode.turns++;
    const calls = typeof reply === "string" ? [] : (reply.message.tool_calls ?? []);
    if (calls.length === 0) {
      episode.repliedWithoutCall = true;
      trajectory.log("the agent replied without a tool call: the episode ends");
      break;
    }
    for (const call of calls) {
      const content = call.type === "function"
        ? await options.call(call.function.name, call.function.arguments)
        : `Error: ${call.custom.name} is not a function tool; call one of ${names.join(", ")}.`;
      episode.toolCalls++;
      if (content.startsWith("Error:")) episode.toolErrors++;
      trajectory.messagesAndChoices.push({ role: "tool", tool_call_id: call.id, content });
    }
  }
  return episode;
}
