/**
 * The op vocabulary the transformer's inference and training passes are written against (transformer.ts,
 * training.ts). The CPU backend (lib/model/cpu) is the readable reference; the CUDA backend (lib/cuda) implements
 * the same ops on device memory. docs/engine.md lists every op with its CPU body, its CUDA kernel and the test that
 * compares them.
 *
 * Conventions every implementation follows:
 * - A Tensor owns backend memory (a Float32Array on CPU, a device pointer on CUDA) until `free`. Its `dtype` is the
 *   storage type; ops compute in f32 whatever the storage ("bf16" lets a GPU keep weights at half the bytes).
 * - Activations are 2-D `[rows, features]`: one row per token of the batch. Ops write into `out` tensors the caller
 *   allocated (memory is planned by the caller, llm.c style), so a training pass can keep every named activation.
 * - Only host transfers (`upload`, `download`) and small per-row index/parameter arrays cross as typed arrays; the
 *   rest stays on the backend. Sampling runs on the backend, so only the chosen ids and logprobs come back.
 * - Ops are ordered: an implementation may queue them (a CUDA stream); `download` and `sample` wait for the queue.
 * - Within one forward pass the transformer hands every layer the same `positions` / RowPlacement arrays (the same
 *   objects), so a device backend can upload them once per pass and reuse them by identity.
 */
import { ArtError } from "../core/errors.ts";

export type DType = "f32" | "bf16";

export interface Tensor {
  readonly shape: readonly number[];
  readonly dtype: DType;
  /** Number of elements (product of `shape`). */
  readonly size: number;
}

/** An unmerged LoRA on a projection: `y += scale · (x Aᵀ) Bᵀ` with `a: [rank, in]`, `b: [out, rank]` (lora.ts). */
export interface LoraWeights {
  a: Tensor;
  b: Tensor;
  scale: number;
}

/**
 * Where a LoRA's x Aᵀ is kept for the backward: columns column .. column + rank of `tensor` [n, width]. The LoRAs of
 * projections that read one input keep theirs side by side in one tensor, in the order of their A matrices, so a
 * backend whose A matrices also lie side by side (DifferentiableTransformer stacks them) can take the group's down
 * products, and their backward, as one product each.
 */
export interface LoraDown {
  tensor: Tensor;
  column: number;
}

/**
 * One projection's LoRA for addLoras, with A:[rank, in], B:[outF, rank]: it adds into columns column .. column + outF
 * of `out` [n, width], the projection's own output (column 0) or its half of the gate/up product. `down`, when given,
 * keeps x Aᵀ for projectionsBackward; a kept LoRA is f32.
 */
export interface LoraTarget {
  lora: LoraWeights;
  out: Tensor;
  column: number;
  down?: LoraDown;
}

/**
 * The unmerged LoRAs an op adds into one of its inputs before reading it: `addLoras(x, targets)` then the op, which a
 * backend may run as one (the CUDA backend folds an inference pass's q/k/v LoRAs into the split that rotates q and k,
 * gate's and up's into the SwiGLU, and o's and down's into the add + RMSNorm that reads their outputs: one launch
 * where there were two, with the same bits). Afterwards that input may or may not hold the LoRA's part (the fused op
 * leaves it out): read the op's outputs.
 */
export interface InputLoras {
  x: Tensor;
  targets: readonly LoraTarget[];
}

/**
 * One projection y = x Wᵀ (+ bias) (+ scale · (x Aᵀ) Bᵀ) in projectionsBackward, with dOut = dLoss/dy [n, outF]:
 * dWeight and dBias (full-parameter training) take the base weight's gradients when given; `lora` its LoRA's, from
 * the x Aᵀ addLoras kept.
 */
export interface ProjectionGradient {
  weight: Tensor;
  dOut: Tensor;
  dWeight: Tensor | null;
  dBias: Tensor | null;
  lora?: { weights: LoraWeights; down: LoraDown; dA: Tensor; dB: Tensor };
}

export interface KvCacheSpec {
  numLayers: number;
  numKvHeads: number;
  headDim: number;
  /** Independent sequences the cache can hold at once (continuous batching assigns one slot per request). */
  numSlots: number;
  /** Positions per slot (prompt + generated tokens). */
  maxPositions: number;
}

/** The rotary embedding's arguments, as `rope` takes them: row i rotates by positions[i] · invFreq. */
export interface RopeRotation {
  positions: Int32Array;
  invFreq: Tensor;
  headDim: number;
}

