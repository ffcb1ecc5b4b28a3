/**
 * The main job on the embedded default: GRPO teaches the small model in models/tictactoe-small (which plays random
 * legal moves after its SFT) to beat a random opponent at tic-tac-toe, on the CPU in minutes.
 *
 * One TrainableModel does everything: rollouts go through its unmodified `openai` client in-process (the
 * continuous batcher serves every game of a step together), `train()` updates the LoRA in place, and the next
 * step's rollouts already use it. The run measures the win rate before and after on held-out games, and writes a
 * reward curve (HTML), sample transcripts and a JSON summary into `outDir`.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { gatherTrajectoryGroups, gatherTrajectories } from "../core/gather.ts";
import type { Choice, Trajectory, TrajectoryGroup } from "../core/trajectory.ts";
import type { Device } from "../load/causal-lm.ts";
import { rewardCurve, stepRecord, type StepRecord } from "../notebook/plot.ts";
import { TrainableModel } from "../trainable/model.ts";
import { describeGame, playTicTacToe, type MovePolicy } from "./tictactoe.ts";

export interface DemoOptions {
  /** The base model: the committed models/tictactoe-small by default. */
  baseModel: string;
  artDir: string;
  project: string;
  name: string;
  /** Where the report, transcripts and summary go. */
  outDir: string;
  steps: number;
  groupsPerStep: number;
  gamesPerGroup: number;
  /** Held-out games for the win rate before and after. */
  evalGames: number;
  learningRate: number;
  loraRank: number;
  loraAlpha: number;
  seed: number;
  device: Device;
  /** Progress lines; gather's progress bar is shown too unless `quiet`. */
  log: (line: string) => void;
  quiet: boolean;
}

export const DEMO_DEFAULTS: DemoOptions = {
  baseModel: "models/tictactoe-small",
  artDir: ".art",
  project: "tic-tac-toe",
  name: "demo-001",
  outDir: ".art/tic-tac-toe/demo",
  steps: 480,
  groupsPerStep: 16,
  gamesPerGroup: 4,
  evalGames: 200,
  learningRate: 2e-3,
  loraRank: 16,
  loraAlpha: 32,
  seed: 1,
  device: "auto",
  log: (line) => console.log(line),
  quiet: false,
};

export interface Outcomes {
  games: number;
  winRate: number;
  drawRate: number;
  lossRate: number;
  invalidRate: number;
  meanReward: number;
}

export interface DemoResult {
  /** Held-out games sampled at temperature 1: the policy GRPO trains. */
  before: Outcomes;
  after: Outcomes;
  /** The same games played greedily (temperature 0): the policy as an agent would deploy it. */
  greedy: { before: Outcomes; after: Outcomes };
  steps: number;
  seconds: number;
  files: { report: string; transcripts: string; summary: string; modelDir: string };
}

function outcomes(trajectories: Trajectory[]): Outcomes {
  const share = (metric: string) => trajectories.filter((t) => t.metrics[metric] === true).length / trajectories.length;
  return {
    games: trajectories.length,
    winRate: share("win"), drawRate: share("draw"), lossRate: share("loss"), invalidRate: share("invalid_move"),
    meanReward: trajectories.reduce((a, t) => a + t.reward, 0) / trajectories.length,
  };
}

const percent = (x: number) => `${(x * 100).toFixed(1)}%`;

function describeOutcomes(label: string, o: Outcomes): string {
  return `${label}: win ${percent(o.winRate)}, draw ${percent(o.drawRate)}, loss ${percent(o.lossRate)}, invalid ${percent(o.invalidRate)} over ${o.games} games (mean reward ${o.meanReward.toFixed(3)})`;
}

/** A request seed per (game seed, game in its group, move): rollouts replay exactly. */
function moveSeed(gameSeed: number, game: number, move: number): number {
  return (Math.imul(gameSeed, 0x9e3779b1) ^ Math.imul(game + 1, 0x85ebca6b) ^ Math.imul(move + 1, 0xc2b2ae35)) >>> 0;
}

/** The model as a tic-tac-toe player: its in-process OpenAI client, sampling (temperature 1 unless given) with logprobs. */
function modelPolicy(model: TrainableModel, gameSeed: number, game: number, temperature = 1): MovePolicy {
  const client = model.openai();
  return async (messages, board) => {
    const move = board.cells.flat().filter((c) => c === "x").length;
    const response = await client.chat.completions.create({
      model: model.name, messages, max_tokens: 10, temperature, logprobs: true, seed: moveSeed(gameSeed, game, move),
    });
    return response.choices[0] as Choice;
  };
}

async function evaluate(model: TrainableModel, options: DemoOptions, label: string, temperature = 1): Promise<Trajectory[]> {
  const seeds = Array.from({ length: options.evalGames }, (_, i) => 1_000_000 + options.seed * 10_000 + i);
  return gatherTrajectories(seeds.map((seed) => () => playTicTacToe(modelPolicy(model, seed, 0, temperature), seed)), {
    description: label, progress: options.quiet ? false : undefined,
  });
}

