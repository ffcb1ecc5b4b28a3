/**
 * The transformer's training pass: the forward of transformer.ts keeping every named activation, and the matching
 * hand-written backward, per layer (llm.c style), for qwen2 / qwen3 / llama, on the ops of the transformer's own
 * backend. The forward is the very layer forward decoding runs (Transformer.layerForward); training attends within
 * packed sequences instead of over a KV cache.
 *
 * The base weights are the engine's own tensors, not a copy: rollouts and training share one set of weights in
 * memory. LoRA adapters live here (A, B and their gradients, f32 tensors on the same backend) and are handed to the
 * engine as those very tensors, so a sampler sees every optimiser update at once.
 *
 * Two modes: LoRA (base frozen, gradients only for A/B of the chosen projections) and full-parameter (every weight
 * has a gradient; for SFT of small models, on backends that have those gradients). A layer whose activations are
 * recomputed keeps only its input, and the backward runs its forward again: activation memory is then one layer's
 * worth plus N×D per layer. `recomputeActivations` says which layers: none, all, or ("auto") those that would not
 * fit in the memory the backend reports (the later ones, so the longest sequences still train).
 */
import { ArtError } from "../core/errors.ts";
import { seededRandom } from "../core/random.ts";
import { type Backend, type ChunkSizes, type DType, type PackedSegment, type ProjectionGradient, type Tensor, checkTokenIds, segmentsCoverRows, stackedParts } from "./backend.ts";
import type { ModelConfig } from "./config.ts";
import { type LayerLoras, type LoraConfig, loraScale, PROJECTION_GROUPS, PROJECTIONS, type Projection, projectionPath } from "./lora.ts";
import { type Adapter, writeAdapter } from "./peft.ts";
import { type Attend, gateUpLoras, type LayerActivations, type LayerChain, type Transformer } from "./transformer.ts";

/**
 * A parameter: its PEFT / Hugging Face name (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight), its
 * shape, its value and its gradient (null when frozen), tensors of the backend it trains on. Read and write them
 * with backend.download / backend.write, on any backend.
 */
export class Param {
  readonly name: string;
  readonly shape: number[];
  readonly tensor: Tensor;
  readonly gradTensor: Tensor | null;
  constructor(name: string, shape: readonly number[], tensor: Tensor, gradTensor: Tensor | null) {
    this.name = name;
    this.shape = [...shape];
    this.tensor = tensor;
    this.gradTensor = gradTensor;
  }
}

/** A trained parameter as tensors of the backend it trains on. */
export interface ParameterTensors {
  name: string;
  value: Tensor;
  grad: Tensor;
  shape: number[];
}

interface LinearParams { weight: Param; bias: Param | null }

interface LayerParams {
  inputNorm: Param; postAttentionNorm: Param; qNorm: Param | null; kNorm: Param | null;
  linears: Record<Projection, LinearParams>;
}

export interface LoraParams {
  projection: Projection; layer: number; rank: number; scale: number;
  a: Param; b: Param;
}

/**
 * Rows of several sequences, concatenated. targets[row] is the token whose logprob row predicts (−1: none).
 * A segment with a `prefix` continues another segment (a prompt stored once for several completions): its rows
 * attend to all of the prefix's rows, then causally to their own; their positions continue after the prefix.
 */
export interface SequenceBatch {
  tokens: Int32Array;
  positions: Int32Array;
  segments: PackedSegment[];
  targets: Int32Array;
}

/** A layer of a forward pass: its input, and its activations unless they are recomputed in the backward. */
interface SavedLayer {
  input: Tensor;
  acts: LayerActivations | null;
}

/**
 * A forward pass. Its tensors live on the backend until `backward` (which consumes the pass) or `release(pass)`.
 */
export interface ForwardPass {
  batch: SequenceBatch;
  useAdapter: boolean;
  /** per layer; empty when activations were not kept */
  layers: SavedLayer[];
  finalResidual: Tensor;
  finalRstd: Tensor;
  /** rows that have a target, in order; logprobs/entropies are indexed like this list */
  scoredRows: Int32Array;
  scoredHidden: Tensor;
  logprobs: Float32Array;
  entropies: Float32Array;
  logsumexp: Float32Array;
}

