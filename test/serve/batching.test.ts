/**
 * Continuous batching: concurrent requests share forward passes, each answer equals the request alone with
 * the same seed, aborted requests free their slot, the queue is bounded, pause holds decoding, adapters route.
 */
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Batcher, type SequenceSpec } from "../../lib/serve/batcher.ts";
import { ModelServer, type ServableModel } from "../../lib/serve/model-server.ts";
import { type LayerLoras } from "../../lib/model/lora.ts";
import { JsonGrammar } from "../../lib/serve/json-grammar.ts";
import { compileSchema } from "../../lib/serve/json-schema.ts";
import { JsonConstraint, tokenTrieFor } from "../../lib/serve/token-mask.ts";
import { tinyServableModel } from "./tiny-model.ts";

let model: ServableModel;
beforeAll(async () => {
  model = await tinyServableModel(3);
});

function serverWith(options: { numSlots: number; maxQueued?: number; reusePrefixes?: boolean }): { server: ModelServer; client: OpenAI } {
  const server = new ModelServer({ batcher: { maxPositions: 512, ...options } });
  server.addBaseModel("tiny", model);
  return { server, client: server.openai({ maxRetries: 0 }) };
}

const ids = (completion: OpenAI.Chat.ChatCompletion) => (completion.choices[0] as { token_ids?: number[] }).token_ids;

describe("continuous batching", () => {
  let server: ModelServer;
  let client: OpenAI;
  beforeAll(() => ({ server, client } = serverWith({ numSlots: 16 })));
  afterAll(() => server.close());

  it("16 concurrent requests take far fewer forward passes than 16 sequential ones, with the same answers", async () => {
    const request = (i: number) => client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content: `Request number ${i}: ${"say something ".repeat(i % 4)}` }],
      max_tokens: 8, temperature: 1.5, seed: 100 + i,
    });
    const stats = server.batcherFor("tiny").stats;
    const before = stats.passes;
    const concurrent = await Promise.all(Array.from({ length: 16 }, (_, i) => request(i)));
    const concurrentPasses = stats.passes - before;

    const sequential = [];
    const middle = stats.passes;
    for (let i = 0; i < 16; i++) sequential.push(await request(i));
    const sequentialPasses = stats.passes - middle;

    expect(sequentialPasses).toBe(16 * 8); // one pass per token: the prefill pass samples the first
    expect(concurrentPasses).toBeLessThanOrEqual(12);
    for (let i = 0; i < 16; i++) {
      expect(ids(concurrent[i]), `request ${i}`).toEqual(ids(sequential[i]));
      expect(concurrent[i].choices[0].logprobs).toEqual(sequential[i].choices[0].logprobs);
    }
    // Different seeds really sample differently (so the equality above is not vacuous).
    expect(new Set(concurrent.map((c) => JSON.stringify(ids(c)))).size).toBeGreaterThan(8);
  });

  it("a model that never stops is cut at max_tokens with finish_reason length", async () => {
    // With this seed the noise model samples no end token (checked below), so only max_tokens stops it.
    const completion = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Go on forever." }], max_completion_tokens: 40, temperature: 1, seed: 4 });
    expect(completion.choices[0].finish_reason).toBe("length");
    expect(ids(completion)).toHaveLength(40);
    expect(ids(completion)!.some((id) => model.tokenizer.eosTokenIds.includes(id))).toBe(false);
    expect(completion.usage!.completion_tokens).toBe(40);
  });

  it("a stop string ends the content before it; token_ids keep every sampled token", async () => {
    const params = { model: "tiny", messages: [{ role: "user" as const, content: "Words." }], max_tokens: 30, temperature: 2, seed: 9 };
    const free = await client.chat.completions.create(params);
    const text = free.choices[0].message.content!;
    const stop = text.slice(10, 14);
    const cut = await client.chat.completions.create({ ...params, stop: [stop] });
    expect(cut.choices[0].finish_reason).toBe("stop");
    expect(cut.choices[0].message.content).toBe(text.slice(0, text.indexOf(stop)));
    const cutIds = ids(cut)!;
    expect(ids(free)!.slice(0, cutIds.length)).toEqual(cutIds);
  });
});

