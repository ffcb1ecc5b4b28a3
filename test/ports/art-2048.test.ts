/**
 * ART's 2048 example (OpenPipe/ART, examples/2048: the notebook's game utilities, rollout and training loop), ported
 * line for line onto art-ts: the same game rules (a tile spawns after every parsed move; the game ends at the
 * winning value or when no cell is empty), the same rollout (the whole conversation in context, an invalid move
 * ends the game with reward -1, the same log-scaled reward), group size 18, one group per step, learning rate 1e-5,
 * checkpoints pruned by "train/reward" before each train. The system prompt is art-ts's own wording of the task.
 *
 * Differences, each for the test's sake: Python's unseeded `random` and sampling become seeded ones so a failure
 * reproduces, the loop runs 2 of ART's 20 steps (the second is where pruning first meets the history), and the
 * model is models/2048-tiny, taught only the answer format.
 *
 * It shows what a porter gets: one optimizer step per packed row, the CISPO loss by default, and training on the
 * prompt ids the engine recorded. Heavy (minutes on a CPU): runs with ART_TEST_PORTS=1, which CI sets.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { gatherTrajectoryGroups } from "../../lib/core/gather.ts";
import { seededRandom, type Rng } from "../../lib/core/random.ts";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { SYSTEM_PROMPT_2048 } from "../../lib/envs/game2048.ts";
import { resolveTrainConfig } from "../../lib/grpo/config.ts";
import { tokenizeGroups } from "../../lib/grpo/tokenize.ts";
import { TrainableModel } from "../../lib/trainable/mod.ts";

const BASE_MODEL = path.resolve(import.meta.dirname, "../../models/2048-tiny");
const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-port-2048-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

// ---- ART's game utilities -------------------------------------------------------------------------------------
const WINNING_VALUE = 64;

type Cell = number | null;
interface TwentyFortyEightGame { id: string; board: Cell[][] }

const random: Rng = seededRandom(2048);
const choice = <T>(items: T[]): T => items[Math.floor(random() * items.length)]!;

function populateRandomCell(game: TwentyFortyEightGame): void {
  const allClearCoordinates: [number, number][] = [];
  game.board.forEach((row, i) => row.forEach((cell, j) => { if (cell === null) allClearCoordinates.push([i, j]); }));
  const [i, j] = choice(allClearCoordinates);
  game.board[i]![j] = random() < 0.9 ? 2 : 4;
}

function generateGame(boardLength = 4): TwentyFortyEightGame {
  const id = Math.floor(random() * 36 ** 6).toString(36);
  const game = { id, board: Array.from({ length: boardLength }, () => new Array<Cell>(boardLength).fill(null)) };
  populateRandomCell(game);
  populateRandomCell(game);
  return game;
}

function renderBoard(game: TwentyFortyEightGame): string {
  const cells = game.board.flat().filter((cell): cell is number => cell !== null);
  const maxCellWidth = Math.max(...cells.map((cell) => String(cell).length));
  let boardStr = "";
  for (const row of game.board) {
    boardStr += row.map((cell) => (cell === null ? "_" : String(cell)).padStart(maxCellWidth)).join("|");
    boardStr += "\n";
  }
  return boardStr;
}

/** Slides the non-empty cells to the front and merges equal neighbours once, front pair first. */
function condenseSequence(sequence: Cell[]): Cell[] {
  const gapless = sequence.filter((cell) => cell !== null);
  const condensed: Cell[] = [];
  for (let i = 0; i < gapless.length; i++) {
    if (i + 1 < gapless.length && gapless[i] === gapless[i + 1]) {
      condensed.push(gapless[i]! * 2);
      i++;
    } else {
      condensed.push(gapless[i]!);
    }
  }
  while (condensed.length < sequence.length) condensed.push(null);
  return condensed;
}

function condenseBoard(game: TwentyFortyEightGame, direction: "left" | "right" | "up" | "down"): void {
  const n = game.board.length;
  for (let k = 0; k < n; k++) {
    const line: [number, number][] = Array.from({ length: n }, (_, j) =>
      direction === "left" ? [k, j] : direction === "right" ? [k, n - 1 - j] : direction === "up" ? [j, k] : [n - 1 - j, k]);
    const condensed = condenseSequence(line.map(([r, c]) => game.board[r]![c]!));
    line.forEach(([r, c], j) => (game.board[r]![c] = condensed[j]!));
  }
}

class ValueError extends Error {}

function applyAgentMove(game: TwentyFortyEightGame, moveXml: string): void {
  // ART parses the reply as an XML element and takes its text.
  const element = /^\s*<move>([^<]*)<\/move>\s*$/.exec(moveXml);
  if (element === null) throw new ValueError("Invalid xml");
  const direction = element[1]!;
  if (direction !== "left" && direction !== "right" && direction !== "up" && direction !== "down") throw new ValueError("Invalid direction");
  condenseBoard(game, direction);
  populateRandomCell(game);
}

const maxCellValue = (game: TwentyFortyEightGame) => Math.max(...game.board.flat().map((cell) => cell ?? 0));
const totalBoardValue = (game: TwentyFortyEightGame) => game.board.flat().reduce<number>((sum, cell) => sum + (cell ?? 0), 0);
const checkGameFinished = (game: TwentyFortyEightGame) => maxCellValue(game) >= WINNING_VALUE || game.board.flat().every((cell) => cell !== null);

// ---- ART's rollout ------------------------------------------------------------------------------------------------
let requestSeed = 0;

