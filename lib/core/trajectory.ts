/**
 * The data model of a rollout, after ART's (src/art/trajectories.py), in idiomatic TypeScript.
 *
 * A Trajectory records one play of a task: the chat messages the agent saw and the assistant turns it
 * sampled. Sampled turns are kept as Choices (not plain messages) because a Choice carries the exact
 * token ids and logprobs the engine sampled; training uses those tokens, never a re-tokenisation.
 */
import type {
  ChatCompletion,
  ChatCompletionAssistantMessageParam,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from "openai/resources/chat/completions";
import { ArtError } from "./errors.ts";

export type Message = ChatCompletionMessageParam;
export type Tool = ChatCompletionTool;

/**
 * A sampled assistant turn as the engine returns it: OpenAI's Choice, plus `token_ids`, the exact ids the model
 * sampled, and `prompt_token_ids`, the exact prompt it sampled them after (vLLM's names for the same fields).
 * Per-token logprobs are in `logprobs.content`. Training uses both id lists as they are.
 */
export type Choice = ChatCompletion.Choice & { token_ids?: number[]; prompt_token_ids?: number[] };

export type MessageOrChoice = Message | Choice;

export type MetricValue = number | boolean;
export type MetadataValue = string | number | boolean | null;

/** A conversation beside the main one (e.g. a sub-agent's), trained like the main history. */
export interface History {
  messagesAndChoices: MessageOrChoice[];
  tools?: Tool[];
}

export function isChoice(item: MessageOrChoice): item is Choice {
  return typeof item === "object" && item !== null && "message" in item && "finish_reason" in item;
}

/** The tokens a Choice sampled: its token_ids, else its logprobs; undefined when it carries neither (an API's reply). */
export function sampledTokenCount(choice: Choice): number | undefined {
  return choice.token_ids?.length ?? choice.logprobs?.content?.length;
}

/** Turns a Choice back into the assistant message it stands for (tool calls included). */
export function choiceToMessage(choice: Choice): ChatCompletionAssistantMessageParam {
  const { content, tool_calls, refusal } = choice.message;
  const message: ChatCompletionAssistantMessageParam = { role: "assistant", content: content ?? "" };
  if (tool_calls && tool_calls.length > 0) message.tool_calls = tool_calls;
  if (refusal) message.refusal = refusal;
  return message;
}

export interface TrajectoryInit {
  messagesAndChoices?: MessageOrChoice[];
  tools?: Tool[];
  additionalHistories?: History[];
  reward?: number;
  metrics?: Record<string, MetricValue>;
  metadata?: Record<string, MetadataValue>;
  logs?: string[];
  /**
   * When the rollout began (ms since the epoch), for a trajectory built after its work is done; default: now.
   * finish() measures `duration` from it, so one built at the end with the default would report 0 s.
   */
  startTime?: number;
}

export class Trajectory {
  messagesAndChoices: MessageOrChoice[];
  tools: Tool[] | undefined;
  additionalHistories: History[];
  reward: number;
  metrics: Record<string, MetricValue>;
  metadata: Record<string, MetadataValue>;
  logs: string[];
  readonly startTime: number;
  endTime: number | undefined;

  constructor(init: TrajectoryInit = {}) {
    this.messagesAndChoices = init.messagesAndChoices ?? [];
    this.tools = init.tools;
    this.additionalHistories = init.additionalHistories ?? [];
    this.reward = init.reward ?? 0;
    this.metrics = { ...init.metrics };
    this.metadata = { ...init.metadata };
    this.logs = [...(init.logs ?? [])];
    this.startTime = init.startTime ?? Date.now();
    if (!Number.isFinite(this.startTime)) throw new ArtError("bad_trajectory", `Trajectory: startTime must be a time in ms since the epoch (Date.now()), got ${String(init.startTime)}`);
    this.endTime = undefined;
  }

  /**
   * Records the end of the rollout and what it cost in metrics: `duration` (seconds), and from its sampled turns (every
   * history's Choices) `turns`, `prompt_tokens` and `completion_tokens`. A count is left out when the Choices do not
   * all carry its ids (an API's replies: set the tokens from the responses' `usage`), and kept when the rollout set it.
   */
  finish(): this {
    this.endTime = Date.now();
    this.metrics.duration = (this.endTime - this.startTime) / 1000;
    const choices = this.choices();
    if (choices.length === 0) return this;
    this.metrics.turns ??= choices.length;
    const prompts = choices.map((c) => c.prompt_token_ids?.length), completions = choices.map(sampledTokenCount);
    if (prompts.every((n) => n !== undefined)) this.metrics.prompt_tokens ??= prompts.reduce((a, b) => a + b, 0);
    if (completions.every((n) => n !== undefined)) this.metrics.completion_tokens ??= completions.reduce((a, b) => a + b, 0);
    return this;
  }

  /** Every sampled turn, the main history's first, then each additional history's. */
  choices(): Choice[] {
    return [this.messagesAndChoices, ...this.additionalHistories.map((h) => h.messagesAndChoices)].flat().filter(isChoice);
  }

  /** The conversation as plain chat messages, sampled turns turned back into assistant messages. */
  messages(): Message[] {
    return this.messagesAndChoices.map((item) => (isChoice(item) ? choiceToMessage(item) : item));
  }

  log(line: string): void {
    this.logs.push(line);
  }

  /** A deep copy with the same timing, for code that returns changed trajectories and leaves its input alone (RULER). */
  clone(): Trajectory {
    return Object.assign(Object.create(Trajectory.prototype) as Trajectory, structuredClone({ ...this }));
  }

  toJSON(): Record<string, unknown> {
    return {
      messages_and_choices: this.messagesAndChoices,
      tools: this.tools ?? null,
      additional_histories: this.additionalHistories.map((h) => ({
        messages_and_choices: h.messagesAndChoices,
        tools: h.tools ?? null,
      })),
      reward: this.reward,
      metrics: this.metrics,
      metadata: this.metadata,
      logs: this.logs,
      start_time: new Date(this.startTime).toISOString(),
      end_time: this.endTime === undefined ? null : new Date(this.endTime).toISOString(),
    };
  }

  static fromJSON(json: Record<string, unknown>): Trajectory {
    const histories = (json.additional_histories as { messages_and_choices: MessageOrChoice[]; tools: Tool[] | null }[]) ?? [];
    const t = new Trajectory({
      messagesAndChoices: (json.messages_and_choices as MessageOrChoice[]) ?? [],
      tools: (json.tools as Tool[] | null) ?? undefined,
      additionalHistories: histories.map((h) => ({ messagesAndChoices: h.messages_and_choices, tools: h.tools ?? undefined })),
      reward: (json.reward as number) ?? 0,
      metrics: (json.metrics as Record<string, MetricValue>) ?? {},
      metadata: (json.metadata as Record<string, MetadataValue>) ?? {},
      logs: (json.logs as string[]) ?? [],
      startTime: typeof json.start_time === "string" ? Date.parse(json.start_time) : undefined,
    });
    if (typeof json.end_time === "string") t.endTime = Date.parse(json.end_time);
    return t;
  }
}

/** A rollout that raised instead of returning a Trajectory, kept so a group can report it. */
export interface RolloutException {
  error: unknown;
  message: string;
}

/**
 * Trajectories played from the same starting point. GRPO compares rewards within a group, so a group is
 * the unit of training; exceptions from its rollouts are kept beside the trajectories that succeeded.
 */
export class TrajectoryGroup {
  trajectories: Trajectory[];
  exceptions: RolloutException[];
  metadata: Record<string, MetadataValue>;

  constructor(trajectories: Iterable<Trajectory> = [], options: { exceptions?: RolloutException[]; metadata?: Record<string, MetadataValue> } = {}) {
    this.trajectories = [...trajectories];
    this.trajectories.forEach((t, i) => {
      if (!(t instanceof Trajectory)) {
        throw new ArtError("bad_trajectory", `TrajectoryGroup: item ${i + 1} is ${describeValue(t)}, not a Trajectory; build each one with new Trajectory({ messagesAndChoices, reward, ... })`);
      }
    });
    this.exceptions = [...(options.exceptions ?? [])];
    this.metadata = { ...options.metadata };
  }

  /** Awaits pending rollouts; a rollout that throws becomes an exception of the group, not a failure of it. */
  static async fromRollouts(rollouts: Iterable<Promise<Trajectory> | (() => Promise<Trajectory>)>): Promise<TrajectoryGroup> {
    const pending = [...rollouts].map((r) => (typeof r === "function" ? r() : r));
    const settled = await Promise.allSettled(pending);
    const group = new TrajectoryGroup();
    for (const result of settled) {
      if (result.status === "fulfilled" && result.value instanceof Trajectory) group.trajectories.push(result.value);
      else {
        const error = result.status === "rejected" ? result.reason : new TypeError(`a rollout returned ${describeValue(result.value)}, not a Trajectory`);
        group.exceptions.push({ error, message: errorMessage(error) });
      }
    }
    return group;
  }

  get rewards(): number[] {
    return this.trajectories.map((t) => t.reward);
  }

  toJSON(): Record<string, unknown> {
    return {
      trajectories: this.trajectories.map((t) => t.toJSON()),
      exceptions: this.exceptions.map((e) => e.message),
      metadata: this.metadata,
    };
  }
}

export function errorMessage(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

/** A short description of a value that is not what was expected: "a plain object", "null", "a string". */
export function describeValue(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (typeof value === "object") return value.constructor === Object || value.constructor === undefined ? "a plain object" : `a ${value.constructor.name}`;
  return typeof value === "undefined" ? "undefined" : `a ${typeof value}`;
}