describe("prompt-prefix reuse", () => {
  it("a multi-turn rollout's next turn skips the prefix its slot holds, with the same tokens as a fresh prefill", async () => {
    const reusing = serverWith({ numSlots: 2 });
    const fresh = serverWith({ numSlots: 2, reusePrefixes: false });
    const turn = async (client: OpenAI) => {
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "system", content: "Play well." }, { role: "user", content: "Your move?" }];
      const first = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 6, seed: 1, logprobs: true });
      messages.push({ role: "assistant", content: first.choices[0].message.content }, { role: "user", content: "And now?" });
      const second = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 6, seed: 2, logprobs: true });
      return { first, second };
    };
    const a = await turn(reusing.client);
    const b = await turn(fresh.client);
    const stats = reusing.server.batcherFor("tiny").stats;
    // The second prompt starts with the first prompt (and usually part of the answer): those were not prefilled again.
    expect(stats.reusedTokens).toBeGreaterThanOrEqual(a.first.usage!.prompt_tokens - 1);
    expect(fresh.server.batcherFor("tiny").stats.reusedTokens).toBe(0);
    expect(a.second.choices[0].logprobs).toEqual(b.second.choices[0].logprobs);
    await reusing.server.close();
    await fresh.server.close();
  });
});

describe("shared prompts", () => {
  const choices = (completion: OpenAI.Chat.ChatCompletion) => completion.choices.map((c) => [(c as { token_ids?: number[] }).token_ids, c.logprobs]);
  const question = { model: "tiny", messages: [{ role: "user" as const, content: "Pick a square on the board." }], max_tokens: 6, temperature: 1.5, logprobs: true };

  it("n = 8 choices prefill the prompt once; each choice is what it is with its own prefill", async () => {
    const sharing = serverWith({ numSlots: 8 }), alone = serverWith({ numSlots: 8, reusePrefixes: false });
    const [shared, separate] = await Promise.all([sharing, alone].map(({ client }) => client.chat.completions.create({ ...question, n: 8, seed: 5 })));
    const promptLength = shared.usage!.prompt_tokens;
    const stats = sharing.server.batcherFor("tiny").stats;
    // One prefill; the 7 others copy all but the last prompt token, which each feeds again for its logits.
    expect(stats.promptRows).toBe(promptLength + 7);
    expect(stats.copiedTokens).toBe(7 * (promptLength - 1));
    expect(alone.server.batcherFor("tiny").stats.promptRows).toBe(8 * promptLength);
    expect(choices(shared)).toEqual(choices(separate));
    expect(new Set(shared.choices.map((c) => c.message.content)).size).toBeGreaterThan(4); // the seeds differ
    await sharing.server.close();
    await alone.server.close();
  });

  it("8 identical concurrent requests (a GRPO group) prefill the prompt once, with the same answers as alone", async () => {
    const sharing = serverWith({ numSlots: 8 }), alone = serverWith({ numSlots: 8, reusePrefixes: false });
    const group = await Promise.all(Array.from({ length: 8 }, (_, i) => sharing.client.chat.completions.create({ ...question, seed: 20 + i })));
    const stats = sharing.server.batcherFor("tiny").stats;
    expect(stats.promptRows).toBe(group[0].usage!.prompt_tokens + 7);
    for (const [i, completion] of group.entries()) {
      expect(choices(completion), `request ${i}`).toEqual(choices(await alone.client.chat.completions.create({ ...question, seed: 20 + i })));
    }
    await sharing.server.close();
    await alone.server.close();
  });

  describe("on the batcher", () => {
    const prompt = Array.from({ length: 30 }, (_, i) => (i * 7 + 3) % 600);
    const spec = (seed: number, extra: Partial<SequenceSpec> = {}): SequenceSpec => ({
      promptIds: prompt, maxTokens: 5, temperature: 1.5, topP: 1, seed, numTopLogprobs: 0, stopTokenIds: [], constraint: null, loras: null, ...extra,
    });
    const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));
    const aloneTokens = async (seed: number) => {
      const batcher = new Batcher(model.model, { numSlots: 1, maxPositions: 64, reusePrefixes: false });
      const { tokens } = await batcher.submit(spec(seed));
      await batcher.close();
      return tokens;
    };

    it("a new prompt takes the least recently freed slot, so the turn that just ended keeps its prefix", async () => {
      const batcher = new Batcher(model.model, { numSlots: 2, maxPositions: 64 });
      await batcher.submit(spec(6, { promptIds: [9, 8, 7, 6], maxTokens: 2 })); // some earlier rollout
      const turn = await batcher.submit(spec(7));
      await batcher.submit(spec(8, { promptIds: [1, 2, 3, 4, 5], maxTokens: 2 })); // another rollout meanwhile
      const reused = batcher.stats.reusedTokens;
      await batcher.submit(spec(9, { promptIds: [...prompt, ...turn.tokens.map((t) => t.id), 11, 12] }));
      expect(batcher.stats.reusedTokens - reused).toBe(prompt.length + turn.tokens.length - 1);
      await batcher.close();
    });

    it("a sequence waiting on an aborted one copies what it had prefilled and prefills the rest itself", async () => {
      const batcher = new Batcher(model.model, { numSlots: 2, maxPositions: 64, maxPrefillTokens: 4 });
      const abort = new AbortController();
      const leader = batcher.submit(spec(1, { signal: abort.signal }));
      const follower = batcher.submit(spec(2));
      while (batcher.stats.passes < 2) await nextTurn();
      abort.abort(new Error("client went away"));
      await expect(leader).rejects.toThrow("client went away");
      expect((await follower).tokens).toEqual(await aloneTokens(2));
      // The leader had prefilled part of the prompt (4 tokens a step): the follower copied that part.
      expect(batcher.stats.copiedTokens).toBeGreaterThan(0);
      expect(batcher.stats.copiedTokens).toBeLessThan(prompt.length - 1);
      expect(batcher.load).toEqual({ running: 0, queued: 0 });
      await batcher.close();
    });

    it("after pause and resume (weights may have changed) a running sequence is no prefix source", async () => {
      const batcher = new Batcher(model.model, { numSlots: 4, maxPositions: 64 });
      const long = batcher.submit(spec(3, { maxTokens: 30 }));
      while (batcher.stats.sampled < 1) await nextTurn();
      const before = await batcher.submit(spec(4));
      const copiedBefore = batcher.stats.copiedTokens;
      expect(copiedBefore).toBe(prompt.length - 1);
      await batcher.pause();
      batcher.resume();
      const after = await batcher.submit(spec(5));
      expect(batcher.load.running).toBe(1); // the long sequence still runs: it was there to copy from
      expect(batcher.stats.copiedTokens).toBe(copiedBefore);
      expect(before.tokens).toEqual(await aloneTokens(4));
      expect(after.tokens).toEqual(await aloneTokens(5));
      await long;
      await batcher.close();
    });

    it("a constraint that dead-ends fails only its own sequence; the others in the pass sample as alone", async () => {
      const batcher = new Batcher(model.model, { numSlots: 2, maxPositions: 64, reusePrefixes: false });
      // "{}" needs 2 bytes and the end token: with max 2 tokens no first token can still finish the JSON.
      const grammar = new JsonGrammar(compileSchema({ type: "object" }), { textCost: tokenTrieFor(model.tokenizer).greedyTokenCount });
      const constraint = new JsonConstraint(grammar, tokenTrieFor(model.tokenizer));
      const doomed = batcher.submit(spec(1, { constraint, maxTokens: 2 }));
      const free = batcher.submit(spec(2));
      await expect(doomed).rejects.toThrow(/constraint_dead_end|no allowed token/);
      expect((await free).tokens).toEqual(await aloneTokens(2));
      expect(batcher.stats.passes).toBeLessThan(10); // they shared passes (each alone would take 5 + 1)
      expect(batcher.load).toEqual({ running: 0, queued: 0 });
      await batcher.close();
    });
  });
});

