// Decode and prefill throughput of the CUDA backend on random weights of real model shapes (bench/cuda-shapes.json),
// against the measured memory-bandwidth roofline and, when given, the Hugging Face transformers peer measured in the
// same run (bench/peers/hf_generate.py). Prints JSON.
//
// Usage: node bench/cuda-decode.ts [--peer hf.json] [--shapes qwen2.5-0.5b,qwen2.5-1.5b] [--batches 1,8,64]
//        [--prompt 128] [--steps 128] [--prefill 1x512,8x512,1x4096] [--copy-mib 1024]
// Decode: every sequence prefills `prompt` tokens (untimed), then `steps` decode steps are timed (forward + on-device
// greedy sampling + the ids back to the host, i.e. what generation does), once with decode passes replayed as CUDA
// graphs (the default) and once eagerly, on two backends of the same process, and once more with graphs through an
// unmerged rank-8 LoRA on all seven projections (every rollout after a GRPO run's first step samples so):
// `loraTokensPerSecond` and `loraCost`, the share of the plain pass's speed it costs. `replayTokensPerSecond`: the same
// decode passes back to back, replayed graphs with nothing read back in between (each pass rewrites the position after
// the prompt) and one wait at the end: the GPU's own pace; `hostShare`, the share of a generation step spent beyond
// it (sampling, reading the ids back, the host's work between passes). With graphs, the first decode pass
// is untimed (a new shape runs eagerly once) and the timed ones include the recording and, at the key-window
// change, one more eager pass and recording: what generation pays. Prefill: one forward per size (sequences x
// tokens), logits for the last row of each sequence only, and where its GPU time goes (bench/cuda-profile.ts). Roofline per decode pass: all weight bytes plus the
// KV cache read, at the bandwidth of a device-to-device copy measured here (`--copy-mib` of it; the bench's own test runs
// the tiny shape on the kernel emulator with a small one).
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createCudaBackend } from "../lib/cuda/mod.ts";
import { decode, type DecodeSequence } from "../lib/model/generate.ts";
import { type LayerLoras, PROJECTIONS, projectionShape } from "../lib/model/lora.ts";
import { Transformer } from "../lib/model/transformer.ts";
import { type OpProfile, profileBackend } from "./cuda-profile.ts";
import { measureBandwidth, randomWeights, shapeConfig } from "./cuda-random-model.ts";

const { values } = parseArgs({ options: {
  peer: { type: "string" }, shapes: { type: "string", default: "qwen2.5-0.5b,qwen2.5-1.5b" },
  batches: { type: "string", default: "1,8,64" }, prompt: { type: "string", default: "128" },
  steps: { type: "string", default: "128" }, prefill: { type: "string", default: "1x512,8x512,1x4096" },
  "copy-mib": { type: "string", default: "1024" },
} });
const promptLength = Number(values.prompt), steps = Number(values.steps);
const prefillSizes = values.prefill!.split(",").map((size) => size.split("x").map(Number) as [number, number]);
const batches = values.batches!.split(",").map(Number);
const peer = values.peer ? JSON.parse(readFileSync(values.peer, "utf8")) as PeerResults : null;

interface PeerResults {
  results: Record<string, { decode: Record<string, number>; decodeLoop?: Record<string, number>; prefill: Record<string, number> }>;
}

const greedy = { temperature: 0, topP: 1, topK: 0, uniform: 0, topLogprobs: 0 };

/** A rank-8 LoRA (alpha 16) on every projection of every layer, small random values: what a rollout decodes with. */
function randomLoras(model: Transformer): LayerLoras[] {
  const b = model.backend, rank = 8;
  let seed = 1;
  const values = (size: number) => Float32Array.from({ length: size }, () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5) * 0.02);
  return Array.from({ length: model.config.numLayers }, () => Object.fromEntries(PROJECTIONS.map((projection) => {
    const { outFeatures, inFeatures } = projectionShape(model.config, projection);
    const a = b.empty([rank, inFeatures]), up = b.empty([outFeatures, rank]);
    b.write(a, values(rank * inFeatures));
    b.write(up, values(outFeatures * rank));
    return [projection, { a, b: up, scale: 2 }];
  })));
}

