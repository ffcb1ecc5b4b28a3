import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { type StreamDecoding, generate, decode } from "../../lib/model/generate.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import { type Transformer } from "../../lib/model/transformer.ts";
import { maxAbsDiff, tinyCheckpoint } from "./helpers.ts";

const qwen3 = loadTransformer(tinyCheckpoint({ arch: "qwen3", seed: 3 }), new CpuBackend());
const qwen2 = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 4 }), new CpuBackend());
const vocab = 256;
const rowsOf = (flat: Float32Array, from: number, to: number) => flat.subarray(from * vocab, to * vocab);

function forwardRows(model: Transformer, cache: ReturnType<Transformer["createKvCache"]>, ids: number[], slots: number[], positions: number[]): Float32Array {
  const logits = model.forward(Int32Array.from(ids), { slots: Int32Array.from(slots), positions: Int32Array.from(positions) }, cache, null);
  const host = model.backend.download(logits);
  model.backend.free(logits);
  return host;
}

describe("KV cache and batching", () => {
  const a = [1, 9, 40, 7, 200, 13, 5];
  const b = [1, 77, 3];
  const c = [2, 250, 100, 31, 8, 64, 99, 11, 0, 4];

  it("decoding token by token with the cache gives the full recompute's logits", () => {
    for (const model of [qwen2, qwen3]) {
      const full = sequenceLogits(model, a);
      const cache = model.createKvCache(1, a.length);
      const prefill = forwardRows(model, cache, a.slice(0, 3), [0, 0, 0], [0, 1, 2]);
      expect(maxAbsDiff(prefill, rowsOf(full, 0, 3))).toBeLessThan(1e-5);
      for (let p = 3; p < a.length; p++) {
        const decoded = forwardRows(model, cache, [a[p]], [0], [p]);
        expect(maxAbsDiff(decoded, rowsOf(full, p, p + 1))).toBeLessThan(1e-5);
      }
    }
  });

  it("a batch of mixed-length sequences (prefill and decode rows together) gives what each gives alone", () => {
    const alone = [a, b, c].map((ids) => sequenceLogits(qwen3, ids));
    const cache = qwen3.createKvCache(3, 16);
    // Slot 0 already holds a's first 6 tokens; this pass decodes a's 7th while b and c prefill.
    forwardRows(qwen3, cache, a.slice(0, 6), [0, 0, 0, 0, 0, 0], [0, 1, 2, 3, 4, 5]);
    const mixed = forwardRows(
      qwen3, cache,
      [...b, a[6], ...c],
      [1, 1, 1, 0, ...c.map(() => 2)],
      [0, 1, 2, 6, ...c.map((_, i) => i)],
    );
    expect(maxAbsDiff(rowsOf(mixed, 0, 3), alone[1])).toBeLessThan(1e-5);
    expect(maxAbsDiff(rowsOf(mixed, 3, 4), rowsOf(alone[0], 6, 7))).toBeLessThan(1e-5);
    expect(maxAbsDiff(rowsOf(mixed, 4, 14), alone[2])).toBeLessThan(1e-5);
  });

  it("decode samples only the last row of each sequence and reports its logprob", () => {
    const cache = qwen2.createKvCache(2, 8);
    const greedy = { temperature: 0, topP: 1, topK: 0, uniform: 0.5, topLogprobs: 3 };
    const out = decode(qwen2, cache, [
      { slot: 0, startPosition: 0, tokens: b, sample: greedy },
      { slot: 1, startPosition: 0, tokens: a.slice(0, 2), sample: null },
    ]);
    expect(out[1]).toBeNull();
    const last = rowsOf(sequenceLogits(qwen2, b), 2, 3);
    const best = last.indexOf(Math.max(...last));
    const logZ = Math.log(last.reduce((s, v) => s + Math.exp(v), 0));
    expect(out[0]!.id).toBe(best);
    expect(out[0]!.logprob).toBeCloseTo(last[best] - logZ, 4);
    expect(out[0]!.topLogprobs).toHaveLength(3);
    expect(out[0]!.topLogprobs[0]).toEqual({ id: best, logprob: out[0]!.logprob });
    expect(out[0]!.topLogprobs[1].logprob).toBeLessThanOrEqual(out[0]!.topLogprobs[0].logprob);
  });

  it("decode constrains a row to its allowedTokens: greedy takes the best allowed id, the logprob stays the raw model's", () => {
    const last = rowsOf(sequenceLogits(qwen2, b), 2, 3);
    const logZ = Math.log(last.reduce((s, v) => s + Math.exp(v), 0));
    const ranked = [...last.keys()].sort((x, y) => last[y] - last[x]);
    const allowed = [ranked[40], ranked[7], ranked[100]]; // the best of them is the 8th most likely token
    const cache = qwen2.createKvCache(2, 8);
    const greedy = { temperature: 0, topP: 1, topK: 0, uniform: 0.5, topLogprobs: 2 };
    const out = decode(qwen2, cache, [
      { slot: 0, startPosition: 0, tokens: b, sample: { ...greedy, allowedTokens: allowed } },
      { slot: 1, startPosition: 0, tokens: b, sample: greedy }, // unconstrained batch-mate
    ]);
    expect(out[0]!.id).toBe(ranked[7]);
    expect(out[0]!.logprob).toBeCloseTo(last[ranked[7]] - logZ, 4);
    expect(out[0]!.topLogprobs.map((t) => t.id)).toEqual([ranked[7], ranked[40]]);
    expect(out[1]!.id).toBe(ranked[0]);
    const sampled = decode(qwen2, qwen2.createKvCache(1, 8), [
      { slot: 0, startPosition: 0, tokens: b, sample: { ...greedy, temperature: 1, uniform: 0.999, allowedTokens: allowed } },
    ]);
    expect(allowed).toContain(sampled[0]!.id);
    expect(() => decode(qwen2, qwen2.createKvCache(1, 8), [
      { slot: 0, startPosition: 0, tokens: b, sample: { ...greedy, allowedTokens: [vocab] } },
    ])).toThrow(/id 256 is outside the vocabulary/);
  });
});