describe("capacity", () => {
  it("an aborted request frees its slot for the next one, in-process and over HTTP", async () => {
    const { server, client } = serverWith({ numSlots: 1 });
    const batcher = server.batcherFor("tiny");
    const http = await server.listen();
    const long = { model: "tiny", messages: [{ role: "user" as const, content: "Long." }], max_tokens: 100, seed: 1, stream: true as const }; // seeded: samples no end token in 100
    try {
      // In-process: abort through the client's signal once tokens flow.
      const abort = new AbortController();
      const stream = await client.chat.completions.create(long, { signal: abort.signal });
      let chunks = 0;
      for await (const _ of stream) if (++chunks === 3) abort.abort(); // the openai stream ends quietly on abort
      expect(chunks).toBe(3);
      const short = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
      expect(short.choices[0].finish_reason).toMatch(/^(length|stop)$/);
      expect(batcher.load).toEqual({ running: 0, queued: 0 });

      // HTTP: the client drops the connection mid-stream.
      const response = await fetch(`${http.baseURL}/chat/completions`, { method: "POST", body: JSON.stringify(long), headers: { "content-type": "application/json" } });
      const reader = response.body!.getReader();
      await reader.read();
      await reader.cancel();
      for (let i = 0; i < 200 && batcher.load.running > 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(batcher.load).toEqual({ running: 0, queued: 0 });

      // HTTP, not streamed: the client gives up waiting.
      const sampledBefore = batcher.stats.sampled;
      const giveUp = new AbortController();
      const waiting = fetch(`${http.baseURL}/chat/completions`, { method: "POST", body: JSON.stringify({ ...long, stream: false }), headers: { "content-type": "application/json" }, signal: giveUp.signal });
      for (let i = 0; i < 200 && batcher.stats.sampled < 5 + sampledBefore; i++) await new Promise((r) => setTimeout(r, 10));
      giveUp.abort();
      await expect(waiting).rejects.toThrow();
      for (let i = 0; i < 200 && batcher.load.running > 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(batcher.load).toEqual({ running: 0, queued: 0 });
      expect(server.metrics.aborted).toBe(3);
    } finally {
      await server.close();
    }
  });

  it("beyond the queue bound, requests get 429 rate_limit_error", async () => {
    const { server, client } = serverWith({ numSlots: 1, maxQueued: 1 });
    const request = () => client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 20 });
    const results = await Promise.allSettled([request(), request(), request()]);
    expect(results.filter((r) => r.status === "fulfilled")).toHaveLength(2);
    const rejected = results.find((r) => r.status === "rejected") as PromiseRejectedResult;
    expect(rejected.reason).toMatchObject({ status: 429, type: "rate_limit_error", code: "queue_full" });
    await server.close();
  });

  it("cancels a refused n > 1 request's admitted choices at once, instead of decoding them for nobody", async () => {
    const { server, client } = serverWith({ numSlots: 1, maxQueued: 1 });
    const batcher = server.batcherFor("tiny");
    const passesBefore = batcher.stats.passes;
    await expect(client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 400, n: 3, temperature: 1, seed: 5 }))
      .rejects.toMatchObject({ status: 429, code: "queue_full" });
    while (batcher.load.running + batcher.load.queued > 0) await new Promise((r) => setTimeout(r, 5));
    expect(batcher.stats.passes - passesBefore).toBeLessThanOrEqual(2);
    await server.close();
  });

  it("pause holds every forward pass until resume", async () => {
    const { server, client } = serverWith({ numSlots: 4 });
    await server.pause();
    const batcher = server.batcherFor("tiny");
    const pending = client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 3 });
    await new Promise((r) => setTimeout(r, 50));
    expect(batcher.stats.passes).toBe(0);
    expect(batcher.load.queued + batcher.load.running).toBe(1);
    server.resume();
    expect((await pending).choices[0].finish_reason).toMatch(/^(length|stop)$/);
    await server.close();
  });
});