/**
 * Which layers' activations the backward recomputes instead of keeping: none (false), all (true), or "auto": a
 * layer's are kept while, with them, the backend's available memory still holds what the rest of the step needs at
 * once (see AUTO_RESERVE_LAYERS) and a logits block; on a backend that reports no memory (the CPU) "auto" keeps them
 * all.
 */
export type RecomputeActivations = boolean | "auto";

/**
 * What "auto" keeps free after a kept layer, in units of the memory a layer's forward took (measured: the backend's
 * available memory before minus after it, so the allocator's rounding counts). The worst moment after it is the
 * backward of a recomputed layer: its activations again (1 layer) and, beside them, its gradients and the products'
 * scratch. Measured on the CUDA backend's recording device at Qwen2.5 0.5B-14B widths, 8 × 1024 and 2 × 4096 tokens,
 * that working set is 1.09-1.20 layers and a forward's own transient peak 1.16-1.27; 2.5 leaves a tenth more.
 */
const AUTO_RESERVE_LAYERS = 2.5;

/** Memory "auto" leaves free beyond what it accounts for (cuBLAS workspace, small tensors). */
const recomputeMarginBytes = 512 << 20;

export interface DifferentiableTransformerOptions {
  /** null: full-parameter training (every weight gets a gradient) */
  lora: LoraConfig | null;
  /** default "auto" */
  recomputeActivations?: RecomputeActivations;
  /** seed of the LoRA A initialisation (B starts at zero, so a new adapter leaves the model unchanged) */
  seed?: number;
  /** start from this adapter (its rank, alpha and target modules replace `lora`) */
  adapter?: Adapter;
  /** the logits block of the logprob passes (default: the backend's own, backend.logitChunks) */
  chunks?: ChunkSizes;
}

/** A Transformer with the parameters being trained (LoRA adapters, or every weight) and their gradients. */
export class DifferentiableTransformer {
  readonly transformer: Transformer;
  readonly backend: Backend;
  readonly config: ModelConfig;
  readonly lora: LoraConfig | null;
  readonly loras: LoraParams[] = [];
  recomputeActivations: RecomputeActivations;
  chunks: ChunkSizes;
  private readonly embedding: Param;
  private readonly lmHead: Param;
  private readonly finalNorm: Param;
  private readonly layers: LayerParams[];
  private readonly loraByLayer: Partial<Record<Projection, LoraParams>>[];
  /** The tensors this model allocated (gradients; a LoRA's A and B and the stacks its A matrices are views of): free() frees them. */
  private readonly owned: Tensor[] = [];

