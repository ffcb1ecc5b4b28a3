/**
 * The decoder-only transformer of qwen2, qwen3 and llama, written once against the Backend op vocabulary.
 *
 * Per layer (pre-norm):  a = RMSNorm(x);  q, k, v = a Wqᵀ(+b), a Wkᵀ(+b), a Wvᵀ(+b);  [qwen3: per-head RMSNorm of q, k];
 * RoPE(q, k);  o = GQA-attention(q, k, v) Woᵀ;  mid = x + o;  m = RMSNorm(mid);
 * out = mid + (silu(m Wgᵀ) · m Wuᵀ) Wdᵀ.   Then logits = RMSNorm(x) Wheadᵀ (Whead = the embedding when tied).
 *
 * `layerForward` is the one layer forward of both passes, llm.c style: every intermediate lands in a named buffer
 * (LayerActivations). Decoding attends over the KV cache and reuses one set of buffers for every layer, updating
 * the residual stream in place; the training pass (training.ts) attends within packed sequences and keeps each
 * layer's buffers, with what its hand-written backward needs (the norms' rstd, LoRA's x·Aᵀ, the attention's saved
 * statistics).
 */
import { ArtError } from "../core/errors.ts";
import { type Backend, type DType, type InputLoras, type KvCache, type LoraDown, type LoraTarget, type RowPlacement, type Tensor, checkTokenIds, stackedParts } from "./backend.ts";
import { type ModelConfig, type RopeScaling, readConfig } from "./config.ts";
import { type LayerLoras, PROJECTIONS, type Projection, projectionPath, projectionShape } from "./lora.ts";
import { openSafetensors, type TensorStore } from "./safetensors.ts";

/** A projection's weight [out, in] and its bias (q/k/v always on qwen2; per config on llama and qwen3). */
export interface Linear {
  weight: Tensor;
  bias: Tensor | null;
}

/**
 * A layer's weights. The projections that read one input are stored as one weight, their rows stacked: q, k, v as
 * `qkv` [q + k + v, D] (with their biases as one), gate and up as `gateUp` [2I, D], so each sublayer's input is
 * multiplied once, where it was multiplied three times and twice. `projections` still names every projection's own
 * weight and bias (PEFT names, full-parameter training, the backward): views of the stacked ones for those five.
 */
export interface LayerWeights {
  inputNorm: Tensor;
  qNorm: Tensor | null; kNorm: Tensor | null;
  postAttentionNorm: Tensor;
  qkv: Linear;
  gateUp: Linear;
  projections: Record<Projection, Linear>;
}

export interface ModelWeights {
  embedding: Tensor;
  layers: LayerWeights[];
  finalNorm: Tensor;
  /** The output projection; the same tensor as `embedding` when the checkpoint ties them. */
  lmHead: Tensor;
}

const objectIds = new WeakMap<object, number>();
let nextObjectId = 1;
function objectId(object: object): number {
  let id = objectIds.get(object);
  if (id === undefined) objectIds.set(object, (id = nextObjectId++));
  return id;
}

/** Throws ArtError unless `loras` has one entry per layer, each keyed by projection names only. */
function checkLoraSet(loras: LayerLoras[], numLayers: number): void {
  if (loras.length !== numLayers) {
    throw new ArtError("bad_lora", `the LoRA set has ${loras.length} layers; this model has ${numLayers} (one entry per layer, {} for none)`);
  }
  loras.forEach((layer, l) => {
    for (const name of Object.keys(layer)) {
      if (!(PROJECTIONS as readonly string[]).includes(name)) {
        throw new ArtError("bad_lora", `the LoRA of layer ${l} names "${name}"; a LoRA targets one of ${PROJECTIONS.join(", ")}`);
      }
    }
  });
}

/**
 * What a forward pass's ops depend on in a LoRA set: which tensors (by identity: a tensor keeps its memory for its
 * life, and training updates it in place) and the scales. Recorded decode passes are keyed on it.
 */
function loraKey(loras: LayerLoras[] | undefined): string {
  if (!loras) return "";
  const parts: (number | string)[] = [];
  loras.forEach((layer, l) => {
    for (const name of PROJECTIONS) {
      const lora = layer[name];
      if (lora) parts.push(l, name, objectId(lora.a), objectId(lora.b), lora.scale);
    }
  });
  return parts.join(" ");
}

