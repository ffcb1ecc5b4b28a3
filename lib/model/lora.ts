/**
 * LoRA as the engine knows it: which projections an adapter can target (PEFT's `target_modules` names, also the keys
 * of the engine's per-layer LoRA set), their shapes for a model, where they live in a checkpoint, and the scale.
 * An unmerged LoRA adds `scale · (x Aᵀ) Bᵀ` to a projection's output, A [rank, in] and B [out, rank] (PEFT's shapes).
 */
import type { LoraWeights } from "./backend.ts";
import type { ModelConfig } from "./config.ts";

export const PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const;
export type Projection = (typeof PROJECTIONS)[number];

/**
 * The projections by the input they read, in a layer's order: q/k/v (the attention input), o, gate/up (the MLP
 * input), down. A group's weights are stacked into one product at load (loadWeights), and a LoRA's A matrices and
 * kept x Aᵀ in training (DifferentiableTransformer).
 */
export const PROJECTION_GROUPS: readonly (readonly Projection[])[] = [["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]];

export interface LoraConfig {
  rank: number;
  alpha: number;
  targetModules: Projection[];
  /** rsLoRA: scale alpha/sqrt(rank) instead of alpha/rank. */
  useRslora: boolean;
}

/** ART's default adapter: rank 8, alpha 16, all seven projections. */
export const DEFAULT_LORA: LoraConfig = { rank: 8, alpha: 16, targetModules: [...PROJECTIONS], useRslora: false };

export function loraScale(lora: LoraConfig): number {
  return lora.useRslora ? lora.alpha / Math.sqrt(lora.rank) : lora.alpha / lora.rank;
}

/** The LoRA of one layer, by projection (a projection without one is absent). */
export type LayerLoras = Partial<Record<Projection, LoraWeights>>;

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

/** `model.layers.N.self_attn.q_proj`: the module path shared by Hugging Face weight names and PEFT adapter names. */
export function projectionPath(layer: number, projection: Projection): string {
  const module = projection === "gate_proj" || projection === "up_proj" || projection === "down_proj" ? "mlp" : "self_attn";
  return `model.layers.${layer}.${module}.${projection}`;
}