  constructor(transformer: Transformer, options: DifferentiableTransformerOptions) {
    this.transformer = transformer;
    const backend = this.backend = transformer.backend;
    const config = this.config = transformer.config;
    const weights = transformer.weights;
    this.lora = options.adapter?.lora ?? options.lora;
    this.recomputeActivations = options.recomputeActivations ?? "auto";
    this.chunks = options.chunks ?? backend.logitChunks;
    const full = this.lora === null;
    const param = (name: string, tensor: Tensor): Param => {
      if (full && tensor.dtype !== "f32") {
        throw new ArtError("full_parameter_needs_f32", `full-parameter training updates every weight in place, but ${name} is stored ${tensor.dtype}; load the model with f32 weights or train a LoRA adapter`);
      }
      return new Param(name, tensor.shape, tensor, full ? this.own(backend.zeros(tensor.shape)) : null);
    };
    this.embedding = param("model.embed_tokens.weight", weights.embedding);
    this.finalNorm = param("model.norm.weight", weights.finalNorm);
    // Tied: the LM head IS the embedding parameter, so both uses add into one gradient.
    this.lmHead = config.tieWordEmbeddings ? this.embedding : param("lm_head.weight", weights.lmHead);
    this.layers = weights.layers.map((w, l) => {
      const p = `model.layers.${l}.`;
      const linears = {} as Record<Projection, LinearParams>;
      for (const proj of PROJECTIONS) {
        const path = projectionPath(l, proj);
        const { weight, bias } = w.projections[proj];
        linears[proj] = { weight: param(`${path}.weight`, weight), bias: bias === null ? null : param(`${path}.bias`, bias) };
      }
      return {
        inputNorm: param(`${p}input_layernorm.weight`, w.inputNorm),
        postAttentionNorm: param(`${p}post_attention_layernorm.weight`, w.postAttentionNorm),
        qNorm: w.qNorm ? param(`${p}self_attn.q_norm.weight`, w.qNorm) : null,
        kNorm: w.kNorm ? param(`${p}self_attn.k_norm.weight`, w.kNorm) : null,
        linears,
      };
    });
    this.loraByLayer = this.layers.map(() => ({}));
    if (this.lora !== null) this.initLora(this.lora, options.seed ?? 0);
    if (options.adapter) {
      for (const t of options.adapter.tensors) {
        const params = this.loraByLayer[t.layer][t.projection]!;
        backend.write(params.a.tensor, t.a);
        backend.write(params.b.tensor, t.b);
      }
    }
  }

  private own<T extends Tensor>(tensor: T): T {
    this.owned.push(tensor);
    return tensor;
  }

  /**
   * PEFT's default initialisation: A ~ kaiming-uniform(a=√5) = U(−1/√in, 1/√in), B = 0. Names follow PEFT's
   * adapter_model.safetensors keys. The A matrices of targets that read one input (lora.ts PROJECTION_GROUPS) are
   * rows of one tensor, in the group's order, and so are their gradients: a backend can take the group's down
   * products and their backward as one product each (projectionsBackward).
   */
  private initLora(lora: LoraConfig, seed: number): void {
    const backend = this.backend;
    const random = seededRandom(seed);
    const scale = loraScale(lora);
    for (let l = 0; l < this.layers.length; l++) {
      // Drawn in lora.targetModules' order, as PEFT creates them.
      const initial = new Map<Projection, Float32Array>();
      for (const proj of lora.targetModules) {
        const inFeatures = this.layers[l].linears[proj].weight.shape[1];
        const bound = 1 / Math.sqrt(inFeatures);
        const a = new Float32Array(lora.rank * inFeatures);
        for (let i = 0; i < a.length; i++) a[i] = (random() * 2 - 1) * bound;
        initial.set(proj, a);
      }
      const created = new Map<Projection, LoraParams>();
      for (const group of PROJECTION_GROUPS) {
        const targets = group.filter((proj) => initial.has(proj));
        if (targets.length === 0) continue;
        const inFeatures = this.layers[l].linears[targets[0]].weight.shape[1];
        const stackedShape = [targets.length * lora.rank, inFeatures];
        const values = new Float32Array(targets.length * lora.rank * inFeatures);
        targets.forEach((proj, t) => values.set(initial.get(proj)!, t * lora.rank * inFeatures));
        const ranks = targets.map(() => lora.rank);
        const as = stackedParts(backend, this.own(backend.upload(values, stackedShape)), ranks);
        const grads = stackedParts(backend, this.own(backend.zeros(stackedShape)), ranks);
        targets.forEach((proj, t) => {
          const outFeatures = this.layers[l].linears[proj].weight.shape[0];
          const prefix = `base_model.model.${projectionPath(l, proj)}`;
          const aShape = [lora.rank, inFeatures], bShape = [outFeatures, lora.rank];
          created.set(proj, {
            projection: proj, layer: l, rank: lora.rank, scale,
            a: new Param(`${prefix}.lora_A.weight`, aShape, as[t], grads[t]),
            b: new Param(`${prefix}.lora_B.weight`, bShape, this.own(backend.zeros(bShape)), this.own(backend.zeros(bShape))),
          });
        });
      }
      // In lora.targetModules' order: the parameter list, and so the optimiser's and the checkpoint's, keep it.
      for (const proj of lora.targetModules) {
        const params = created.get(proj)!;
        this.loras.push(params);
        this.loraByLayer[l][proj] = params;
      }
    }
  }

