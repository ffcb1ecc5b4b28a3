/**
 * Soak of `art-ts serve` on loopback: thousands of mixed requests (completions, streams aborted mid-way, n > 1,
 * constrained JSON, malformed bodies, wrong content types, bodies over the size limit, unknown models, wrong keys,
 * clients that hang up) against one server process, rounds after rounds. Between rounds it records the server's
 * resident memory (/proc/<pid>/status) and the latency of two probes (GET /v1/models and a short completion), so
 * growth or slowdown over time shows. Prints one JSON object (the command is inside it).
 *
 *   node bench/serve-soak.ts [--rounds 6] [--per-round 500]
 *
 * The model is a random tiny checkpoint (make-tiny-checkpoint.ts) behind a Qwen-style tokenizer: the bench measures
 * the server, not a model.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { writeTinyCheckpoint } from "../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../scripts/serve-small-tokenizer.ts";

const args = new Map<string, string>();
for (let i = 2; i < process.argv.length; i += 2) args.set(process.argv[i]!.replace(/^--/, ""), process.argv[i + 1]!);
const rounds = Number(args.get("rounds") ?? 6);
const perRound = Number(args.get("per-round") ?? 500);
const KEY = "soak-key";

const dir = mkdtempSync(join(tmpdir(), "art-ts-soak-"));
writeSmallQwenTokenizer(dir);
writeTinyCheckpoint(dir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
const keyFile = join(dir, "key");
writeFileSync(keyFile, `${KEY}\n`);

// The server in its own process, as users run it; its first output line names the address.
const server = spawn(process.execPath, ["lib/cli.ts", "serve", "--model", dir, "--name", "soak", "--port", "0", "--api-key-file", keyFile,
  "--device", "cpu", "--slots", "16", "--context", "512", "--max-request-mb", "1"], { stdio: ["ignore", "pipe", "inherit"] });
const baseURL = await new Promise<string>((resolve, reject) => {
  let out = "";
  server.stdout!.on("data", (chunk: Buffer) => {
    out += chunk.toString();
    const match = /at (http:\/\/\S+\/v1)/.exec(out);
    if (match) resolve(match[1]!);
  });
  server.on("exit", (code) => reject(new Error(`art-ts serve exited with ${code}: ${out}`)));
});
const url = new URL(baseURL);

function rssMb(): number {
  const status = readFileSync(`/proc/${server.pid}/status`, "utf8");
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)![1]) / 1024;
}

interface Reply { status: number; ms: number }

/** One raw HTTP request; `hangUpAfterMs` closes the connection early (a client that goes away). */
function send(method: string, path: string, body: string | Buffer | null, headers: Record<string, string>, hangUpAfterMs?: number): Promise<Reply> {
  const started = performance.now();
  return new Promise((resolve) => {
    const req = httpRequest({ host: url.hostname, port: url.port, path: `/v1${path}`, method, headers }, (res) => {
      res.on("data", () => {});
      res.on("end", () => resolve({ status: res.statusCode!, ms: performance.now() - started }));
      res.on("error", () => resolve({ status: -1, ms: performance.now() - started }));
    });
    req.on("error", () => resolve({ status: -1, ms: performance.now() - started }));
    if (hangUpAfterMs !== undefined) setTimeout(() => req.destroy(), hangUpAfterMs);
    if (body !== null) req.write(body);
    req.end();
  });
}

const json = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
const chat = (extra: Record<string, unknown>) => JSON.stringify({ model: "soak", messages: [{ role: "user", content: "Your move?" }], max_tokens: 12, ...extra });
const schema = { type: "object", properties: { move: { enum: ["A1", "B2", "C3"] } }, required: ["move"], additionalProperties: false };