/** Trains and evaluates; see DEMO_DEFAULTS for the options. */
export async function runDemo(init: Partial<DemoOptions> = {}): Promise<DemoResult> {
  const options: DemoOptions = { ...DEMO_DEFAULTS, ...init };
  const { log } = options;
  const started = Date.now();
  // The demo is a fresh run: an earlier run's checkpoints would otherwise be resumed.
  const modelDir = path.join(options.artDir, options.project, "models", options.name);
  fs.rmSync(modelDir, { recursive: true, force: true });
  fs.mkdirSync(options.outDir, { recursive: true });
  const model = await TrainableModel.load({
    name: options.name, project: options.project, baseModel: options.baseModel, artDir: options.artDir, device: options.device,
    lora: { rank: options.loraRank, alpha: options.loraAlpha }, seed: options.seed, log,
    batcher: { numSlots: Math.max(options.groupsPerStep * options.gamesPerGroup, 16), maxPositions: 64 },
  });
  try {
    log(`art-ts demo: ${options.baseModel} learns tic-tac-toe (x, moving first) against a random opponent with GRPO`);
    log(`  ${options.steps} steps × ${options.groupsPerStep} groups × ${options.gamesPerGroup} games, LoRA r${options.loraRank}, lr ${options.learningRate}`);
    const beforeGames = await evaluate(model, options, "eval before");
    const before = outcomes(beforeGames);
    model.log(beforeGames, { split: "val" });
    log(describeOutcomes("before training", before));
    const greedyBefore = outcomes(await evaluate(model, options, "greedy eval before", 0));
    log(describeOutcomes("before training, greedy", greedyBefore));

    const history: StepRecord[] = [stepRecord(0, beforeGames, "val")];
    for (let step = 0; step < options.steps; step++) {
      const stepStarted = Date.now();
      const groups: TrajectoryGroup[] = await gatherTrajectoryGroups(
        Array.from({ length: options.groupsPerStep }, (_, g) => {
          const gameSeed = options.seed * 1_000_003 + step * options.groupsPerStep + g;
          return Array.from({ length: options.gamesPerGroup }, (_, game) => () => playTicTacToe(modelPolicy(model, gameSeed, game), gameSeed));
        }),
        { description: `step ${step + 1}/${options.steps}`, progress: options.quiet ? false : undefined },
      );
      const result = await model.train(groups, {
        learningRate: options.learningRate, maxGradNorm: 1, weightDecay: 0, microBatchSize: 32, seed: options.seed,
        // Decaying to a tenth steadies the late steps, where a small model's policy is easily knocked over.
        schedule: { kind: "cosine", warmupSteps: 0, totalSteps: options.steps, minLearningRate: options.learningRate / 10 },
      });
      history.push(stepRecord(step, groups, "train"));
      // As ART's notebooks do after each step: the latest checkpoint stays, and the one of the best training reward
      // (a step's is 1 MB; 480 would fill 0.5 GB). From the second step: the first's reward is the base model's, which
      // has no checkpoint, and deleteCheckpoints would say so.
      if (step > 0) model.deleteCheckpoints({ keepBestBy: "train/reward" });
      const m = result.metrics;
      log(`step ${String(step + 1).padStart(3)}/${options.steps}: reward ${Number(m["train/reward"]).toFixed(3)}, ` +
        `win ${percent(Number(m["train/win"]))}, invalid ${percent(Number(m["train/invalid_move"]))}, loss ${result.loss.toFixed(4)}, ` +
        `${((Date.now() - stepStarted) / 1000).toFixed(1)} s${result.message ? ` (${result.message})` : ""}`);
    }

    const afterGames = await evaluate(model, options, "eval after");
    const after = outcomes(afterGames);
    model.log(afterGames, { split: "val" });
    history.push(stepRecord(options.steps, afterGames, "val"));
    log(describeOutcomes("after training", after));
    const greedy = { before: greedyBefore, after: outcomes(await evaluate(model, options, "greedy eval after", 0)) };
    log(describeOutcomes("after training, greedy", greedy.after));

    const files = writeOutputs(options, history, beforeGames, afterGames, { before, after, steps: options.steps }, modelDir);
    const seconds = (Date.now() - started) / 1000;
    const summary = { before, after, greedy, steps: options.steps, seconds, options: { ...options, log: undefined } };
    fs.writeFileSync(files.summary, JSON.stringify(summary, null, 2) + "\n");
    log(`win rate ${percent(before.winRate)} → ${percent(after.winRate)} sampled, ${percent(greedy.before.winRate)} → ${percent(greedy.after.winRate)} greedy, in ${seconds.toFixed(0)} s`);
    log(`wrote ${files.report}, ${files.transcripts}, ${files.summary}; checkpoints in ${path.join(modelDir, "checkpoints")}`);
    return { before, after, greedy, steps: options.steps, seconds, files };
  } finally {
    await model.close();
  }
}

function writeOutputs(
  options: DemoOptions, history: StepRecord[], beforeGames: Trajectory[], afterGames: Trajectory[],
  result: { before: Outcomes; after: Outcomes; steps: number }, modelDir: string,
): DemoResult["files"] {
  const report = path.join(options.outDir, "reward-curve.html");
  rewardCurve(history, { metrics: ["reward", "win"], title: "tic-tac-toe vs random: reward and win rate per step" }).saveHtml(report);
  const transcripts = path.join(options.outDir, "transcripts.txt");
  const sample = (games: Trajectory[]) => games.slice(0, 4).map((t, i) => `--- game ${i + 1} (seed ${t.metadata.seed})\n${describeGame(t)}`).join("\n\n");
  fs.writeFileSync(transcripts, [
    `tic-tac-toe demo: the model plays x (moves first) against a random opponent; each turn it sees the board as`,
    `three rows of x/o/_ and answers <move>B2</move> (rows A-C, columns 1-3).`,
    "",
    `=== before training (${percent(result.before.winRate)} wins)`, sample(beforeGames), "",
    `=== after ${result.steps} GRPO steps (${percent(result.after.winRate)} wins)`, sample(afterGames), "",
  ].join("\n"));
  return { report, transcripts, summary: path.join(options.outDir, "summary.json"), modelDir };
}