  /** Frees what this model allocated on the backend (LoRA A/B, gradients): for a model no longer trained. The base weights are the transformer's. */
  free(): void {
    for (const tensor of this.owned.splice(0)) this.backend.free(tensor);
  }

  /** The parameters the optimiser updates, as tensors: LoRA A/B (PEFT names), or every weight (HF names) in full mode. */
  parameterTensors(): ParameterTensors[] {
    return this.trainedParams().map((p) => ({ name: p.name, value: p.tensor, grad: p.gradTensor!, shape: p.shape }));
  }

  private trainedParams(): Param[] {
    return this.lora !== null ? this.loras.flatMap((p) => [p.a, p.b]) : this.allBaseParams();
  }

  private allBaseParams(): Param[] {
    const params = [this.embedding];
    for (const layer of this.layers) {
      params.push(layer.inputNorm);
      if (layer.qNorm) params.push(layer.qNorm);
      if (layer.kNorm) params.push(layer.kNorm);
      for (const proj of PROJECTIONS) {
        params.push(layer.linears[proj].weight);
        const bias = layer.linears[proj].bias;
        if (bias) params.push(bias);
      }
      params.push(layer.postAttentionNorm);
    }
    params.push(this.finalNorm);
    if (this.lmHead !== this.embedding) params.push(this.lmHead);
    return params;
  }

  zeroGradients(): void {
    this.backend.zero(this.trainedParams().map((p) => p.gradTensor!));
  }

  /** The adapter as the engine's per-layer LoRA: the very tensors AdamW updates, so inference sees every update. */
  engineLoras(): LayerLoras[] {
    return this.loraByLayer.map((_, l) => this.engineLorasOf(l));
  }

  /** Writes the adapter as a PEFT adapter directory (F32 tensors, so a reload is bit-identical). */
  saveAdapter(dir: string, baseModel = ""): void {
    if (this.lora === null) throw new ArtError("no_adapter", "saveAdapter: this model trains every weight (no LoRA); save a full checkpoint instead");
    const tensors = this.loras.flatMap((p) => [p.a, p.b]).map((param) => ({ name: param.name, shape: param.shape, data: this.backend.download(param.tensor) }));
    writeAdapter(dir, this.lora, tensors, baseModel);
  }

  // ---------------------------------------------------------------- forward