/** Keys and values in a cache of `spec`: two planes (K, V) per layer of slots × positions × kv heads × head_dim. */
export function kvCacheElements(spec: KvCacheSpec): number {
  return 2 * spec.numLayers * spec.numSlots * spec.maxPositions * spec.numKvHeads * spec.headDim;
}

/** Keys and values of every layer for `numSlots` sequences. A row at (slot, position) attends to positions 0..position. */
export interface KvCache {
  readonly spec: KvCacheSpec;
  free(): void;
}

/**
 * Where each row of a batch lives: row i is the token at `positions[i]` of the sequence in KV slot `slots[i]`.
 * Prefill rows (many positions of one slot) and decode rows (one position of other slots) mix freely; within one
 * pass, rows of a slot must be in increasing position order and cover every position not already cached.
 */
export interface RowPlacement {
  slots: Int32Array;
  positions: Int32Array;
}

/**
 * Per-row sampling parameters. temperature 0 means greedy; topK 0 means no top-k limit; topP 1 means no nucleus.
 * Both backends run one algorithm (lib/model/cpu/sample.ts describes it), so equal uniforms give equal ids.
 */
export interface SamplingParams {
  temperature: Float32Array;
  topP: Float32Array;
  topK: Int32Array;
  /** One uniform draw in [0, 1) per row, from the host's seeded per-request generator (reproducible sampling). */
  uniforms: Float32Array;
  /** How many most-likely alternatives (with logprobs) to return per row; 0 for none. */
  numTopLogprobs: number;
  /**
   * Constrained decoding: the tokens each row may produce, a packed bitset of `allowedTokenWords(vocab)` words per
   * row (bit `id % 32` of word `id >> 5`; build it with `allowedTokenMask`). The draw, greedy pick and top
   * alternatives see only allowed tokens; the returned logprobs stay the raw model's. Absent: everything allowed.
   */
  allowedTokens?: Uint32Array;
}

/** Words of one row of an allowed-token mask. */
export function allowedTokenWords(vocab: number): number {
  return Math.ceil(vocab / 32);
}

/** The bits of a row's last mask word that stand for tokens (the rest lie past the vocabulary and are ignored). */
function lastWordBits(vocab: number): number {
  return vocab % 32 === 0 ? 0xffffffff : 2 ** (vocab % 32) - 1;
}

/** The packed allowed-token mask of SamplingParams: one entry per row, its allowed ids, or null for every token. */
export function allowedTokenMask(vocab: number, rows: readonly (ArrayLike<number> | null)[]): Uint32Array {
  const words = allowedTokenWords(vocab);
  const mask = new Uint32Array(rows.length * words);
  rows.forEach((ids, row) => {
    const rowMask = mask.subarray(row * words, (row + 1) * words);
    if (ids === null) {
      rowMask.fill(0xffffffff);
      rowMask[words - 1] = lastWordBits(vocab);
      return;
    }
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (!(Number.isInteger(id) && id >= 0 && id < vocab)) {
        throw new ArtError("bad_token_mask", `allowed-token mask of row ${row}: id ${id} is outside the vocabulary 0..${vocab - 1}`);
      }
      rowMask[id >>> 5] |= 1 << (id & 31);
    }
  });
  return mask;
}

/** Throws ArtError naming the first id outside 0..vocab-1 (every embedding lookup checks its ids with this). */
export function checkTokenIds(ids: ArrayLike<number>, vocab: number): void {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i];
    if (!(id >= 0 && id < vocab)) throw new ArtError("bad_token_id", `token id ${id} is outside the vocabulary (0..${vocab - 1})`);
  }
}

/** Throws ArtError when sampling parameters do not fit logits of `rows` × `vocab` (shared by every backend). */
export function checkSamplingParams(backend: string, params: SamplingParams, rows: number, vocab: number): void {
  for (const [name, array] of [["temperature", params.temperature], ["topP", params.topP], ["topK", params.topK],
    ["uniforms", params.uniforms]] as const) {
    if (array.length !== rows) throw new ArtError("wrong_shape", `${backend}: sampling ${name} has ${array.length} entries for ${rows} rows`);
  }
  if (!(Number.isInteger(params.numTopLogprobs) && params.numTopLogprobs >= 0 && params.numTopLogprobs <= vocab)) {
    throw new ArtError("bad_sampling", `${backend}: numTopLogprobs ${params.numTopLogprobs} must be an integer in 0..${vocab} (the vocabulary)`);
  }
  const mask = params.allowedTokens;
  if (!mask) return;
  const words = allowedTokenWords(vocab);
  if (mask.length !== rows * words) {
    throw new ArtError("wrong_shape", `${backend}: allowedTokens has ${mask.length} words; ${rows} rows of vocabulary ${vocab} need ${rows * words} (build it with allowedTokenMask)`);
  }
  for (let row = 0; row < rows; row++) {
    let any = mask[(row + 1) * words - 1] & lastWordBits(vocab);
    for (let w = row * words; w < (row + 1) * words - 1; w++) any |= mask[w];
    if (any === 0) {
      throw new ArtError("empty_token_mask", `${backend}: row ${row}'s allowed-token mask allows no token; allow at least one, or give the row no constraint (every bit set)`);
    }
  }
}