describe("isolation", () => {
  it("a sequence whose token callback throws fails alone; its batch-mates finish", async () => {
    const { server } = serverWith({ numSlots: 4 });
    const batcher = server.batcherFor("tiny");
    const base = { promptIds: [1, 2, 3], maxTokens: 5, temperature: 1, topP: 1, seed: 1, numTopLogprobs: 0, stopTokenIds: [], constraint: null, loras: null };
    const [bad, good] = await Promise.allSettled([
      batcher.submit({ ...base, onToken: () => { throw new Error("callback bug"); } }),
      batcher.submit(base),
    ]);
    expect(bad).toMatchObject({ status: "rejected", reason: { message: "callback bug" } });
    expect(good).toMatchObject({ status: "fulfilled", value: { finishReason: "length" } });
    await server.close();
  });
});

describe("adapters", () => {
  it("an adapter id decodes with its LoRA, the base id without, and mixed batches match each alone", async () => {
    const { server, client } = serverWith({ numSlots: 8 });
    const transformer = model.model;
    const { hiddenSize: d, numHeads, headDim } = transformer.config;
    const rank = 4;
    const random = (n: number, scale: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 12.9898 + scale) * scale);
    const loras: LayerLoras[] = Array.from({ length: transformer.config.numLayers }, () => ({
      q_proj: { a: transformer.backend.upload(random(rank * d, 0.5), [rank, d]), b: transformer.backend.upload(random(numHeads * headDim * rank, 2), [numHeads * headDim, rank]), scale: 4 },
      down_proj: { a: transformer.backend.upload(random(rank * transformer.config.intermediateSize, 0.7), [rank, transformer.config.intermediateSize]), b: transformer.backend.upload(random(d * rank, 3), [d, rank]), scale: 4 },
    }));
    let live: LayerLoras[] | null = loras;
    server.addAdapter("tiny-agent", "tiny", () => live);
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(["tiny", "tiny-agent"]);

    const ask = (modelId: string, seed: number) => client.chat.completions.create({ model: modelId, messages: [{ role: "user", content: "Hi" }], max_tokens: 6, temperature: 1, seed, logprobs: true });
    const aloneBase = await ask("tiny", 1);
    const aloneAgent = await ask("tiny-agent", 1);
    expect(aloneAgent.choices[0].logprobs).not.toEqual(aloneBase.choices[0].logprobs);
    const mixed = await Promise.all([ask("tiny", 1), ask("tiny-agent", 1), ask("tiny", 1), ask("tiny-agent", 1)]);
    for (const [i, completion] of mixed.entries()) {
      expect(completion.choices[0].logprobs).toEqual((i % 2 === 0 ? aloneBase : aloneAgent).choices[0].logprobs);
    }
    // The provider is read per request: without a LoRA the adapter id answers like the base.
    live = null;
    expect((await ask("tiny-agent", 1)).choices[0].logprobs).toEqual(aloneBase.choices[0].logprobs);
    await server.close();
  });
});

