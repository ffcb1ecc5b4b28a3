/**
 * Writes tiny random checkpoints in Hugging Face layout (config.json, generation_config.json, model.safetensors or
 * shards + model.safetensors.index.json), deterministic from a seed, one preset per architecture feature the engine
 * must get right:
 *   qwen2  GQA 4/2, q/k/v biases, tied head, rope_theta 1e6
 *   qwen3  per-head q/k RMSNorm, head_dim 16 != hidden/heads 8, untied head, rope_theta 1e6
 *   llama  GQA 4/1, untied head, Llama-3 rope_scaling (one frequency in the blended band)
 *
 * With `tokenizer: true` (the CLI's default) it adds the tiny byte-level BPE tokenizer with a ChatML template
 * (lib/model/tokenizer-tiny.ts): tokenizer.json, tokenizer_config.json, and its generation_config.json eos ids.
 *
 * Usage: node scripts/make-tiny-checkpoint.ts <out-dir> [--arch qwen2|qwen3|llama] [--dtype F32|BF16|F16]
 *        [--seed N] [--shards N] [--size tiny|20m] [--tokenizer yes|no]
 * Tests call writeTinyCheckpoint() directly.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { seededRandom } from "../lib/core/random.ts";
import type { ModelType } from "../lib/model/config.ts";
import { type SafetensorsDType, type TensorToWrite, writeSafetensors } from "../lib/model/safetensors.ts";
import { buildTinyTokenizerFiles, type TinyTokenizerOptions } from "../lib/model/tokenizer-tiny.ts";

export interface TinyCheckpointOptions {
  arch: ModelType;
  dtype?: SafetensorsDType;
  seed?: number;
  /** Split the tensors over this many files behind model.safetensors.index.json (1: a single model.safetensors). */
  shards?: number;
  /** "20m": about 20M parameters, for benchmarks. */
  size?: "tiny" | "20m";
  /**
   * Also write the tiny tokenizer; the model's vocabulary then defaults to 512 to cover it. With options (a vocabulary
   * size, a corpus of its own), that tokenizer, and the model's vocabulary defaults to its size.
   */
  tokenizer?: boolean | TinyTokenizerOptions;
  /** Extra or replaced config.json keys. */
  configOverrides?: Record<string, unknown>;
}

/** The tiny tokenizer's size: its corpus supports about 720 merges, larger model vocabularies are padding. */
const TOKENIZER_VOCAB = 512;

const PRESETS: Record<ModelType, Record<string, unknown>> = {
  qwen2: {
    architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_size: 32, intermediate_size: 64,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, rope_theta: 1_000_000,
    tie_word_embeddings: true, rms_norm_eps: 1e-6,
  },
  qwen3: {
    architectures: ["Qwen3ForCausalLM"], model_type: "qwen3", hidden_size: 32, intermediate_size: 64,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rope_theta: 1_000_000,
    attention_bias: false, tie_word_embeddings: false, rms_norm_eps: 1e-6,
  },
  llama: {
    architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 32, intermediate_size: 64,
    num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 1, rope_theta: 10_000,
    tie_word_embeddings: false, rms_norm_eps: 1e-5, attention_bias: false, mlp_bias: false,
    rope_scaling: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 },
  },
};

/** ~20M parameters: hidden 384, 8 layers, 6/2 heads of 64, intermediate 1536, vocab 8192. */
const SIZE_20M = {
  hidden_size: 384, intermediate_size: 1536, num_hidden_layers: 8, num_attention_heads: 6, num_key_value_heads: 2,
  head_dim: 64, vocab_size: 8192,
};

/** `tokenizer: true` is the tiny tokenizer with its defaults. */
function tokenizerOptions(options: TinyCheckpointOptions): TinyTokenizerOptions | undefined {
  return options.tokenizer === true ? {} : options.tokenizer || undefined;
}

export function tinyConfig(options: TinyCheckpointOptions): Record<string, unknown> {
  return {
    ...PRESETS[options.arch],
    vocab_size: tokenizerOptions(options)?.vocabSize ?? (options.tokenizer ? TOKENIZER_VOCAB : 256),
    hidden_act: "silu",
    max_position_embeddings: 2048,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: { F32: "float32", BF16: "bfloat16", F16: "float16" }[options.dtype ?? "F32"],
    ...(options.size === "20m" ? SIZE_20M : {}),
    ...options.configOverrides,
  };
}

/** Seeded normal draws (mulberry32 + Box–Muller): the same seed gives the same checkpoint everywhere. */
function normalGenerator(seed: number): () => number {
  const random = seededRandom(seed);
  // Shifted by half a step into (0, 1) so the logarithm never sees 0 (exact in doubles: x/2³² + 2⁻³³).
  const uniform = () => random() + 2 ** -33;
  return () => Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform());
}