/** The mix: each kind of request a careless or hostile client sends, in turn. */
const KINDS: (readonly [string, (i: number) => Promise<Reply>])[] = [
  ["completion", (i) => send("POST", "/chat/completions", chat({ seed: i, temperature: 1 }), json)],
  ["n=4", (i) => send("POST", "/chat/completions", chat({ seed: i, n: 4 }), json)],
  ["json_schema", (i) => send("POST", "/chat/completions", chat({ seed: i, max_tokens: 24, response_format: { type: "json_schema", json_schema: { name: "m", schema } } }), json)],
  ["stream, hung up", (i) => send("POST", "/chat/completions", chat({ seed: i, stream: true, max_tokens: 200 }), json, 5)],
  ["malformed JSON", () => send("POST", "/chat/completions", "{\"model\": \"soak\", \"messages\": [", json)],
  ["text/plain", () => send("POST", "/chat/completions", chat({}), { authorization: `Bearer ${KEY}`, "content-type": "text/plain" })],
  ["over the size limit", () => send("POST", "/chat/completions", Buffer.alloc(2 * 1024 * 1024, 32), json)],
  ["wrong key, large body", () => send("POST", "/chat/completions", Buffer.alloc(512 * 1024, 32), { ...json, authorization: "Bearer wrong" })],
  ["unknown model", () => send("POST", "/chat/completions", JSON.stringify({ model: "nope", messages: [{ role: "user", content: "x" }] }), json)],
  ["bad schema", () => send("POST", "/chat/completions", chat({ response_format: { type: "json_schema", json_schema: { name: "s", schema: { type: "string", pattern: "a+" } } } }), json)],
  ["too long for the context", () => send("POST", "/chat/completions", chat({ messages: [{ role: "user", content: "word ".repeat(20_000) }] }), json)],
];

async function probe(): Promise<{ modelsMs: number; completionMs: number }> {
  const models = await send("GET", "/models", null, { authorization: `Bearer ${KEY}` });
  const completion = await send("POST", "/chat/completions", chat({ seed: 1, max_tokens: 4 }), json);
  if (models.status !== 200 || completion.status !== 200) throw new Error(`probe failed: ${models.status} / ${completion.status}`);
  return { modelsMs: round(models.ms), completionMs: round(completion.ms) };
}

const round = (x: number) => Math.round(x * 10) / 10;
const percentile = (values: number[], q: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(q * values.length))] ?? NaN;

for (let i = 0; i < 20; i++) await probe(); // warm up: code paths compiled, slots allocated
const timeline = [{ round: 0, requests: 0, rssMb: round(rssMb()), ...(await probe()) }];
const statuses: Record<string, Record<string, number>> = {};
const latencies: Record<string, number[]> = {};
let sent = 0;
const started = performance.now();
for (let r = 1; r <= rounds; r++) {
  // 32 clients at a time, each taking the next request of the mix.
  let next = 0;
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (next < perRound) {
      const i = next++;
      const [kind, run] = KINDS[i % KINDS.length]!;
      const reply = await run(sent + i);
      (statuses[kind] ??= {})[reply.status] = (statuses[kind]![reply.status] ?? 0) + 1;
      (latencies[kind] ??= []).push(reply.ms);
    }
  }));
  sent += perRound;
  await new Promise((resolve) => setTimeout(resolve, 500)); // let hung-up streams leave the batch
  timeline.push({ round: r, requests: sent, rssMb: round(rssMb()), ...(await probe()) });
}
const seconds = (performance.now() - started) / 1000;
server.kill("SIGINT");

console.log(JSON.stringify({
  bench: "serve-soak",
  command: `node bench/serve-soak.ts --rounds ${rounds} --per-round ${perRound}`,
  date: new Date().toISOString(),
  node: process.version,
  loadAverage: (await import("node:os")).loadavg().map(round),
  server: "art-ts serve, tiny random qwen2 checkpoint, CPU, 16 slots, context 512, --max-request-mb 1, --api-key-file",
  requests: sent,
  seconds: round(seconds),
  timeline,
  rssGrowthMb: round(timeline.at(-1)!.rssMb - timeline[1]!.rssMb),
  byKind: Object.fromEntries(KINDS.map(([kind]) => [kind, { statuses: statuses[kind], p50Ms: round(percentile(latencies[kind] ?? [], 0.5)), p95Ms: round(percentile(latencies[kind] ?? [], 0.95)) }])),
}, null, 2));
