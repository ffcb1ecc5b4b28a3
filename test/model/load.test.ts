import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { cudaAvailability } from "../../lib/cuda/mod.ts";
import { loadCausalLM } from "../../lib/load/causal-lm.ts";
import { sequenceLogits } from "../../lib/model/transformer.ts";
import { maxAbsDiff, tinyCheckpoint } from "./helpers.ts";

const dir = tinyCheckpoint({ arch: "qwen2", seed: 21, tokenizer: true });
const quiet = { device: "cpu" as const };

describe("loadCausalLM", () => {
  it("loads config, tokenizer and weights; logits are [ids × vocab]", async () => {
    const lm = await loadCausalLM(dir, quiet);
    expect(lm.config.vocabSize).toBe(512);
    expect(lm.backend.name).toBe("cpu");
    const ids = lm.tokenizer.encode("hello world");
    const logits = await lm.logits(ids);
    expect(logits).toHaveLength(ids.length * 512);
    expect(maxAbsDiff(logits, sequenceLogits(lm.model, ids))).toBe(0);
    await expect(lm.logits([])).rejects.toThrow("logits: ids is empty; give at least one token id");
  });

  it("generates from text, ids and chat messages; stops at the tokenizer's eos ids", async () => {
    const lm = await loadCausalLM(dir, quiet);
    const [fromText, fromIds, fromChat] = await lm.generate([
      { prompt: "The cat", temperature: 0, maxTokens: 6 },
      { prompt: lm.tokenizer.encode("The cat"), temperature: 0, maxTokens: 6 },
      { messages: [{ role: "user", content: "hi" }], seed: 1, maxTokens: 400, topLogprobs: 2 },
    ]);
    expect(fromText.tokenIds).toEqual(fromIds.tokenIds);
    expect(fromText.text).toBe(lm.tokenizer.decode(fromText.tokenIds, { skipSpecialTokens: true }));
    expect(fromChat.topLogprobs.every((top) => top.length === 2)).toBe(true);
    if (fromChat.finishReason === "stop") expect(lm.tokenizer.eosTokenIds).toContain(fromChat.tokenIds.at(-1));
    else expect(fromChat.tokenIds).toHaveLength(400);
  });

  it("streams tokens as an async iterator, ending with what generate returns", async () => {
    const lm = await loadCausalLM(dir, quiet);
    const request = { prompt: "Once upon", seed: 5, maxTokens: 7 };
    const tokens = [];
    for await (const token of lm.stream(request)) tokens.push(token);
    const [whole] = await lm.generate([request]);
    expect(tokens.map((t) => t.id)).toEqual(whole.tokenIds);
    expect(tokens.map((t) => t.text).join("")).toBe(whole.text);
  });

  it("a request aborts after its current token while its batch-mates go on", async () => {
    const lm = await loadCausalLM(dir, quiet);
    const abort = new AbortController();
    const [stopped, other] = await lm.generate([
      { prompt: "a", seed: 1, maxTokens: 50, stopIds: [], signal: abort.signal, onToken: () => abort.abort() },
      { prompt: "b", seed: 2, maxTokens: 5, stopIds: [] },
    ]);
    expect([stopped.tokenIds.length, stopped.finishReason]).toEqual([1, "abort"]);
    expect([other.tokenIds.length, other.finishReason]).toEqual([5, "length"]);
  });

  const cuda = cudaAvailability();
  it.skipIf(cuda.ok)("without a usable GPU, device cuda throws why and auto says why it runs on the CPU", async () => {
    await expect(loadCausalLM(dir, { device: "cuda" })).rejects.toThrow(`the CUDA backend cannot start: ${cuda.reason}`);
    const notes: string[] = [];
    const lm = await loadCausalLM(dir, { device: "auto", log: (m) => notes.push(m) });
    expect(lm.backend.name).toBe("cpu");
    expect(notes).toEqual([`art-ts: running on the CPU because ${cuda.reason}`]);
    await expect(loadCausalLM(dir, { device: "tpu" as "cpu" })).rejects.toThrow('device must be "cpu", "cuda" or "auto", got "tpu"');
  });

  it("weights can be stored as bf16 on the CPU too (the GPU's numerics)", async () => {
    const lm = await loadCausalLM(dir, { device: "cpu", dtype: "bf16" });
    expect(lm.model.weights.layers[0].projections.q_proj.weight.dtype).toBe("bf16");
    expect(lm.model.weights.finalNorm.dtype).toBe("f32");
  });

  it("a tokenizer larger than the model's vocabulary is refused", async () => {
    const small = tinyCheckpoint({ arch: "llama", tokenizer: true, configOverrides: { vocab_size: 400 } });
    fs.copyFileSync(path.join(dir, "tokenizer.json"), path.join(small, "tokenizer.json"));
    await expect(loadCausalLM(small, quiet)).rejects.toThrow(
      `${small}: tokenizer.json has 512 tokens but config.json's vocab_size is 400; they must belong to the same model`,
    );
  });
});
