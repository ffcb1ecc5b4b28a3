/**
 * Makes notebooks/data/first-empty-square.jsonl, the dataset of notebooks/sft-dataset.ipynb: one conversation per
 * line in trainSftFromFile()'s format (`{"messages": [...]}`), a tic-tac-toe board as the user turn (three rows of x,
 * o and _, as the embedded tiny model reads them) and the first empty square in reading order as the answer
 * (`<move>A2</move>`). The rule is deterministic and stated nowhere but in the answers, so held-out accuracy shows
 * whether SFT taught it; the tiny model already knows the answer format and plays about random legal squares, so
 * before training it matches about as many as chance.
 *
 * The boards are distinct positions with x to move (as many x as o), no winner yet and at least three free squares
 * (so a random free square matches about three answers in ten), drawn with a seeded generator: the same file on
 * every run.
 *
 * Usage: node scripts/make-sft-data.ts [out-file, default notebooks/data/first-empty-square.jsonl] [lines, default 400]
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { ArtError } from "../lib/core/errors.ts";
import { seededRandom, shuffleInPlace } from "../lib/core/random.ts";
import { squareName, TicTacToeBoard } from "../lib/envs/tictactoe.ts";

/** Free squares on every board: with fewer, guessing any free square would often be right by chance. */
const FREE_SQUARES = 3;

/** The board as the tiny model reads it: three rows of x, o and _. */
export function boardRows(board: TicTacToeBoard): string {
  return board.cells.map((row) => row.join("")).join("\n");
}

/**
 * `lines` JSONL lines of distinct boards, each answered with its first empty square, the answers spread evenly over
 * the squares (as far as positions allow: with three squares free, C1 is the last that can come first, and few boards
 * have B3 or C1 first), so always naming one square matches few of them.
 */
export function firstEmptySquareLines(lines: number, seed = 1): string[] {
  // Every position with x to move (as many x as o), no line of three and enough free squares, by its first empty one.
  const byAnswer = new Map<string, TicTacToeBoard[]>();
  for (let code = 0; code < 3 ** 9; code++) {
    const cells = Array.from({ length: 9 }, (_, i) => "xo_"[Math.floor(code / 3 ** i) % 3]!);
    const board = TicTacToeBoard.parse([0, 3, 6].map((i) => cells.slice(i, i + 3).join("")));
    const marks = board.cells.flat();
    if (marks.filter((c) => c === "x").length !== marks.filter((c) => c === "o").length || board.winner() !== null) continue;
    if (board.emptySquares().length < FREE_SQUARES) continue;
    const answer = squareName(board.emptySquares()[0]!);
    byAnswer.set(answer, [...(byAnswer.get(answer) ?? []), board]);
  }
  const available = [...byAnswer.values()].reduce((n, boards) => n + boards.length, 0);
  if (!Number.isInteger(lines) || lines < 1 || lines > available) {
    throw new ArtError("sft_data.lines", `lines must be an integer from 1 to ${available} (the distinct positions), got ${lines}`);
  }
  const random = seededRandom(seed);
  const groups = [...byAnswer.values()].map((boards) => shuffleInPlace(boards, random));
  const chosen: TicTacToeBoard[] = [];
  // Round robin over the answers, each group until it runs out.
  for (let round = 0; chosen.length < lines; round++) {
    for (const boards of groups) if (round < boards.length && chosen.length < lines) chosen.push(boards[round]!);
  }
  // Shuffled, so any slice (the notebook holds out the last lines) has the same mix.
  return shuffleInPlace(chosen, random).map((board) => JSON.stringify({ messages: [
    { role: "user", content: boardRows(board) },
    { role: "assistant", content: `<move>${squareName(board.emptySquares()[0]!)}</move>` },
  ] }));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const file = process.argv[2] ?? "notebooks/data/first-empty-square.jsonl";
  const lines = Number(process.argv[3] ?? 400);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, firstEmptySquareLines(lines).join("\n") + "\n");
  console.log(`wrote ${lines} conversations to ${file}`);
}
