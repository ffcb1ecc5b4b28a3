/**
 * Makes models/tictactoe-tiny, the notebooks' small stand-in and the tic-tac-toe notebook's model: the tiny
 * byte-level BPE tokenizer with its ChatML template and a small Qwen2-shaped transformer taught the answer format of
 * tic-tac-toe by the engine's own SFT (full-parameter) on synthetic transcripts of random legal play. The result
 * answers `<move>B2</move>` with a legal square chosen about uniformly: it plays like the random opponent, and GRPO
 * has to teach it to win. The task (TICTACTOE_TASK) is also the main job's model's (make-tictactoe-small-model.ts).
 *
 * Made by scripts/task-model.ts, deterministically; test/models/task-models.test.ts checks the committed model
 * against this script.
 *
 * Usage: node scripts/make-tictactoe-model.ts [out-dir, default models/tictactoe-tiny]
 */
import { AGENT_MARK, moveAnswer, movePrompt } from "../lib/demo/tictactoe.ts";
import { TicTacToeBoard, parseTicTacToeMove, randomOpponent, type Square } from "../lib/envs/tictactoe.ts";
import { pick, seededRandom, type Rng } from "../lib/core/random.ts";
import { generate } from "../lib/model/generate.ts";
import type { Tokenizer } from "../lib/model/tokenizer.ts";
import type { Transformer } from "../lib/model/transformer.ts";
import type { Message } from "../lib/core/trajectory.ts";
import { TINY_TASK_SHAPE, runTaskModelScript, type Task, type TaskModelOptions } from "./task-model.ts";

export const TICTACTOE_TINY_OPTIONS: Omit<TaskModelOptions, "log"> = {
  seed: 7,
  shape: TINY_TASK_SHAPE,
  sftSteps: 600,
  batchSize: 64,
  learningRate: 5e-3,
  warmupSteps: 20,
  maxLength: 64,
  checkAnswers: 256,
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

export const TICTACTOE_TASK: Task = { conversations: sftConversations, answerRate: legalMoveRate, answers: "legal moves" };

runTaskModelScript(import.meta.url, "models/tictactoe-tiny", TICTACTOE_TASK, TICTACTOE_TINY_OPTIONS);