/**
 * Returns a backend's sampled rows once each holds a drawn token. A row of NaN logits (an engine bug, or weights that
 * hold NaN) draws nothing: the samplers report id -1 and a NaN logprob, which would otherwise reach the tokenizer or
 * the next pass as a token. Shared by every backend.
 */
export function checkSampled(backend: string, result: SampleResult): SampleResult {
  for (let row = 0; row < result.ids.length; row++) {
    if (result.ids[row] < 0 || Number.isNaN(result.logprobs[row])) {
      throw new ArtError("non_finite_logits", `${backend}: row ${row} of the logits is not numbers (NaN), so no token can be drawn from it. ` +
        `This is a bug in the engine or NaN in the model's weights; please report it with the model and the request that hit it`);
    }
  }
  return result;
}

/** A decode pass: one row per KV slot and logits for every row (see Backend.runDecodePass). */
export interface DecodePass {
  /** Whose weights the pass reads; its recordings go with it (releaseDecodePasses). */
  owner: object;
  /** What else decides which ops the pass queues (the transformer's LoRA set); "" for nothing. */
  key: string;
  cache: KvCache;
  ids: Int32Array;
  rows: RowPlacement;
}

export interface SampleResult {
  ids: Int32Array;
  /** log p(id) under the model's unmodified distribution (log-softmax of the raw logits, temperature 1). */
  logprobs: Float32Array;
  /** `[rows × numTopLogprobs]` row-major, most likely first; empty when numTopLogprobs is 0. */
  topIds: Int32Array;
  topLogprobs: Float32Array;
}

/**
 * One sequence of a packed training batch: rows [start, start + length), attending causally among themselves and,
 * when `prefix` names another segment's rows (a prompt stored once for several completions), to all of those first.
 */
export interface PackedSegment { start: number; length: number; prefix?: { start: number; length: number } }

/**
 * Whether the segments hold each of the `rows` rows exactly once (toBatch's always do): packed attention then writes
 * every row of its output, which needs no zeroing first.
 */
export function segmentsCoverRows(segments: readonly PackedSegment[], rows: number): boolean {
  // In order of their first rows, each non-empty segment starts where the one before it ends (a few segments per
  // batch: cheaper than marking the rows, and it runs once per layer).
  const ordered = segments.filter((s) => s.length !== 0).sort((a, b) => a.start - b.start);
  let end = 0;
  for (const { start, length } of ordered) {
    if (start !== end || !(length > 0)) return false;
    end = start + length;
  }
  return end === rows;
}

/** The logits block targetLogprobs works on: `rowChunk` rows by `vocabChunk` vocabulary entries at a time. */
export interface ChunkSizes { rowChunk: number; vocabChunk: number }

export interface TokenLogprobs {
  /** log p(target) per row; NaN where the row has no target (target < 0). */
  logprobs: Float32Array;
  entropies: Float32Array;
  /** Per-row log-sum-exp of the logits, what the backward needs. */
  logsumexp: Float32Array;
}

/** The scalars of one AdamW update (the same for every parameter of a step). */
/** A parameter and its gradient and moments, as one AdamW update takes them. */
export interface AdamWTensors {
  value: Tensor;
  grad: Tensor;
  m: Tensor;
  v: Tensor;
}

export interface AdamWScalars {
  /** Gradient multiplier from global-norm clipping (≤ 1). */
  clip: number;
  learningRate: number; beta1: number; beta2: number; eps: number; weightDecay: number;
  /** 1 − β₁ᵗ and 1 − β₂ᵗ: the bias corrections at this step. */
  correction1: number; correction2: number;
}

