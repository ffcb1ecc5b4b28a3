// Engine logits vs the independent PyTorch reference (scripts/reference/transformer_reference.py), whose outputs
// are committed as fixtures; the checkpoints are rebuilt here from the same seeds.
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import type { ReferenceFixture } from "../../scripts/reference/make-reference-fixtures.ts";
import { maxAbsDiff, tinyCheckpoint } from "./helpers.ts";

const fixtureDir = path.join(import.meta.dirname, "..", "fixtures", "reference");
const fixtures: ReferenceFixture[] = fs.readdirSync(fixtureDir).sort()
  .map((file) => JSON.parse(fs.readFileSync(path.join(fixtureDir, file), "utf8")));

describe("logits match the PyTorch reference", () => {
  it("covers all three architectures and the half-precision formats", () => {
    expect(fixtures.map((f) => f.name)).toEqual(["llama", "qwen2-bf16", "qwen2", "qwen3-f16-sharded", "qwen3"]);
  });

  for (const fixture of fixtures) {
    it(`${fixture.name}: max abs error < 1e-4`, () => {
      const model = loadTransformer(tinyCheckpoint(fixture.checkpoint), new CpuBackend());
      const logits = sequenceLogits(model, fixture.ids);
      const error = maxAbsDiff(logits, fixture.logits.flat());
      expect(error).toBeLessThan(1e-4);
      // The fixture is not trivially small: the logits spread over several units.
      expect(Math.max(...fixture.logits.flat().map(Math.abs))).toBeGreaterThan(1);
    });
  }

  it("a BF16 checkpoint agrees with its F32 original within bf16 tolerance", () => {
    const f32 = fixtures.find((f) => f.name === "qwen2")!;
    const bf16 = loadTransformer(tinyCheckpoint({ ...f32.checkpoint, dtype: "BF16" }), new CpuBackend());
    const logits = sequenceLogits(bf16, f32.ids);
    const scale = Math.max(...f32.logits.flat().map(Math.abs));
    const error = maxAbsDiff(logits, f32.logits.flat());
    expect(error).toBeLessThan(0.05 * scale);
    expect(error).toBeGreaterThan(0); // the weights really were rounded
  });
});
