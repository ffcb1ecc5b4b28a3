/**
 * Makes models/2048-3x3-tiny, the 2048 notebook's own model: a small Qwen2-shaped transformer taught only 2048's
 * answer format (`<move>left</move>`) on 3×3 boards, by SFT on positions of random legal play, each asked as the
 * notebook asks it (`rollout2048` with context "board" and no system prompt: the current board alone) and answered
 * with a move drawn uniformly among those that change the board. It plays about like a random player, so GRPO has
 * everything to learn.
 *
 * Its tokenizer is the tiny one's trainer run on the task's conversations (300 tokens: a board in about 23, an
 * answer in 5 or 6), and it has no system prompt to read (ART's would triple a move's tokens): both keep a move
 * cheap enough for a hundred GRPO steps on a CPU.
 *
 * Usage: node scripts/make-2048-3x3-model.ts [out-dir, default models/2048-3x3-tiny]
 */
import { pick, seededRandom, type Rng } from "../lib/core/random.ts";
import type { Message } from "../lib/core/trajectory.ts";
import { Game2048, parseMove2048 } from "../lib/envs/game2048.ts";
import { generate } from "../lib/model/generate.ts";
import { TINY_TASK_SHAPE, runTaskModelScript, type Task, type TaskModelOptions } from "./task-model.ts";

/** The notebook's game on its task model: a 3×3 board, won at tile 32 (random legal play wins about 62%). */
const BOARD_3X3 = { size: 3, winningTile: 32 } as const;

export const MODEL_2048_3X3_OPTIONS: Omit<TaskModelOptions, "log"> = {
  seed: 13,
  shape: TINY_TASK_SHAPE,
  sftSteps: 600,
  batchSize: 64,
  learningRate: 5e-3,
  warmupSteps: 20,
  maxLength: 64,
  checkAnswers: 256,
  tokenizer: { vocabSize: 300, corpusConversations: 2000 },
};

/** The boards before each move of one game of uniformly random legal moves. */
function randomGamePositions(rng: Rng): Game2048[] {
  const game = new Game2048({ ...BOARD_3X3, seed: Math.floor(rng() * 2 ** 31) });
  const positions: Game2048[] = [];
  while (!game.finished()) {
    positions.push(Game2048.fromBoard(game.board, { winningTile: BOARD_3X3.winningTile, seed: 1 }));
    game.move(pick(rng, game.changingMoves()));
  }
  return positions;
}

/** One move's conversation as rollout2048 asks it with context "board" and no system prompt. */
const movePrompt = (game: Game2048): Message[] => [{ role: "user", content: game.render() }];

function positionsOf(rng: Rng, count: number): Game2048[] {
  const positions: Game2048[] = [];
  while (positions.length < count) positions.push(...randomGamePositions(rng));
  return positions.slice(0, count);
}

export const TASK_2048_3X3: Task = {
  conversations: (rng, count) => positionsOf(rng, count).map((game) => ({
    messages: [...movePrompt(game), { role: "assistant", content: `<move>${pick(rng, game.changingMoves())}</move>` }],
  })),
  /** Answers that are moves changing the board, at positions of fresh random games. */
  answerRate: async (model, tokenizer, count, seed) => {
    const positions = positionsOf(seededRandom(seed), count);
    const results = await generate(model, positions.map((game, i) => ({
      promptIds: tokenizer.encode(tokenizer.applyChatTemplate(movePrompt(game), { addGenerationPrompt: true }), { addSpecialTokens: false }),
      maxTokens: 12, temperature: 1, seed: seed + i,
    })), { tokenizer, eosTokenIds: tokenizer.eosTokenIds });
    return results.filter((result, i) => {
      const parsed = parseMove2048(result.text);
      return parsed.ok && positions[i]!.changingMoves().includes(parsed.move);
    }).length / count;
  },
  answers: "moves that change the board",
};

runTaskModelScript(import.meta.url, "models/2048-3x3-tiny", TASK_2048_3X3, MODEL_2048_3X3_OPTIONS);
