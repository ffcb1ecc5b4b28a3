/**
 * The dataset of notebooks/sft-dataset.ipynb: the committed file is what scripts/make-sft-data.ts writes, and every
 * answer is its board's first empty square, spread over the squares so no single guess scores well.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseTicTacToeMove, TicTacToeBoard } from "../../lib/envs/tictactoe.ts";
import { firstEmptySquareLines } from "../../scripts/make-sft-data.ts";

const FILE = join(import.meta.dirname, "..", "..", "notebooks", "data", "first-empty-square.jsonl");

describe("first-empty-square dataset", () => {
  const lines = firstEmptySquareLines(400);
  const examples = lines.map((line) => JSON.parse(line) as { messages: { role: string; content: string }[] });

  it("is the committed file, line for line (regenerate with node scripts/make-sft-data.ts)", () => {
    expect(readFileSync(FILE, "utf8")).toBe(lines.join("\n") + "\n");
  });

  it("answers each distinct board, x to move with no winner and three free squares, with its first empty square", () => {
    expect(new Set(examples.map((e) => e.messages[0]!.content)).size).toBe(400);
    for (const { messages } of examples) {
      expect(messages.map((m) => m.role)).toEqual(["user", "assistant"]);
      const board = TicTacToeBoard.parse(messages[0]!.content.split("\n"));
      expect(board.toMove()).toBe("x");
      expect(board.winner()).toBeNull();
      expect(board.emptySquares().length).toBeGreaterThanOrEqual(3);
      const move = parseTicTacToeMove(messages[1]!.content);
      expect("move" in move && move.move).toEqual(board.emptySquares()[0]);
    }
  });

  it("spreads the answers so always naming one square matches at most a fifth", () => {
    const counts = new Map<string, number>();
    for (const { messages } of examples) counts.set(messages[1]!.content, (counts.get(messages[1]!.content) ?? 0) + 1);
    expect(counts.size).toBe(7);
    expect(Math.max(...counts.values())).toBeLessThanOrEqual(400 / 5);
    expect(() => firstEmptySquareLines(0)).toThrow("lines must be an integer from 1 to");
  });
});
