/**
 * Makes a small task model like the ones under models/: the tiny byte-level BPE tokenizer with its ChatML template
 * (or, per model, merges learned from the task's own conversations and a template of its own) and a small
 * Qwen2-shaped transformer taught a task's answer format by the engine's own SFT (full-parameter) on synthetic
 * conversations, after the task's warm-up phases if it has any. The task supplies the conversations and a check of
 * the result; the rest (initial weights, schedules, files written) is shared, so every task model is made the same way.
 *
 * Deterministic: the same options give byte-identical files (seeded data, seeded initialisation, the portable
 * products, whose float32 bits do not depend on the machine or the thread count).
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { ArtError } from "../lib/core/errors.ts";
import { seededRandom, type Rng } from "../lib/core/random.ts";
import type { SftConversation } from "../lib/trainable/model.ts";
import { tokenizeForSft } from "../lib/grpo/tokenize.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { CpuBackend } from "../lib/model/cpu/backend.ts";
import { writeSafetensors, type TensorToWrite } from "../lib/model/safetensors.ts";
import { loadTokenizer, type Tokenizer } from "../lib/model/tokenizer.ts";
import type { TinyTokenizerOptions } from "../lib/model/tokenizer-tiny.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { loadTransformer, type Transformer } from "../lib/model/transformer.ts";
import { writeTinyCheckpoint } from "./make-tiny-checkpoint.ts";

/** The network of the tiny task models: Qwen2-shaped, hidden 64, 2 layers, 4 query and 2 key/value heads (config keys). */
export const TINY_TASK_SHAPE = {
  hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
  max_position_embeddings: 4096,
} as const;

export interface TaskModelOptions {
  seed: number;
  /** config.json keys over the qwen2 tiny preset */
  shape: Record<string, unknown>;
  sftSteps: number;
  /** conversations per SFT step (one optimizer step each) */
  batchSize: number;
  learningRate: number;
  /** linear warmup steps of the cosine schedule */
  warmupSteps: number;
  /** conversations longer than this many tokens are truncated */
  maxLength: number;
  /** answers sampled to measure the result (Task.answerRate) */
  checkAnswers: number;
  /**
   * The tokenizer, when not the tiny one: a chat template of the task's own, and a vocabulary of `vocabSize` tokens
   * whose merges are learned from `corpusConversations` of the task's conversations as that template renders them.
   */
  tokenizer?: { chatTemplate?: string; vocabSize?: number; corpusConversations?: number };
  /** called with progress lines */
  log: (line: string) => void;
}

export interface Task {
  /** `count` SFT conversations drawn from `rng`; assistant turns are trained. */
  conversations(rng: Rng, count: number): SftConversation[];
  /** Share of `count` answers sampled (temperature 1) at fresh positions that are what the task asks for. */
  answerRate(model: Transformer, tokenizer: Tokenizer, count: number, seed: number): Promise<number>;
  /** What answerRate counts, e.g. "legal moves". */
  answers: string;
  /**
   * Phases of SFT before the task's own conversations, each with its own optimizer and schedule, for skills whole
   * conversations teach too slowly (ART·E's copying of ids and answers from earlier in a long context).
   */
  warmUp?: { steps: number; batchSize: number; conversations(rng: Rng, count: number): SftConversation[] }[];
}

