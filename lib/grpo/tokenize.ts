/**
 * Trajectories → training sequences, as ART does it: every sampled assistant turn (a Choice) contributes its exact
 * sampled token ids and logprobs, never a re-tokenisation of its text, after the exact prompt ids it was sampled
 * from when the server recorded them (`prompt_token_ids`: the art-ts engine does). A Choice whose prompt ids do not
 * extend the sequence so far token for token (a template that drops earlier reasoning) starts a new sequence from
 * them. Only the sampled tokens are trained; everything after the last Choice is cut.
 *
 * Choices without prompt ids (from another server) fall back to the chat template, rendered around the conversation:
 * the text between two Choices comes from the template itself: the previous Choice is replaced by a sentinel
 * message, the template is rendered up to the next generation prompt, and what follows the sentinel is the
 * between-text (end of the assistant turn, the next user/tool messages, the next "assistant" header). If the
 * sampled ids already end with the end-of-turn token the template would write, that token is not added twice.
 * When the sequence built so far is not what the template renders as the next Choice's prompt (Qwen3 drops the
 * reasoning of earlier turns), that Choice starts a new sequence from its real prompt: each Choice is trained in
 * the context it was sampled in.
 *
 * Each history (the main one and each additional history) is its own sequence; a group's shared prompt is stored
 * once per micro-batch later, when the batch is built (toBatch in train.ts).
 */
import { ArtError } from "../core/errors.ts";
import { choiceToMessage, isChoice, type Choice, type Message, type MessageOrChoice, type Tool, type TrajectoryGroup } from "../core/trajectory.ts";
import type { Tokenizer } from "../model/tokenizer.ts";
import type { TrainConfig } from "./config.ts";
import { groupAdvantages } from "./loss.ts";

/** One token sequence to train on. */
export interface TrainingSequence {
  tokens: number[];
  /** 1 where the token was sampled by the policy (or is an assistant token, for SFT) and is trained */
  trainable: Uint8Array;
  /** the sampler's logprob of each token; NaN where unknown */
  logprobs: Float32Array;
  advantage: number;
  /** index of the trajectory it came from: a trajectory's sequences share its token weight */
  trajectory: number;
}

/** What tokenisation needs of a tokenizer (the engine's Tokenizer has it). */
export type ChatTokenizer = Pick<Tokenizer, "applyChatTemplate" | "encode" | "decode" | "eosTokenIds">;

const SENTINEL = "\u0000art-ts-turn-boundary\u0000";

export interface TokenizedHistory {
  tokens: number[];
  trainable: Uint8Array;
  logprobs: Float32Array;
}

/** How sampled turns without logprobs are treated: an error (ART's default), or trained as on-policy (ratio 1). */
export interface LogprobPolicy { allowTrainingWithoutLogprobs: boolean }

interface Building { tokens: number[]; trainable: number[]; logprobs: number[]; text: string }

/**
 * One conversation (messages and sampled Choices) → training sequences: usually one; a new one starts at a Choice
 * whose prompt, as the template renders it, differs from the sequence built so far (Qwen3 drops the reasoning of
 * earlier turns), so every Choice is trained in exactly the context it was sampled in. Empty without any Choice.
 */