describe("host work during a pass", () => {
  /** A tiny model of its own whose backend samples in two halves, as the CUDA backend does; `onLaunch` runs at each launch. */
  async function twoHalvesModel(onLaunch: () => void, onTaken: () => void = () => {}): Promise<ServableModel> {
    const own = await tinyServableModel(3);
    const backend = own.model.backend;
    backend.startSample = (logits, params) => {
      onLaunch();
      const result = backend.sample(logits, params);
      return () => {
        onTaken();
        return result;
      };
    };
    return own;
  }

  it("with a backend that samples in two halves, requests are handled while a pass computes, not between passes", async () => {
    // The log says, in order, when a pass's sampling was queued, when its result was taken, and when a request's chat
    // template was rendered.
    const log: string[] = [];
    const own = await twoHalvesModel(() => log.push("launched"), () => log.push("taken"));
    const render = own.tokenizer.applyChatTemplate.bind(own.tokenizer);
    own.tokenizer.applyChatTemplate = (messages, options) => {
      log.push(`templated ${String(messages.at(-1)!.content)}`);
      return render(messages, options);
    };
    const server = new ModelServer({ batcher: { maxPositions: 512, numSlots: 4 } });
    server.addBaseModel("tiny", own);
    const client = server.openai({ maxRetries: 0 });
    const ask = (content: string, maxTokens: number) => client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content }], max_tokens: maxTokens, seed: 5, ignore_eos: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    // A's answer starts a follow-up (a rollout's next turn) while B still decodes.
    await Promise.all([ask("A", 2).then(() => ask("follow-up", 2)), ask("B", 24)]);
    await server.close();
    const followUp = log.indexOf("templated follow-up");
    expect(followUp).toBeGreaterThan(0);
    // The last pass event before it: a pass was in flight (queued, its result not yet taken) when the request came.
    const before = log.slice(0, followUp).filter((event) => event === "launched" || event === "taken");
    expect(before.at(-1)).toBe("launched");
    expect(log.filter((event) => event === "launched").length).toBe(log.filter((event) => event === "taken").length);
  });

  it("a request aborted while its pass is in flight leaves its slot a prefix that answers like a fresh prefill", async () => {
    const abort = new AbortController();
    let launches = 0;
    // The abort lands between the third pass's launch and its tokens being taken.
    const own = await twoHalvesModel(() => {
      if (++launches === 3) setImmediate(() => abort.abort());
    });
    const server = new ModelServer({ batcher: { maxPositions: 512, numSlots: 2 } });
    server.addBaseModel("tiny", own);
    const client = server.openai({ maxRetries: 0 });
    const ask = (content: string, maxTokens: number, signal?: AbortSignal) => client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content }], max_tokens: maxTokens, seed: 9, ignore_eos: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming, { signal });
    const batcher = server.batcherFor("tiny");
    const [aborted, beside] = await Promise.allSettled([ask("Tell me a long story.", 40, abort.signal), ask("B", 6)]);
    expect(aborted.status).toBe("rejected");
    expect(beside.status).toBe("fulfilled");
    expect(batcher.load).toEqual({ running: 0, queued: 0 });
    // The same prompt again takes the aborted one's keys and values (a free slot's prefix) and samples what a server
    // that never saw it samples.
    const reusedBefore = batcher.stats.reusedTokens;
    const again = await ask("Tell me a long story.", 8);
    expect(batcher.stats.reusedTokens).toBeGreaterThan(reusedBefore);
    await server.close();
    const fresh = serverWith({ numSlots: 2 });
    const alone = await fresh.client.chat.completions.create({
      model: "tiny", messages: [{ role: "user", content: "Tell me a long story." }], max_tokens: 8, seed: 9, ignore_eos: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    await fresh.server.close();
    expect(ids(again)).toEqual(ids(alone));
  });
});
