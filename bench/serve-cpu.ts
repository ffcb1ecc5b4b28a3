/**
 * Serving throughput on the CPU: completion tokens per second with 1, 8 and 32 concurrent rollouts through the
 * whole stack (unmodified openai client → in-process fetch → continuous batcher → CPU transformer), what a
 * training pause costs the rollouts in flight, and a GRPO-style group (k rollouts of one long prompt) with its
 * prompt prefilled once and copied to the other slots against each rollout prefilling its own. Prints one JSON
 * object; ratios are against a peer measured in the same run.
 *
 *   node bench/serve-cpu.ts [--size tiny|20m] [--tokens 64] [--group 8]
 *
 * The model is a random checkpoint of make-tiny-checkpoint.ts (20m: ~20M parameters, hidden 384, 8 layers) behind
 * a Qwen-style tokenizer cut to its vocabulary, so the numbers measure the serving path, not a model's quality.
 */
import OpenAI from "openai";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadCausalLM } from "../lib/load/causal-lm.ts";
import { IN_PROCESS_BASE_URL, ModelServer } from "../lib/serve/model-server.ts";
import { writeTinyCheckpoint } from "../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../scripts/serve-small-tokenizer.ts";

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i].replace(/^--/, ""), process.argv[i + 1]);
const size = (args.get("size") ?? "20m") as "tiny" | "20m";
const maxTokens = Number(args.get("tokens") ?? 64);
const groupSize = Number(args.get("group") ?? 8);

const dir = mkdtempSync(join(tmpdir(), "art-ts-bench-"));
const vocab = size === "20m" ? 8192 : 682;
writeSmallQwenTokenizer(dir, vocab - 256 - 26);
writeTinyCheckpoint(dir, { arch: "qwen2", size, configOverrides: { vocab_size: vocab } });
const lm = await loadCausalLM(dir, { device: "cpu", log: () => {} });
const server = new ModelServer({ batcher: { numSlots: 32, maxPositions: 512 } });
server.addBaseModel("bench", lm);
const batcher = server.batcherFor("bench");
const client = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch, maxRetries: 0 });

function rollout(i: number) {
  return client.chat.completions.create({
    model: "bench",
    messages: [{ role: "system", content: "You play tic-tac-toe." }, { role: "user", content: `Board ${i}: . . . / . X . / . . O. Your move?` }],
    max_tokens: maxTokens,
    temperature: 1,
    seed: i,
  });
}

async function measure(concurrency: number) {
  const passes = batcher.stats.passes;
  const reused = batcher.stats.reusedTokens;
  const start = performance.now();
  const results = await Promise.all(Array.from({ length: concurrency }, (_, i) => rollout(i)));
  const seconds = (performance.now() - start) / 1000;
  const tokens = results.reduce((n, r) => n + r.usage!.completion_tokens, 0);
  return { concurrency, completionTokens: tokens, seconds: round(seconds), tokensPerSecond: round(tokens / seconds), forwardPasses: batcher.stats.passes - passes, reusedPromptTokens: batcher.stats.reusedTokens - reused };
}

/** 8 rollouts decode; a "training step" pauses the server for `holdMs`, then resumes. */
async function pauseOverhead(holdMs: number) {
  const sampled = batcher.stats.sampled;
  const running = Promise.all(Array.from({ length: 8 }, (_, i) => rollout(100 + i)));
  await until(() => batcher.stats.sampled > sampled); // decoding is under way
  const t0 = performance.now();
  await server.pause();
  const pauseLatencyMs = performance.now() - t0;
  await new Promise((r) => setTimeout(r, holdMs));
  const t1 = performance.now();
  server.resume();
  const before = batcher.stats.passes;
  await until(() => batcher.stats.passes > before || batcher.load.running + batcher.load.queued === 0);
  const resumeToFirstPassDoneMs = performance.now() - t1;
  await running;
  return { pauseLatencyMs: round(pauseLatencyMs), resumeToFirstPassDoneMs: round(resumeToFirstPassDoneMs) };
}

/**
 * k rollouts of one prompt (a GRPO group: same messages, seeds 0..k-1) on a server of their own, sharing the
 * prompt's prefill (copyKvSlot) or not (`reusePrefixes: false`). The prompt is long, as an agent's system prompt is.
 */
async function group(share: boolean) {
  const groupServer = new ModelServer({ batcher: { numSlots: groupSize, maxPositions: 1024, reusePrefixes: share } });
  groupServer.addBaseModel("bench", lm);
  const groupClient = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: groupServer.fetch, maxRetries: 0 });
  const rules = "You play tic-tac-toe as X on a 3 by 3 board. Squares are numbered 1 to 9 from the top left. ".repeat(8);
  const start = performance.now();
  const results = await Promise.all(Array.from({ length: groupSize }, (_, seed) => groupClient.chat.completions.create({
    model: "bench",
    messages: [{ role: "system", content: rules }, { role: "user", content: "Board: . . . / . X . / . . O. Your move?" }],
    max_tokens: maxTokens, temperature: 1, seed,
  })));
  const seconds = (performance.now() - start) / 1000;
  const tokens = results.reduce((n, r) => n + r.usage!.completion_tokens, 0);
  const { passes, rows, promptRows, copiedTokens } = groupServer.batcherFor("bench").stats;
  await groupServer.close();
  return {
    sharedPrefill: share, promptTokens: results[0].usage!.prompt_tokens, completionTokens: tokens, seconds: round(seconds),
    tokensPerSecond: round(tokens / seconds), forwardPasses: passes, rows, promptRows, copiedPromptTokens: copiedTokens,
  };
}

function until(condition: () => boolean): Promise<void> {
  return new Promise((resolve) => {
    const poll = () => (condition() ? resolve() : setImmediate(poll));
    poll();
  });
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

await measure(4); // warm-up
const runs = [];
for (const concurrency of [1, 8, 32]) runs.push(await measure(concurrency));
const single = runs[0].tokensPerSecond;
const pause = await pauseOverhead(200);
const [separate, shared] = [await group(false), await group(true)];
console.log(JSON.stringify({
  bench: "serve-cpu",
  model: { size, parameters: lm.config.numLayers * (4 * lm.config.hiddenSize ** 2 + 3 * lm.config.hiddenSize * lm.config.intermediateSize) + vocab * lm.config.hiddenSize, vocab },
  maxTokens,
  runs: runs.map((r) => ({ ...r, speedupVsOne: round(r.tokensPerSecond / single) })),
  pause,
  group: { size: groupSize, separate, shared, speedupVsSeparate: round(shared.tokensPerSecond / separate.tokensPerSecond) },
}, null, 2));
await server.close();