  forward(batch: SequenceBatch, options: { useAdapter?: boolean; keepActivations?: boolean } = {}): ForwardPass {
    const useAdapter = options.useAdapter ?? true;
    const keep = options.keepActivations ?? true;
    const b = this.backend, c = this.config;
    const n = batch.tokens.length;
    const d = c.hiddenSize;
    checkTokenIds(batch.tokens, c.vocabSize);
    const held = new Holdings(b);
    try {
      let x = held.empty([n, d]);
      b.embedding(this.embedding.tensor, batch.tokens, x);
      const layers: SavedLayer[] = [];
      // The memory a layer's forward takes, measured on the first (every layer has the same shapes): "auto" keeps
      // layers by it.
      let layerBytes: number | undefined;
      // Each layer's last add writes the next one's normed input (after the last layer, the final norm's output) as
      // one fused add + RMSNorm (LayerChain); the first layer norms its own.
      let normed: Normed | null = null;
      for (let l = 0; l < c.numLayers; l++) {
        const availableBefore = l === 0 && keep && this.recomputeActivations === "auto" ? this.backend.availableMemory?.() : undefined;
        const next: Normed = { attnInput: held.empty([n, d]), rstd1: held.empty([n]) };
        const nextNorm = l + 1 < c.numLayers ? this.layers[l + 1].inputNorm.tensor : this.finalNorm.tensor;
        const { acts, output } = this.layerForward(l, x, batch, useAdapter, { normed, nextNorm, next });
        for (const tensor of [...activationTensors(acts), output]) held.hold(tensor);
        if (availableBefore !== undefined) layerBytes = Math.max(0, availableBefore - this.backend.availableMemory!());
        if (!keep) {
          held.freeAll(activationTensors(acts));
          held.free(x);
        } else if (this.keepsActivations(layerBytes, (c.numLayers - 1 - l) * output.size * (output.dtype === "bf16" ? 2 : 4))) {
          layers.push({ input: x, acts });
        } else {
          held.freeAll(activationTensors(acts));
          layers.push({ input: x, acts: null });
        }
        x = output;
        normed = next;
      }
      const { attnInput: finalHidden, rstd1: finalRstd } = normed!;
      const scored: number[] = [];
      for (let r = 0; r < n; r++) if (batch.targets[r] >= 0) scored.push(r);
      const scoredRows = Int32Array.from(scored);
      const scoredHidden = held.empty([scored.length, d]);
      b.gatherRows(finalHidden, scoredRows, scoredHidden);
      held.free(finalHidden);
      const scoredTargets = Int32Array.from(scoredRows, (row) => batch.targets[row]);
      const { logprobs, entropies, logsumexp } = b.targetLogprobs(scoredHidden, this.lmHead.tensor, scoredTargets, this.chunks);
      const pass: ForwardPass = {
        batch, useAdapter, layers, finalResidual: x, finalRstd, scoredRows, scoredHidden, logprobs, entropies, logsumexp,
      };
      if (!keep) this.release(pass);
      return pass;
    } catch (error) {
      held.freeAll();
      throw error;
    }
  }

  /**
   * Whether a layer's activations, just computed, stay for the backward (see RecomputeActivations): `layerBytes` is
   * what a layer's forward took of the backend's memory (undefined where the backend reports none), `laterInputsBytes`
   * what the later layers' inputs will hold (every layer keeps its input, recomputed or not).
   */
  private keepsActivations(layerBytes: number | undefined, laterInputsBytes: number): boolean {
    if (this.recomputeActivations !== "auto") return !this.recomputeActivations;
    const available = this.backend.availableMemory?.();
    if (available === undefined || layerBytes === undefined) return true;
    const logitsBlock = this.chunks.rowChunk * this.chunks.vocabChunk * 4;
    return available >= AUTO_RESERVE_LAYERS * layerBytes + laterInputsBytes + logitsBlock + recomputeMarginBytes;
  }

  /** Frees what a forward pass holds on the backend (backward does this itself). */
  release(pass: ForwardPass): void {
    for (const saved of pass.layers) {
      if (saved.acts) this.freeActivations(saved.acts);
      this.backend.free(saved.input);
    }
    pass.layers = [];
    for (const tensor of [pass.finalResidual, pass.finalRstd, pass.scoredHidden]) this.backend.free(tensor);
  }

  /** Frees what a layer's forward kept for its backward (qkv, attnOut and mlpOut went when the forward ended). */
  private freeActivations(acts: LayerActivations): void {
    for (const tensor of activationTensors(acts)) this.backend.free(tensor);
  }