/** Writes the task model into `dir`; returns its answer rate (Task.answerRate over options.checkAnswers answers). */
export async function makeTaskModel(dir: string, task: Task, options: TaskModelOptions): Promise<{ answerRate: number }> {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "art-task-model-"));
  try {
    // Initial weights and the tokenizer files, from the engine's tiny-checkpoint writer.
    const { chatTemplate, vocabSize, corpusConversations } = options.tokenizer ?? {};
    const write = (tokenizer: TinyTokenizerOptions) => writeTinyCheckpoint(work, { arch: "qwen2", seed: options.seed, tokenizer, configOverrides: options.shape });
    write({ chatTemplate });
    if (corpusConversations !== undefined) {
      // The task's own merges, learned from its conversations as the chat template renders them.
      const plain = await loadTokenizer(work);
      const corpus = task.conversations(seededRandom(options.seed + 2), corpusConversations)
        .map(({ messages, tools }) => plain.applyChatTemplate(messages, { tools })).join("\n");
      write({ chatTemplate, vocabSize, corpus });
    }
    const tokenizer = await loadTokenizer(work);
    // The portable products: a system BLAS rounds by its library and CPU, and the model must be the same bytes everywhere.
    const transformer = loadTransformer(work, new CpuBackend({ blas: "portable" }));
    const model = new DifferentiableTransformer(transformer, { lora: null });
    // The writer draws embeddings with std 1; the tied head then gives logits of std ~sqrt(hidden). Starting
    // near uniform (std 0.1) lets SFT converge in a few hundred steps.
    const embedding = model.parameterTensors().find((p) => p.name === "model.embed_tokens.weight")!;
    model.backend.write(embedding.value, model.backend.download(embedding.value).map((x) => x * 0.1));
    // Each phase with its own optimizer and cosine schedule; sftSteps 0 writes the initial model.
    const phases = [
      ...(options.sftSteps > 0 ? (task.warmUp ?? []).map((phase, i) => ({ name: `warm-up ${i + 1} sft`, seed: options.seed + 10 + i, ...phase })) : []),
      { name: "sft", seed: options.seed, steps: options.sftSteps, batchSize: options.batchSize, conversations: task.conversations },
    ];
    for (const phase of phases.filter((p) => p.steps > 0)) {
      const trainer = new Trainer(model, {
        lora: null, learningRate: options.learningRate, weightDecay: 0, maxGradNorm: 1, microBatchSize: phase.batchSize,
        optimizerSteps: "one",
        schedule: { kind: "cosine", warmupSteps: options.warmupSteps, totalSteps: phase.steps, minLearningRate: options.learningRate / 10 },
        seed: phase.seed,
      });
      const rng = seededRandom(phase.seed);
      for (let step = 1; step <= phase.steps; step++) {
        const { sequences, warnings } = tokenizeForSft(tokenizer, phase.conversations(rng, phase.batchSize), options.maxLength);
        const result = trainer.sftStep(sequences);
        if (!result.trained) {
          // A model that learns nothing must not be written as if it had: most likely maxLength cuts off every answer.
          throw new ArtError("task_model_sft", `${phase.name}: ${result.message} (${warnings.slice(0, 2).join("; ")}); raise maxLength past the conversations' answers`);
        }
        if (step % 25 === 0 || step === 1) options.log(`${phase.name} step ${step}/${phase.steps}: loss ${result.loss.toFixed(4)}`);
      }
    }
    const answerRate = await task.answerRate(transformer, tokenizer, options.checkAnswers, options.seed + 1);
    options.log(`${task.answers} after SFT: ${(answerRate * 100).toFixed(1)}% of ${options.checkAnswers} sampled answers`);

    fs.mkdirSync(dir, { recursive: true });
    for (const file of ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]) {
      fs.copyFileSync(path.join(work, file), path.join(dir, file));
    }
    const tensors: Record<string, TensorToWrite> = {};
    for (const p of model.parameterTensors()) tensors[p.name] = { dtype: "F32", shape: p.shape, data: model.backend.download(p.value) };
    writeSafetensors(path.join(dir, "model.safetensors"), tensors, { format: "pt" });
    transformer.free();
    return { answerRate };
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

/**
 * A model script's command line, `node <script> [out-dir]`: makes the model into out-dir (default `defaultDir`) when
 * `scriptUrl` (the script's import.meta.url) is the program being run; does nothing when the script is imported.
 */
export function runTaskModelScript(scriptUrl: string, defaultDir: string, task: Task, options: Omit<TaskModelOptions, "log">): void {
  if (!process.argv[1] || path.resolve(process.argv[1]) !== fileURLToPath(scriptUrl)) return;
  const dir = process.argv[2] ?? defaultDir;
  const started = Date.now();
  makeTaskModel(dir, task, { ...options, log: (line) => console.log(line) }).then(() => {
    console.log(`wrote ${dir} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  });
}
