/**
 * Makes models/2048-tiny: the tiny tokenizer and a small Qwen2-shaped transformer taught 2048's answer format
 * (`<move>left</move>`) by SFT on whole conversations of random play, as ART's 2048 rollout builds them (the system
 * prompt, then each board as a user turn and each move as an assistant turn, everything in context). The moves are
 * drawn uniformly, so the model plays about like a random player and GRPO has something to improve.
 *
 * Boards are rendered both as art-ts's Game2048 renders them and with a newline after each row (ART's
 * render_board), so a port of ART's rollout and art-ts's own one both get well-formed answers. Conversations run up
 * to 80 moves, longer than a game of ART's rules lasts under random play (to tile 64 or a full board), so whole games
 * stay within what the model was taught.
 *
 * Usage: node scripts/make-2048-model.ts [out-dir, default models/2048-tiny]
 */
import { pick, seededRandom, type Rng } from "../lib/core/random.ts";
import type { Message } from "../lib/core/trajectory.ts";
import { DIRECTIONS, Game2048, parseMove2048, SYSTEM_PROMPT_2048 } from "../lib/envs/game2048.ts";
import { generate } from "../lib/model/generate.ts";
import { TINY_TASK_SHAPE, runTaskModelScript, type Task, type TaskModelOptions } from "./task-model.ts";

export const MODEL_2048_OPTIONS: Omit<TaskModelOptions, "log"> = {
  seed: 11,
  shape: { ...TINY_TASK_SHAPE, max_position_embeddings: 8192 },
  sftSteps: 128,
  batchSize: 4,
  learningRate: 5e-3,
  warmupSteps: 5,
  maxLength: 8192,
  checkAnswers: 64,
};

const MAX_MOVES = 80;

/** A game's board as ART's render_board writes it: each row followed by a newline. */
function renderWithNewlines(game: Game2048): string {
  return game.render().split("\n").map((row) => `${row}\n`).join("");
}

/** One random-play conversation of `moves` moves at most, ending with an assistant move. */
function randomPlay(rng: Rng, moves: number): Message[] {
  // Tile 128 is out of random play's reach within MAX_MOVES, so a whole conversation runs to the move limit.
  const game = new Game2048({ seed: Math.floor(rng() * 2 ** 31), winningTile: 128 });
  const render = rng() < 0.5 ? renderWithNewlines : (g: Game2048) => g.render();
  const messages: Message[] = [{ role: "system", content: SYSTEM_PROMPT_2048 }];
  for (let move = 0; move < moves && !game.finished(); move++) {
    messages.push({ role: "user", content: render(game) });
    const direction = pick(rng, DIRECTIONS);
    messages.push({ role: "assistant", content: `<move>${direction}</move>` });
    game.move(direction);
  }
  return messages;
}

const randomLength = (rng: Rng) => 1 + Math.floor(rng() * MAX_MOVES);

export const TASK_2048: Task = {
  // Whole conversations: every depth a game reaches is taught as often as the first move.
  conversations: (rng, count) => Array.from({ length: count }, () => ({ messages: randomPlay(rng, MAX_MOVES) })),
  /** Answers that parse as a move, at the last board of fresh random-play conversations. */
  answerRate: async (model, tokenizer, count, seed) => {
    const rng = seededRandom(seed);
    const prompts = Array.from({ length: count }, () => randomPlay(rng, randomLength(rng)).slice(0, -1));
    const results = await generate(model, prompts.map((messages, i) => ({
      promptIds: tokenizer.encode(tokenizer.applyChatTemplate(messages, { addGenerationPrompt: true }), { addSpecialTokens: false }),
      maxTokens: 16, temperature: 1, seed: seed + i,
    })), { tokenizer, eosTokenIds: tokenizer.eosTokenIds });
    return results.filter((result) => parseMove2048(result.text).ok).length / count;
  },
  answers: "well-formed moves",
};

runTaskModelScript(import.meta.url, "models/2048-tiny", TASK_2048, MODEL_2048_OPTIONS);