async function rollout(model: TrainableModel, step: number, isValidation: boolean): Promise<Trajectory> {
  const client = model.openai();
  const game = generateGame();
  let moveNumber = 0;
  const trajectory = new Trajectory({
    messagesAndChoices: [{ role: "system", content: SYSTEM_PROMPT_2048 }],
    metadata: { game_id: game.id, "notebook-id": "2048", step, validation: isValidation },
    reward: 0,
  });
  while (true) {
    trajectory.messagesAndChoices.push({ role: "user", content: renderBoard(game) });
    const messages = trajectory.messages();
    const chatCompletion = await client.chat.completions.create({
      max_completion_tokens: 128, messages, model: model.inferenceName(), stream: false, seed: requestSeed++,
    });
    const chosen = chatCompletion.choices[0] as Choice;
    const content = chosen.message.content;
    if (typeof content !== "string") throw new Error("expected text content");
    trajectory.messagesAndChoices.push(chosen);
    try {
      applyAgentMove(game, content);
      moveNumber += 1;
    } catch (error) {
      if (!(error instanceof ValueError)) throw error;
      trajectory.reward = -1;
      break;
    }
    if (checkGameFinished(game)) {
      const maxValue = maxCellValue(game);
      const boardValue = totalBoardValue(game);
      trajectory.metrics.max_value = maxValue;
      trajectory.metrics.board_value = boardValue;
      trajectory.metrics.move_number = moveNumber;
      if (maxValue < WINNING_VALUE) {
        const maxValueReward = (Math.log2(maxValue) - 1) / (Math.log2(WINNING_VALUE) - 1);
        const boardValueReward = (Math.log2(boardValue) - 1) / (Math.log2(WINNING_VALUE * 16) - 1);
        trajectory.reward = maxValueReward + boardValueReward * 0.2;
      } else {
        trajectory.reward = 2;
      }
      break;
    }
  }
  return trajectory;
}

// ---- what the test checks about a train call --------------------------------------------------------------------

/**
 * ART's packing, counted independently: rows as long as the longest sequence rounded up to 2,048 tokens, filled in
 * order; a sequence whose prompt (all before its first trained token but one) is already in the row adds only the rest.
 */
function packedRowCount(sequences: { tokens: number[]; trainable: Uint8Array }[], maxSequenceLength: number): number {
  const rowLength = Math.min(maxSequenceLength, Math.ceil(Math.max(...sequences.map((s) => s.tokens.length)) / 2048) * 2048);
  let rows = 1, used = 0, prompts = new Set<string>();
  for (const { tokens, trainable } of sequences) {
    const shared = trainable.indexOf(1) - 1;
    const prompt = tokens.slice(0, shared).join(",");
    const length = tokens.length - (prompts.has(prompt) ? shared : 0);
    if (used > 0 && used + length > rowLength) [rows, used, prompts] = [rows + 1, 0, new Set()];
    used += tokens.length - (prompts.has(prompt) ? shared : 0);
    prompts.add(prompt);
  }
  return rows;
}

describe.runIf(process.env.ART_TEST_PORTS === "1")("ART's 2048 example, ported line for line", () => {
  it("takes one optimizer step per packed row, trains with CISPO by default, on the prompt ids the engine recorded", async () => {
    const model = await TrainableModel.load({ name: "agent-001", project: "2048-multi-turn", baseModel: BASE_MODEL, artDir: path.join(root, ".art"), log: () => {} });
    const config = resolveTrainConfig({ learningRate: 1e-5 });
    expect([config.policyLoss, config.epsilon, config.epsilonHigh]).toEqual(["cispo", 1.0, 4.0]);

    for (let i = model.step; i < 2; i++) {
      const trainGroups = await gatherTrajectoryGroups(
        Array.from({ length: 1 }, () => TrajectoryGroup.fromRollouts(Array.from({ length: 18 }, () => rollout(model, i, false)))),
        { description: "gather", maxExceptions: 18, progress: false },
      );
      model.deleteCheckpoints({ keepBestBy: "train/reward" });

      // What the trainer will see: one sequence per game that has an advantage, made of the ids the engine recorded.
      const { sequences } = tokenizeGroups(model.lm.tokenizer, trainGroups, config);
      const games = trainGroups.flatMap((group) => group.trajectories);
      const rewards = games.map((game) => game.reward);
      expect(new Set(rewards).size, `rewards ${rewards.join(", ")}`).toBeGreaterThan(1);
      expect(sequences.length).toBeGreaterThan(0);
      for (const sequence of sequences) {
        const choices = games[sequence.trajectory]!.messagesAndChoices.filter((item): item is Choice => "finish_reason" in item);
        const last = choices.at(-1)!;
        expect(sequence.tokens, `game ${sequence.trajectory}`).toEqual([...last.prompt_token_ids!, ...last.token_ids!]);
      }
      expect(new Set(sequences.map((s) => s.trajectory)).size).toBe(sequences.length);

      const result = await model.train(trainGroups, { learningRate: 1e-5 });
      expect(result.gradientSteps).toBe(packedRowCount(sequences, config.maxSequenceLength));
      expect(result.gradientSteps).toBeGreaterThan(1);
      expect(result.metrics["loss/num_gradient_steps"]).toBe(result.gradientSteps);
      expect(result.metrics["train/reward"]).toBeCloseTo(rewards.reduce((a, b) => a + b, 0) / rewards.length, 12);
    }
    expect(model.step).toBe(2);
    expect(model.checkpoints()).toEqual([1, 2]);
    await model.close();
  }, 1_800_000);
});
