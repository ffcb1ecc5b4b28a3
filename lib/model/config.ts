/**
 * config.json of a Hugging Face checkpoint → ModelConfig, for the architectures the engine runs: qwen2 (Qwen2/2.5),
 * qwen3 and llama. Both rope forms are read: the classic `rope_theta` + `rope_scaling` keys and the newer
 * `rope_parameters` object (transformers 5). Anything the engine would silently compute wrong is an error instead.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";

export type ModelType = "qwen2" | "qwen3" | "llama";
export const MODEL_TYPES: readonly ModelType[] = ["qwen2", "qwen3", "llama"];

export interface RopeScaling {
  type: "llama3";
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

export interface ModelConfig {
  modelType: ModelType;
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  rmsNormEps: number;
  ropeTheta: number;
  ropeScaling: RopeScaling | null;
  /** q/k/v biases (qwen2 always; llama/qwen3 per config, where o_proj then has one too). */
  attentionBias: boolean;
  /** Per-head RMSNorm of q and k before RoPE (qwen3). */
  qkNorm: boolean;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  bosTokenId: number | null;
  eosTokenIds: number[];
}

type Json = Record<string, unknown>;

function fail(file: string, message: string): never {
  throw new ArtError("bad_config", `${file}: ${message}`);
}

function positiveInt(json: Json, key: string, file: string, fallback?: number): number {
  const value = json[key] ?? fallback;
  if (value === undefined) fail(file, `missing "${key}" (a positive integer)`);
  if (typeof value !== "number" || !Number.isInteger(value) || value <= 0) {
    fail(file, `"${key}" must be a positive integer, got ${JSON.stringify(value)}`);
  }
  return value;
}

function positiveNumber(value: unknown, key: string, file: string): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
    fail(file, `"${key}" must be a positive number, got ${JSON.stringify(value)}`);
  }
  return value;
}

function optionalBool(json: Json, key: string, fallback: boolean, file: string): boolean {
  const value = json[key] ?? fallback;
  if (typeof value !== "boolean") fail(file, `"${key}" must be true or false, got ${JSON.stringify(value)}`);
  return value;
}

function tokenIds(value: unknown, key: string, file: string): number[] {
  if (value === undefined || value === null) return [];
  const ids = Array.isArray(value) ? value : [value];
  for (const id of ids) {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0) {
      fail(file, `"${key}" must be a token id or a list of them, got ${JSON.stringify(value)}`);
    }
  }
  return ids as number[];
}

/** Reads theta and scaling from either `rope_parameters` (newer) or `rope_theta` + `rope_scaling` (classic). */
function parseRope(json: Json, file: string): { ropeTheta: number; ropeScaling: RopeScaling | null } {
  const params = json.rope_parameters as Json | undefined | null;
  if (params !== undefined && params !== null && (typeof params !== "object" || Array.isArray(params))) {
    fail(file, `"rope_parameters" must be an object, got ${JSON.stringify(params)}`);
  }
  const thetaKey = json.rope_theta !== undefined ? "rope_theta" : "rope_parameters.rope_theta";
  const ropeTheta = positiveNumber(json.rope_theta ?? params?.rope_theta ?? 10000, thetaKey, file);
  const scalingKey = json.rope_scaling ? "rope_scaling" : "rope_parameters";
  const scaling = (json.rope_scaling ?? params ?? null) as Json | null;
  if (scaling === null) return { ropeTheta, ropeScaling: null };
  if (typeof scaling !== "object" || Array.isArray(scaling)) {
    fail(file, `"${scalingKey}" must be an object or null, got ${JSON.stringify(scaling)}`);
  }
  const type = scaling.rope_type ?? scaling.type ?? "default";
  if (type === "default") return { ropeTheta, ropeScaling: null };
  if (type !== "llama3") {
    fail(file, `${scalingKey} type "${String(type)}" is not supported (supported: default, llama3)`);
  }
  const need = (key: string) => positiveNumber(scaling[key], `${scalingKey}.${key}`, file);
  return {
    ropeTheta,
    ropeScaling: {
      type: "llama3",
      factor: need("factor"),
      lowFreqFactor: need("low_freq_factor"),
      highFreqFactor: need("high_freq_factor"),
      originalMaxPositionEmbeddings: need("original_max_position_embeddings"),
    },
  };
}

export function parseConfig(json: unknown, file: string): ModelConfig {
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    fail(file, "expected a JSON object (a Hugging Face config.json)");
  }
  const c = json as Json;
  const modelType = c.model_type;
  if (!MODEL_TYPES.includes(modelType as ModelType)) {
    throw new ArtError(
      "unknown_model_type",
      `${file}: model_type ${JSON.stringify(modelType)} is not supported; art-ts runs ${MODEL_TYPES.join(", ")} checkpoints`,
    );
  }
  const type = modelType as ModelType;
  const activation = c.hidden_act ?? "silu";
  if (activation !== "silu") fail(file, `"hidden_act" ${JSON.stringify(activation)} is not supported (only "silu")`);
  if (c.mlp_bias === true) fail(file, `"mlp_bias": true is not supported`);
  // Qwen2 configs carry sliding_window but only apply it when use_sliding_window is set; the engine attends fully.
  if (c.use_sliding_window === true) fail(file, `"use_sliding_window": true is not supported (the engine uses full attention)`);

  const hiddenSize = positiveInt(c, "hidden_size", file);
  const numHeads = positiveInt(c, "num_attention_heads", file);
  const numKvHeads = positiveInt(c, "num_key_value_heads", file, numHeads);
  if (numHeads % numKvHeads !== 0) {
    fail(file, `"num_attention_heads" (${numHeads}) must be a multiple of "num_key_value_heads" (${numKvHeads})`);
  }
  const defaultHeadDim = Number.isInteger(hiddenSize / numHeads) ? hiddenSize / numHeads : undefined;
  const headDim = positiveInt(c, "head_dim", file, defaultHeadDim);
  if (headDim % 2 !== 0) fail(file, `"head_dim" must be even for rotary embeddings, got ${headDim}`);
  const rmsNormEps = positiveNumber(c.rms_norm_eps ?? 1e-6, "rms_norm_eps", file);

  return {
    modelType: type,
    vocabSize: positiveInt(c, "vocab_size", file),
    hiddenSize,
    intermediateSize: positiveInt(c, "intermediate_size", file),
    numLayers: positiveInt(c, "num_hidden_layers", file),
    numHeads,
    numKvHeads,
    headDim,
    rmsNormEps,
    ...parseRope(c, file),
    attentionBias: type === "qwen2" ? true : optionalBool(c, "attention_bias", false, file),
    qkNorm: type === "qwen3",
    tieWordEmbeddings: optionalBool(c, "tie_word_embeddings", false, file),
    maxPositionEmbeddings: positiveInt(c, "max_position_embeddings", file, 32768),
    bosTokenId: tokenIds(c.bos_token_id, "bos_token_id", file)[0] ?? null,
    eosTokenIds: tokenIds(c.eos_token_id, "eos_token_id", file),
  };
}

/** config.json of the checkpoint directory `dir`. */
export function readConfig(dir: string): ModelConfig {
  const file = path.join(dir, "config.json");
  if (!fs.existsSync(file)) throw new ArtError("not_found", `${file}: missing (a Hugging Face checkpoint directory has a config.json)`);
  let json: unknown;
  try {
    json = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (error) {
    throw new ArtError("bad_config", `${file}: not valid JSON (${(error as Error).message})`);
  }
  return parseConfig(json, file);
}
