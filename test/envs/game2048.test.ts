import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { Game2048, greedyPolicy2048, parseMove2048, rollout2048, slideBoard, slideLine } from "../../lib/envs/mod.ts";
import { isContextLengthError } from "../../lib/envs/policy.ts";
import { TrainableModel } from "../../lib/trainable/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

describe("2048 merges", () => {
  it.each([
    [[2, 2, 2, 2], [4, 4, 0, 0]],
    [[4, 4, 8, 0], [8, 8, 0, 0]],
    [[2, 2, 4, 4], [4, 8, 0, 0]],
    [[2, 0, 0, 2], [4, 0, 0, 0]],
    [[2, 2, 2, 0], [4, 2, 0, 0]],
    [[0, 2, 2, 2], [4, 2, 0, 0]],
    [[4, 2, 2, 0], [4, 4, 0, 0]],
    [[2, 4, 2, 4], [2, 4, 2, 4]],
    [[0, 0, 0, 0], [0, 0, 0, 0]],
    [[8, 0, 8, 8], [16, 8, 0, 0]],
  ])("slideLine(%j) = %j", (line, expected) => {
    expect(slideLine(line)).toEqual(expected);
  });

  it("slides every direction toward its side", () => {
    const board = [
      [2, 2, 0, 0],
      [0, 0, 0, 0],
      [2, 0, 0, 4],
      [2, 0, 0, 4],
    ];
    expect(slideBoard(board, "left")[0]).toEqual([4, 0, 0, 0]);
    expect(slideBoard(board, "right")[0]).toEqual([0, 0, 0, 4]);
    expect(slideBoard(board, "right")[2]).toEqual([0, 0, 2, 4]);
    expect(slideBoard(board, "up").map((r) => r[0])).toEqual([4, 2, 0, 0]);
    expect(slideBoard(board, "down").map((r) => r[0])).toEqual([0, 0, 2, 4]);
    expect(slideBoard(board, "down").map((r) => r[3])).toEqual([0, 0, 0, 8]);
  });
});