  /**
   * One layer through Transformer.layerForward with buffers of its own, but for its normed input where the layer
   * before wrote it (`chain.normed`); with `chain`, its last add writes `chain.next` (LayerChain). Returns the buffers
   * and the layer's output.
   */
  private layerForward(l: number, input: Tensor, batch: SequenceBatch, useAdapter: boolean,
    chain?: { normed: Normed | null; nextNorm: Tensor; next: Normed }): { acts: LayerActivations; output: Tensor } {
    const b = this.backend, c = this.config, w = this.layers[l];
    const n = batch.tokens.length;
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = c;
    const held = new Holdings(b);
    try {
      // Every activation is written whole by the op that produces it (a product, a norm, SwiGLU, the residual adds),
      // so none is zeroed first; packed attention writes only the rows of segments, so its output is zeroed unless they
      // cover every row (as toBatch's always do).
      const z = (width: number) => held.empty([n, width]);
      const covered = segmentsCoverRows(batch.segments, n);
      const loras = useAdapter ? this.engineLorasOf(l) : undefined;
      // A group's x·Aᵀ side by side in one tensor, in the order of its stacked A matrices (initLora).
      const loraDown: LayerActivations["loraDown"] = {};
      for (const group of PROJECTION_GROUPS) {
        const targets = group.filter((projection) => loras?.[projection]);
        if (targets.length === 0) continue;
        const tensor = z(targets.reduce((width, projection) => width + loras![projection]!.a.shape[0], 0));
        let column = 0;
        for (const projection of targets) {
          loraDown[projection] = { tensor, column };
          column += loras![projection]!.a.shape[0];
        }
      }
      // Without the q/k norm, the split writes q, k and v rotated, for the attention alone: as attentionInputs (bf16 on
      // a GPU, half the bytes, the same values the attention reads). With it, the norms and RoPE in between work in f32.
      const qkNorm = w.qNorm !== null && w.kNorm !== null;
      const attentionInput = (width: number) => held.empty([n, width], qkNorm ? "f32" : b.attentionInputs);
      const qRaw = attentionInput(h * hd), kRaw = attentionInput(kv * hd);
      const acts: LayerActivations = {
        attnInput: chain?.normed?.attnInput ?? z(d), rstd1: chain?.normed?.rstd1 ?? held.empty([n]), qkv: z((h + 2 * kv) * hd), qRaw, kRaw, qRstd: qkNorm ? held.empty([n * h]) : null,
        kRstd: qkNorm ? held.empty([n * kv]) : null, q: qkNorm ? z(h * hd) : qRaw, k: qkNorm ? z(kv * hd) : kRaw, v: attentionInput(kv * hd),
        attn: covered ? z(h * hd) : held.zeros([n, h * hd]), attnSaved: null, attnOut: z(d), mid: z(d), mlpInput: z(d), rstd2: held.empty([n]), gateUp: z(2 * inter),
        hidden: z(inter), mlpOut: z(d), loraDown,
      };
      const output = z(d);
      const attend: Attend = (_layer, q, k, v, out) => held.hold(b.packedAttention(q, k, v, batch.segments, hd, out));
      const links: LayerChain | undefined = chain && { normed: chain.normed !== null, nextNorm: chain.nextNorm, next: chain.next };
      this.transformer.layerForward(l, input, output, acts, batch.positions, attend, loras, links);
      for (const scratch of [acts.qkv, acts.attnOut, acts.mlpOut]) held.free(scratch);
      return { acts, output };
    } catch (error) {
      held.freeAll();
      throw error;
    }
  }

  private engineLorasOf(l: number): LayerLoras {
    const out: LayerLoras = {};
    for (const p of Object.values(this.loraByLayer[l])) out[p.projection] = { a: p.a.tensor, b: p.b.tensor, scale: p.scale };
    return out;
  }

  // ---------------------------------------------------------------- backward