/**
 * Named intermediates of one layer's forward over n rows. Decoding leaves the optional ones out and lets qRaw be q and
 * kRaw be k (the norm and RoPE then run in place); the training pass keeps them all for its backward.
 */
export interface LayerActivations {
  attnInput: Tensor;        // [n, D]   RMSNorm(x)
  rstd1: Tensor | null;     // [n]      its 1/rms
  qkv: Tensor;              // [n, (H + 2·KV)·hd] the q, k, v product before the split (scratch: training frees it)
  qRaw: Tensor;             // [n, H·hd] q projection (+bias), before the q-norm
  kRaw: Tensor;             // [n, KV·hd]
  qRstd: Tensor | null;     // [n·H]    qwen3's q-norm 1/rms
  kRstd: Tensor | null;     // [n·KV]
  q: Tensor;                // [n, H·hd] after q-norm and RoPE
  k: Tensor;                // [n, KV·hd]
  v: Tensor;                // [n, KV·hd]
  attn: Tensor;             // [n, H·hd] attention output before o_proj
  attnSaved: Tensor | null; // what the packed attention's backward needs (backend-specific layout)
  attnOut: Tensor;          // [n, D]   o_proj output
  mid: Tensor;              // [n, D]   x + attnOut: the residual stream between the sublayers
  mlpInput: Tensor;         // [n, D]   RMSNorm(mid)
  rstd2: Tensor | null;     // [n]
  gateUp: Tensor;           // [n, 2I]  gate and up projections, side by side in each row
  hidden: Tensor;           // [n, I]   silu(gate) · up
  mlpOut: Tensor;           // [n, D]   down_proj output
  /** x·Aᵀ of each projection with a LoRA, for its backward (training only): a group's side by side (LoraDown). */
  loraDown: Partial<Record<Projection, LoraDown>>;
}

/**
 * How a layer meets its neighbours (Transformer.layerForward): whether its input's norm is already in its
 * acts.attnInput and acts.rstd1 (`normed`), and the norm weight of what comes next (`nextNorm`: the next layer's input
 * norm, or the final norm), whose output the layer's last add writes as one fused add + RMSNorm, into `next` (the
 * next layer's own buffers, training) or else into its own acts (inference, where one set of buffers serves every
 * layer). The same values as an add then an RMSNorm, one launch fewer per layer.
 */
export interface LayerChain {
  normed: boolean;
  nextNorm: Tensor | null;
  next?: Pick<LayerActivations, "attnInput" | "rstd1">;
}

/** How a layer's attention reads its keys and values: the KV cache (decoding) or the packed batch (training). */
export type Attend = (layer: number, q: Tensor, k: Tensor, v: Tensor, out: Tensor) => Tensor | null;

/**
 * The LoRAs of projections that read x, each into its output at its column (none: null), for the op that reads those
 * outputs to add on its way in (InputLoras: one launch on a GPU where there were two); a training pass's keep their
 * x Aᵀ in acts.loraDown.
 */
function inputLoras(loras: LayerLoras | undefined, acts: LayerActivations, x: Tensor, outputs: [Projection, Tensor, number][]): InputLoras | null {
  const targets: LoraTarget[] = [];
  for (const [projection, out, column] of outputs) {
    const lora = loras?.[projection];
    if (lora) targets.push({ lora, out, column, down: acts.loraDown[projection] });
  }
  return targets.length > 0 ? { x, targets } : null;
}