function decodeRun(model: Transformer, batch: number, loras?: LayerLoras[]): { tokensPerSecond: number; kvBytesPerStep: number } {
  const c = model.config;
  const cache = model.createKvCache(batch, promptLength + steps + 1);
  const prompt = Array.from({ length: promptLength }, (_, i) => (i * 7919) % c.vocabSize);
  let rows: DecodeSequence[] = Array.from({ length: batch }, (_, slot) => ({ slot, startPosition: 0, tokens: prompt, sample: greedy }));
  const advance = (sampled: ReturnType<typeof decode>) => {
    rows = rows.map((r, i) => ({ slot: r.slot, startPosition: r.startPosition + r.tokens.length, tokens: [sampled[i]!.id], sample: greedy }));
  };
  advance(decode(model, cache, rows, loras));
  advance(decode(model, cache, rows, loras)); // warm-up decode pass
  const started = performance.now();
  for (let s = 0; s < steps - 1; s++) advance(decode(model, cache, rows, loras));
  const seconds = (performance.now() - started) / 1000;
  cache.free();
  // Mean context over the timed steps; per token of context, K and V of every layer, bf16.
  const meanContext = promptLength + 1 + steps / 2;
  const kvBytesPerStep = batch * meanContext * c.numLayers * 2 * c.numKvHeads * c.headDim * 2;
  return { tokensPerSecond: (batch * (steps - 1)) / seconds, kvBytesPerStep };
}

/** Tokens/s of `steps` decode passes of `batch` rows queued back to back (forward only, no sampling), one wait at the end. */
function replayRun(model: Transformer, batch: number): number {
  const cache = model.createKvCache(batch, promptLength + 1);
  const prompt = Array.from({ length: promptLength }, (_, i) => (i * 7919) % model.config.vocabSize);
  decode(model, cache, Array.from({ length: batch }, (_, slot) => ({ slot, startPosition: 0, tokens: prompt, sample: greedy })));
  const ids = new Int32Array(batch).fill(1);
  const rows = { slots: Int32Array.from({ length: batch }, (_, slot) => slot), positions: new Int32Array(batch).fill(promptLength) };
  const pass = () => model.backend.free(model.forward(ids, rows, cache, null));
  for (let s = 0; s < 3; s++) pass(); // eager once, recorded once, then replayed
  backend.synchronize();
  const started = performance.now();
  for (let s = 0; s < steps; s++) pass();
  backend.synchronize();
  const seconds = (performance.now() - started) / 1000;
  cache.free();
  return (batch * steps) / seconds;
}

/** Prefill tokens/s of `batch` sequences of `length` tokens, then one more prefill through the per-op profile. */
function prefillRun(model: Transformer, profiled: Transformer, batch: number, length: number): { tokensPerSecond: number; profileMs: Record<string, OpProfile> } {
  const c = model.config;
  const cache = model.createKvCache(batch, length);
  const prompt = Array.from({ length }, (_, i) => (i * 104729) % c.vocabSize);
  const rows = Array.from({ length: batch }, (_, slot) => ({ slot, startPosition: 0, tokens: prompt, sample: greedy }));
  decode(model, cache, rows); // warm-up
  const repeats = 3;
  const started = performance.now();
  for (let r = 0; r < repeats; r++) decode(model, cache, rows);
  const seconds = (performance.now() - started) / 1000;
  profile.start();
  decode(profiled, cache, rows);
  const profileMs = profile.report();
  cache.free();
  return { tokensPerSecond: (repeats * batch * length) / seconds, profileMs };
}

