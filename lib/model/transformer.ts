/**
 * The decoder-only transformer of qwen2, qwen3 and llama, written once against the Backend interface.
 *
 * Per layer (pre-norm):  a = RMSNorm(x);  q, k, v = a Wqᵀ(+b), a Wkᵀ(+b), a Wvᵀ(+b);  [qwen3: per-head RMSNorm of q, k];
 * RoPE(q, k);  o = GQA-attention(q, k, v over the KV cache) Woᵀ;  x += o;  m = RMSNorm(x);
 * x += (silu(m Wgᵀ) · m Wuᵀ) Wdᵀ.   Then logits = RMSNorm(x) Wheadᵀ (Whead = the embedding when tied).
 *
 * `layerForward` computes one layer from its input residual alone and leaves every intermediate in named buffers
 * (LayerActivations), so a training pass can keep them per layer, or recompute a layer from a saved input, and write
 * the matching backward (llm.c style). The residual is updated in place; the one intermediate residual a backward
 * needs (the input of the MLP's RMSNorm) is the layer input + attnOut. Keys and values live in the KV cache at the
 * rows' (slot, position); re-running a layer rewrites the same values.
 */
import { ArtError } from "../core/errors.ts";
import { type Backend, type DType, type KvCache, type LoraWeights, type RowPlacement, type Tensor, checkTokenIds } from "./backend.ts";
import type { ModelConfig, RopeScaling } from "./config.ts";
import type { TensorStore } from "./safetensors.ts";

export interface LayerWeights {
  inputNorm: Tensor;
  qProj: Tensor; qBias: Tensor | null;
  kProj: Tensor; kBias: Tensor | null;
  vProj: Tensor; vBias: Tensor | null;
  oProj: Tensor; oBias: Tensor | null;
  qNorm: Tensor | null; kNorm: Tensor | null;
  postAttentionNorm: Tensor;
  gateProj: Tensor; upProj: Tensor; downProj: Tensor;
}

export interface ModelWeights {
  embedding: Tensor;
  layers: LayerWeights[];
  finalNorm: Tensor;
  /** The output projection; the same tensor as `embedding` when the checkpoint ties them. */
  lmHead: Tensor;
}

export type ProjectionName = "qProj" | "kProj" | "vProj" | "oProj" | "gateProj" | "upProj" | "downProj";
/** Unmerged LoRA per layer and projection (the training area fills it). */
export type LayerLoras = Partial<Record<ProjectionName, LoraWeights>>;

const projectionNames: readonly ProjectionName[] = ["qProj", "kProj", "vProj", "oProj", "gateProj", "upProj", "downProj"];
const objectIds = new WeakMap<object, number>();
let nextObjectId = 1;
function objectId(object: object): number {
  let id = objectIds.get(object);
  if (id === undefined) objectIds.set(object, (id = nextObjectId++));
  return id;
}

/**
 * What a forward pass's ops depend on in a LoRA set: which tensors (by identity: a tensor keeps its memory for its
 * life, and training updates it in place) and the scales. Recorded decode passes are keyed on it.
 */
function loraKey(loras: LayerLoras[] | undefined): string {
  if (!loras) return "";
  const parts: (number | string)[] = [];
  loras.forEach((layer, l) => {
    for (const name of projectionNames) {
      const lora = layer[name];
      if (lora) parts.push(l, name, objectId(lora.a), objectId(lora.b), lora.scale);
    }
  });
  return parts.join(" ");
}

/** Named intermediates of one layer's forward over n rows. */
export interface LayerActivations {
  attnInput: Tensor;   // [n, D]   RMSNorm(x)
  q: Tensor;           // [n, H·hd] after bias, q-norm, RoPE
  k: Tensor;           // [n, KV·hd]
  v: Tensor;           // [n, KV·hd]
  attn: Tensor;        // [n, H·hd] attention output before o_proj
  attnOut: Tensor;     // [n, D]   o_proj output
  mlpInput: Tensor;    // [n, D]   RMSNorm(x + attnOut)
  gate: Tensor;        // [n, I]
  up: Tensor;          // [n, I]
  hidden: Tensor;      // [n, I]   silu(gate) · up
  mlpOut: Tensor;      // [n, D]
}

