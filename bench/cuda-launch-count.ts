// Host-side work of one CUDA decode pass, counted without a GPU: the CUDA backend on the recording device
// (test/cuda/recording-device.ts), which records every kernel launch, cuBLAS call, upload and graph launch instead of
// running them. The models keep the real shapes' structure (layers, heads, biases, tied head), with small widths:
// the count depends on the structure, not on the widths, except where an op adds its input's LoRAs on its way in,
// which it does while the rows times their B matrices' bytes stay within 8 MiB (lib/cuda/backend.ts LORA_FOLD_BYTES):
// at these widths every LoRA of a decode pass and of the prefill chunk folds until that bound (docs/cuda.md gives
// the real widths' counts). A decode pass is counted eagerly and as a replayed CUDA
// graph, without and with a LoRA adapter on all seven projections (a GRPO rollout after the first training step);
// and the prefill of a 512-token prompt chunk with that LoRA (eager, as every pass with prompt rows runs).
// And a LoRA training micro-batch (forward keeping activations, backward: what the GPU step repeats per packed row)
// of 2 sequences × 1,024 tokens, the second half of each trained, with the real vocabulary (the LM head's logits blocks
// depend on it), counting pool allocations too. Deterministic; no timing. Prints JSON.
//
// usage: node bench/cuda-launch-count.ts [--batches 1,8,64]
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { CudaBackend } from "../lib/cuda/backend.ts";
import { parseConfig } from "../lib/model/config.ts";
import { decode, type DecodeSequence } from "../lib/model/generate.ts";
import { type LayerLoras, PROJECTIONS, projectionShape } from "../lib/model/lora.ts";
import { DifferentiableTransformer } from "../lib/model/training.ts";
import { loadWeights, Transformer } from "../lib/model/transformer.ts";
import type { TensorStore } from "../lib/model/safetensors.ts";
import { RecordingDevice } from "../test/cuda/recording-device.ts";

const { values } = parseArgs({ options: { batches: { type: "string", default: "1,8,64" } } });
const batches = values.batches!.split(",").map(Number);
const shapes = JSON.parse(readFileSync(new URL("./cuda-shapes.json", import.meta.url), "utf8")) as Record<string, Record<string, unknown>>;
const promptLength = 128;

/** Zeros of any shape: the recording device reads no values. */
const zeros: TensorStore = { readF32: (_name: string, shape: number[]) => new Float32Array(shape.reduce((a, b) => a * b, 1)) } as unknown as TensorStore;

/** One decode pass of `batch` rows once its shape is recorded, or (prefillRows > 0) one pass prefilling that many rows of one prompt. */
function count(shape: Record<string, unknown>, batch: number, graphs: boolean, withLora: boolean, prefillRows = 0) {
  const heads = shape.num_attention_heads as number;
  const config = parseConfig({ ...shape, hidden_size: heads * 16, intermediate_size: heads * 32, vocab_size: 1024 }, "narrowed shape");
  const device = new RecordingDevice();
  const backend = new CudaBackend(device, device.gemm(), RecordingDevice.kernels(), { graphs });
  const model = new Transformer(backend, config, loadWeights(backend, config, zeros, "bf16"));
  const loras: LayerLoras[] | undefined = !withLora ? undefined : Array.from({ length: config.numLayers }, () => Object.fromEntries(
    PROJECTIONS.map((name) => {
      const { outFeatures, inFeatures } = projectionShape(config, name);
      return [name, { a: backend.zeros([8, inFeatures]), b: backend.zeros([outFeatures, 8]), scale: 2 }];
    })));
  const cache = model.createKvCache(batch, Math.max(promptLength + 8, prefillRows));
  const greedy = { temperature: 0, topP: 1, topK: 0, uniform: 0, topLogprobs: 0 };
  let rows: DecodeSequence[] = Array.from({ length: batch }, (_, slot) => ({ slot, startPosition: 0, tokens: Array(promptLength).fill(1), sample: greedy }));
  const advance = () => {
    decode(model, cache, rows, loras);
    rows = rows.map((r) => ({ ...r, startPosition: r.startPosition + r.tokens.length, tokens: [1] }));
  };
  const mark = () => ({ launches: device.launches.length, gemms: device.gemms.length, events: device.events.length, graphLaunches: device.graphLaunches,
    memsets: device.memsets });
  const countSince = (before: ReturnType<typeof mark>) => ({
    kernelLaunches: device.launches.length - before.launches,
    gemmCalls: device.gemms.length - before.gemms,
    graphLaunches: device.graphLaunches - before.graphLaunches,
    memsets: device.memsets - before.memsets,
    uploads: device.events.slice(before.events).filter((e) => e.event === "upload").length,
  });
  if (prefillRows > 0) {
    const before = mark();
    decode(model, cache, [{ slot: 0, startPosition: 0, tokens: Array(prefillRows).fill(1), sample: greedy }], loras);
    return countSince(before);
  }
  for (let s = 0; s < 3; s++) advance(); // prefill, then a first sighting and a recording with graphs
  const before = mark();
  advance();
  return countSince(before);
}

