// Random-weight models of real shapes (bench/cuda-shapes.json) on the CUDA backend, and the measured copy bandwidth:
// what the CUDA benches (cuda-decode.ts, cuda-train.ts) share.
import { readFileSync } from "node:fs";
import type { CudaBackend } from "../lib/cuda/backend.ts";
import type { Tensor } from "../lib/model/backend.ts";
import { type ModelConfig, parseConfig } from "../lib/model/config.ts";
import { type ModelWeights } from "../lib/model/transformer.ts";

const shapes = JSON.parse(readFileSync(new URL("./cuda-shapes.json", import.meta.url), "utf8")) as Record<string, unknown>;

/** The config of a named shape in bench/cuda-shapes.json. */
export function shapeConfig(name: string): ModelConfig {
  if (!(name in shapes)) throw new Error(`bench/cuda-shapes.json has no shape "${name}"; it has ${Object.keys(shapes).join(", ")}`);
  return parseConfig(shapes[name], `bench/cuda-shapes.json#${name}`);
}

/** Random weights at the model's shapes, bf16 matrices and f32 norms, as loadWeights would upload them. */
export function randomWeights(backend: CudaBackend, c: ModelConfig): { weights: ModelWeights; bytes: number } {
  const pool = Float32Array.from({ length: 1 << 22 }, () => (Math.random() - 0.5) * 0.04);
  let bytes = 0;
  const tensor = (shape: number[]): Tensor => {
    const size = shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(size);
    for (let at = 0; at < size; at += pool.length) data.set(pool.subarray(0, Math.min(pool.length, size - at)), at);
    if (shape.length === 1) data.fill(1);
    bytes += size * (shape.length === 1 ? 4 : 2);
    return backend.upload(data, shape, shape.length === 1 ? "f32" : "bf16");
  };
  const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = c;
  const linear = (outFeatures: number, inFeatures: number, biased: boolean) => ({ weight: tensor([outFeatures, inFeatures]), bias: biased ? tensor([outFeatures]) : null });
  const layers = Array.from({ length: c.numLayers }, () => ({
    inputNorm: tensor([d]), qNorm: null, kNorm: null, postAttentionNorm: tensor([d]),
    projections: {
      q_proj: linear(h * hd, d, true), k_proj: linear(kv * hd, d, true), v_proj: linear(kv * hd, d, true), o_proj: linear(d, h * hd, false),
      gate_proj: linear(inter, d, false), up_proj: linear(inter, d, false), down_proj: linear(d, inter, false),
    },
  }));
  const embedding = tensor([c.vocabSize, d]);
  const lmHead = c.tieWordEmbeddings ? embedding : tensor([c.vocabSize, d]);
  return { weights: { embedding, layers, finalNorm: tensor([d]), lmHead }, bytes };
}

/** Bandwidth of a device-to-device copy (bytes read + written per second). */
export function measureBandwidth(backend: CudaBackend): number {
  const ctx = backend.context, bytes = 1 << 30;
  const a = ctx.pool.allocate(bytes), b = ctx.pool.allocate(bytes);
  const start = ctx.createEvent(), end = ctx.createEvent();
  ctx.copyDeviceToDevice(b, a, bytes);
  ctx.recordEvent(start);
  for (let i = 0; i < 10; i++) ctx.copyDeviceToDevice(b, a, bytes);
  ctx.recordEvent(end);
  const seconds = ctx.elapsedMs(start, end) / 1000;
  for (const e of [start, end]) ctx.destroyEvent(e);
  ctx.pool.free(a);
  ctx.pool.free(b);
  return (2 * 10 * bytes) / seconds;
}
