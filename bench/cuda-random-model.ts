// Random-weight models of real shapes (bench/cuda-shapes.json) on the CUDA backend or as a checkpoint on disk, and the
// measured copy bandwidth: what the CUDA benches (cuda-decode.ts, cuda-train.ts, grpo-step.ts) share.
import { closeSync, copyFileSync, mkdirSync, mkdtempSync, openSync, readFileSync, writeFileSync, writeSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { seededRandom } from "../lib/core/random.ts";
import type { CudaBackend } from "../lib/cuda/backend.ts";
import { type ModelConfig, parseConfig } from "../lib/model/config.ts";
import { f32ToBf16, type TensorStore } from "../lib/model/safetensors.ts";
import { loadTokenizer } from "../lib/model/tokenizer.ts";
import { loadWeights, type ModelWeights } from "../lib/model/transformer.ts";
import { tinyConfig } from "../scripts/make-tiny-checkpoint.ts";
import { QWEN3_TOKENIZER_DIR, writeSmallQwenTokenizer } from "../scripts/serve-small-tokenizer.ts";

const shapes = JSON.parse(readFileSync(new URL("./cuda-shapes.json", import.meta.url), "utf8")) as Record<string, Record<string, unknown>>;

/** The config.json object of a named shape in bench/cuda-shapes.json. */
export function shapeJson(name: string): Record<string, unknown> {
  if (!(name in shapes)) throw new Error(`bench/cuda-shapes.json has no shape "${name}"; it has ${Object.keys(shapes).join(", ")}`);
  return shapes[name];
}

/** The config of a named shape in bench/cuda-shapes.json, or of TINY_SHAPE (the benches' own tests, on the emulator). */
export function shapeConfig(name: string): ModelConfig {
  if (name === TINY_SHAPE) return parseConfig(tinyConfig({ arch: "qwen2" }), TINY_SHAPE);
  return parseConfig(shapeJson(name), `bench/cuda-shapes.json#${name}`);
}

/**
 * Random weights at the model's shapes, bf16 matrices and f32 vectors (norms and biases, all 1), uploaded by
 * loadWeights itself (the layout every model gets) from a store that makes up each tensor it is asked for.
 */
export function randomWeights(backend: CudaBackend, c: ModelConfig): { weights: ModelWeights; bytes: number } {
  const pool = Float32Array.from({ length: 1 << 22 }, () => (Math.random() - 0.5) * 0.04);
  let bytes = 0;
  const store: TensorStore = {
    names: () => [],
    info: () => undefined,
    readF32: (_name, shape = []) => {
      const size = shape.reduce((a, b) => a * b, 1);
      const data = new Float32Array(size);
      for (let at = 0; at < size; at += pool.length) data.set(pool.subarray(0, Math.min(pool.length, size - at)), at);
      if (shape.length === 1) data.fill(1);
      bytes += size * (shape.length === 1 ? 4 : 2);
      return data;
    },
    close: () => {},
  };
  return { weights: loadWeights(backend, c, store, "bf16"), bytes };
}

/** Bandwidth of a device-to-device copy of `bytes` (bytes read + written per second). */
export function measureBandwidth(backend: CudaBackend, bytes = 1 << 30): number {
  const ctx = backend.context;
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

/** Elements of the repeated random pool the checkpoint writer streams (8 MiB of bf16). */
const POOL_SIZE = 1 << 22;

/**
 * Writes a qwen2 checkpoint of random bf16 weights of `config` (a config.json object) into `dir`: config.json and one
 * model.safetensors, each matrix a repetition of one seeded pool of uniform values in ±0.02 (randomWeights' values),
 * norms 1, streamed tensor by tensor so a 7B checkpoint never sits in memory.
 *
 * Its samples are always among `sampledIds` (bench/grpo-step.ts: digits, whose text re-tokenizes to the same ids, as a
 * trained model's text does; random tokens rarely would, and training would then see each turn as a sequence of its
 * own). How, without changing any shape or the cost of any product: in the last layer, kv head 0's value bias is
 * large in its dimension 0, which attention averages to the same large value at every position; o_proj carries it
 * into hidden dimension 0 from the group's first query head alone (its columns for the other heads' copies are zero);
 * the final norm keeps only dimension 0, so the logits are that one value times the head's column 0, which is zero
 * except for `sampledIds`: they lead every other token by ~48 nats (47.9 measured at the 0.5B and 1.5B shapes).
 */
export function writeRandomCheckpoint(dir: string, configJson: Record<string, unknown>, sampledIds: readonly number[]): void {
  const c = parseConfig(configJson, "writeRandomCheckpoint");
  if (c.modelType !== "qwen2") throw new Error(`writeRandomCheckpoint writes qwen2 checkpoints (its sampling rides on v_proj's bias), not ${c.modelType}`);
  const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter, vocabSize: vocab } = c;
  const bf16 = f32ToBf16;
  const random = seededRandom(7);
  const pool = Uint16Array.from({ length: POOL_SIZE }, () => bf16((random() - 0.5) * 0.04));
  // The value bias that dominates hidden dimension 0 after the last layer (see above; the other dimensions reach ~10 at
  // the 1.5B shape, and 256 left a margin of 32 nats there), and the head's weight of the sampled ids: the final norm's
  // output there is about √d, so the sampled ids' logits are ~48 and every other one 0.
  const dominantBias = 4096, sampledWeight = 48 / Math.sqrt(d);
  type Patch = (chunk: Uint16Array, start: number) => void;
  /** Sets column `column` of a row-major [rows, columns] tensor to `value(row)` within a chunk starting at element `start`. */
  const column = (columns: number, col: number, value: (row: number) => number): Patch => (chunk, start) => {
    for (let e = start + ((col - (start % columns)) % columns + columns) % columns; e < start + chunk.length; e += columns) chunk[e - start] = bf16(value((e - col) / columns));
  };
  /** Sets element 0 to `value`. */
  const first = (value: number): Patch => (chunk, start) => {
    if (start === 0) chunk[0] = bf16(value);
  };
  const sampled = new Set(sampledIds);
  const headColumn = column(d, 0, (row) => (sampled.has(row) ? sampledWeight : 0));
  const tensors: { name: string; shape: number[]; fill?: number; patches?: Patch[] }[] = [{ name: "model.embed_tokens.weight", shape: [vocab, d], patches: c.tieWordEmbeddings ? [headColumn] : [] }];
  for (let l = 0; l < c.numLayers; l++) {
    const p = `model.layers.${l}.`, last = l === c.numLayers - 1;
    const groupHeads = Array.from({ length: h / kv }, (_, head) => head * hd);
    tensors.push(
      { name: `${p}input_layernorm.weight`, shape: [d], fill: 1 },
      { name: `${p}self_attn.q_proj.weight`, shape: [h * hd, d] }, { name: `${p}self_attn.q_proj.bias`, shape: [h * hd] },
      { name: `${p}self_attn.k_proj.weight`, shape: [kv * hd, d] }, { name: `${p}self_attn.k_proj.bias`, shape: [kv * hd] },
      { name: `${p}self_attn.v_proj.weight`, shape: [kv * hd, d] },
      { name: `${p}self_attn.v_proj.bias`, shape: [kv * hd], patches: last ? [first(dominantBias)] : [] },
      { name: `${p}self_attn.o_proj.weight`, shape: [d, h * hd], patches: last ? groupHeads.map((col) => column(h * hd, col, (row) => (row === 0 && col === 0 ? 1 : 0))) : [] },
      { name: `${p}post_attention_layernorm.weight`, shape: [d], fill: 1 },
      { name: `${p}mlp.gate_proj.weight`, shape: [inter, d] }, { name: `${p}mlp.up_proj.weight`, shape: [inter, d] },
      { name: `${p}mlp.down_proj.weight`, shape: [d, inter] },
    );
  }
  tensors.push({ name: "model.norm.weight", shape: [d], fill: 0, patches: [first(1)] });
  if (!c.tieWordEmbeddings) tensors.push({ name: "lm_head.weight", shape: [vocab, d], patches: [headColumn] });

  // The safetensors layout (lib/model/safetensors.ts writes the same): a little-endian u64 header length, the JSON
  // header padded with spaces to 8 bytes, then the data.
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let offset = 0;
  for (const t of tensors) {
    const bytes = t.shape.reduce((a, b) => a * b, 1) * 2;
    header[t.name] = { dtype: "BF16", shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...configJson, torch_dtype: "bfloat16" }, null, 2));
  const fd = openSync(join(dir, "model.safetensors"), "w");
  try {
    writeSync(fd, length);
    writeSync(fd, Buffer.from(json, "utf8"));
    const chunk = new Uint16Array(POOL_SIZE);
    for (const t of tensors) {
      const size = t.shape.reduce((a, b) => a * b, 1);
      for (let start = 0; start < size; start += POOL_SIZE) {
        const part = chunk.subarray(0, Math.min(POOL_SIZE, size - start));
        if (t.fill !== undefined) part.fill(bf16(t.fill));
        else part.set(pool.subarray(0, part.length));
        for (const patch of t.patches ?? []) patch(part, start);
        writeSync(fd, new Uint8Array(part.buffer, part.byteOffset, part.byteLength));
      }
    }
  } finally {
    closeSync(fd);
  }
}