  /**
   * Accumulates parameter gradients for d(loss)/d(logprobs[i]) = dLogprobs[i] (indexed like pass.scoredRows), and
   * frees the pass. Call zeroGradients() before the first micro-batch of a step.
   */
  backward(pass: ForwardPass, dLogprobs: Float32Array): void {
    if (!pass.useAdapter && this.lora !== null) throw new ArtError("bad_backward", "backward needs a forward pass with the adapter enabled");
    const b = this.backend, c = this.config;
    const n = pass.batch.tokens.length;
    const d = c.hiddenSize;
    if (pass.layers.length !== c.numLayers) throw new ArtError("bad_backward", "backward needs a forward pass that kept its activations (each pass serves one backward)");
    const scoredTargets = Int32Array.from(pass.scoredRows, (row) => pass.batch.targets[row]);
    // On failure, what the backward holds and the pass itself go back to the backend (gradients stay half-accumulated
    // until the next zeroGradients).
    const held = new Holdings(b);
    try {
      const dScored = held.zeros([pass.scoredRows.length, d]);
      b.targetLogprobsBackward(pass.scoredHidden, this.lmHead.tensor, scoredTargets, pass.logsumexp, dLogprobs, dScored, this.lmHead.gradTensor,
        this.chunks);
      const dFinal = held.zeros([n, d]);
      b.gatherRowsBackward(pass.scoredRows, dScored, dFinal);
      held.free(dScored);
      let dx = held.zeros([n, d]);
      b.rmsNormBackward(pass.finalResidual, this.finalNorm.tensor, pass.finalRstd, dFinal, dx, this.finalNorm.gradTensor);
      held.free(dFinal);
      for (let l = c.numLayers - 1; l >= 0; l--) {
        const saved = pass.layers[l];
        let acts = saved.acts;
        if (!acts) {
          const recomputed = this.layerForward(l, saved.input, pass.batch, true);
          b.free(recomputed.output);
          acts = recomputed.acts;
          for (const tensor of activationTensors(acts)) held.hold(tensor);
        }
        this.layerBackward(l, saved.input, acts, dx, pass.batch);
        // Done with this layer: only its input stays (the previous layer's output), freed with the pass.
        if (saved.acts) this.freeActivations(saved.acts);
        else held.freeAll(activationTensors(acts));
        saved.acts = null;
      }
      if (this.embedding.gradTensor) b.embeddingBackward(pass.batch.tokens, dx, this.embedding.gradTensor);
      held.free(dx);
    } catch (error) {
      held.freeAll();
      throw error;
    } finally {
      this.release(pass);
    }
  }

  /**
   * Turns d(loss)/d(layer output) in `dResidual` into d(loss)/d(layer input), in place, accumulating parameter
   * gradients: the residual stream carries its gradient through the layer unchanged, and each sublayer adds its own.
   */
  private layerBackward(l: number, input: Tensor, acts: LayerActivations, dResidual: Tensor, batch: SequenceBatch): void {
    const b = this.backend, c = this.config, w = this.layers[l], invFreq = this.transformer.invFreq;
    const held = new Holdings(b);
    const n = batch.tokens.length;
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = c;
    /** The backward of projections reading x, whose output gradients are dOuts, into dx: a fresh buffer (empty) this writes. */
    const projectionsBack = (projections: readonly Projection[], x: Tensor, dOuts: Tensor[], dx: Tensor) => {
      b.projectionsBackward(x, projections.map((proj, i): ProjectionGradient => {
        const { weight, bias } = w.linears[proj];
        const lora = this.loraByLayer[l][proj], down = acts.loraDown[proj];
        return {
          weight: weight.tensor, dOut: dOuts[i], dWeight: weight.gradTensor, dBias: bias?.gradTensor ?? null,
          lora: lora && down ? { weights: { a: lora.a.tensor, b: lora.b.tensor, scale: lora.scale }, down, dA: lora.a.gradTensor!, dB: lora.b.gradTensor! } : undefined,
        };
      }), dx, true);
    };
    try {
      // MLP: out = mid + down(swiglu(gate(m), up(m))), m = norm2(mid)
      // Each gradient buffer's first writer writes it (overwrite), so none is zeroed first.
      const dHidden = held.empty([n, inter]);
      projectionsBack(["down_proj"], acts.hidden, [dResidual], dHidden);
      const dGate = held.empty([n, inter]);
      const dUp = held.empty([n, inter]);
      b.swigluBackward(acts.gateUp, dHidden, dGate, dUp, true, gateUpLoras(this.engineLorasOf(l), acts, inter));
      const dMlpInput = held.empty([n, d]);
      projectionsBack(["gate_proj", "up_proj"], acts.mlpInput, [dGate, dUp], dMlpInput);
      // dResidual becomes d(loss)/d(mid): the residual branch's gradient plus the MLP input norm's.
      b.rmsNormBackward(acts.mid, w.postAttentionNorm.tensor, acts.rstd2!, dMlpInput, dResidual, w.postAttentionNorm.gradTensor);
      for (const t of [dHidden, dGate, dUp, dMlpInput]) held.free(t);
      // attention: mid = input + o(attn(rope(norm?(q(a))), rope(norm?(k(a))), v(a))), a = norm1(input)
      const dAttn = held.empty([n, h * hd]);
      projectionsBack(["o_proj"], acts.attn, [dResidual], dAttn);
      const dq = held.empty([n, h * hd]);
      const dk = held.empty([n, kv * hd]);
      const dv = held.empty([n, kv * hd]);
      b.packedAttentionBackward(acts.q, acts.k, acts.v, acts.attn, acts.attnSaved!, batch.segments, hd, dAttn, dq, dk, dv, true);
      held.free(dAttn);
      b.ropeBackward(dq, dk, batch.positions, invFreq, hd);
      let dqRaw = dq, dkRaw = dk;
      if (w.qNorm && w.kNorm && acts.qRstd && acts.kRstd) {
        dqRaw = held.zeros([n, h * hd]);
        dkRaw = held.zeros([n, kv * hd]);
        b.rmsNormBackward(acts.qRaw, w.qNorm.tensor, acts.qRstd, dq, dqRaw, w.qNorm.gradTensor);
        b.rmsNormBackward(acts.kRaw, w.kNorm.tensor, acts.kRstd, dk, dkRaw, w.kNorm.gradTensor);
        held.free(dq);
        held.free(dk);
      }
      const dAttnInput = held.empty([n, d]);
      projectionsBack(["q_proj", "k_proj", "v_proj"], acts.attnInput, [dqRaw, dkRaw, dv], dAttnInput);
      for (const t of [dqRaw, dkRaw, dv]) held.free(t);
      // And d(loss)/d(input): d(mid) plus the attention input norm's.
      b.rmsNormBackward(input, w.inputNorm.tensor, acts.rstd1!, dAttnInput, dResidual, w.inputNorm.gradTensor);
      held.free(dAttnInput);
    } catch (error) {
      held.freeAll();
      throw error;
    }
  }
}