/** Inverse RoPE frequencies theta^(-2j/hd), with Llama-3 scaling of the long wavelengths when configured. */
export function ropeInverseFrequencies(headDim: number, theta: number, scaling: RopeScaling | null): Float32Array {
  const inv = new Float32Array(headDim / 2);
  for (let j = 0; j < headDim / 2; j++) inv[j] = 1 / theta ** ((2 * j) / headDim);
  if (!scaling) return inv;
  const { factor, lowFreqFactor, highFreqFactor, originalMaxPositionEmbeddings: context } = scaling;
  const shortestScaledWavelength = context / lowFreqFactor;
  const longestKeptWavelength = context / highFreqFactor;
  for (let j = 0; j < inv.length; j++) {
    const wavelength = (2 * Math.PI) / inv[j];
    if (wavelength < longestKeptWavelength) continue;
    if (wavelength > shortestScaledWavelength) {
      inv[j] = inv[j] / factor;
      continue;
    }
    // Between the two: blend scaled and unscaled frequencies, linearly in context/wavelength.
    const smooth = (context / wavelength - lowFreqFactor) / (highFreqFactor - lowFreqFactor);
    inv[j] = (1 - smooth) * (inv[j] / factor) + smooth * inv[j];
  }
  return inv;
}

/** Reads the checkpoint's tensors into backend memory, checking every shape against the config. */
export function loadWeights(backend: Backend, config: ModelConfig, store: TensorStore, dtype: DType = "f32"): ModelWeights {
  const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter, vocabSize: vocab } = config;
  const uploaded: Tensor[] = [];
  const get = (name: string, shape: number[]): Tensor => {
    const tensor = backend.upload(store.readF32(name, shape), shape, shape.length === 1 ? "f32" : dtype);
    uploaded.push(tensor);
    return tensor;
  };
  try {
    const oBias = config.attentionBias && config.modelType !== "qwen2";
    const layers = Array.from({ length: config.numLayers }, (_, l): LayerWeights => {
      const p = `model.layers.${l}.`;
      return {
        inputNorm: get(`${p}input_layernorm.weight`, [d]),
        qProj: get(`${p}self_attn.q_proj.weight`, [h * hd, d]),
        qBias: config.attentionBias ? get(`${p}self_attn.q_proj.bias`, [h * hd]) : null,
        kProj: get(`${p}self_attn.k_proj.weight`, [kv * hd, d]),
        kBias: config.attentionBias ? get(`${p}self_attn.k_proj.bias`, [kv * hd]) : null,
        vProj: get(`${p}self_attn.v_proj.weight`, [kv * hd, d]),
        vBias: config.attentionBias ? get(`${p}self_attn.v_proj.bias`, [kv * hd]) : null,
        oProj: get(`${p}self_attn.o_proj.weight`, [d, h * hd]),
        oBias: oBias ? get(`${p}self_attn.o_proj.bias`, [d]) : null,
        qNorm: config.qkNorm ? get(`${p}self_attn.q_norm.weight`, [hd]) : null,
        kNorm: config.qkNorm ? get(`${p}self_attn.k_norm.weight`, [hd]) : null,
        postAttentionNorm: get(`${p}post_attention_layernorm.weight`, [d]),
        gateProj: get(`${p}mlp.gate_proj.weight`, [inter, d]),
        upProj: get(`${p}mlp.up_proj.weight`, [inter, d]),
        downProj: get(`${p}mlp.down_proj.weight`, [d, inter]),
      };
    });
    const embedding = get("model.embed_tokens.weight", [vocab, d]);
    const finalNorm = get("model.norm.weight", [d]);
    const lmHead = config.tieWordEmbeddings ? embedding : get("lm_head.weight", [vocab, d]);
    return { embedding, layers, finalNorm, lmHead };
  } catch (error) {
    for (const tensor of uploaded) backend.free(tensor);
    throw error;
  }
}

export class Transformer {
  readonly backend: Backend;
  readonly config: ModelConfig;
  readonly weights: ModelWeights;
  readonly invFreq: Tensor;

  constructor(backend: Backend, config: ModelConfig, weights: ModelWeights) {
    this.backend = backend;
    this.config = config;
    this.weights = weights;
    this.invFreq = backend.upload(ropeInverseFrequencies(config.headDim, config.ropeTheta, config.ropeScaling), [config.headDim / 2]);
  }

  createKvCache(numSlots: number, maxPositions: number): KvCache {
    const { numLayers, numKvHeads, headDim } = this.config;
    return this.backend.createKvCache({ numLayers, numKvHeads, headDim, numSlots, maxPositions });
  }

  allocateLayerActivations(rows: number): LayerActivations {
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = this.config;
    const z = (width: number) => this.backend.zeros([rows, width]);
    return {
      attnInput: z(d), q: z(h * hd), k: z(kv * hd), v: z(kv * hd), attn: z(h * hd), attnOut: z(d),
      mlpInput: z(d), gate: z(inter), up: z(inter), hidden: z(inter), mlpOut: z(d),
    };
  }

  freeActivations(acts: LayerActivations): void {
    for (const tensor of Object.values(acts)) this.backend.free(tensor);
  }