/** The shape name of make-tiny-checkpoint.ts's qwen2 preset behind a cut-down Qwen tokenizer: the benches on the CPU. */
export const TINY_SHAPE = "tiny-qwen2";

/**
 * A random-weight checkpoint of a shape of bench/cuda-shapes.json (or TINY_SHAPE) with Qwen's tokenizer, in a new
 * temporary directory: what the benches that go through the public path (TrainableModel, the server) load. It samples
 * digits only (writeRandomCheckpoint says why); the end of a turn or of the text ends a completion, as for
 * Qwen2.5-Instruct (ignore_eos overrides both).
 */
export async function writeBenchCheckpoint(shape: string): Promise<string> {
  const dir = mkdtempSync(join(os.tmpdir(), `art-bench-${shape}-`));
  if (shape === TINY_SHAPE) writeSmallQwenTokenizer(dir);
  else for (const file of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(join(QWEN3_TOKENIZER_DIR, file), join(dir, file));
  const tokenizer = await loadTokenizer(dir);
  const endOfText = tokenizer.encode("<|endoftext|>", { addSpecialTokens: false });
  const imEnd = tokenizer.encode("<|im_end|>", { addSpecialTokens: false });
  const config = shape === TINY_SHAPE ? { ...tinyConfig({ arch: "qwen2" }), vocab_size: tokenizer.vocabSize, max_position_embeddings: 32768 } : shapeJson(shape);
  if ((config.vocab_size as number) < tokenizer.vocabSize) throw new Error(`${shape}: vocab_size ${config.vocab_size} is smaller than the tokenizer's ${tokenizer.vocabSize}`);
  writeRandomCheckpoint(dir, { ...config, bos_token_id: endOfText[0], eos_token_id: endOfText[0] }, tokenizer.encode("0123456789", { addSpecialTokens: false }));
  writeFileSync(join(dir, "generation_config.json"), JSON.stringify({ bos_token_id: endOfText[0], eos_token_id: [...imEnd, ...endOfText] }));
  return dir;
}