describe("Game2048", () => {
  it("spawns the same tiles from the same seed and different ones from another", () => {
    const play = (seed: number) => {
      const game = new Game2048({ seed });
      for (const d of ["left", "down", "right", "down", "left", "up"] as const) game.move(d);
      return game.render();
    };
    expect(play(7)).toBe(play(7));
    const boards = new Set([1, 2, 3, 4, 5].map(play));
    expect(boards.size).toBeGreaterThan(1);
  });

  it("starts with two tiles of 2 or 4 and spawns one per changing move only", () => {
    const game = new Game2048({ seed: 3 });
    const tiles = () => game.board.flat().filter((v) => v !== 0);
    expect(tiles().length).toBe(2);
    expect(tiles().every((v) => v === 2 || v === 4)).toBe(true);
    const stuck = Game2048.fromBoard([[2, 4, 2, 4], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], { seed: 1 });
    expect(stuck.move("up")).toBe(false);
    expect(stuck.board.flat().filter((v) => v !== 0).length).toBe(4);
    expect(stuck.move("down")).toBe(true);
    expect(stuck.board.flat().filter((v) => v !== 0).length).toBe(5);
  });

  it("wins at the configured tile and ends when no move changes the board", () => {
    const almost = Game2048.fromBoard([[32, 32, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], { winningTile: 64, seed: 1 });
    expect(almost.won()).toBe(false);
    almost.move("left");
    expect(almost.won()).toBe(true);
    expect(almost.finished()).toBe(true);
    expect(almost.reward()).toBe(2);
    const full = Game2048.fromBoard([[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2]], { seed: 1 });
    expect(full.canMove()).toBe(false);
    expect(full.changingMoves()).toEqual([]);
    expect(full.finished()).toBe(true);
    const fullButMergeable = Game2048.fromBoard([[2, 2, 4, 8], [4, 8, 16, 32], [8, 16, 32, 64], [16, 32, 64, 4]], { seed: 1 });
    expect(fullButMergeable.changingMoves()).toEqual(["left", "right"]);
    expect(fullButMergeable.finished()).toBe(false);
    expect(Game2048.fromBoard([[2, 0], [0, 0]], { seed: 1 }).changingMoves()).toEqual(["right", "down"]);
  });

  it("renders like ART: padded to the widest tile, _ for empty, | between cells", () => {
    const game = Game2048.fromBoard([[0, 2, 0, 4], [4, 8, 2, 16], [16, 32, 64, 128], [0, 2, 2, 4]], { seed: 1, winningTile: 256 });
    expect(game.render()).toBe(["  _|  2|  _|  4", "  4|  8|  2| 16", " 16| 32| 64|128", "  _|  2|  2|  4"].join("\n"));
  });

  it("computes ART's reward from max tile and board sum", () => {
    const game = Game2048.fromBoard([[16, 8, 0, 0], [4, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 4]], { winningTile: 128, seed: 1 });
    const maxPart = (Math.log2(16) - 1) / (Math.log2(128) - 1);
    const sumPart = (Math.log2(32) - 1) / (Math.log2(128 * 16) - 1);
    expect(game.reward()).toBeCloseTo(maxPart + 0.2 * sumPart, 12);
  });

  it("rejects a size or winning tile that cannot work", () => {
    expect(() => new Game2048({ winningTile: 100 })).toThrow(/power of two/);
    expect(() => new Game2048({ size: 1 })).toThrow(/size must be an integer >= 2/);
  });
});

describe("2048 answers", () => {
  it("parses <move>dir</move>, case-insensitively, after a think block", () => {
    expect(parseMove2048("<move>left</move>")).toEqual({ ok: true, move: "left" });
    expect(parseMove2048("  <move> UP </move>\n")).toEqual({ ok: true, move: "up" });
    expect(parseMove2048("<think>down looks risky</think>\n<move>right</move>")).toEqual({ ok: true, move: "right" });
  });

  it("rejects anything else with a reason", () => {
    for (const bad of ["left", "<move>sideways</move>", "I move <move>left</move>", "<move>left</move><move>up</move>", ""]) {
      const parsed = parseMove2048(bad);
      expect(parsed.ok, bad).toBe(false);
    }
    expect(parseMove2048("<move>sideways</move>")).toEqual({ ok: false, error: 'unknown direction "sideways"' });
  });

  it("plays a whole game with a scripted policy and records reward and metrics", async () => {
    const t = await rollout2048(greedyPolicy2048, { seed: 11, winningTile: 64 });
    expect(t.metrics.invalid_move).toBe(false);
    expect(typeof t.metrics.max_tile).toBe("number");
    expect(t.reward).toBe(t.metrics.win ? 2 : t.reward);
    expect(t.messagesAndChoices[0]).toMatchObject({ role: "system" });
    expect(t.messagesAndChoices.filter((m) => "role" in m && m.role === "assistant").length).toBe(t.metrics.moves);
    const again = await rollout2048(greedyPolicy2048, { seed: 11, winningTile: 64 });
    expect(again.metrics).toEqual({ ...t.metrics, duration: again.metrics.duration });
  });

  it("asks each move with the current board alone under context \"board\", one history per move, the same game", async () => {
    const seen: number[] = [];
    const policy = (messages: Parameters<typeof greedyPolicy2048>[0], game: Game2048) => {
      seen.push(messages.length);
      expect(messages[0]).toMatchObject({ role: "system" });
      expect(messages[1]).toEqual({ role: "user", content: game.render() });
      return greedyPolicy2048(messages, game);
    };
    const t = await rollout2048(policy, { seed: 11, winningTile: 64, context: "board", size: 3 });
    const whole = await rollout2048(greedyPolicy2048, { seed: 11, winningTile: 64, size: 3 });
    expect(new Set(seen)).toEqual(new Set([2]));
    expect({ ...t.metrics, duration: 0 }).toEqual({ ...whole.metrics, duration: 0 });
    expect(t.reward).toBe(whole.reward);
    const histories = [t.messagesAndChoices, ...t.additionalHistories.map((h) => h.messagesAndChoices)];
    expect(histories).toHaveLength(Number(t.metrics.moves));
    expect(histories.every((h) => h.length === 3)).toBe(true);
    const boards = histories.map((h) => (h[1] as { content: string }).content);
    expect(boards).toEqual(whole.messages().filter((m) => m.role === "user").map((m) => m.content));
    expect(t.metadata.context).toBe("board");
    const bare = await rollout2048((messages, game) => {
      expect(messages).toEqual([{ role: "user", content: game.render() }]);
      return greedyPolicy2048(messages, game);
    }, { seed: 11, winningTile: 64, context: "board", size: 3, systemPrompt: null });
    expect(bare.reward).toBe(whole.reward);
    expect(bare.messagesAndChoices.map((m) => ("role" in m ? m.role : "choice"))).toEqual(["user", "assistant"]);
    await expect(rollout2048(policy, { seed: 1, context: "turn" as "board" })).rejects.toThrow(/context must be "game" or "board", got "turn"/);
  });

  it("ends the game with reward -1 on an invalid answer", async () => {
    const t = await rollout2048(() => "I think left", { seed: 1 });
    expect(t.reward).toBe(-1);
    expect(t.metrics.invalid_move).toBe(true);
    expect(t.logs[0]).toMatch(/invalid move: expected <move>/);
  });

  it("stops a game whose conversation outgrows the model's context, scored as it stands (the server's real 400)", async () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-2048-context-"));
    writeTinyCheckpoint(path.join(root, "base"), { arch: "qwen2", seed: 3, tokenizer: true });
    // A 512-position context holds the system prompt and a few turns of a 4×4 game (~50 tokens each).
    const model = await TrainableModel.load({ name: "ctx", project: "envs", baseModel: path.join(root, "base"), artDir: path.join(root, ".art"), batcher: { maxPositions: 512 }, log: () => {} });
    try {
      const client = model.openai();
      // The request is the model's (it raises the context error); the move is the scripted player's, so the game goes on.
      const policy = async (messages: Parameters<typeof greedyPolicy2048>[0], game: Game2048) => {
        await client.chat.completions.create({ model: model.name, messages, max_tokens: 1 });
        return greedyPolicy2048(messages, game);
      };
      const t = await rollout2048(policy, { seed: 3, winningTile: 2048 });
      expect(t.metrics).toMatchObject({ context_exceeded: true, invalid_move: false });
      expect(Number(t.metrics.moves)).toBeGreaterThan(2);
      expect(Number(t.metrics.moves)).toBeLessThan(20);
      const replay = new Game2048({ seed: 3, winningTile: 2048 });
      for (const item of t.messages().filter((m) => m.role === "assistant")) {
        const parsed = parseMove2048(String(item.content));
        if (parsed.ok) replay.move(parsed.move);
      }
      expect(t.reward).toBe(replay.reward());
      expect(t.messages().at(-1)!.role).toBe("assistant"); // the board that did not fit is not left unanswered
      expect(t.logs.at(-1)).toMatch(/stopped after \d+ moves: the conversation outgrew the model's context \(.*This model's maximum context length is 512 tokens/);
    } finally {
      await model.close();
      fs.rmSync(root, { recursive: true, force: true });
    }
  }, 60_000);

  it("lets every other policy error through", async () => {
    await expect(rollout2048(() => { throw new Error("network down"); }, { seed: 1 })).rejects.toThrow("network down");
    expect(isContextLengthError({ status: 400, message: "This model's maximum context length is 2048 tokens." })).toBe(true); // vLLM: no code
    expect(isContextLengthError({ status: 400, code: "invalid_value", message: "bad temperature" })).toBe(false);
    expect(isContextLengthError("context_length_exceeded")).toBe(false);
  });
});
