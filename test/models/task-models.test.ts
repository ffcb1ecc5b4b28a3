/**
 * Each committed task model is what its script makes: config and tokenizer files are regenerated and compared on
 * every run; the weights (minutes of SFT) with ART_TEST_DEMO_MODEL=1. And each answers in its task's format, which
 * the same network before SFT does not.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { MODEL_2048_3X3_OPTIONS, TASK_2048_3X3 } from "../../scripts/make-2048-3x3-model.ts";
import { MODEL_2048_OPTIONS, TASK_2048 } from "../../scripts/make-2048-model.ts";
import { ARTE_MODEL_OPTIONS, TASK_ARTE } from "../../scripts/make-arte-model.ts";
import { TICTACTOE_TASK, TICTACTOE_TINY_OPTIONS } from "../../scripts/make-tictactoe-model.ts";
import { TICTACTOE_SMALL_OPTIONS } from "../../scripts/make-tictactoe-small-model.ts";
import { makeTaskModel, type Task, type TaskModelOptions } from "../../scripts/task-model.ts";

const FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];
const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-task-models-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));
const quiet = () => {};

interface TaskModel {
  dir: string;
  task: Task;
  options: Omit<TaskModelOptions, "log">;
  /** answers sampled by the test, and the committed model's bar: a few points under its measured rate */
  answers: number;
  bar: number;
}

const MODELS: TaskModel[] = [
  { dir: "models/tictactoe-tiny", task: TICTACTOE_TASK, options: TICTACTOE_TINY_OPTIONS, answers: 128, bar: 0.9 },
  { dir: "models/tictactoe-small", task: TICTACTOE_TASK, options: TICTACTOE_SMALL_OPTIONS, answers: 128, bar: 0.9 },
  // 2048's prompts are whole games (up to ~5k tokens), so fewer answers keep the default run short.
  { dir: "models/2048-tiny", task: TASK_2048, options: MODEL_2048_OPTIONS, answers: 32, bar: 0.85 },
  // Moves that change the board (88.7% of 256 at the script's check): a random legal player's, about.
  { dir: "models/2048-3x3-tiny", task: TASK_2048_3X3, options: MODEL_2048_3X3_OPTIONS, answers: 128, bar: 0.8 },
  { dir: "models/arte-tiny", task: TASK_ARTE, options: ARTE_MODEL_OPTIONS, answers: 64, bar: 0.9 },
];

describe.each(MODELS)("$dir", ({ dir: committed, task, options, answers, bar }) => {
  const untrainedDir = path.join(root, path.basename(committed), "no-sft");

  it("holds the files the script writes, with the script's config and tokenizer", async () => {
    expect(fs.readdirSync(committed).sort()).toEqual(FILES);
    await makeTaskModel(untrainedDir, task, { ...options, sftSteps: 0, checkAnswers: 1, log: quiet });
    for (const file of FILES.filter((f) => f !== "model.safetensors")) {
      expect(fs.readFileSync(path.join(committed, file), "utf8"), file).toBe(fs.readFileSync(path.join(untrainedDir, file), "utf8"));
    }
    expect(fs.statSync(path.join(committed, "model.safetensors")).size).toBe(fs.statSync(path.join(untrainedDir, "model.safetensors")).size);
  });

  it(`answers in the task's format after its SFT (the untrained network does not)`, async () => {
    const tokenizer = await loadTokenizer(committed);
    const model = loadTransformer(committed, new CpuBackend());
    expect(await task.answerRate(model, tokenizer, answers, 99)).toBeGreaterThan(bar);
    model.free();
    const untrained = loadTransformer(untrainedDir, new CpuBackend());
    expect(await task.answerRate(untrained, tokenizer, 16, 99)).toBeLessThan(0.2);
    untrained.free();
  });

  it.runIf(process.env.ART_TEST_DEMO_MODEL === "1")("is byte-identical to a fresh run of the script", async () => {
    const dir = path.join(root, path.basename(committed), "fresh");
    await makeTaskModel(dir, task, { ...options, log: quiet });
    for (const file of FILES) expect(fs.readFileSync(path.join(dir, file)).equals(fs.readFileSync(path.join(committed, file))), file).toBe(true);
  }, 3_600_000);
});

describe("makeTaskModel", () => {
  it("refuses to write a model whose SFT trained nothing (every answer beyond maxLength)", async () => {
    const dir = path.join(root, "cut-off");
    await expect(makeTaskModel(dir, TASK_2048_3X3, { ...MODEL_2048_3X3_OPTIONS, sftSteps: 30, maxLength: 8, log: quiet }))
      .rejects.toThrow(/sft: step 1: nothing to train — no assistant tokens in the batch \(conversation 0: truncated to 8 tokens of its \d+, which cuts every assistant token: nothing to train; .*\); raise maxLength/);
    expect(fs.existsSync(dir)).toBe(false);
  });
});
