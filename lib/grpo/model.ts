/**
 * The transformer's training pass: forward that keeps every named activation, and the matching hand-written
 * backward, per layer (llm.c style), for qwen2 / qwen3 / llama. Written once against TrainingOps (training-ops.ts):
 * on the CPU the ops are the Float32Array kernels of ops.ts, on a device its kernels.
 *
 * The base weights are the engine's own tensors, not a copy: rollouts and training share one set of weights in
 * memory. LoRA adapters live here (A, B and their gradients, f32 tensors on the same backend) and are handed to the
 * engine as those very tensors, so a sampler sees every optimiser update at once.
 *
 * Two modes: LoRA (base frozen, gradients only for A/B of the chosen projections) and full-parameter (every weight
 * has a gradient; for SFT of small models). With `recomputeActivations` only each layer's input is kept and the layer
 * is recomputed during the backward, so activation memory is one layer's worth plus N×D per layer.
 *
 * A batch is several sequences concatenated row-wise; attention stays within each sequence (segment).
 */
import { ArtError } from "../core/errors.ts";
import { checkTokenIds, type Tensor } from "../model/backend.ts";
import type { ModelConfig } from "../model/config.ts";
import { CpuTensor } from "../model/cpu/backend.ts";
import { ropeInverseFrequencies, type LayerLoras, type ModelWeights, type ProjectionName } from "../model/transformer.ts";
import type { ParameterTensors, TrainableParameter } from "./adamw.ts";
import type { Adapter } from "./peft.ts";
import { loraScale, PROJECTIONS, type LoraConfig, type Projection } from "./config.ts";
import { cpuTrainingOps } from "./cpu-training-ops.ts";
import type { ChunkSizes } from "./logprobs.ts";
import type { AttentionShape, RopeTensors, TrainingOps } from "./training-ops.ts";
import { seededRandom } from "../core/random.ts";

/** Where each projection lives in a Hugging Face / PEFT checkpoint, and its name in the engine's LayerLoras. */
const PROJECTION_INFO: Record<Projection, { module: "self_attn" | "mlp"; engineName: ProjectionName }> = {
  q_proj: { module: "self_attn", engineName: "qProj" },
  k_proj: { module: "self_attn", engineName: "kProj" },
  v_proj: { module: "self_attn", engineName: "vProj" },
  o_proj: { module: "self_attn", engineName: "oProj" },
  gate_proj: { module: "mlp", engineName: "gateProj" },
  up_proj: { module: "mlp", engineName: "upProj" },
  down_proj: { module: "mlp", engineName: "downProj" },
};

/** The engine's name for a projection in LayerLoras. */
export function engineProjectionName(projection: Projection): ProjectionName {
  return PROJECTION_INFO[projection].engineName;
}

/** [out, in] of a projection's weight for this model. */
export function projectionShape(config: ModelConfig, projection: Projection): { outFeatures: number; inFeatures: number } {
  const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = config;
  const shapes: Record<Projection, [number, number]> = {
    q_proj: [h * hd, d], k_proj: [kv * hd, d], v_proj: [kv * hd, d], o_proj: [d, h * hd],
    gate_proj: [inter, d], up_proj: [inter, d], down_proj: [d, inter],
  };
  const [outFeatures, inFeatures] = shapes[projection];
  return { outFeatures, inFeatures };
}

/** `model.layers.N.self_attn.q_proj` — the module path shared by HF weight names and PEFT adapter names. */
export function projectionPath(layer: number, projection: Projection): string {
  return `model.layers.${layer}.${PROJECTION_INFO[projection].module}.${projection}`;
}