export function tokenizeHistory(
  tokenizer: ChatTokenizer, items: MessageOrChoice[], tools: Tool[] | undefined, policy: LogprobPolicy = { allowTrainingWithoutLogprobs: false },
): TokenizedHistory[] {
  const choiceIndices = items.flatMap((item, i) => (isChoice(item) ? [i] : []));
  const messages: Message[] = items.map((item) => (isChoice(item) ? choiceToMessage(item) : item));
  const render = (upTo: Message[]) => tokenizer.applyChatTemplate(upTo, { tools, addGenerationPrompt: true });
  const encode = (text: string) => tokenizer.encode(text, { addSpecialTokens: false });
  const decode = (ids: number[]) => tokenizer.decode(ids, { skipSpecialTokens: false });
  const pushText = (seq: Building, ids: number[], text: string) => {
    for (const id of ids) {
      seq.tokens.push(id);
      seq.trainable.push(0);
      seq.logprobs.push(NaN);
    }
    seq.text += text;
  };

  const built: Building[] = [];
  let current: Building | null = null;
  choiceIndices.forEach((index, k) => {
    const choice = items[index] as Choice;
    const promptIds = choice.prompt_token_ids;
    if (promptIds !== undefined) {
      if (!Array.isArray(promptIds) || promptIds.length === 0 || !promptIds.every(Number.isInteger)) {
        throw new ArtError("bad_prompt_ids", `message ${index}: prompt_token_ids must be the non-empty list of prompt token ids the Choice was sampled after`);
      }
      // The prompt the model read, as ids: a sequence continues only where these ids extend it token for token.
      if (current !== null && !startsWith(promptIds, current.tokens)) {
        built.push(current);
        current = null;
      }
      current ??= { tokens: [], trainable: [], logprobs: [], text: "" };
      const added = promptIds.slice(current.tokens.length);
      pushText(current, added, decode(added));
    } else {
      const prompt = render(messages.slice(0, index));
      if (current !== null) {
        // the text between the previous Choice and this one: what follows a sentinel put in the previous Choice's place
        const previous = choiceIndices[k - 1];
        const withSentinel = [...messages.slice(0, previous), { role: "assistant", content: SENTINEL } as Message, ...messages.slice(previous + 1, index)];
        const rendered = render(withSentinel);
        const at = rendered.indexOf(SENTINEL);
        let between = at < 0 ? null : rendered.slice(at + SENTINEL.length);
        // the sampler usually emits the end-of-turn token itself; the template writes it too
        const lastId = current.tokens[current.tokens.length - 1];
        if (between !== null && tokenizer.eosTokenIds.includes(lastId)) {
          const eosText = decode([lastId]);
          if (between.startsWith(eosText)) between = between.slice(eosText.length);
        }
        if (between !== null && current.text + between === prompt) {
          pushText(current, encode(between), between);
        } else {
          built.push(current);
          current = null;
        }
      }
      if (current === null) {
        current = { tokens: [], trainable: [], logprobs: [], text: "" };
        pushText(current, encode(prompt), prompt);
      }
    }
    const ids = sampledIds(choice, index);
    const logprobs = sampledLogprobs(choice, index, ids.length, policy);
    ids.forEach((id, i) => {
      current!.tokens.push(id);
      current!.trainable.push(1);
      current!.logprobs.push(logprobs[i]);
    });
    current.text += decode(ids);
  });
  if (current !== null) built.push(current);

  // everything after the last Choice was never added: the cut after the last trainable message
  return built.map((seq) => ({ tokens: seq.tokens, trainable: Uint8Array.from(seq.trainable), logprobs: Float32Array.from(seq.logprobs) }));
}

/** Whether `ids` begins with every id of `prefix`. */
function startsWith(ids: number[], prefix: number[]): boolean {
  return ids.length >= prefix.length && prefix.every((id, i) => ids[i] === id);
}

/**
 * The sampler's logprob of each sampled id. Without them the importance ratio is unknown: an error unless the
 * policy allows training such turns as on-policy (NaN: ratio 1). Logprobs that cannot be the sampler's (another
 * count than the ids, positive, not numbers) are always an error.
 */
function sampledLogprobs(choice: Choice, index: number, count: number, policy: LogprobPolicy): number[] {
  const content = choice.logprobs?.content;
  if (!content) {
    if (policy.allowTrainingWithoutLogprobs) return new Array<number>(count).fill(NaN);
    throw new ArtError("missing_logprobs", `message ${index} is a Choice without logprobs, so its importance ratio is unknown; request logprobs: true when sampling, or set TrainConfig.allowTrainingWithoutLogprobs to train it as on-policy`);
  }
  if (content.length !== count) {
    throw new ArtError("bad_logprobs", `message ${index}: ${content.length} logprobs for ${count} sampled token ids; each sampled id needs the sampler's logprob`);
  }
  const bad = content.findIndex((entry) => typeof entry.logprob !== "number" || !(entry.logprob <= 0));
  if (bad >= 0) {
    throw new ArtError("bad_logprobs", `message ${index}: logprob ${content[bad].logprob} of token ${bad} is not a log-probability (a number <= 0)`);
  }
  return content.map((entry) => entry.logprob);
}

function sampledIds(choice: Choice, index: number): number[] {
  const ids = choice.token_ids;
  if (!Array.isArray(ids) || ids.length === 0) {
    throw new ArtError(
      "missing_token_ids",
      `message ${index} is a Choice without token_ids; training needs the exact sampled ids. Sample with the art-ts engine (it records them), or pass the turn as a plain assistant message (then it is context, not trained).`,
    );
  }
  return ids;
}

export interface TokenizedGroups {
  sequences: TrainingSequence[];
  /** notices of dropped (overlong) sequences and truncated SFT conversations, one line each */
  warnings: string[];
  /** trajectories with advantage 0 (not trained) */
  skippedTrajectories: number;
}

/**
 * Groups → sequences with their GRPO advantages. Trajectories whose advantage is 0 are skipped (a group whose
 * rewards are all equal trains nothing); sequences longer than config.maxSequenceLength are dropped, as ART drops
 * them, each named in `warnings`. Errors name the group and trajectory.
 */