/** A character decoder for the tiny vocabulary: id → one letter (a real tokenizer is tested in test/model/load). */
const letters: StreamDecoding = {
  createStreamDecoder: () => ({ push: (id: number) => String.fromCharCode(97 + (id % 26)), flush: () => "" }),
};

describe("LoRA sets", () => {
  it("forward refuses a LoRA set with the wrong number of layers or a projection name it does not know", () => {
    const b = qwen2.backend, { numLayers, hiddenSize: d } = qwen2.config;
    const lora = { a: b.zeros([2, d]), b: b.zeros([d, 2]), scale: 1 };
    const layers = (first: Record<string, typeof lora>) => [first, ...Array.from({ length: numLayers - 1 }, () => ({}))];
    const run = (loras: unknown) => qwen2.forward(Int32Array.of(1), { slots: Int32Array.of(0), positions: Int32Array.of(0) }, qwen2.createKvCache(1, 2), null, loras as never);
    expect(() => run([{}])).toThrow(`the LoRA set has 1 layers; this model has ${numLayers}`);
    expect(() => run(layers({ qProj: lora }))).toThrow('the LoRA of layer 0 names "qProj"; a LoRA targets one of q_proj, k_proj');
    b.free(run(layers({ o_proj: lora })));
  });
});

describe("generate", () => {
  const prompts = [[1, 9, 40, 7], [1, 77], [3, 3, 3, 3, 3, 3, 3]];

  it("same seed → same tokens, and a request's tokens do not depend on its batch-mates", async () => {
    const requests = prompts.map((promptIds, i) => ({ promptIds, seed: 100 + i, maxTokens: 8, topP: 0.9 }));
    const batched = await generate(qwen3, requests);
    const again = await generate(qwen3, requests);
    const alone = await generate(qwen3, [requests[1]]);
    expect(again.map((r) => r.tokenIds)).toEqual(batched.map((r) => r.tokenIds));
    expect(alone[0].tokenIds).toEqual(batched[1].tokenIds);
    expect(maxAbsDiff(alone[0].logprobs, batched[1].logprobs)).toBeLessThan(1e-5);
    const other = await generate(qwen3, [{ ...requests[1], seed: 7 }]);
    expect(other[0].tokenIds).not.toEqual(batched[1].tokenIds);
    expect(batched.every((r) => r.tokenIds.length === 8 && r.finishReason === "length")).toBe(true);
  });

  it("greedy generation follows the argmax of full recomputes, with matching logprobs", async () => {
    const [result] = await generate(qwen2, [{ promptIds: prompts[0], temperature: 0, maxTokens: 5 }]);
    const ids = [...prompts[0]];
    for (let t = 0; t < 5; t++) {
      const all = sequenceLogits(qwen2, ids);
      const last = rowsOf(all, ids.length - 1, ids.length);
      const best = last.indexOf(Math.max(...last));
      const logZ = Math.log(last.reduce((s, v) => s + Math.exp(v), 0));
      expect(result.tokenIds[t]).toBe(best);
      expect(result.logprobs[t]).toBeCloseTo(last[best] - logZ, 4);
      ids.push(best);
    }
  });

  it("stops at stop ids (kept in tokenIds) and at stop strings (cut from the text), streaming as it goes", async () => {
    const [free] = await generate(qwen2, [{ promptIds: prompts[0], temperature: 0, maxTokens: 6 }], { tokenizer: letters });
    const stopId = free.tokenIds[2];
    const firstStop = free.tokenIds.indexOf(stopId);
    const [byId] = await generate(qwen2, [{ promptIds: prompts[0], temperature: 0, maxTokens: 6, stopIds: [stopId] }]);
    expect(byId.tokenIds).toEqual(free.tokenIds.slice(0, firstStop + 1));
    expect(byId.finishReason).toBe("stop");

    const stopText = free.text.slice(2, 4);
    const cut = free.text.indexOf(stopText);
    const streamed: string[] = [];
    const [byText] = await generate(qwen2, [{
      promptIds: prompts[0], temperature: 0, maxTokens: 6, stop: [stopText], onToken: (t) => streamed.push(t.text),
    }], { tokenizer: letters, eosTokenIds: [] });
    expect(byText.text).toBe(free.text.slice(0, cut));
    expect(byText.finishReason).toBe("stop");
    expect(streamed).toHaveLength(byText.tokenIds.length);
    expect(streamed.join("")).toBe(byText.text);
  });

  it("bad requests name the problem", async () => {
    await expect(generate(qwen2, [{ promptIds: [] }])).rejects.toThrow("generate: request 0 has an empty prompt");
    await expect(generate(qwen2, [{ promptIds: [1], stop: ["x"] }]))
      .rejects.toThrow("generate: stop strings need a tokenizer to decode text; pass options.tokenizer or use stopIds");
    await expect(generate(qwen2, [{ promptIds: [1], maxTokens: 5000 }]))
      .rejects.toThrow("generate: prompt + maxTokens reaches 5001 positions; the model allows 2048");
    await expect(generate(qwen2, [{ promptIds: [1] }, { promptIds: [1], topP: 0 }]))
      .rejects.toThrow("generate: request 1 has topP 0; use a number in (0, 1]");
    await expect(generate(qwen2, [{ promptIds: [1], temperature: -1 }]))
      .rejects.toThrow("generate: request 0 has temperature -1; use a finite number >= 0 (0 = greedy)");
    await expect(generate(qwen2, [{ promptIds: [1], maxTokens: 0 }]))
      .rejects.toThrow("generate: request 0 has maxTokens 0; use an integer >= 1");
  });
});