/** Gate's and up's LoRAs, as layerForward hands them to swiglu and a training pass's backward to swigluBackward. */
export function gateUpLoras(loras: LayerLoras | undefined, acts: LayerActivations, intermediateSize: number): InputLoras | null {
  return inputLoras(loras, acts, acts.mlpInput, [["gate_proj", acts.gateUp, 0], ["up_proj", acts.gateUp, intermediateSize]]);
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
  const { hiddenSize: d, headDim: hd, vocabSize: vocab } = config;
  const uploaded: Tensor[] = [];
  const get = (name: string, shape: number[]): Tensor => {
    const tensor = backend.upload(store.readF32(name, shape), shape, shape.length === 1 ? "f32" : dtype);
    uploaded.push(tensor);
    return tensor;
  };
  /** One weight (or bias) of the projections' tensors stacked in order: rows of the first, then of the next… */
  const stacked = (names: string[], shapes: number[][]): Tensor => {
    const parts = names.map((name, i) => store.readF32(name, shapes[i]));
    let values = parts[0];
    if (parts.length > 1) {
      values = new Float32Array(parts.reduce((total, part) => total + part.length, 0));
      let offset = 0;
      for (const part of parts) {
        values.set(part, offset);
        offset += part.length;
      }
    }
    const shape = [shapes.reduce((rows, shape) => rows + shape[0], 0), ...shapes[0].slice(1)];
    const tensor = backend.upload(values, shape, shape.length === 1 ? "f32" : dtype);
    uploaded.push(tensor);
    return tensor;
  };
  try {
    // q/k/v biases where attentionBias is set (config.ts sets it for every qwen2); o_proj's too, except on qwen2.
    const qkvBiased = config.attentionBias, oBiased = config.attentionBias && config.modelType !== "qwen2";
    const layers = Array.from({ length: config.numLayers }, (_, l): LayerWeights => {
      const p = `model.layers.${l}.`;
      const projections = {} as Record<Projection, Linear>;
      /** The parts' weights (and biases) stacked into one; each part's own is a view of its rows (a lone part's, the tensor). */
      const stack = (parts: readonly Projection[], biased: boolean): Linear => {
        const shapes = parts.map((projection) => projectionShape(config, projection));
        const paths = parts.map((projection) => projectionPath(l, projection));
        const stackedLinear: Linear = {
          weight: stacked(paths.map((path) => `${path}.weight`), shapes.map(({ outFeatures, inFeatures }) => [outFeatures, inFeatures])),
          bias: biased ? stacked(paths.map((path) => `${path}.bias`), shapes.map(({ outFeatures }) => [outFeatures])) : null,
        };
        const rows = shapes.map(({ outFeatures }) => outFeatures);
        const weights = stackedParts(backend, stackedLinear.weight, rows);
        const biases = stackedLinear.bias && stackedParts(backend, stackedLinear.bias, rows);
        parts.forEach((projection, i) => {
          projections[projection] = { weight: weights[i], bias: biases && biases[i] };
        });
        return stackedLinear;
      };
      const qkv = stack(["q_proj", "k_proj", "v_proj"], qkvBiased), gateUp = stack(["gate_proj", "up_proj"], false);
      stack(["o_proj"], oBiased);
      stack(["down_proj"], false);
      return {
        inputNorm: get(`${p}input_layernorm.weight`, [d]),
        qNorm: config.qkNorm ? get(`${p}self_attn.q_norm.weight`, [hd]) : null,
        kNorm: config.qkNorm ? get(`${p}self_attn.k_norm.weight`, [hd]) : null,
        postAttentionNorm: get(`${p}post_attention_layernorm.weight`, [d]),
        qkv, gateUp, projections,
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

  /**
   * One layer over the rows of `input` (the residual stream entering layer `layer`), writing the stream leaving it to
   * `output`: the same tensor when decoding (updated in place), another when training (the input is kept for the
   * backward). Every intermediate goes to `acts`; `attend` runs the attention and returns what its backward needs.
   * `chain`: what the neighbouring layers compute for this one and this one for the next (LayerChain).
   */
  layerForward(layer: number, input: Tensor, output: Tensor, acts: LayerActivations, positions: Int32Array, attend: Attend,
    loras?: LayerLoras, chain: LayerChain = { normed: false, nextNorm: null }): void {
    this.layerAttention(layer, input, acts, positions, attend, loras, chain.normed);
    this.layerOutput(layer, input, output, acts, loras, chain);
  }

  /**
   * The first part of layerForward: the input's norm (unless `normed`), q, k, v, and the attention into acts.attn.
   * Every row's keys and values go to the attention (the KV cache keeps them), which is why a prefill's last layer
   * runs this part over all its rows and layerOutput over the scored rows only.
   */
  layerAttention(layer: number, input: Tensor, acts: LayerActivations, positions: Int32Array, attend: Attend, loras: LayerLoras | undefined,
    normed: boolean): void {
    const b = this.backend, w = this.weights.layers[layer], c = this.config, eps = c.rmsNormEps;
    if (!normed) b.rmsNorm(input, w.inputNorm, eps, acts.attnInput, acts.rstd1);
    // q, k, v: one product, then split into the three with each projection's LoRA and bias added into its columns and
    // rotated, one op (after a q/k norm where the model has one).
    b.linear(acts.attnInput, w.qkv.weight, null, acts.qkv);
    const qWidth = c.numHeads * c.headDim, kvWidth = c.numKvHeads * c.headDim;
    const qkvLoras = inputLoras(loras, acts, acts.attnInput, [["q_proj", acts.qkv, 0], ["k_proj", acts.qkv, qWidth], ["v_proj", acts.qkv, qWidth + kvWidth]]);
    if (w.qNorm && w.kNorm) {
      b.splitColumns(acts.qkv, w.qkv.bias, [acts.qRaw, acts.kRaw, acts.v], null, qkvLoras);
      b.rmsNorm(acts.qRaw, w.qNorm, eps, acts.q, acts.qRstd);
      b.rmsNorm(acts.kRaw, w.kNorm, eps, acts.k, acts.kRstd);
      b.rope(acts.q, acts.k, positions, this.invFreq, c.headDim);
    } else {
      b.splitColumns(acts.qkv, w.qkv.bias, [acts.q, acts.k, acts.v], { positions, invFreq: this.invFreq, headDim: c.headDim }, qkvLoras);
    }
    acts.attnSaved = attend(layer, acts.q, acts.k, acts.v, acts.attn);
  }

  /**
   * The rest of layerForward, row by row: o_proj of acts.attn, the residual add, the MLP and its residual add into
   * `output` (with the next norm, per `chain`).
   */
  layerOutput(layer: number, input: Tensor, output: Tensor, acts: LayerActivations, loras: LayerLoras | undefined, chain: LayerChain): void {
    const b = this.backend, w = this.weights.layers[layer], c = this.config, eps = c.rmsNormEps;
    /** A lone projection's product; its LoRA is left to the op that reads its output (addRmsNorm's `loras`). */
    const linear = (projection: Projection, x: Tensor, out: Tensor): InputLoras | null => {
      const { weight, bias } = w.projections[projection];
      b.linear(x, weight, bias, out);
      return inputLoras(loras, acts, x, [[projection, out, 0]]);
    };
    const oLoras = linear("o_proj", acts.attn, acts.attnOut);
    b.addRmsNorm(input, acts.attnOut, acts.mid, w.postAttentionNorm, eps, acts.mlpInput, acts.rstd2, oLoras);
    // gate and up: one product into the two halves of each row, each half's LoRA added by the SwiGLU that reads them.
    b.linear(acts.mlpInput, w.gateUp.weight, null, acts.gateUp);
    b.swiglu(acts.gateUp, acts.hidden, gateUpLoras(loras, acts, c.intermediateSize));
    const downLoras = linear("down_proj", acts.hidden, acts.mlpOut);
    if (chain.nextNorm) {
      const next = chain.next ?? acts;
      b.addRmsNorm(acts.mid, acts.mlpOut, output, chain.nextNorm, eps, next.attnInput, next.rstd1, downLoras);
    } else {
      if (downLoras) b.addLoras(downLoras.x, downLoras.targets);
      b.add(acts.mid, acts.mlpOut, output);
    }
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
    if (loras) checkLoraSet(loras, this.config.numLayers);
    const everyRow = logitRows === null || (logitRows.length === n && logitRows.every((row, i) => row === i));
    const pass = () => this.#forwardPass(ids, rows, cache, everyRow ? null : logitRows, loras);
    if (everyRow && this.backend.runDecodePass && new Set(rows.slots).size === n) {
      return this.backend.runDecodePass({ owner: this, key: loraKey(loras), cache, ids, rows }, pass);
    }
    return pass();
  }

  #forwardPass(ids: Int32Array, rows: RowPlacement, cache: KvCache, logitRows: Int32Array | null, loras?: LayerLoras[]): Tensor {
    const b = this.backend, c = this.config;
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = c;
    // Every buffer of the pass, freed at its end, also when an allocation or an op fails (out of GPU memory). Each is
    // written whole by the op that produces it (the embedding, a product, a norm, the attention of every row), so none
    // needs zeroing first.
    const buffers: Tensor[] = [];
    const z = (width: number, rowCount = ids.length) => {
      buffers.push(b.empty([rowCount, width]));
      return buffers.at(-1)!;
    };
    try {
      const x = z(d);
      // One set of buffers for every layer; q and k are normed and rotated in place, and the residual stream is x.
      const q = z(h * hd), k = z(kv * hd);
      const acts: LayerActivations = {
        attnInput: z(d), rstd1: null, qkv: z((h + 2 * kv) * hd), qRaw: q, kRaw: k, qRstd: null, kRstd: null, q, k, v: z(kv * hd), attn: z(h * hd),
        attnSaved: null, attnOut: z(d), mid: x, mlpInput: z(d), rstd2: null, gateUp: z(2 * inter), hidden: z(inter), mlpOut: z(d), loraDown: {},
      };
      const attend: Attend = (layer, q, k, v, out) => {
        b.attention(q, k, v, cache, layer, rows, out);
        return null;
      };
      b.embedding(this.weights.embedding, ids, x);
      const layers = this.weights.layers, last = c.numLayers - 1;
      for (let l = 0; l < last; l++) {
        this.layerForward(l, x, x, acts, rows.positions, attend, loras?.[l], { normed: l > 0, nextNorm: layers[l + 1].inputNorm });
      }
      // The last layer's add goes with the final norm, into attnInput (of acts, or of the scored rows' buffers).
      const chain = { normed: last > 0, nextNorm: this.weights.finalNorm };
      if (!logitRows) {
        this.layerForward(last, x, x, acts, rows.positions, attend, loras?.[last], chain);
        return this.#logits(acts.attnInput);
      }
      this.layerAttention(last, x, acts, rows.positions, attend, loras?.[last], chain.normed);
      // A prompt chunk that ends no prompt has no row to score: nothing more (a GPU refuses a launch over no rows).
      if (logitRows.length === 0) return b.empty([0, c.vocabSize]);
      // Past its attention, the last layer feeds only the logits: the rest of it runs over the scored rows alone (a
      // prefill's last rows; the keys and values of every row are in the cache already).
      const m = logitRows.length, mid = z(d, m);
      const scored: LayerActivations = {
        ...acts, attnInput: z(d, m), attn: z(h * hd, m), attnOut: z(d, m), mid, mlpInput: z(d, m), gateUp: z(2 * inter, m), hidden: z(inter, m),
        mlpOut: z(d, m),
      };
      b.gatherRows(acts.attn, logitRows, scored.attn);
      b.gatherRows(x, logitRows, mid);
      this.layerOutput(last, mid, mid, scored, loras?.[last], chain);
      return this.#logits(scored.attnInput);
    } finally {
      for (const tensor of buffers) b.free(tensor);
    }
  }

  /** logits = hidden · Wheadᵀ, a tensor the caller frees. */
  #logits(hidden: Tensor): Tensor {
    const b = this.backend;
    const logits = b.empty([hidden.shape[0], this.config.vocabSize]);
    try {
      b.linear(hidden, this.weights.lmHead, null, logits);
    } catch (error) {
      b.free(logits);
      throw error;
    }
    return logits;
  }

  free(): void {
    this.backend.releaseDecodePasses?.(this);
    const w = this.weights;
    const tensors = new Set<Tensor>([w.embedding, w.finalNorm, w.lmHead, this.invFreq]);
    for (const layer of w.layers) {
      for (const norm of [layer.inputNorm, layer.qNorm, layer.kNorm, layer.postAttentionNorm]) if (norm) tensors.add(norm);
      // The stacked weights own the memory; the other projections' are views of them.
      for (const { weight, bias } of [layer.qkv, layer.gateUp, layer.projections.o_proj, layer.projections.down_proj]) {
        tensors.add(weight);
        if (bias) tensors.add(bias);
      }
    }
    for (const tensor of tensors) this.backend.free(tensor);
  }
}

/** Config + weights of the checkpoint in `dir` on `backend` (weights stored as `dtype`). */
export function loadTransformer(dir: string, backend: Backend, dtype: DType = "f32"): Transformer {
  const config = readConfig(dir);
  const store = openSafetensors(dir);
  try {
    return new Transformer(backend, config, loadWeights(backend, config, store, dtype));
  } finally {
    store.close();
  }
}

/** Logits of every position of one sequence, [ids.length × vocab] row-major (a full forward in a fresh cache). */
export function sequenceLogits(model: Transformer, ids: readonly number[], loras?: LayerLoras[]): Float32Array {
  if (ids.length === 0) throw new ArtError("empty_input", "logits: ids is empty; give at least one token id");
  const cache = model.createKvCache(1, ids.length);
  try {
    const positions = Int32Array.from(ids, (_, i) => i);
    const logits = model.forward(Int32Array.from(ids), { slots: new Int32Array(ids.length), positions }, cache, null, loras);
    const host = model.backend.download(logits);
    model.backend.free(logits);
    return host;
  } finally {
    cache.free();
  }
}