/**
 * A parameter: its value and gradient (null when frozen) as tensors of the training backend, and its shape.
 * `value` / `grad` are the same numbers as host arrays, for CPU training (they are the tensors' own arrays there).
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
  get value(): Float32Array {
    return hostArray(this.tensor, this.name);
  }
  get grad(): Float32Array | null {
    return this.gradTensor === null ? null : hostArray(this.gradTensor, `the gradient of ${this.name}`);
  }
}

function hostArray(tensor: Tensor, what: string): Float32Array {
  if (!(tensor instanceof CpuTensor)) {
    throw new ArtError("parameters_on_device", `${what} lives on the GPU, not in a host array; use model.parameterTensors() and model.ops.download(tensor) to read it`);
  }
  return tensor.data;
}

interface LinearParams { weight: Param; bias: Param | null; inFeatures: number; outFeatures: number }

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
  segments: Segment[];
  targets: Int32Array;
}

export interface Segment { start: number; length: number; prefix?: { start: number; length: number } }

/** Everything one layer's backward needs. */
interface LayerActivations {
  input: Tensor; attnInput: Tensor; rstd1: Tensor;
  qRaw: Tensor; kRaw: Tensor; qRstd: Tensor | null; kRstd: Tensor | null;
  q: Tensor; k: Tensor; v: Tensor;
  /** what the attention backward needs besides q, k, v */
  attnSaved: Tensor;
  attn: Tensor; mid: Tensor; mlpInput: Tensor; rstd2: Tensor;
  gate: Tensor; up: Tensor; hidden: Tensor;
  /** x·Aᵀ per LoRA projection */
  loraDown: Partial<Record<Projection, Tensor>>;
}

function isLayerActivations(saved: LayerActivations | Tensor): saved is LayerActivations {
  return "loraDown" in saved;
}

/**
 * A forward pass. Its tensors live on the training backend until `backward` (which consumes the pass) or
 * `model.release(pass)`.
 */
export interface ForwardPass {
  batch: SequenceBatch;
  useAdapter: boolean;
  rope: RopeTensors;
  /** per layer: full activations, or only the input when recomputing; empty when activations were not kept */
  layers: (LayerActivations | Tensor)[];
  finalResidual: Tensor;
  finalRstd: Tensor;
  /** rows that have a target, in order; logprobs/entropies are indexed like this list */
  scoredRows: Int32Array;
  scoredHidden: Tensor;
  logprobs: Float32Array;
  entropies: Float32Array;
  logsumexp: Float32Array;
}

export interface TrainingModelOptions {
  /** null: full-parameter training (every weight gets a gradient) */
  lora: LoraConfig | null;
  recomputeActivations?: boolean;
  /** seed of the LoRA A initialisation (B starts at zero, so a new adapter leaves the model unchanged) */
  seed?: number;
  /** start from this adapter (its rank, alpha and target modules replace `lora`) */
  adapter?: Adapter;
  /** the logits block of the logprob passes (default: the ops' own, ops.logitChunks) */
  chunks?: ChunkSizes;
  /** the ops of the backend holding `weights` (default: the CPU's) */
  ops?: TrainingOps;
}

export class TrainingModel {
  readonly config: ModelConfig;
  readonly lora: LoraConfig | null;
  readonly loras: LoraParams[] = [];
  readonly ops: TrainingOps;
  recomputeActivations: boolean;
  chunks: ChunkSizes;
  private readonly embedding: Param;
  private readonly lmHead: Param;
  private readonly finalNorm: Param;
  private readonly layers: LayerParams[];
  private readonly loraByLayer: Partial<Record<Projection, LoraParams>>[];
  private readonly invFreq: Float32Array;

