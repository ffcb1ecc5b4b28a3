// The engine, the PEFT adapter loader, the trainer's gradients and the tokenizer against what Hugging Face itself
// computes: test/fixtures/hf, written by scripts/reference/hf_fixtures.py with transformers + PEFT (its README says
// how and with which versions). Checkpoints and adapters are the files save_pretrained wrote, read as they are.
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadAdapter, readAdapter } from "../../lib/model/peft.ts";
import { Trainer } from "../../lib/grpo/train.ts";
import { type TrainingSequence } from "../../lib/grpo/tokenize.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import { openSafetensors } from "../../lib/model/safetensors.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { relativeError } from "./check.ts";
import { maxAbsDiff } from "./helpers.ts";

const root = path.join(import.meta.dirname, "..", "fixtures", "hf");

function expected(arch: string) {
  const store = openSafetensors(path.join(root, arch, "expected.safetensors"));
  try {
    const batch = store.info("ids")!.shape[0];
    const rows = (t: Float32Array) => Array.from({ length: batch }, (_, s) => t.subarray((s * t.length) / batch, ((s + 1) * t.length) / batch));
    const gradients = new Map(store.names().filter((n) => n.includes("lora_")).map((n) => [n, store.readF32(n)]));
    return {
      ids: rows(store.readF32("ids")).map((r) => Array.from(r)), assistant: rows(store.readF32("assistant")), advantages: Array.from(store.readF32("advantages")),
      logits: rows(store.readF32("logits")), adapterLogits: rows(store.readF32("adapter_logits")), gradients,
    };
  } finally {
    store.close();
  }
}

describe("Hugging Face fixtures (transformers + PEFT)", () => {
  for (const arch of ["qwen2", "qwen3", "llama"]) {
    const checkpoint = path.join(root, arch, "checkpoint"), adapterDir = path.join(root, arch, "adapter");

    it(`${arch}: logits of the saved checkpoint, without and with the PEFT adapter, within 1e-4`, () => {
      const want = expected(arch);
      const model = loadTransformer(checkpoint, new CpuBackend());
      const adapter = loadAdapter(adapterDir, model);
      want.ids.forEach((ids, s) => {
        expect(maxAbsDiff(sequenceLogits(model, ids), want.logits[s])).toBeLessThan(1e-4);
        expect(maxAbsDiff(sequenceLogits(model, ids, adapter), want.adapterLogits[s])).toBeLessThan(1e-4);
        // The adapter really changes the logits, so the second check is not the first one again.
        expect(maxAbsDiff(want.adapterLogits[s], want.logits[s])).toBeGreaterThan(0.01);
      });
    });

    it(`${arch}: every LoRA gradient of the GRPO surrogate within 1e-3 of PEFT's autograd`, () => {
      const want = expected(arch);
      const model = loadTransformer(checkpoint, new CpuBackend());
      const adapter = readAdapter(adapterDir, model.config);
      expect(adapter.lora).toMatchObject({ rank: 4, alpha: 8, useRslora: false });
      const training = new DifferentiableTransformer(model, { lora: adapter.lora, adapter });
      const sequences: TrainingSequence[] = want.ids.map((tokens, s) => ({
        tokens, trainable: Uint8Array.from(want.assistant[s]), logprobs: new Float32Array(tokens.length).fill(NaN),
        advantage: want.advantages[s], trajectory: s,
      }));
      const { gradients } = new Trainer(training, { lora: adapter.lora }).computeGradients(sequences);
      expect([...gradients.keys()].sort()).toEqual([...want.gradients.keys()].sort());
      expect(want.gradients.size).toBe(2 * 7 * model.config.numLayers);
      for (const [name, reference] of want.gradients) {
        expect(Math.max(...reference.map(Math.abs)), name).toBeGreaterThan(0);
        expect(relativeError(gradients.get(name)!, reference), name).toBeLessThan(1e-3);
      }
    });
  }

  it("the byte-level BPE tokenizer that Hugging Face tokenizers trained encodes as it does", async () => {
    const tokenizer = await loadTokenizer(path.join(root, "tokenizer"));
    const cases = JSON.parse(fs.readFileSync(path.join(root, "tokenizer", "expected-encodings.json"), "utf8")) as { text: string; ids: number[] }[];
    for (const { text, ids } of cases) {
      expect(tokenizer.encode(text), text).toEqual(ids);
      expect(tokenizer.decode(ids), text).toBe(text);
    }
  });
});