/**
 * The op vocabulary: every op of the transformer's inference and training passes, one body per device (the CPU's in
 * lib/model/cpu, CUDA's in lib/cuda). Arguments run inputs first, then outputs; shapes come from the tensors.
 * A backward op takes what its forward read (and saved), the gradient of its output, then the gradients it
 * produces, which ACCUMULATE (+=) into tensors the caller zeroed: the residual stream hands one activation to two
 * consumers, and a parameter serves many micro-batches. A null gradient is one nobody needs (a frozen weight).
 * projectionsBackward's dx, swigluBackward's and packedAttentionBackward's gradients can instead be written
 * (`overwrite`): the first contribution
 * to a fresh buffer (Backend.empty), which then needs no zeroing, a memset of the buffer fewer on a GPU. Adding to
 * zeros gives the written values exactly, so the choice changes no bits.
 */
export interface Backend {
  readonly name: "cpu" | "cuda";
  /**
   * The logits block of targetLogprobs when the caller names none: small on the CPU (it stays in cache), large on a
   * GPU (each block is a product and a few launches, so many small blocks would be launch-bound).
   */
  readonly logitChunks: ChunkSizes;
  /**
   * Bytes the backend could still allocate (on a GPU: the device's free memory and the blocks its pool caches), or
   * absent where that is not known (the CPU). Training uses it to decide which layers' activations to keep.
   */
  availableMemory?(): number;
  /**
   * The type packedAttention and its backward read q, k and v in: the values they round those to anyway, so a training
   * pass that stores them so loses nothing and moves half the bytes. "bf16" on CUDA (tensor-core tiles; splitColumns
   * with a rotation writes bf16 parts there), "f32" on the CPU. Both backends also take f32 q, k and v.
   */
  readonly attentionInputs: DType;

  // Memory and host transfers.
  /**
   * A new tensor holding `data`, stored as `dtype` (default "f32"). The backend takes `data` over: the CPU keeps the
   * array itself (no second copy of a checkpoint in memory), a device backend copies it; do not modify it afterwards.
   */
  upload(data: Float32Array, shape: readonly number[], dtype?: DType): Tensor;
  /** A new f32 tensor of zeros (activations, scratch). */
  zeros(shape: readonly number[]): Tensor;
  /**
   * A new tensor whose values are unspecified until written: for an output that the op writing it fills whole
   * (a product, a norm, an embedding), it saves zeroing the memory first, a launch on a GPU. Never for an output an op
   * adds into. f32 unless `dtype` says otherwise, which only `attentionInputs` does.
   */
  empty(shape: readonly number[], dtype?: DType): Tensor;
  /** A new f32 tensor holding x's values. */
  copy(x: Tensor): Tensor;
  /** Copies a tensor back to the host as f32 (waits for queued ops). */
  download(tensor: Tensor): Float32Array;
  /** Overwrites an f32 tensor with `data` (the same number of values). */
  write(tensor: Tensor, data: Float32Array): void;
  /** Sets every value of each tensor to 0 (one launch for all of them on a GPU). */
  zero(tensors: readonly Tensor[]): void;
  free(tensor: Tensor): void;
  /** Whether `tensor` is this kind of backend's (a model's weights must be, to run or train here). */
  owns(tensor: Tensor): boolean;
  /**
   * Rows `start .. start + rows` of `tensor` (elements, for a vector) as a tensor of their own that shares its
   * memory: one projection's weight within a fused group's. A view owns nothing: freeing it does nothing, and it
   * lives as long as its owner.
   */
  view(tensor: Tensor, start: number, rows: number): Tensor;