  constructor(config: ModelConfig, weights: ModelWeights, options: TrainingModelOptions) {
    this.config = config;
    this.lora = options.adapter?.lora ?? options.lora;
    this.recomputeActivations = options.recomputeActivations ?? false;
    const ops = this.ops = options.ops ?? cpuTrainingOps;
    this.chunks = options.chunks ?? ops.logitChunks;
    const full = this.lora === null;
    if (full && !ops.fullParameter) {
      throw new ArtError("cuda_unsupported", `full-parameter training runs on the CPU only; train a LoRA adapter on ${ops.name}, or load the model with device "cpu"`);
    }
    const param = (name: string, tensor: Tensor): Param => {
      if (!ops.owns(tensor)) {
        throw new ArtError(ops.name === "cpu" ? "training_needs_cpu" : "wrong_backend",
          `training runs on ${ops.name} tensors; ${name} lives on another backend (load the model with device "${ops.name}", or pass the training ops of its backend)`);
      }
      if (full && tensor.dtype !== "f32") {
        throw new ArtError("full_parameter_needs_f32", `full-parameter training updates every weight in place, but ${name} is stored ${tensor.dtype}; load the model with f32 weights or train a LoRA adapter`);
      }
      return new Param(name, tensor.shape, tensor, full ? ops.zeros(tensor.shape) : null);
    };
    this.embedding = param("model.embed_tokens.weight", weights.embedding);
    this.finalNorm = param("model.norm.weight", weights.finalNorm);
    // Tied: the LM head IS the embedding parameter, so both uses add into one gradient.
    this.lmHead = config.tieWordEmbeddings ? this.embedding : param("lm_head.weight", weights.lmHead);
    this.layers = weights.layers.map((w, l) => {
      const p = `model.layers.${l}.`;
      const bias = { q_proj: w.qBias, k_proj: w.kBias, v_proj: w.vBias, o_proj: w.oBias, gate_proj: null, up_proj: null, down_proj: null };
      const weight = { q_proj: w.qProj, k_proj: w.kProj, v_proj: w.vProj, o_proj: w.oProj, gate_proj: w.gateProj, up_proj: w.upProj, down_proj: w.downProj };
      const linears = {} as Record<Projection, LinearParams>;
      for (const proj of PROJECTIONS) {
        const path = projectionPath(l, proj);
        const b = bias[proj];
        linears[proj] = {
          weight: param(`${path}.weight`, weight[proj]),
          bias: b === null ? null : param(`${path}.bias`, b),
          ...projectionShape(config, proj),
        };
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
        ops.write(params.a.tensor, t.a);
        ops.write(params.b.tensor, t.b);
      }
    }
    this.invFreq = ropeInverseFrequencies(config.headDim, config.ropeTheta, config.ropeScaling);
  }

  /**
   * PEFT's default initialisation: A ~ kaiming-uniform(a=√5) = U(−1/√in, 1/√in), B = 0. Names follow PEFT's
   * adapter_model.safetensors keys.
   */
  private initLora(lora: LoraConfig, seed: number): void {
    const ops = this.ops;
    const random = seededRandom(seed);
    const scale = loraScale(lora);
    for (let l = 0; l < this.layers.length; l++) {
      for (const proj of lora.targetModules) {
        const { inFeatures, outFeatures } = this.layers[l].linears[proj];
        const bound = 1 / Math.sqrt(inFeatures);
        const a = new Float32Array(lora.rank * inFeatures);
        for (let i = 0; i < a.length; i++) a[i] = (random() * 2 - 1) * bound;
        const prefix = `base_model.model.${projectionPath(l, proj)}`;
        const aShape = [lora.rank, inFeatures], bShape = [outFeatures, lora.rank];
        const params: LoraParams = {
          projection: proj, layer: l, rank: lora.rank, scale,
          a: new Param(`${prefix}.lora_A.weight`, aShape, ops.upload(a, aShape), ops.zeros(aShape)),
          b: new Param(`${prefix}.lora_B.weight`, bShape, ops.zeros(bShape), ops.zeros(bShape)),
        };
        this.loras.push(params);
        this.loraByLayer[l][proj] = params;
      }
    }
  }

  /** The parameters the optimiser updates, as tensors: LoRA A/B (PEFT names), or every weight (HF names) in full mode. */
  parameterTensors(): ParameterTensors[] {
    return this.trainedParams().map((p) => ({ name: p.name, value: p.tensor, grad: p.gradTensor!, shape: p.shape }));
  }

  /** parameterTensors() as host arrays (CPU training: the very arrays the model trains). */
  trainableParameters(): TrainableParameter[] {
    return this.trainedParams().map((p) => ({ name: p.name, value: p.value, grad: p.grad!, shape: p.shape }));
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
    for (const p of this.trainedParams()) this.ops.zero(p.gradTensor!);
  }

  /** The adapter as the engine's per-layer LoRA: the very tensors AdamW updates, so inference sees every update. */
  engineLoras(): LayerLoras[] {
    return this.loraByLayer.map((byProj) => {
      const out: LayerLoras = {};
      for (const p of Object.values(byProj)) out[engineProjectionName(p.projection)] = { a: p.a.tensor, b: p.b.tensor, scale: p.scale };
      return out;
    });
  }

  // ---------------------------------------------------------------- forward

  forward(batch: SequenceBatch, options: { useAdapter?: boolean; keepActivations?: boolean } = {}): ForwardPass {
    const useAdapter = options.useAdapter ?? true;
    const keep = options.keepActivations ?? true;
    const ops = this.ops, c = this.config;
    const n = batch.tokens.length;
    const d = c.hiddenSize;
    checkTokenIds(batch.tokens, c.vocabSize);
    const rope = ops.ropeTables(batch.positions, this.invFreq);
    let x = ops.zeros([n, d]);
    ops.embedding(x, this.embedding.tensor, batch.tokens, d);
    const layers: (LayerActivations | Tensor)[] = [];
    for (let l = 0; l < c.numLayers; l++) {
      const { acts, output } = this.layerForward(l, x, batch, rope, useAdapter);
      if (!keep) this.freeActivations(acts, false);
      else if (this.recomputeActivations) this.freeActivations(acts, true);
      layers.push(this.recomputeActivations ? acts.input : acts);
      x = output;
    }
    const finalRstd = ops.zeros([n]);
    const finalHidden = ops.zeros([n, d]);
    ops.rmsnorm(finalHidden, finalRstd, x, this.finalNorm.tensor, n, d, c.rmsNormEps);
    const scored: number[] = [];
    for (let r = 0; r < n; r++) if (batch.targets[r] >= 0) scored.push(r);
    const scoredRows = Int32Array.from(scored);
    const scoredHidden = ops.zeros([scored.length, d]);
    ops.gatherRows(scoredHidden, finalHidden, scoredRows, d);
    ops.free(finalHidden);
    const scoredTargets = Int32Array.from(scoredRows, (row) => batch.targets[row]);
    const { logprobs, entropies, logsumexp } = ops.logprobs(scoredHidden, this.lmHead.tensor, scoredTargets, d, c.vocabSize, this.chunks);
    const pass: ForwardPass = {
      batch, useAdapter, rope, layers: keep ? layers : [], finalResidual: x, finalRstd, scoredRows, scoredHidden,
      logprobs, entropies, logsumexp,
    };
    if (!keep) this.release(pass);
    return pass;
  }

  /** Frees what a forward pass holds on the backend (backward does this itself). */
  release(pass: ForwardPass): void {
    for (const saved of pass.layers) {
      if (isLayerActivations(saved)) this.freeActivations(saved, false);
      else this.ops.free(saved);
    }
    pass.layers = [];
    for (const tensor of [pass.finalResidual, pass.finalRstd, pass.scoredHidden, pass.rope.cos, pass.rope.sin]) this.ops.free(tensor);
  }

  /** Frees a layer's activations; `keepInput` keeps its input (what recomputation starts from). */
  private freeActivations(acts: LayerActivations, keepInput: boolean): void {
    const { input, qRstd, kRstd, loraDown, ...always } = acts;
    const tensors: Tensor[] = [...Object.values(always), ...Object.values(loraDown)];
    if (!keepInput) tensors.push(input);
    if (qRstd) tensors.push(qRstd);
    if (kRstd) tensors.push(kRstd);
    for (const tensor of tensors) this.ops.free(tensor);
  }

  private layerForward(
    l: number, input: Tensor, batch: SequenceBatch, rope: RopeTensors, useAdapter: boolean,
  ): { acts: LayerActivations; output: Tensor } {
    const ops = this.ops, c = this.config, w = this.layers[l];
    const n = batch.tokens.length;
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter, rmsNormEps: eps } = c;
    const loraDown: Partial<Record<Projection, Tensor>> = {};
    const linear = (proj: Projection, x: Tensor): Tensor => {
      const lin = w.linears[proj];
      const out = ops.zeros([n, lin.outFeatures]);
      ops.linear(out, x, lin.weight.tensor, lin.bias?.tensor ?? null, n, lin.inFeatures, lin.outFeatures);
      const lora = useAdapter ? this.loraByLayer[l][proj] : undefined;
      if (lora) {
        const down = ops.zeros([n, lora.rank]);
        ops.loraForward(out, down, x, lora.a.tensor, lora.b.tensor, lora.scale, n, lin.inFeatures, lin.outFeatures, lora.rank);
        loraDown[proj] = down;
      }
      return out;
    };
    const attnInput = ops.zeros([n, d]);
    const rstd1 = ops.zeros([n]);
    ops.rmsnorm(attnInput, rstd1, input, w.inputNorm.tensor, n, d, eps);
    const qRaw = linear("q_proj", attnInput);
    const kRaw = linear("k_proj", attnInput);
    const v = linear("v_proj", attnInput);
    let q: Tensor, k: Tensor, qRstd: Tensor | null = null, kRstd: Tensor | null = null;
    if (w.qNorm && w.kNorm) {
      q = ops.zeros([n, h * hd]);
      k = ops.zeros([n, kv * hd]);
      qRstd = ops.zeros([n * h]);
      kRstd = ops.zeros([n * kv]);
      ops.rmsnorm(q, qRstd, qRaw, w.qNorm.tensor, n * h, hd, eps);
      ops.rmsnorm(k, kRstd, kRaw, w.kNorm.tensor, n * kv, hd, eps);
    } else {
      q = ops.copy(qRaw);
      k = ops.copy(kRaw);
    }
    ops.rope(q, rope, n, h, false);
    ops.rope(k, rope, n, kv, false);
    const attn = ops.zeros([n, h * hd]);
    const attnSaved = ops.attention(attn, q, k, v, batch.segments, this.attentionShape());
    const attnOut = linear("o_proj", attn);
    const mid = ops.zeros([n, d]);
    ops.add(mid, input, attnOut);
    ops.free(attnOut);
    const mlpInput = ops.zeros([n, d]);
    const rstd2 = ops.zeros([n]);
    ops.rmsnorm(mlpInput, rstd2, mid, w.postAttentionNorm.tensor, n, d, eps);
    const gate = linear("gate_proj", mlpInput);
    const up = linear("up_proj", mlpInput);
    const hidden = ops.zeros([n, inter]);
    ops.swiglu(hidden, gate, up, n * inter);
    const output = linear("down_proj", hidden);
    ops.add(output, output, mid);
    const acts: LayerActivations = {
      input, attnInput, rstd1, qRaw, kRaw, qRstd, kRstd, q, k, v, attnSaved, attn, mid, mlpInput, rstd2, gate, up, hidden, loraDown,
    };
    return { acts, output };
  }