const backend = createCudaBackend({ log: (m) => console.error(m) });
const profile = profileBackend(backend, backend.context);
const eagerBackend = createCudaBackend({ log: (m) => console.error(m), graphs: false });
const bandwidth = measureBandwidth(backend, Number(values["copy-mib"]) * 2 ** 20);
const results: Record<string, unknown> = {};
for (const name of values.shapes!.split(",")) {
  const config = shapeConfig(name);
  const { weights, bytes: weightBytes } = randomWeights(backend, config);
  const model = new Transformer(backend, config, weights);
  const eagerModel = new Transformer(eagerBackend, config, randomWeights(eagerBackend, config).weights);
  const loras = randomLoras(model);
  const decode: Record<string, unknown> = {};
  for (const batch of batches) {
    const { tokensPerSecond, kvBytesPerStep } = decodeRun(model, batch);
    const eager = decodeRun(eagerModel, batch).tokensPerSecond;
    const withLora = decodeRun(model, batch, loras).tokensPerSecond;
    const replay = replayRun(model, batch);
    const rooflineTokensPerSecond = (batch * bandwidth) / (weightBytes + kvBytesPerStep);
    const hf = peer?.results[name]?.decode[String(batch)];
    const hfLoop = peer?.results[name]?.decodeLoop?.[String(batch)];
    decode[batch] = {
      tokensPerSecond: +tokensPerSecond.toFixed(1),
      eagerTokensPerSecond: +eager.toFixed(1),
      graphSpeedup: +(tokensPerSecond / eager).toFixed(2),
      rooflineTokensPerSecond: +rooflineTokensPerSecond.toFixed(1),
      fractionOfRoofline: +(tokensPerSecond / rooflineTokensPerSecond).toFixed(3),
      loraTokensPerSecond: +withLora.toFixed(1),
      loraCost: +(1 - withLora / tokensPerSecond).toFixed(3),
      replayTokensPerSecond: +replay.toFixed(1),
      hostShare: +(1 - tokensPerSecond / replay).toFixed(3),
      ...(hf ? { hfTokensPerSecond: hf, ratioToHf: +(tokensPerSecond / hf).toFixed(2) } : {}),
      ...(hfLoop ? { hfForwardLoopTokensPerSecond: hfLoop, ratioToHfForwardLoop: +(tokensPerSecond / hfLoop).toFixed(2) } : {}),
    };
  }
  const prefill: Record<string, unknown> = {};
  const profiled = new Transformer(profile.backend, config, weights); // the same weights, through the profile
  for (const [batch, length] of prefillSizes) {
    const key = `${batch}x${length}`;
    const { tokensPerSecond, profileMs } = prefillRun(model, profiled, batch, length);
    const hf = peer?.results[name]?.prefill[key];
    prefill[key] = {
      tokensPerSecond: Math.round(tokensPerSecond), ...(hf ? { hfTokensPerSecond: hf, ratioToHf: +(tokensPerSecond / hf).toFixed(2) } : {}), profileMs,
    };
  }
  results[name] = { weightBytes, decode, prefill, pool: backend.memoryStats().pool, graphs: backend.decodeGraphStats() };
  for (const layer of loras) for (const lora of Object.values(layer)) for (const tensor of [lora.a, lora.b]) backend.free(tensor);
  model.free();
  eagerModel.free();
}
console.log(JSON.stringify({
  device: backend.context.device.name,
  measuredBandwidthGBps: +(bandwidth / 1e9).toFixed(0),
  settings: {
    promptLength, steps, prefill: values.prefill, sampling: "greedy on device",
    decode: "CUDA graphs (tokensPerSecond), eager (eagerTokensPerSecond), CUDA graphs with a rank-8 LoRA on all projections (loraTokensPerSecond), and graph replays back to back without sampling (replayTokensPerSecond)",
  },
  command: `node bench/cuda-decode.ts ${process.argv.slice(2).join(" ")}`.trim(),
  results,
}, null, 2));
profile.dispose();
backend.dispose();
eagerBackend.dispose();
