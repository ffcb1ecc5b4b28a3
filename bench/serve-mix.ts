// The continuous batcher under requests that arrive and leave at random (issue 17: it must keep the GPU busy): a seeded
// Poisson stream of chat completions with random prompt and completion lengths, each streamed, against the in-process
// server of a TrainableModel on a random-weight checkpoint of a real shape (bench/cuda-random-model.ts). Prefill of
// newcomers and decode of the running mix in the same passes is what this exercises; a fixed batch (bench/cuda-decode.ts)
// never does.
//
// Usage: node bench/serve-mix.ts [--device cuda|cpu] [--shape qwen2.5-0.5b] [--requests 256] [--rate 16]
//        [--prompt 100-2000] [--generate 16-256] [--seed 1] [--whole] [--out mix.json]
//
// Reports: wall seconds from the first arrival to the last completion; generated tokens/s over it; time to first token
// and per-request decode tokens/s (p50/p90/p99); and the batcher's own counts over the run: passes, rows per pass, the
// share of rows that were prefill, and busy = the batcher's passSeconds / wall (how much of the time a pass was in
// flight; the rest the engine waited for requests, or for host work no pass overlapped). Prompts are digits, one token
// each, and every completion runs to its length (ignore_eos), so both sides of any comparison do the same work.
// --whole asks for whole answers, as rollouts do, instead of streams: each request's latency replaces time to first
// token and decode speed. With a fixed batch (--requests 64 --rate 1000000 --prompt 128-128 --generate 128-128) it is
// the decode bench's batch-64 workload (bench/cuda-decode.ts) through the batcher, the server and the openai client.
import { rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import { parseArgs } from "node:util";
import type { ChatCompletionCreateParamsNonStreaming, ChatCompletionCreateParamsStreaming } from "openai/resources/chat/completions";
import { seededRandom } from "../lib/core/random.ts";
import { quantile } from "../lib/notebook/stats.ts";
import { TrainableModel } from "../lib/trainable/model.ts";
import { writeBenchCheckpoint } from "./cuda-random-model.ts";

const { values } = parseArgs({ options: {
  device: { type: "string", default: "cuda" }, shape: { type: "string", default: "qwen2.5-0.5b" }, requests: { type: "string", default: "256" },
  rate: { type: "string", default: "16" }, prompt: { type: "string", default: "100-2000" }, generate: { type: "string", default: "16-256" },
  seed: { type: "string", default: "1" }, whole: { type: "boolean", default: false }, out: { type: "string" },
} });
const device = values.device as "cuda" | "cpu";
if (device !== "cuda" && device !== "cpu") throw new Error(`--device is cuda or cpu, got ${values.device}`);
const span = (name: string, text: string): [number, number] => {
  const match = /^(\d+)-(\d+)$/.exec(text);
  if (!match || Number(match[1]) < 1 || Number(match[2]) < Number(match[1])) throw new Error(`--${name} is a range of tokens like 100-2000, got ${text}`);
  return [Number(match[1]), Number(match[2])];
};
const [promptMin, promptMax] = span("prompt", values.prompt!), [generateMin, generateMax] = span("generate", values.generate!);
const count = Number(values.requests), rate = Number(values.rate);
if (!(Number.isInteger(count) && count >= 1) || !(rate > 0)) throw new Error("--requests is a whole number >= 1 and --rate a number of requests per second > 0");

// The stream of requests, fixed by the seed: exponential gaps between arrivals, uniform lengths.
const random = seededRandom(Number(values.seed));
const uniform = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo + 1));
let at = 0;
const plan = Array.from({ length: count }, (_, i) => {
  at += -Math.log(1 - random()) / rate;
  return { index: i, arrival: at, promptTokens: uniform(promptMin, promptMax), generateTokens: uniform(generateMin, generateMax) };
});

const summary = (xs: number[]) => ({ p50: +quantile(xs, 0.5).toFixed(4), p90: +quantile(xs, 0.9).toFixed(4), p99: +quantile(xs, 0.99).toFixed(4) });

const checkpoint = await writeBenchCheckpoint(values.shape!);
const artDir = `${checkpoint}-runs`;
const model = await TrainableModel.load({
  name: "mix", project: "bench", baseModel: checkpoint, device, artDir, log: (m) => console.error(m),
  batcher: { maxPositions: promptMax + generateMax + 64 },
});
try {
  const client = model.openai({ maxRetries: 0 });
  const batcher = model.server.batcherFor(model.name);
  const before = { ...batcher.stats };
  const started = performance.now();
  const seconds = () => (performance.now() - started) / 1000;
  const done = await Promise.all(plan.map(async (request) => {
    await new Promise((resolve) => setTimeout(resolve, request.arrival * 1000));
    const sent = seconds();
    // The chat template adds a few tokens around the digits: a prompt is within them of its planned length.
    const body = {
      model: model.name, messages: [{ role: "user" as const, content: "7".repeat(request.promptTokens) }], max_tokens: request.generateTokens,
      temperature: 1, seed: request.index, ignore_eos: true,
    };
    let first = 0, tokens = 0;
    if (values.whole) {
      const completion = await client.chat.completions.create(body as ChatCompletionCreateParamsNonStreaming);
      tokens = completion.choices[0]!.message.content!.length; // digits: one token each
    } else {
      for await (const chunk of await client.chat.completions.create({ ...body, stream: true } as ChatCompletionCreateParamsStreaming)) {
        const text = chunk.choices[0]?.delta?.content ?? "";
        if (text !== "" && first === 0) first = seconds();
        tokens += text.length;
      }
    }
    const finished = seconds();
    if (tokens !== request.generateTokens) throw new Error(`request ${request.index}: ${tokens} tokens streamed, ${request.generateTokens} asked for`);
    return { sent, first, finished, tokens };
  }));
  const wall = Math.max(...done.map((d) => d.finished)) - plan[0]!.arrival;
  const stats = batcher.stats;
  const passes = stats.passes - before.passes, rows = stats.rows - before.rows;
  const report = {
    benchmark: "serve-mix", command: `node bench/serve-mix.ts ${process.argv.slice(2).join(" ")}`.trim(),
    device: device === "cuda" ? "cuda" : `cpu: ${os.cpus()[0]?.model ?? "unknown"} × ${os.cpus().length}`, shape: values.shape,
    stream: { requests: count, answers: values.whole ? "whole" : "streamed", ratePerSecond: rate, promptTokens: [promptMin, promptMax], generateTokens: [generateMin, generateMax], seed: Number(values.seed) },
    wallSeconds: +wall.toFixed(3),
    generatedTokensPerSecond: +(done.reduce((sum, d) => sum + d.tokens, 0) / wall).toFixed(1),
    ...(values.whole ? { latencySeconds: summary(done.map((d) => d.finished - d.sent)) } : {
      timeToFirstTokenSeconds: summary(done.map((d) => d.first - d.sent)),
      decodeTokensPerSecondPerRequest: summary(done.map((d) => (d.tokens - 1) / Math.max(1e-9, d.finished - d.first))),
    }),
    batcher: {
      passes, rowsPerPass: +(rows / passes).toFixed(1), prefillShareOfRows: +((stats.promptRows - before.promptRows) / rows).toFixed(3),
      busy: +((stats.passSeconds - before.passSeconds) / wall).toFixed(3),
    },
  };
  const json = JSON.stringify(report, null, 2);
  if (values.out) writeFileSync(values.out, `${json}\n`);
  console.log(json);
} finally {
  await model.close();
  rmSync(checkpoint, { recursive: true, force: true });
  rmSync(artDir, { recursive: true, force: true });
}