/** Host calls of one LoRA training micro-batch's forward and backward (no optimizer step: it is per step, not per row). */
function countTraining(shape: Record<string, unknown>, sequences: number, tokens: number) {
  const heads = shape.num_attention_heads as number;
  const config = parseConfig({ ...shape, hidden_size: heads * 16, intermediate_size: heads * 32 }, "narrowed shape");
  const device = new RecordingDevice();
  const backend = new CudaBackend(device, device.gemm(), RecordingDevice.kernels(), { graphs: false });
  let allocations = 0;
  const allocate = device.pool.allocate.bind(device.pool);
  device.pool.allocate = (bytes) => (allocations++, allocate(bytes));
  const base = new Transformer(backend, config, loadWeights(backend, config, zeros, "bf16"));
  const model = new DifferentiableTransformer(base, { lora: { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false }, recomputeActivations: false });
  const n = sequences * tokens;
  const batch = {
    tokens: Int32Array.from({ length: n }, (_, i) => (i * 7919) % config.vocabSize), positions: Int32Array.from({ length: n }, (_, i) => i % tokens),
    segments: Array.from({ length: sequences }, (_, s) => ({ start: s * tokens, length: tokens })),
    targets: Int32Array.from({ length: n }, (_, i) => (i % tokens >= tokens / 2 ? (i * 31) % config.vocabSize : -1)),
  };
  const before = { launches: device.launches.length, gemms: device.gemms.length, events: device.events.length, memsets: device.memsets, allocations };
  const pass = model.forward(batch);
  model.backward(pass, new Float32Array(pass.scoredRows.length).fill(1));
  return {
    kernelLaunches: device.launches.length - before.launches, gemmCalls: device.gemms.length - before.gemms, memsets: device.memsets - before.memsets,
    uploads: device.events.slice(before.events).filter((e) => e.event === "upload").length, poolAllocations: allocations - before.allocations,
  };
}

const rows: object[] = [];
for (const [name, shape] of Object.entries(shapes)) {
  for (const batch of batches) {
    for (const adapter of ["none", "lora"] as const) {
      for (const graphs of [false, true]) {
        rows.push({ shape: name, layers: shape.num_hidden_layers, batch, adapter, decode: graphs ? "graph" : "eager", ...count(shape, batch, graphs, adapter === "lora") });
      }
    }
  }
}
for (const [name, shape] of Object.entries(shapes)) {
  rows.push({ shape: name, layers: shape.num_hidden_layers, prefill: 512, adapter: "lora", ...count(shape, 1, false, true, 512) });
}
for (const [name, shape] of Object.entries(shapes)) {
  rows.push({ shape: name, layers: shape.num_hidden_layers, training: "2x1024", adapter: "lora", ...countTraining(shape, 2, 1024) });
}
// One line per case.
console.log(`{
  "benchmark": "cuda-launch-count",
  "command": ${JSON.stringify(`node bench/cuda-launch-count.ts ${process.argv.slice(2).join(" ")}`.trim())},
  "what": "host calls of one decode pass (forward and on-device sampling) once its shape is recorded, of one pass prefilling a 512-token prompt chunk (prefill), and of one LoRA training micro-batch's forward and backward (training: sequences x tokens); lora: rank 8 on all 7 projections",
  "results": [
${rows.map((row) => `    ${JSON.stringify(row)}`).join(",\n")}
  ]
}`);