  private attentionShape(): AttentionShape {
    return { heads: this.config.numHeads, kvHeads: this.config.numKvHeads, headDim: this.config.headDim };
  }

  // ---------------------------------------------------------------- backward

  /**
   * Accumulates parameter gradients for d(loss)/d(logprobs[i]) = dLogprobs[i] (indexed like pass.scoredRows), and
   * frees the pass. Call zeroGradients() before the first micro-batch of a step.
   */
  backward(pass: ForwardPass, dLogprobs: Float32Array): void {
    if (!pass.useAdapter && this.lora !== null) throw new ArtError("bad_backward", "backward needs a forward pass with the adapter enabled");
    const ops = this.ops, c = this.config;
    const n = pass.batch.tokens.length;
    const d = c.hiddenSize;
    if (pass.layers.length !== c.numLayers) throw new ArtError("bad_backward", "backward needs a forward pass that kept its activations (each pass serves one backward)");
    const scoredTargets = Int32Array.from(pass.scoredRows, (row) => pass.batch.targets[row]);
    const dScored = ops.zeros([pass.scoredRows.length, d]);
    ops.logprobsBackward(dScored, this.lmHead.gradTensor, dLogprobs, pass.scoredHidden, this.lmHead.tensor, scoredTargets,
      pass.logsumexp, d, c.vocabSize, this.chunks);
    const dFinal = ops.zeros([n, d]);
    ops.scatterRows(dFinal, dScored, pass.scoredRows, d);
    ops.free(dScored);
    let dx = ops.zeros([n, d]);
    ops.rmsnormBackward(dx, this.finalNorm.gradTensor, dFinal, pass.finalResidual, pass.finalRstd, this.finalNorm.tensor, n, d);
    ops.free(dFinal);
    for (let l = c.numLayers - 1; l >= 0; l--) {
      const saved = pass.layers[l];
      let acts: LayerActivations;
      if (isLayerActivations(saved)) {
        acts = saved;
      } else {
        const recomputed = this.layerForward(l, saved, pass.batch, pass.rope, true);
        ops.free(recomputed.output);
        acts = recomputed.acts;
      }
      const dInput = this.layerBackward(l, acts, dx, pass.batch, pass.rope);
      // Done with this layer: only its input stays (the previous layer's output), freed with the pass.
      this.freeActivations(acts, true);
      pass.layers[l] = acts.input;
      ops.free(dx);
      dx = dInput;
    }
    if (this.embedding.gradTensor) ops.embeddingBackward(this.embedding.gradTensor, dx, pass.batch.tokens, d);
    ops.free(dx);
    this.release(pass);
  }