/** A layer's normed input and its 1/rms, written by the layer before (LayerChain's `next`). */
interface Normed {
  attnInput: Tensor;
  rstd1: Tensor;
}

/**
 * The tensors a pass has allocated and not yet freed or handed on. If the pass fails part-way (out of GPU memory, most
 * often), freeing them leaves the backend's memory as the pass found it, so the engine goes on serving and training.
 */
class Holdings {
  readonly #tensors = new Set<Tensor>();
  readonly #backend: Backend;
  constructor(backend: Backend) {
    this.#backend = backend;
  }
  hold<T extends Tensor>(tensor: T): T {
    this.#tensors.add(tensor);
    return tensor;
  }
  zeros(shape: readonly number[]): Tensor {
    return this.hold(this.#backend.zeros(shape));
  }
  /** Backend.empty: for an output its op writes whole. */
  empty(shape: readonly number[], dtype?: DType): Tensor {
    return this.hold(this.#backend.empty(shape, dtype));
  }
  free(tensor: Tensor): void {
    this.#tensors.delete(tensor);
    this.#backend.free(tensor);
  }
  /** Frees `tensors` (default: everything still held). */
  freeAll(tensors: Iterable<Tensor> = [...this.#tensors]): void {
    for (const tensor of tensors) this.free(tensor);
  }
}

/** The tensors a layer's forward keeps for its backward, each once (qkv, attnOut and mlpOut went when the forward ended). */
function activationTensors(acts: LayerActivations): Set<Tensor> {
  const { qkv: _qkv, attnOut: _attnOut, mlpOut: _mlpOut, loraDown, ...kept } = acts;
  const tensors = new Set<Tensor>(Object.values(loraDown).map((down) => down.tensor));
  for (const tensor of Object.values(kept)) if (tensor) tensors.add(tensor);
  return tensors;
}
