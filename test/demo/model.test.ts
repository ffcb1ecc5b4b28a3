/**
 * The committed demo model is what scripts/demo-make-model.ts makes: config and tokenizer files are regenerated and
 * compared on every run; the weights (minutes of SFT) with ART_TEST_DEMO_MODEL=1. And it answers legal moves.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { DEMO_MODEL_OPTIONS, legalMoveRate, makeDemoModel } from "../../scripts/demo-make-model.ts";

const committed = "models/tictactoe-tiny";
const FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];
const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-demo-model-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
const quiet = () => {};

describe("models/tictactoe-tiny", () => {
  it("holds the files the script writes, with the script's config and tokenizer", async () => {
    expect(fs.readdirSync(committed).sort()).toEqual(FILES);
    const dir = path.join(root, "no-sft");
    await makeDemoModel(dir, { ...DEMO_MODEL_OPTIONS, sftSteps: 0, log: quiet });
    for (const file of FILES.filter((f) => f !== "model.safetensors")) {
      expect(fs.readFileSync(path.join(committed, file), "utf8"), file).toBe(fs.readFileSync(path.join(dir, file), "utf8"));
    }
    expect(fs.statSync(path.join(committed, "model.safetensors")).size).toBe(fs.statSync(path.join(dir, "model.safetensors")).size);
  });

  it("answers with legal moves after its SFT (a random-init model does not)", async () => {
    const tokenizer = await loadTokenizer(committed);
    const model = loadTransformer(committed, new CpuBackend());
    expect(await legalMoveRate(model, tokenizer, 128, 99)).toBeGreaterThan(0.9);
    model.free();
    const untrained = loadTransformer(path.join(root, "no-sft"), new CpuBackend());
    expect(await legalMoveRate(untrained, tokenizer, 32, 99)).toBeLessThan(0.2);
    untrained.free();
  });

  it.runIf(process.env.ART_TEST_DEMO_MODEL === "1")("is byte-identical to a fresh run of the script", async () => {
    const dir = path.join(root, "fresh");
    await makeDemoModel(dir, { ...DEMO_MODEL_OPTIONS, log: quiet });
    for (const file of FILES) expect(fs.readFileSync(path.join(dir, file)).equals(fs.readFileSync(path.join(committed, file))), file).toBe(true);
  }, 3_600_000);
});