  /** Takes d(loss)/d(layer output) and returns d(loss)/d(layer input), accumulating parameter gradients. */
  private layerBackward(l: number, acts: LayerActivations, dOut: Tensor, batch: SequenceBatch, rope: RopeTensors): Tensor {
    const ops = this.ops, c = this.config, w = this.layers[l];
    const n = batch.tokens.length;
    const { hiddenSize: d, numHeads: h, numKvHeads: kv, headDim: hd, intermediateSize: inter } = c;
    const linearBack = (proj: Projection, dx: Tensor, dy: Tensor, x: Tensor) => {
      const lin = w.linears[proj];
      ops.linearBackward(dx, lin.weight.gradTensor, lin.bias?.gradTensor ?? null, dy, x, lin.weight.tensor, n, lin.inFeatures, lin.outFeatures);
      const lora = this.loraByLayer[l][proj];
      const down = acts.loraDown[proj];
      if (lora && down) {
        ops.loraBackward(dx, lora.a.gradTensor!, lora.b.gradTensor!, dy, x, down, lora.a.tensor, lora.b.tensor, lora.scale,
          n, lin.inFeatures, lin.outFeatures, lora.rank);
      }
    };
    // MLP: out = mid + down(swiglu(gate(m), up(m))), m = norm2(mid)
    const dHidden = ops.zeros([n, inter]);
    linearBack("down_proj", dHidden, dOut, acts.hidden);
    const dGate = ops.zeros([n, inter]);
    const dUp = ops.zeros([n, inter]);
    ops.swigluBackward(dGate, dUp, dHidden, acts.gate, acts.up, n * inter);
    const dMlpInput = ops.zeros([n, d]);
    linearBack("gate_proj", dMlpInput, dGate, acts.mlpInput);
    linearBack("up_proj", dMlpInput, dUp, acts.mlpInput);
    const dMid = ops.copy(dOut); // residual branch
    ops.rmsnormBackward(dMid, w.postAttentionNorm.gradTensor, dMlpInput, acts.mid, acts.rstd2, w.postAttentionNorm.tensor, n, d);
    for (const t of [dHidden, dGate, dUp, dMlpInput]) ops.free(t);
    // attention: mid = input + o(attn(rope(norm?(q(a))), rope(norm?(k(a))), v(a))), a = norm1(input)
    const dAttn = ops.zeros([n, h * hd]);
    linearBack("o_proj", dAttn, dMid, acts.attn);
    const dq = ops.zeros([n, h * hd]);
    const dk = ops.zeros([n, kv * hd]);
    const dv = ops.zeros([n, kv * hd]);
    ops.attentionBackward(dq, dk, dv, dAttn, acts.attnSaved, acts.q, acts.k, acts.v, batch.segments, this.attentionShape());
    ops.free(dAttn);
    ops.rope(dq, rope, n, h, true);
    ops.rope(dk, rope, n, kv, true);
    let dqRaw = dq, dkRaw = dk;
    if (w.qNorm && w.kNorm && acts.qRstd && acts.kRstd) {
      dqRaw = ops.zeros([n, h * hd]);
      dkRaw = ops.zeros([n, kv * hd]);
      ops.rmsnormBackward(dqRaw, w.qNorm.gradTensor, dq, acts.qRaw, acts.qRstd, w.qNorm.tensor, n * h, hd);
      ops.rmsnormBackward(dkRaw, w.kNorm.gradTensor, dk, acts.kRaw, acts.kRstd, w.kNorm.tensor, n * kv, hd);
      ops.free(dq);
      ops.free(dk);
    }
    const dAttnInput = ops.zeros([n, d]);
    linearBack("q_proj", dAttnInput, dqRaw, acts.attnInput);
    linearBack("k_proj", dAttnInput, dkRaw, acts.attnInput);
    linearBack("v_proj", dAttnInput, dv, acts.attnInput);
    for (const t of [dqRaw, dkRaw, dv]) ops.free(t);
    const dInput = ops.copy(dMid); // residual branch
    ops.rmsnormBackward(dInput, w.inputNorm.gradTensor, dAttnInput, acts.input, acts.rstd1, w.inputNorm.tensor, n, d);
    ops.free(dMid);
    ops.free(dAttnInput);
    return dInput;
  }
}