  /** One layer: reads x (the residual stream entering layer `layer`), updates it in place to the layer's output. */
  layerForward(layer: number, x: Tensor, acts: LayerActivations, cache: KvCache, rows: RowPlacement, loras?: LayerLoras): void {
    const b = this.backend, w = this.weights.layers[layer], c = this.config;
    b.rmsNorm(x, w.inputNorm, c.rmsNormEps, acts.attnInput);
    b.linear(acts.attnInput, w.qProj, w.qBias, acts.q, loras?.qProj);
    b.linear(acts.attnInput, w.kProj, w.kBias, acts.k, loras?.kProj);
    b.linear(acts.attnInput, w.vProj, w.vBias, acts.v, loras?.vProj);
    if (w.qNorm && w.kNorm) {
      b.rmsNorm(acts.q, w.qNorm, c.rmsNormEps, acts.q);
      b.rmsNorm(acts.k, w.kNorm, c.rmsNormEps, acts.k);
    }
    b.rope(acts.q, rows.positions, this.invFreq, c.headDim);
    b.rope(acts.k, rows.positions, this.invFreq, c.headDim);
    b.attention(acts.q, acts.k, acts.v, cache, layer, rows, acts.attn);
    b.linear(acts.attn, w.oProj, w.oBias, acts.attnOut, loras?.oProj);
    b.addRmsNorm(x, acts.attnOut, w.postAttentionNorm, c.rmsNormEps, acts.mlpInput);
    b.linear(acts.mlpInput, w.gateProj, null, acts.gate, loras?.gateProj);
    b.linear(acts.mlpInput, w.upProj, null, acts.up, loras?.upProj);
    b.swiglu(acts.gate, acts.up, acts.hidden);
    b.linear(acts.hidden, w.downProj, null, acts.mlpOut, loras?.downProj);
    b.addInPlace(x, acts.mlpOut);
  }

  /**
   * One forward pass over a batch of rows (ids[i] at rows.slots[i], rows.positions[i]), filling the KV cache.
   * Returns logits [logitRows.length, vocab] for the chosen rows (all rows when null); the caller frees it.
   * A decode pass (one row per slot, logits for every row) goes through the backend's runDecodePass when it has
   * one: the CUDA backend replays such passes as recorded graphs.
   */
  forward(ids: Int32Array, rows: RowPlacement, cache: KvCache, logitRows: Int32Array | null, loras?: LayerLoras[]): Tensor {
    const n = ids.length;
    if (rows.slots.length !== n || rows.positions.length !== n) {
      throw new ArtError("bad_rows", `forward: ${n} ids but ${rows.slots.length} slots and ${rows.positions.length} positions`);
    }
    checkTokenIds(ids, this.config.vocabSize);
    const everyRow = logitRows === null || (logitRows.length === n && logitRows.every((row, i) => row === i));
    const pass = () => this.#forwardPass(ids, rows, cache, everyRow ? null : logitRows, loras);
    if (everyRow && this.backend.runDecodePass && new Set(rows.slots).size === n) {
      return this.backend.runDecodePass({ owner: this, key: loraKey(loras), cache, ids, rows }, pass);
    }
    return pass();
  }

  #forwardPass(ids: Int32Array, rows: RowPlacement, cache: KvCache, logitRows: Int32Array | null, loras?: LayerLoras[]): Tensor {
    const b = this.backend, c = this.config;
    const x = b.zeros([ids.length, c.hiddenSize]);
    const acts = this.allocateLayerActivations(ids.length);
    try {
      b.embedding(this.weights.embedding, ids, x);
      for (let l = 0; l < c.numLayers; l++) this.layerForward(l, x, acts, cache, rows, loras?.[l]);
      let final = x;
      if (logitRows) {
        final = b.zeros([logitRows.length, c.hiddenSize]);
        b.gatherRows(x, logitRows, final);
      }
      b.rmsNorm(final, this.weights.finalNorm, c.rmsNormEps, final);
      const logits = b.zeros([final.shape[0], c.vocabSize]);
      b.linear(final, this.weights.lmHead, null, logits);
      if (final !== x) b.free(final);
      return logits;
    } finally {
      this.freeActivations(acts);
      b.free(x);
    }
  }

  free(): void {
    this.backend.releaseDecodePasses?.(this);
    const w = this.weights;
    const tensors = new Set<Tensor>([w.embedding, w.finalNorm, w.lmHead, this.invFreq]);
    for (const layer of w.layers) for (const t of Object.values(layer)) if (t) tensors.add(t);
    for (const tensor of tensors) this.backend.free(tensor);
  }
}
