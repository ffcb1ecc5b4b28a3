/**
 * The ops of the training pass over backend tensors: forward ops that keep what their backward needs, the backward
 * ops, LoRA forward/backward, the fused chunked logprobs and its backward, and the optimiser's two reductions.
 * TrainingModel (model.ts) and the AdamW driver (adamw.ts) are written once against this interface; the CPU
 * implementation (cpu-training-ops.ts) runs the readable Float32Array kernels of ops.ts and logprobs.ts, and a device
 * implementation runs the same ops on device memory.
 *
 * Conventions (those of ops.ts): activations are row-major `[rows, features]`, f32; base weights are the engine's own
 * tensors and may be stored bf16 on a device; parameter gradients and activation gradients ACCUMULATE (+=) into
 * buffers the caller zeroes; a null gradient means "frozen, skip it". Row counts and widths are passed explicitly.
 * Every tensor an op returns is owned by the caller, who frees it.
 */
import type { Tensor } from "../model/backend.ts";
import type { ChunkSizes, TokenLogprobs } from "./logprobs.ts";

/** One sequence of a packed batch (see SequenceBatch in model.ts): rows [start, start + length) plus an optional shared prefix. */
export interface AttentionSegment { start: number; length: number; prefix?: { start: number; length: number } }

/** Rotary angles of one batch: cos and sin of position · invFreq, each [rows, half]. */
export interface RopeTensors { cos: Tensor; sin: Tensor; half: number }

/** Attention sizes: query heads, kv heads (grouped-query), head size. */
export interface AttentionShape { heads: number; kvHeads: number; headDim: number }

/** The scalars of one AdamW update (same for every parameter of a step). */
export interface AdamWScalars {
  /** gradient multiplier from global-norm clipping (≤ 1) */
  clip: number;
  learningRate: number; beta1: number; beta2: number; eps: number; weightDecay: number;
  /** 1 − β₁ᵗ and 1 − β₂ᵗ: the bias corrections at this step */
  correction1: number; correction2: number;
}

export interface TrainingOps {
  readonly name: "cpu" | "cuda";
  /** Whether every weight can be trained (weight, bias, norm and embedding gradients), not only LoRA adapters. */
  readonly fullParameter: boolean;
  /**
   * The logits block the logprob passes work on when the model names none: small on the CPU (it stays in cache),
   * large on a GPU (each block is a product and a few launches, so many small blocks would be launch-bound).
   */
  readonly logitChunks: ChunkSizes;
  /** Whether `tensor` lives where these ops run (an engine's weights must, to be trained here). */
  owns(tensor: Tensor): boolean;

  // memory
  /** An f32 tensor of zeros. */
  zeros(shape: readonly number[]): Tensor;
  /** An f32 tensor holding `data` (the CPU keeps the array itself). */
  upload(data: Float32Array, shape: readonly number[]): Tensor;
  /** A host copy of the values as f32. */
  download(tensor: Tensor): Float32Array;
  /** Overwrites an f32 tensor with `data` (same size). */
  write(tensor: Tensor, data: Float32Array): void;
  zero(tensor: Tensor): void;
  free(tensor: Tensor): void;
  /** A new tensor with x's values. */
  copy(x: Tensor): Tensor;
  /** out = a + b, elementwise. */
  add(out: Tensor, a: Tensor, b: Tensor): void;
  /** out = x[rows[i]] per i; x is [*, width], out [rows.length, width]. */
  gatherRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void;
  /** out[rows[i]] = x[i] per i (the backward of gatherRows into a zeroed out; rows are distinct). */
  scatterRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void;

  // the layer ops with their backwards (shapes as in ops.ts)
  embedding(out: Tensor, table: Tensor, ids: Int32Array, dim: number): void;
  embeddingBackward(dTable: Tensor, dOut: Tensor, ids: Int32Array, dim: number): void;
  linear(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | null, rows: number, inFeatures: number, outFeatures: number): void;
  linearBackward(dx: Tensor | null, dWeight: Tensor | null, dBias: Tensor | null, dOut: Tensor, x: Tensor, weight: Tensor,
    rows: number, inFeatures: number, outFeatures: number): void;
  /** out += scale · (x Aᵀ) Bᵀ; `xa` [rows, rank] receives x Aᵀ for the backward. */
  loraForward(out: Tensor, xa: Tensor, x: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void;
  loraBackward(dx: Tensor | null, dA: Tensor, dB: Tensor, dOut: Tensor, x: Tensor, xa: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void;
  /** `rstd` [rows] keeps 1/rms per row (group of `dim`). */
  rmsnorm(out: Tensor, rstd: Tensor, x: Tensor, weight: Tensor, rows: number, dim: number, eps: number): void;
  rmsnormBackward(dx: Tensor, dWeight: Tensor | null, dOut: Tensor, x: Tensor, rstd: Tensor, weight: Tensor, rows: number, dim: number): void;
  ropeTables(positions: Int32Array, inverseFrequencies: Float32Array): RopeTensors;
  /** Rotates x [rows, heads·2·half] in place; `inverse` (the backward) rotates back. */
  rope(x: Tensor, tables: RopeTensors, rows: number, heads: number, inverse: boolean): void;
  /**
   * Causal attention within each segment (a segment's rows also see all rows of its prefix). Returns what the
   * backward needs besides q, k, v (its layout is the implementation's own).
   */
  attention(out: Tensor, q: Tensor, k: Tensor, v: Tensor, segments: readonly AttentionSegment[], shape: AttentionShape): Tensor;
  attentionBackward(dq: Tensor, dk: Tensor, dv: Tensor, dOut: Tensor, saved: Tensor, q: Tensor, k: Tensor, v: Tensor,
    segments: readonly AttentionSegment[], shape: AttentionShape): void;
  swiglu(out: Tensor, gate: Tensor, up: Tensor, size: number): void;
  swigluBackward(dGate: Tensor, dUp: Tensor, dOut: Tensor, gate: Tensor, up: Tensor, size: number): void;

  // logprobs of target tokens from the final hidden states, never holding [rows × vocab]
  logprobs(hidden: Tensor, head: Tensor, targets: Int32Array, dim: number, vocab: number, chunks: ChunkSizes): TokenLogprobs;
  logprobsBackward(dHidden: Tensor, dHead: Tensor | null, dLogprobs: Float32Array, hidden: Tensor, head: Tensor,
    targets: Int32Array, logsumexp: Float32Array, dim: number, vocab: number, chunks: ChunkSizes): void;

  // optimiser
  /** Σ x² over every element of every tensor, accumulated in float64 (the global gradient norm is its root). */
  sumOfSquares(tensors: readonly Tensor[]): number;
  /** One AdamW update of `value` in place (moments m, v updated too). */
  adamw(value: Tensor, grad: Tensor, m: Tensor, v: Tensor, scalars: AdamWScalars): void;
}
