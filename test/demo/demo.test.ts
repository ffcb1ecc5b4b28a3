import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseDemoArgs } from "../../lib/demo/cli.ts";
import { runDemo } from "../../lib/demo/run.ts";
import { compactBoard, playTicTacToe } from "../../lib/demo/tictactoe.ts";
import { TicTacToeBoard, heuristicPolicyTicTacToe } from "../../lib/envs/tictactoe.ts";
import { openSafetensors } from "../../lib/model/safetensors.ts";
import { readHistory } from "../../lib/trainable/store.ts";

const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-demo-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

describe("demo tic-tac-toe", () => {
  it("renders the board as three rows of x/o/_ and plays a game as x", async () => {
    expect(compactBoard(TicTacToeBoard.parse(["x_o", "_x_", "__o"]))).toBe("x_o\n_x_\n__o");
    const game = await playTicTacToe((_messages, board) => heuristicPolicyTicTacToe(null, board), 5);
    expect(game.metadata.agent_mark).toBe("x");
    expect(game.reward).toBeGreaterThanOrEqual(0.5); // the heuristic never loses to a random opponent as x here
    const moves = 1 + game.additionalHistories.length;
    expect(game.metrics.moves).toBe(moves);
    expect(game.messagesAndChoices).toEqual([{ role: "user", content: "___\n___\n___" }, { role: "assistant", content: "<move>B2</move>" }]);
  });

  it("an illegal answer ends the game with reward -1", async () => {
    const game = await playTicTacToe(() => "<move>D9</move>", 1);
    expect(game.reward).toBe(-1);
    expect(game.metrics.invalid_move).toBe(true);
    expect(game.logs[0]).toMatch(/invalid move: square D9 is off the board/);
  });

  it("parses its flags and refuses bad ones with a message", () => {
    expect(parseDemoArgs(["--steps", "3", "--lr", "0.01", "--rank", "4", "--quiet"])).toEqual({ steps: 3, learningRate: 0.01, loraRank: 4, loraAlpha: 8, quiet: true });
    expect(parseDemoArgs(["--help"])).toBe("help");
    expect(() => parseDemoArgs(["--steps", "two"])).toThrow(/--steps must be a positive integer, got "two"/);
    expect(() => parseDemoArgs(["--device", "tpu"])).toThrow(/--device must be auto, cpu or cuda/);
    expect(() => parseDemoArgs(["--stepz", "3"])).toThrow(/art-ts demo: .*stepz.*--help/);
  });

  it("a short run trains the committed model and writes its files", async () => {
    const artDir = path.join(root, ".art");
    const outDir = path.join(root, "out");
    const lines: string[] = [];
    const result = await runDemo({ steps: 3, groupsPerStep: 2, gamesPerGroup: 4, evalGames: 16, artDir, outDir, quiet: true, device: "cpu", log: (l) => lines.push(l) });
    expect(result.before.games).toBe(16);
    expect(result.after.games).toBe(16);
    expect(lines.some((l) => /^before training: win \d+\.\d%/.test(l))).toBe(true);
    expect(lines.filter((l) => /^step +\d+\/3: reward/.test(l))).toHaveLength(3);
    expect(lines.some((l) => /^before training, greedy: win \d+\.\d%/.test(l))).toBe(true);
    expect(lines.some((l) => /^win rate \d+\.\d% → \d+\.\d% sampled, \d+\.\d% → \d+\.\d% greedy, in \d+ s$/.test(l))).toBe(true);
    expect(result.greedy.after.games).toBe(16);

    const html = fs.readFileSync(result.files.report, "utf8");
    expect(html).toMatch(/<svg [^>]*aria-label="tic-tac-toe vs random: reward and win rate per step"/);
    expect(fs.readFileSync(result.files.transcripts, "utf8")).toMatch(/=== before training[\s\S]*<move>[A-C][1-3]<\/move>[\s\S]*=== after 3 GRPO steps/);
    const summary = JSON.parse(fs.readFileSync(result.files.summary, "utf8"));
    expect(summary.after.winRate).toBe(result.after.winRate);
    expect(summary.greedy.after.winRate).toBe(result.greedy.after.winRate);

    // Three train rows (steps 0-2) between two val rows, and the adapter of the last checkpoint moved off zero.
    const history = readHistory(result.files.modelDir);
    expect(history.map((r) => [r.step, "val/reward" in r ? "val" : "train"])).toEqual([[0, "val"], [0, "train"], [1, "train"], [2, "train"], [3, "val"]]);
    const adapter = openSafetensors(path.join(result.files.modelDir, "checkpoints", "0003", "adapter_model.safetensors"));
    const loraB = adapter.names().filter((n) => n.includes("lora_B"));
    expect(loraB.length).toBeGreaterThan(0);
    expect(loraB.some((n) => adapter.readF32(n).some((v) => v !== 0))).toBe(true);
    adapter.close();
    expect(fs.readdirSync(path.join(result.files.modelDir, "trajectories", "train"))).toEqual(["0000.jsonl", "0001.jsonl", "0002.jsonl"]);
    // Each step deletes the checkpoints but the latest and the best by training reward.
    const checkpoints = fs.readdirSync(path.join(result.files.modelDir, "checkpoints"));
    expect(checkpoints).toContain("0003");
    expect(checkpoints.length).toBeLessThanOrEqual(2);
  }, 120_000);

  // The main job at its defaults (seed 1: 94.0% sampled / 95.5% greedy on the development machine, docs/demo.md).
  // The bar is what every seed of 1-5 reached there (86.5% / 87.5% the lowest), since another machine's float
  // rounding moves a seed's result as much as another seed does; and it must beat the untrained model by far.
  it.runIf(process.env.ART_TEST_NOTEBOOKS === "1")("the default run teaches the model to win (ART_TEST_NOTEBOOKS=1)", async () => {
    const result = await runDemo({ artDir: path.join(root, "default-art"), outDir: path.join(root, "default-out"), quiet: true, device: "cpu", log: () => {} });
    console.log(`demo defaults: ${result.before.winRate} → ${result.after.winRate} sampled, ${result.greedy.before.winRate} → ${result.greedy.after.winRate} greedy, ${result.seconds.toFixed(0)} s`);
    expect(result.after.winRate).toBeGreaterThanOrEqual(0.85);
    expect(result.greedy.after.winRate).toBeGreaterThanOrEqual(0.85);
    expect(result.after.winRate - result.before.winRate).toBeGreaterThanOrEqual(0.2);
    expect(result.greedy.after.winRate - result.greedy.before.winRate).toBeGreaterThanOrEqual(0.2);
  }, 900_000);
});