/** The tensors of a checkpoint for `config`, in Hugging Face names, drawn from `seed`. */
export function tinyTensors(config: Record<string, unknown>, dtype: SafetensorsDType, seed: number): Record<string, TensorToWrite> {
  const n = (key: string) => config[key] as number;
  const d = n("hidden_size"), heads = n("num_attention_heads"), kv = n("num_key_value_heads");
  const hd = (config.head_dim as number | undefined) ?? d / heads;
  const inter = n("intermediate_size"), vocab = n("vocab_size");
  const type = config.model_type as ModelType;
  const normal = normalGenerator(seed);
  const tensors: Record<string, TensorToWrite> = {};
  // Weights scaled by 1/sqrt(fan-in) keep activations O(1), so every layer visibly shapes the logits.
  const add = (name: string, shape: number[], scale: number, offset = 0) => {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = offset + scale * normal();
    tensors[name] = { dtype, shape, data };
  };
  add("model.embed_tokens.weight", [vocab, d], 1);
  for (let l = 0; l < n("num_hidden_layers"); l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [d], 0.1, 1);
    add(`${p}self_attn.q_proj.weight`, [heads * hd, d], 1 / Math.sqrt(d));
    add(`${p}self_attn.k_proj.weight`, [kv * hd, d], 1 / Math.sqrt(d));
    add(`${p}self_attn.v_proj.weight`, [kv * hd, d], 1 / Math.sqrt(d));
    add(`${p}self_attn.o_proj.weight`, [d, heads * hd], 1 / Math.sqrt(heads * hd));
    const bias = type === "qwen2" || config.attention_bias === true;
    if (bias) {
      add(`${p}self_attn.q_proj.bias`, [heads * hd], 0.1);
      add(`${p}self_attn.k_proj.bias`, [kv * hd], 0.1);
      add(`${p}self_attn.v_proj.bias`, [kv * hd], 0.1);
      if (type !== "qwen2") add(`${p}self_attn.o_proj.bias`, [d], 0.1);
    }
    if (type === "qwen3") {
      add(`${p}self_attn.q_norm.weight`, [hd], 0.1, 1);
      add(`${p}self_attn.k_norm.weight`, [hd], 0.1, 1);
    }
    add(`${p}post_attention_layernorm.weight`, [d], 0.1, 1);
    add(`${p}mlp.gate_proj.weight`, [inter, d], 1 / Math.sqrt(d));
    add(`${p}mlp.up_proj.weight`, [inter, d], 1 / Math.sqrt(d));
    add(`${p}mlp.down_proj.weight`, [d, inter], 1 / Math.sqrt(inter));
  }
  add("model.norm.weight", [d], 0.1, 1);
  if (config.tie_word_embeddings !== true) add("lm_head.weight", [vocab, d], 1 / Math.sqrt(d));
  return tensors;
}

/** Writes the checkpoint into `dir` (created if needed) and returns its config.json object. */
export function writeTinyCheckpoint(dir: string, options: TinyCheckpointOptions): Record<string, unknown> {
  const dtype = options.dtype ?? "F32";
  const config = tinyConfig(options);
  const tensors = tinyTensors(config, dtype, options.seed ?? 0);
  fs.mkdirSync(dir, { recursive: true });
  let generationConfig: Record<string, unknown> = { bos_token_id: config.bos_token_id, eos_token_id: config.eos_token_id };
  const tokenizer = tokenizerOptions(options);
  if (tokenizer) {
    const files = buildTinyTokenizerFiles({ ...tokenizer, vocabSize: tokenizer.vocabSize ?? Math.min(config.vocab_size as number, TOKENIZER_VOCAB) });
    for (const [name, text] of Object.entries(files)) fs.writeFileSync(path.join(dir, name), text);
    generationConfig = JSON.parse(files["generation_config.json"]);
    config.bos_token_id = generationConfig.bos_token_id;
    config.eos_token_id = generationConfig.eos_token_id;
  }
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(config, null, 2));
  fs.writeFileSync(path.join(dir, "generation_config.json"), JSON.stringify(generationConfig, null, 2));
  const shards = options.shards ?? 1;
  if (shards <= 1) {
    writeSafetensors(path.join(dir, "model.safetensors"), tensors, { format: "pt" });
    return config;
  }
  const names = Object.keys(tensors);
  const perShard = Math.ceil(names.length / shards);
  const weightMap: Record<string, string> = {};
  let totalSize = 0;
  for (let s = 0; s < shards; s++) {
    const file = `model-${String(s + 1).padStart(5, "0")}-of-${String(shards).padStart(5, "0")}.safetensors`;
    const part: Record<string, TensorToWrite> = {};
    for (const name of names.slice(s * perShard, (s + 1) * perShard)) {
      part[name] = tensors[name];
      weightMap[name] = file;
      totalSize += tensors[name].data.length * (dtype === "F32" ? 4 : 2);
    }
    writeSafetensors(path.join(dir, file), part, { format: "pt" });
  }
  fs.writeFileSync(
    path.join(dir, "model.safetensors.index.json"),
    JSON.stringify({ metadata: { total_size: totalSize }, weight_map: weightMap }, null, 2),
  );
  return config;
}

function main(argv: string[]): void {
  const [dir, ...rest] = argv;
  if (!dir || dir.startsWith("--")) {
    console.error("usage: make-tiny-checkpoint.ts <out-dir> [--arch qwen2|qwen3|llama] [--dtype F32|BF16|F16] [--seed N] [--shards N] [--size tiny|20m] [--tokenizer yes|no]");
    process.exit(2);
  }
  const flags = new Map<string, string>();
  for (let i = 0; i < rest.length; i += 2) flags.set(rest[i].replace(/^--/, ""), rest[i + 1]);
  const config = writeTinyCheckpoint(dir, {
    arch: (flags.get("arch") ?? "qwen2") as ModelType,
    dtype: (flags.get("dtype") ?? "F32") as SafetensorsDType,
    seed: Number(flags.get("seed") ?? 0),
    shards: Number(flags.get("shards") ?? 1),
    size: (flags.get("size") ?? "tiny") as "tiny" | "20m",
    tokenizer: flags.get("tokenizer") !== "no",
  });
  console.log(`wrote ${config.model_type} checkpoint to ${dir}`);
}

if (import.meta.url === `file://${process.argv[1]}`) main(process.argv.slice(2));