  // Forward ops (inference and training). Shapes: n = rows; x:[n, d] unless stated.
  /** out[i] = table[ids[i]]; table:[vocab, d], out:[n, d]. */
  embedding(table: Tensor, ids: Int32Array, out: Tensor): void;
  /**
   * RMSNorm over consecutive groups of weight.size elements (the last dim; per-head norm when x is [n, heads·hd]):
   * out = x / sqrt(mean(x²) + eps) · weight; `out` may be `x`. `rstd`, when given, keeps 1/rms per group for the backward.
   */
  rmsNorm(x: Tensor, weight: Tensor, eps: number, out: Tensor, rstd?: Tensor | null): void;
  /**
   * sum = a + b, then out = rmsNorm(sum) (`rstd` as in rmsNorm): the pre-norm transformer's seam between sublayers.
   * `sum` may be `a` (decoding updates the residual stream in place; training keeps the layer's input). `loras`: the
   * LoRAs of the projection whose output b is, added into b first (InputLoras).
   */
  addRmsNorm(a: Tensor, b: Tensor, sum: Tensor, weight: Tensor, eps: number, out: Tensor, rstd?: Tensor | null, loras?: InputLoras | null): void;
  /** out = x Wᵀ (+ bias); x:[n, in], weight:[outF, in], bias:[outF], out:[n, outF]. */
  linear(x: Tensor, weight: Tensor, bias: Tensor | null, out: Tensor): void;
  /**
   * The unmerged LoRAs of projections that read the same x:[n, in] (q, k, v; gate, up; or one projection): for each
   * target, out[:, column .. column + outF) += scale · (x Aᵀ) Bᵀ (LoraTarget). One call per group lets a GPU run a
   * decode pass's LoRAs in two launches instead of two GEMMs per projection.
   */
  addLoras(x: Tensor, targets: readonly LoraTarget[]): void;
  /**
   * out_j = x[:, c_j .. c_j + w_j) (+ bias[c_j .. c_j + w_j)) for outs[j]:[n, w_j], c_j = w_0 + … + w_(j−1): the
   * separate outputs of projections computed as one product (q, k, v); x:[n, Σ w_j], bias:[Σ w_j] or null.
   * With `rotate`, outs[0] and outs[1] (q and k) are then rotated as `rope` rotates them: both in one pass (one
   * launch on a GPU, where a decode pass is launch-bound). `loras`: the LoRAs of the projections whose columns x holds,
   * added into x first (InputLoras).
   */
  splitColumns(x: Tensor, bias: Tensor | null, outs: readonly Tensor[], rotate?: RopeRotation | null, loras?: InputLoras | null): void;
  /**
   * Rotary embedding of q and k in place (one launch on a GPU), rotate-half layout (pairs (j, j + hd/2) within each
   * head), angle positions[i] · invFreq[j] rounded to f32; q:[n, heads·headDim], k:[n, kvHeads·headDim],
   * invFreq:[headDim/2].
   */
  rope(q: Tensor, k: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void;
  /**
   * out = silu(gate) · up, elementwise, over the fused gate/up product: gateUp:[n, 2I] holds gate in its first I
   * columns and up in the rest (the MLP's ProjectionGroup), out:[n, I]. `loras`: gate's and up's LoRAs, added into
   * gateUp first (InputLoras).
   */
  swiglu(gateUp: Tensor, out: Tensor, loras?: InputLoras | null): void;
  /** out = a + b, elementwise; `out` may be `a` or `b`. */
  add(a: Tensor, b: Tensor, out: Tensor): void;
  /** out[i] = x[rowIndex[i]]; picks rows (those that need logits). */
  gatherRows(x: Tensor, rowIndex: Int32Array, out: Tensor): void;

  // Inference: the KV cache, attention over it, sampling.
  createKvCache(spec: KvCacheSpec): KvCache;
  /** Bytes a cache of `spec` takes (f32 on the CPU, bf16 on CUDA): what sizing a cache from free memory divides by. */
  kvCacheBytes(spec: KvCacheSpec): number;
  /**
   * Writes k, v of every row into `cache` at (slot, position) of `layer`, then causal grouped-query attention:
   * row i's query heads attend to positions 0..positions[i] of its slot, softmax(q·k / sqrt(headDim)) v.
   * q:[n, numHeads·hd], k, v:[n, numKvHeads·hd], out:[n, numHeads·hd].
   */
  attention(q: Tensor, k: Tensor, v: Tensor, cache: KvCache, layer: number, rows: RowPlacement, out: Tensor): void;
  /**
   * Copies the keys and values at positions 0..numPositions-1 of slot `from` into slot `to`, every layer; the rest
   * of `to` is left as it was. Keys and values depend only on ids and positions, so sequences that share a prompt
   * prefill it once and copy it (continuous batching). Ordered after the attention writes queued before it.
   */
  copyKvSlot(cache: KvCache, from: number, to: number, numPositions: number): void;
  /** out = log-softmax over the last dim. */
  logSoftmax(logits: Tensor, out: Tensor): void;
  /** Samples one id per row of logits:[n, vocab] (see SamplingParams); waits for queued ops. */
  sample(logits: Tensor, params: SamplingParams): SampleResult;
  /**
   * `sample` in two halves, where the device works while the host goes on: queues the sampling and returns the
   * function that waits for it and gives the result (call it exactly once; `logits` must live until then). The
   * continuous batcher runs the event loop in between, so requests are parsed, templated and answered while a pass
   * computes. Backends that compute on the calling thread leave it out.
   */
  startSample?(logits: Tensor, params: SamplingParams): () => SampleResult;

  // Training: attention over packed sequences, the backward ops, target logprobs, the optimiser's two reductions.
  /**
   * Causal grouped-query attention within each segment of a packed batch (a segment's rows also see every row of its
   * prefix): out = softmax(q·k / sqrt(headDim)) v. Shapes as in `attention`. Returns what the backward needs besides
   * q, k, v and out (its layout is the backend's own); the caller frees it.
   */
  packedAttention(q: Tensor, k: Tensor, v: Tensor, segments: readonly PackedSegment[], headDim: number, out: Tensor): Tensor;
  /**
   * Its backward: dq, dk, dv += the gradients for dOut, given the forward's inputs, output and saved tensor (= with
   * `overwrite`, rows in no segment then zero).
   */
  packedAttentionBackward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, saved: Tensor, segments: readonly PackedSegment[], headDim: number,
    dOut: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, overwrite?: boolean): void;
  /** dTable[ids[i]] += dOut[i]. */
  embeddingBackward(ids: Int32Array, dOut: Tensor, dTable: Tensor): void;
  /** With x̂ = x·rstd and g = dOut·w: dx += rstd · (g − x̂ · mean(g · x̂)); dWeight += Σ dOut · x̂. */
  rmsNormBackward(x: Tensor, weight: Tensor, rstd: Tensor, dOut: Tensor, dx: Tensor, dWeight: Tensor | null): void;
  /**
   * The backward of projections that read one input x (q/k/v, gate/up, or one alone), each with its LoRA if it has
   * one: dx += Σ over them of dOut W + (scale · dOut B) A (dx = … with `overwriteDx`); dWeight += dOutᵀ x, dBias +=
   * Σ_rows dOut; dB += scale · dOutᵀ (x Aᵀ), dA += (scale · dOut B)ᵀ x. Order, and so rounding, is the backend's.
   */
  projectionsBackward(x: Tensor, projections: readonly ProjectionGradient[], dx: Tensor | null, overwriteDx?: boolean): void;
  /** RoPE's backward: the rotation by minus each angle, in place on the gradients (a rotation's transpose is its inverse). */
  ropeBackward(dq: Tensor, dk: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void;
  /**
   * d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))): dGate += dOut · up · that; dUp += dOut · silu(gate), with gate and
   * up the two column halves of gateUp [n, 2I] (as in swiglu); dOut, dGate, dUp:[n, I] (each projection's backward
   * takes its own gradient); with `overwrite`, dGate and dUp are written (=) instead. `loras`: the ones the forward's
   * swiglu took, with gateUp as it left it: gate and up are its inputs with the LoRAs (a backend whose swiglu adds a
   * training pass's kept LoRAs on its way in, leaving gateUp without them, CUDA's, adds them here again; the CPU's
   * swiglu added them into gateUp).
   */
  swigluBackward(gateUp: Tensor, dOut: Tensor, dGate: Tensor, dUp: Tensor, overwrite?: boolean, loras?: InputLoras | null): void;
  /** dx[rowIndex[i]] += dOut[i]. */
  gatherRowsBackward(rowIndex: Int32Array, dOut: Tensor, dx: Tensor): void;
  /**
   * log p(targets[i]) and the entropy of each row's distribution, logits = hidden · headᵀ taken `chunks` at a time
   * with an online log-sum-exp, so [rows × vocab] never exists; hidden:[n, d], head:[vocab, d].
   */
  targetLogprobs(hidden: Tensor, head: Tensor, targets: Int32Array, chunks: ChunkSizes): TokenLogprobs;
  /** With z the logits and g = dLogprobs: dz = g · (onehot(target) − softmax(z)); dHidden += dz · head; dHead += dzᵀ · hidden. */
  targetLogprobsBackward(hidden: Tensor, head: Tensor, targets: Int32Array, logsumexp: Float32Array, dLogprobs: Float32Array,
    dHidden: Tensor, dHead: Tensor | null, chunks: ChunkSizes): void;
  /** Σ x² over every element of every tensor, accumulated in float64 (the global gradient norm is its root). */
  sumOfSquares(tensors: readonly Tensor[]): number;
  /** One AdamW update of each value in place (torch.optim.AdamW), its moments m and v updated too (one launch on a GPU). */
  adamw(params: readonly AdamWTensors[], scalars: AdamWScalars): void;

  // Optional: replaying recorded passes (the CUDA backend's graphs).
  /**
   * Runs `run` (a whole forward pass over `pass`'s rows, returning its logits), or replays what an earlier pass of
   * the same shape queued: the same owner, key and row count (a device backend adds what its own launches depend
   * on, such as the attention's key window). A decode pass then costs one launch instead of hundreds. The contract
   * on `run`: it reads the ids, slots and positions only through these very arrays, and queues the same ops for
   * every pass of that shape. The caller frees the returned logits before its next pass.
   */
  runDecodePass?(pass: DecodePass, run: () => Tensor): Tensor;
  /** Forgets what runDecodePass recorded for `owner` (its weights are about to be freed). */
  releaseDecodePasses?(owner: object): void;
}

/** Number of elements of a shape; the one definition every backend uses. */
export function shapeSize(shape: readonly number[]): number {
  let size = 1;
  for (const d of shape) size *= d;
  return size;
}

/**
 * The parts of a tensor stacked from several, `rows[i]` rows each in order, as views of it (Backend.view); a lone part
 * is the tensor itself. What stacked weights (loadWeights) and stacked LoRA A matrices (DifferentiableTransformer)
 * hand out per projection.
 */
export function stackedParts(backend: Backend, tensor: Tensor, rows: readonly number[]): Tensor[] {
  if (rows.length === 1) return [tensor];
  let start = 0;
  return rows.map((count) => {
    const part = backend.view(tensor, start, count);
    start += count;
    return part;
  });
}

/** The shape of `backend`.view(tensor, start, rows), or ArtError when those rows are not all the tensor's. */
export function viewShape(backend: string, tensor: Tensor, start: number, rows: number): number[] {
  const total = tensor.shape[0];
  if (!(Number.isInteger(start) && Number.isInteger(rows) && start >= 0 && rows >= 1 && start + rows <= total)) {
    throw new ArtError("bad_view", `${backend}: a view of rows ${start}..${start + rows - 1} of a tensor of ${total} rows ([${tensor.shape}]); name rows that it has`);
  }
  return [rows, ...tensor.shape.slice(1)];
}

/** A LoRA target's shapes against the input x, checked (every backend's addLoras): rows n, its output's width. */
export function loraTargetShape(backend: string, x: Tensor, { lora, out, column, down }: LoraTarget):
  { rank: number; inFeatures: number; outFeatures: number; n: number; width: number; downWidth: number } {
  const [rank, inFeatures] = lora.a.shape, outFeatures = lora.b.shape[0];
  const wrong = (name: string, tensor: Tensor, expected: string) =>
    new ArtError("wrong_shape", `${backend}: ${name} has ${tensor.size} elements ([${tensor.shape}]), ${expected}`);
  if (x.size % inFeatures !== 0) throw wrong("LoRA input", x, `not a multiple of ${inFeatures}`);
  const n = x.size / inFeatures;
  if (lora.b.size !== outFeatures * rank) throw wrong("LoRA B", lora.b, `expected ${outFeatures * rank}`);
  const downWidth = down ? loraDownWidth(backend, down, n, rank) : rank;
  const width = n === 0 ? outFeatures : out.size / n;
  if (!(out.size === n * width && Number.isInteger(width) && Number.isInteger(column) && column >= 0 && column + outFeatures <= width)) {
    throw new ArtError("wrong_shape", `${backend}: a LoRA of ${outFeatures} outputs at column ${column} does not fit an output of [${out.shape}] for ${n} rows`);
  }
  return { rank, inFeatures, outFeatures, n, width, downWidth };
}

/**
 * A projectionsBackward projection's shapes against its input x (and dx), checked: rows n, [outF, inF] of its weight,
 * and for its LoRA the rank and the row width of its kept x Aᵀ.
 */
export function projectionGradientShape(backend: string, x: Tensor, dx: Tensor | null, { weight, dOut, lora }: ProjectionGradient):
  { n: number; inFeatures: number; outFeatures: number; rank: number; downWidth: number } {
  const [outFeatures, inFeatures] = weight.shape;
  const wrong = (name: string, tensor: Tensor, expected: number) =>
    new ArtError("wrong_shape", `${backend}: projectionsBackward's ${name} has ${tensor.size} elements ([${tensor.shape}]), expected ${expected}`);
  const n = x.size / inFeatures;
  if (!Number.isInteger(n)) throw new ArtError("wrong_shape", `${backend}: projectionsBackward's input [${x.shape}] does not have rows of ${inFeatures} (a weight of [${weight.shape}])`);
  if (dOut.size !== n * outFeatures) throw wrong("output gradient", dOut, n * outFeatures);
  if (dx && dx.size !== x.size) throw wrong("input gradient", dx, x.size);
  if (!lora) return { n, inFeatures, outFeatures, rank: 0, downWidth: 0 };
  const { weights: { a, b }, dA, dB } = lora;
  const rank = a.shape[0];
  if (a.size !== rank * inFeatures) throw wrong("LoRA A", a, rank * inFeatures);
  if (b.size !== outFeatures * rank) throw wrong("LoRA B", b, outFeatures * rank);
  if (dA.size !== a.size) throw wrong("LoRA A gradient", dA, a.size);
  if (dB.size !== b.size) throw wrong("LoRA B gradient", dB, b.size);
  return { n, inFeatures, outFeatures, rank, downWidth: loraDownWidth(backend, lora.down, n, rank) };
}

/** The row width of the tensor keeping a LoRA's x Aᵀ, checked: n rows, and its rank columns from `column` inside them. */
export function loraDownWidth(backend: string, { tensor, column }: LoraDown, n: number, rank: number): number {
  const width = n === 0 ? rank : tensor.size / n;
  if (!(tensor.size === n * width && Number.isInteger(width) && Number.isInteger(column) && column >= 0 && column + rank <= width)) {
    throw new ArtError("wrong_shape", `${backend}: a LoRA's x·Aᵀ of rank ${rank} at column ${column} does not fit a tensor of [${tensor.shape}] for ${n} rows`);
  }
  return width;
}

/**
 * The widths of the parts splitColumns writes, checked: each part has the fused tensor's rows, their widths add up to
 * its width, and the bias, if any, has one value per column.
 */
export function columnBlocks(backend: string, fused: Tensor, parts: readonly Tensor[], bias: Tensor | null): number[] {
  const rows = fused.shape[0];
  const widths = parts.map((part) => part.size / rows);
  const total = widths.reduce((sum, w) => sum + w, 0);
  if (parts.length === 0 || parts.some((part, j) => part.shape[0] !== rows || !Number.isInteger(widths[j])) || total * rows !== fused.size) {
    throw new ArtError("wrong_shape", `${backend}: splitColumns of [${fused.shape}] into parts [${parts.map((p) => `[${p.shape}]`).join(", ")}]: the parts must have its ${rows} rows and together its width`);
  }
  if (bias && bias.size !== total) throw new ArtError("wrong_shape", `${backend}: splitColumns' bias has ${bias.size} values for ${total} columns`);
  return widths;
}

/** Rows and I of swiglu's gateUp:[rows, 2I] and an [rows, I] tensor beside it (its output or output gradient). */
export function swigluShape(backend: string, gateUp: Tensor, half: Tensor): { rows: number; inter: number } {
  const rows = gateUp.shape[0], inter = rows === 0 ? 0 : half.size / rows;
  if (!(rows === half.shape[0] && Number.isInteger(inter) && gateUp.size === 2 * rows * inter)) {
    throw new ArtError("wrong_shape", `${backend}: swiglu's fused gate/up [${gateUp.shape}] must be twice as wide as [${half.shape}] (gate, then up, per row)`);
  }
  return { rows, inter };
}

/** Throws ArtError unless copyKvSlot's arguments name two different slots of `spec` and a position count it holds. */
export function checkKvSlotCopy(spec: KvCacheSpec, from: number, to: number, numPositions: number): void {
  for (const [name, slot] of [["source", from], ["target", to]] as const) {
    if (!(Number.isInteger(slot) && slot >= 0 && slot < spec.numSlots)) {
      throw new ArtError("kv_cache_range", `copyKvSlot: ${name} slot ${slot} does not exist; the KV cache has slots 0..${spec.numSlots - 1}`);
    }
  }
  if (from === to) throw new ArtError("kv_cache_range", `copyKvSlot: source and target are both slot ${from}; copy between two different slots`);
  if (!(Number.isInteger(numPositions) && numPositions >= 0 && numPositions <= spec.maxPositions)) {
    throw new ArtError("kv_cache_range", `copyKvSlot: cannot copy ${numPositions} positions; a slot holds 0..${spec.maxPositions} positions`);
  }
}