export function tokenizeGroups(tokenizer: ChatTokenizer, groups: TrajectoryGroup[],
  config: Pick<TrainConfig, "scaleRewards" | "maxSequenceLength" | "allowTrainingWithoutLogprobs">): TokenizedGroups {
  const sequences: TrainingSequence[] = [];
  const warnings: string[] = [];
  let skippedTrajectories = 0;
  let trajectoryIndex = 0;
  groups.forEach((group, g) => {
    const advantages = groupAdvantages(group.rewards, config.scaleRewards);
    group.trajectories.forEach((trajectory, t) => {
      const index = trajectoryIndex++;
      if (!Number.isFinite(trajectory.reward)) {
        throw new ArtError("non_finite_reward", `group ${g}, trajectory ${t}: reward is ${trajectory.reward}; rewards must be finite numbers`);
      }
      if (advantages[t] === 0) {
        skippedTrajectories++;
        return;
      }
      const histories = [{ items: trajectory.messagesAndChoices, tools: trajectory.tools }, ...trajectory.additionalHistories.map((h) => ({ items: h.messagesAndChoices, tools: h.tools }))];
      histories.forEach((history, h) => {
        const where = `group ${g}, trajectory ${t}${h > 0 ? `, additional history ${h - 1}` : ""}`;
        let tokenized: TokenizedHistory[];
        try {
          tokenized = tokenizeHistory(tokenizer, history.items, history.tools, config);
        } catch (error) {
          if (error instanceof ArtError) throw new ArtError(error.code, `${where}: ${error.message}`, { cause: error });
          throw error;
        }
        for (const sequence of tokenized) {
          if (sequence.tokens.length > config.maxSequenceLength) {
            warnings.push(`${where}: a sequence of ${sequence.tokens.length} tokens is longer than maxSequenceLength ${config.maxSequenceLength} and is not trained`);
            continue;
          }
          sequences.push({ tokens: sequence.tokens, trainable: sequence.trainable, logprobs: sequence.logprobs, advantage: advantages[t], trajectory: index });
        }
      });
    });
  });
  return { sequences, warnings, skippedTrajectories };
}

/**
 * SFT: the assistant messages of each conversation are trained (their tokens as the template renders them), every
 * one up to the last (`trainOn: "all"`) or only the last (`"last"`: earlier turns are context, so a template that
 * re-renders them, like Qwen3's, is fine). Choices are rendered as text here too.
 */
export function tokenizeForSft(tokenizer: ChatTokenizer, conversations: { messages: Message[]; tools?: Tool[] }[], maxLength: number,
  trainOn: "all" | "last" = "all"): TokenizedGroups {
  const sequences: TrainingSequence[] = [];
  const warnings: string[] = [];
  conversations.forEach(({ messages, tools }, c) => {
    const lastAssistant = messages.map((m) => m.role).lastIndexOf("assistant");
    if (lastAssistant < 0) {
      warnings.push(`conversation ${c}: no assistant message, nothing to train`);
      return;
    }
    const tokens: number[] = [];
    const trainable: number[] = [];
    let renderedSoFar = "";
    for (let i = 0; i <= lastAssistant; i++) {
      if (messages[i].role !== "assistant" || (trainOn === "last" && i < lastAssistant)) continue;
      const prompt = tokenizer.applyChatTemplate(messages.slice(0, i), { tools, addGenerationPrompt: true });
      const full = tokenizer.applyChatTemplate(messages.slice(0, i + 1), { tools });
      if (!prompt.startsWith(renderedSoFar) || !full.startsWith(prompt)) {
        throw new ArtError("template_not_prefix", `conversation ${c}: the chat template re-renders earlier turns differently, so assistant message ${i} cannot be masked; train on it as its own conversation`);
      }
      for (const id of tokenizer.encode(prompt.slice(renderedSoFar.length), { addSpecialTokens: false })) { tokens.push(id); trainable.push(0); }
      for (const id of tokenizer.encode(full.slice(prompt.length), { addSpecialTokens: false })) { tokens.push(id); trainable.push(1); }
      renderedSoFar = full;
    }
    if (tokens.length > maxLength) {
      const length = tokens.length;
      tokens.length = maxLength;
      trainable.length = maxLength;
      warnings.push(trainable.includes(1)
        ? `conversation ${c}: truncated to ${maxLength} tokens`
        : `conversation ${c}: truncated to ${maxLength} tokens of its ${length}, which cuts every assistant token: nothing to train`);
    }
    sequences.push({ tokens, trainable: Uint8Array.from(trainable), logprobs: new Float32Array(tokens.length).fill(NaN), advantage: 0, trajectory: c });
  });
  return { sequences, warnings, skippedTrajectories: 0 };
}
