/**
 * `art-ts demo`: the main job from the command line. Flags override DEMO_DEFAULTS; `--help` lists them.
 * Also runnable directly: node --experimental-transform-types lib/demo/cli.ts [flags].
 */
import * as path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { ArtError } from "../core/errors.ts";
import type { Device } from "../load/causal-lm.ts";
import { DEMO_DEFAULTS, runDemo, type DemoOptions } from "./run.ts";

export const DEMO_USAGE = `art-ts demo: GRPO teaches the embedded small model to beat a random tic-tac-toe opponent (CPU, minutes)

Usage: art-ts demo [--steps N] [--groups N] [--games N] [--eval-games N] [--lr X] [--rank N] [--seed N]
                   [--device auto|cpu|cuda] [--model DIR] [--out DIR] [--art-dir DIR] [--quiet]

  --steps       GRPO steps (default ${DEMO_DEFAULTS.steps})
  --groups      groups per step (default ${DEMO_DEFAULTS.groupsPerStep}); games in a group share the opponent's seed
  --games       games per group (default ${DEMO_DEFAULTS.gamesPerGroup})
  --eval-games  held-out games for the win rate before and after (default ${DEMO_DEFAULTS.evalGames})
  --lr          learning rate (default ${DEMO_DEFAULTS.learningRate})
  --rank        LoRA rank, alpha = 2 x rank (default ${DEMO_DEFAULTS.loraRank})
  --seed        seed of games and sampling (default ${DEMO_DEFAULTS.seed})
  --device      default ${DEMO_DEFAULTS.device}
  --model       base model directory (default ${DEMO_DEFAULTS.baseModel})
  --out         report, transcripts and summary (default ${DEMO_DEFAULTS.outDir})
  --art-dir     checkpoints, history and trajectories root (default ${DEMO_DEFAULTS.artDir})
  --quiet       no progress bars
`;

function positive(flag: string, value: string | undefined, integer: boolean): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) {
    throw new ArtError("bad_flag", `art-ts demo: --${flag} must be a positive ${integer ? "integer" : "number"}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/** Parses the demo's flags into options (only those given). */
export function parseDemoArgs(args: string[]): Partial<DemoOptions> | "help" {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args,
      options: {
        steps: { type: "string" }, groups: { type: "string" }, games: { type: "string" }, "eval-games": { type: "string" },
        lr: { type: "string" }, rank: { type: "string" }, seed: { type: "string" }, device: { type: "string" },
        model: { type: "string" }, out: { type: "string" }, "art-dir": { type: "string" }, quiet: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    throw new ArtError("bad_flag", `art-ts demo: ${(error as Error).message}; run art-ts demo --help for the flags`);
  }
  if (values.help) return "help";
  const device = values.device as string | undefined;
  if (device !== undefined && !["auto", "cpu", "cuda"].includes(device)) {
    throw new ArtError("bad_flag", `art-ts demo: --device must be auto, cpu or cuda, got ${JSON.stringify(device)}`);
  }
  const rank = positive("rank", values.rank as string | undefined, true);
  const options: Partial<DemoOptions> = {
    steps: positive("steps", values.steps as string | undefined, true),
    groupsPerStep: positive("groups", values.groups as string | undefined, true),
    gamesPerGroup: positive("games", values.games as string | undefined, true),
    evalGames: positive("eval-games", values["eval-games"] as string | undefined, true),
    learningRate: positive("lr", values.lr as string | undefined, false),
    loraRank: rank,
    loraAlpha: rank === undefined ? undefined : 2 * rank,
    seed: values.seed === undefined ? undefined : positive("seed", values.seed as string, true),
    device: device as Device | undefined,
    baseModel: values.model as string | undefined,
    outDir: values.out as string | undefined,
    artDir: values["art-dir"] as string | undefined,
    quiet: values.quiet as boolean | undefined,
  };
  return Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) as Partial<DemoOptions>;
}

/** The `demo` subcommand: trains, prints progress and the win rates, writes the files. */
export async function demoCommand(args: string[]): Promise<void> {
  const parsed = parseDemoArgs(args);
  if (parsed === "help") {
    process.stdout.write(DEMO_USAGE);
    return;
  }
  await runDemo(parsed);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  demoCommand(process.argv.slice(2)).then(
    () => process.exit(0),
    (error) => {
      console.error(error instanceof ArtError ? error.message : error);
      process.exit(1);
    },
  );
}
