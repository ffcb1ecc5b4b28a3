/**
 * Makes the embedded demo model (models/tictactoe-tiny): the tiny byte-level BPE tokenizer with its ChatML template
 * and a small Qwen2-shaped transformer taught the answer format of tic-tac-toe by the engine's own SFT
 * (full-parameter) on synthetic transcripts of random legal play. The result answers `<move>B2</move>` with a legal
 * square chosen about uniformly: it plays like the random opponent, and GRPO (the demo) has to teach it to win.
 *
 * Deterministic: the same options give byte-identical files (seeded data, seeded initialisation, single-threaded
 * float32 arithmetic); test/demo checks the committed model against this script.
 *
 * Usage: node scripts/demo-make-model.ts [out-dir, default models/tictactoe-tiny]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { AGENT_MARK, moveAnswer, movePrompt } from "../lib/demo/tictactoe.ts";
import { TicTacToeBoard, parseTicTacToeMove, randomOpponent, type Square } from "../lib/envs/tictactoe.ts";
import { pick, seededRandom, type Rng } from "../lib/core/random.ts";
import { Trainer } from "../lib/grpo/train.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { tokenizeForSft } from "../lib/grpo/tokenize.ts";
import { CpuBackend } from "../lib/model/cpu/backend.ts";
import { generate } from "../lib/model/generate.ts";
import { loadTransformer } from "../lib/model/transformer.ts";
import { writeSafetensors, type TensorToWrite } from "../lib/model/safetensors.ts";
import { loadTokenizer, type Tokenizer } from "../lib/model/tokenizer.ts";
import { type Transformer } from "../lib/model/transformer.ts";
import type { Message } from "../lib/core/trajectory.ts";
import { writeTinyCheckpoint } from "./make-tiny-checkpoint.ts";

export interface DemoModelOptions {
  seed: number;
  /** config.json keys over the qwen2 tiny preset */
  shape: Record<string, unknown>;
  sftSteps: number;
  /** conversations (one move each) per SFT step */
  batchSize: number;
  learningRate: number;
  /** called with progress lines */
  log: (line: string) => void;
}

export const DEMO_MODEL_OPTIONS: Omit<DemoModelOptions, "log"> = {
  seed: 7,
  shape: {
    hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2,
    max_position_embeddings: 4096,
  },
  sftSteps: 600,
  batchSize: 64,
  learningRate: 5e-3,
};

/** The board before each of x's moves in one game where both sides play uniformly random legal moves. */
function randomGamePositions(rng: Rng): TicTacToeBoard[] {
  const board = new TicTacToeBoard();
  const positions: TicTacToeBoard[] = [];
  while (!board.finished()) {
    if (board.toMove() === AGENT_MARK) {
      positions.push(board.clone());
      board.place(pick(rng, board.emptySquares()), AGENT_MARK);
    } else {
      board.place(randomOpponent(board, "o", rng), "o");
    }
  }
  return positions;
}

/** SFT conversations: positions of random games, each answered with a uniformly random legal square. */
function sftConversations(rng: Rng, count: number): { messages: Message[] }[] {
  const conversations: { messages: Message[] }[] = [];
  while (conversations.length < count) {
    for (const board of randomGamePositions(rng)) {
      const square: Square = pick(rng, board.emptySquares());
      conversations.push({ messages: [...movePrompt(board), { role: "assistant", content: moveAnswer(square) }] });
    }
  }
  return conversations.slice(0, count);
}

/** Share of sampled answers that are well-formed legal moves, over positions of fresh random games. */
export async function legalMoveRate(model: Transformer, tokenizer: Tokenizer, positions: number, seed: number): Promise<number> {
  const rng = seededRandom(seed);
  const boards: TicTacToeBoard[] = [];
  while (boards.length < positions) boards.push(...randomGamePositions(rng));
  boards.length = positions;
  const results = await generate(model, boards.map((board, i) => ({
    promptIds: tokenizer.encode(tokenizer.applyChatTemplate(movePrompt(board), { addGenerationPrompt: true }), { addSpecialTokens: false }),
    maxTokens: 12, temperature: 1, seed: seed + i,
  })), { tokenizer, eosTokenIds: tokenizer.eosTokenIds });
  let legal = 0;
  results.forEach((result, i) => {
    const parsed = parseTicTacToeMove(result.text);
    if (parsed.ok && boards[i]!.cells[parsed.move[0]]![parsed.move[1]] === "_") legal++;
  });
  return legal / positions;
}

/** Writes the demo model into `dir`; returns the legal-move rate measured after SFT. */
export async function makeDemoModel(dir: string, options: DemoModelOptions): Promise<{ legalMoveRate: number }> {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "art-demo-model-"));
  try {
    // Initial weights and the tokenizer files, from the engine's tiny-checkpoint writer.
    writeTinyCheckpoint(work, { arch: "qwen2", seed: options.seed, tokenizer: true, configOverrides: options.shape });
    const tokenizer = await loadTokenizer(work);
    const transformer = loadTransformer(work, new CpuBackend());
    const model = new DifferentiableTransformer(transformer, { lora: null });
    // The writer draws embeddings with std 1; the tied head then gives logits of std ~sqrt(hidden). Starting
    // near uniform (std 0.1) lets SFT converge in a few hundred steps.
    const embedding = model.parameterTensors().find((p) => p.name === "model.embed_tokens.weight")!;
    model.backend.write(embedding.value, model.backend.download(embedding.value).map((x) => x * 0.1));
    // sftSteps 0 writes the initial model (the tests compare its config and tokenizer files with the committed ones).
    if (options.sftSteps > 0) {
      const trainer = new Trainer(model, {
        lora: null, learningRate: options.learningRate, weightDecay: 0, maxGradNorm: 1, microBatchSize: options.batchSize,
        schedule: { kind: "cosine", warmupSteps: 20, totalSteps: options.sftSteps, minLearningRate: options.learningRate / 10 },
        seed: options.seed,
      });
      const rng = seededRandom(options.seed);
      for (let step = 1; step <= options.sftSteps; step++) {
        const { sequences } = tokenizeForSft(tokenizer, sftConversations(rng, options.batchSize), 64);
        const result = trainer.sftStep(sequences);
        if (step % 25 === 0 || step === 1) options.log(`sft step ${step}/${options.sftSteps}: loss ${result.loss.toFixed(4)}`);
      }
    }
    const rate = await legalMoveRate(transformer, tokenizer, 256, options.seed + 1);
    options.log(`legal moves after SFT: ${(rate * 100).toFixed(1)}% of 256 sampled answers`);

    fs.mkdirSync(dir, { recursive: true });
    for (const file of ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]) {
      fs.copyFileSync(path.join(work, file), path.join(dir, file));
    }
    const tensors: Record<string, TensorToWrite> = {};
    for (const p of model.parameterTensors()) tensors[p.name] = { dtype: "F32", shape: p.shape, data: model.backend.download(p.value) };
    writeSafetensors(path.join(dir, "model.safetensors"), tensors, { format: "pt" });
    transformer.free();
    return { legalMoveRate: rate };
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const dir = process.argv[2] ?? "models/tictactoe-tiny";
  const started = Date.now();
  makeDemoModel(dir, { ...DEMO_MODEL_OPTIONS, log: (line) => console.log(line) }).then(() => {
    console.log(`wrote ${dir} in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  });
}
