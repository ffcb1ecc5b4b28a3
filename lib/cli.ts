#!/usr/bin/env node
/**
 * The `art-ts` command: a small dispatcher from subcommand names to their modules. Each subcommand parses its
 * own arguments and owns its usage text; add one by adding an entry to COMMANDS.
 */
import { ArtError } from "./core/errors.ts";
import { parseServeArgs, runServe, SERVE_USAGE } from "./serve/cli-serve.ts";
import { DEMO_USAGE, demoCommand } from "./demo/cli.ts";

interface Command {
  summary: string;
  usage: string;
  /** Runs the command; resolves when it has started (servers keep the process alive). */
  run(argv: string[]): Promise<void>;
}

const COMMANDS: Record<string, Command> = {
  demo: { summary: "the main job: GRPO teaches the embedded small model tic-tac-toe (CPU, minutes)", usage: DEMO_USAGE, run: demoCommand },
  serve: {
    summary: "serve a model over an OpenAI-compatible HTTP API",
    usage: SERVE_USAGE,
    async run(argv) {
      const { server } = await runServe(parseServeArgs(argv));
      const stop = () => void server.close().then(() => process.exit(0));
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
    },
  },
};

function usage(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((name) => name.length));
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(width)}  ${c.summary}`);
  return `usage: art-ts <command> [options]\n\ncommands:\n${lines.join("\n")}\n\nart-ts <command> --help shows a command's options.`;
}

async function main(argv: string[]): Promise<void> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    console.log(usage());
    return;
  }
  const command = COMMANDS[name];
  if (!command) throw new ArtError("bad_arguments", `art-ts: unknown command ${JSON.stringify(name)}\n\n${usage()}`);
  if (rest.includes("--help") || rest.includes("-h")) {
    console.log(command.usage);
    return;
  }
  await command.run(rest);
}

main(process.argv.slice(2)).catch((error: unknown) => {
  console.error(error instanceof ArtError ? error.message : error);
  process.exit(1);
});
