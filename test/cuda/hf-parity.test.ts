// GPU acceptance against an independent implementation: logits of a random Qwen2.5-0.5B-shaped checkpoint from
// Hugging Face transformers (float32 math over bf16 weights, written by scripts/cuda-hf-logits.py) versus the CUDA
// engine. Runs with ART_TEST_GPU=1 and ART_HF_REFERENCE=<the script's output directory>.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import type { CudaBackend } from "../../lib/cuda/backend.ts";
import { createCudaBackend } from "../../lib/cuda/mod.ts";
import { cudaAvailable, gpuSkipReason } from "./gpu.ts";

const referenceDir = process.env.ART_HF_REFERENCE;
const skipReason = gpuSkipReason || (referenceDir ? "" : "skipped: set ART_HF_REFERENCE to the output of scripts/cuda-hf-logits.py");

describe.skipIf(!cudaAvailable || !referenceDir)(`CUDA logits vs transformers${skipReason ? ` (${skipReason})` : ""}`, () => {
  let gpu: CudaBackend | null = null;
  afterAll(() => gpu?.dispose());

  it("matches transformers' logits within bf16 tolerance and agrees on the argmax almost everywhere", () => {
    gpu = createCudaBackend();
    const model = loadTransformer(referenceDir!, gpu, "bf16");
    const ids = JSON.parse(readFileSync(join(referenceDir!, "reference-ids.json"), "utf8")) as number[];
    const bytes = readFileSync(join(referenceDir!, "reference-logits.f32"));
    const reference = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const logits = sequenceLogits(model, ids);
    expect(logits.length).toBe(reference.length);
    const vocab = model.config.vocabSize;
    let maxDiff = 0, magnitude = 0, agree = 0;
    for (let t = 0; t < ids.length; t++) {
      let best = 0, bestReference = 0;
      for (let j = 0; j < vocab; j++) {
        const at = t * vocab + j;
        maxDiff = Math.max(maxDiff, Math.abs(logits[at] - reference[at]));
        magnitude = Math.max(magnitude, Math.abs(reference[at]));
        if (logits[at] > logits[t * vocab + best]) best = j;
        if (reference[at] > reference[t * vocab + bestReference]) bestReference = j;
      }
      if (best === bestReference) agree++;
    }
    console.info(JSON.stringify({ relativeMaxDiff: maxDiff / magnitude, argmaxAgreement: agree / ids.length }));
    expect(maxDiff / magnitude).toBeLessThan(5e-2);
    expect(agree / ids.length).toBeGreaterThanOrEqual(0.9);
    model.free();
  });
});
