/**
 * TrainConfig: every knob of a training step, with ART's defaults (src/art/loss.py, src/art/unsloth/train.py,
 * src/art/dev/*): lr 5e-6, LoRA rank 8 / alpha 16 on all seven projections, AdamW betas (0.9, 0.99), weight decay
 * 0.1, max grad norm 0.1, constant schedule, the CISPO loss with eps 1.0 / 4.0 (PPO: 0.2), token-level ratios, no
 * KL, one optimizer step per packed row of at most 32,768 tokens.
 */
import { ArtError } from "../core/errors.ts";
import { DEFAULT_LORA, PROJECTIONS, type LoraConfig } from "../model/lora.ts";
import type { RecomputeActivations } from "../model/training.ts";

/** "ppo": token-level clipped surrogate; "cispo": clipped, detached ratio times A·logp (ART's later default). */
export type PolicyLoss = "ppo" | "cispo";
/**
 * "token": one ratio per token; "sequence": the geometric mean over a sequence's trained tokens (GSPO); "average":
 * the mean of the two; "geometric_average": their geometric mean.
 */
export type ImportanceSampling = "token" | "sequence" | "average" | "geometric_average";
/** "packed_rows": one AdamW step per packed row (ART's local backend); "one": one per train call (its hosted ones). */
export type OptimizerSteps = "packed_rows" | "one";

export interface Schedule {
  kind: "constant" | "cosine" | "linear";
  warmupSteps: number;
  /** cosine and linear: the step where the rate reaches minLearningRate */
  totalSteps: number;
  minLearningRate: number;
}

export interface TrainConfig {
  learningRate: number;
  /** null trains every weight (full-parameter mode, for SFT of small models). */
  lora: LoraConfig | null;
  policyLoss: PolicyLoss;
  importanceSampling: ImportanceSampling;
  epsilon: number;
  epsilonHigh: number;
  /** cap on the (detached) ratio that multiplies each token's loss; null: none */
  truncatedImportanceSampling: number | null;
  /** KL(k3) coefficient to the base model (adapter disabled); 0 (and klPenaltyCoef 0) skips the reference pass. */
  klCoef: number;
  /** ART's KL penalty on advantages against the base model: A += coef · (mean KL − token KL); 0: off */
  klPenaltyCoef: number;
  scaleRewards: boolean;
  /**
   * ART's packer divides every batch's advantages by their mean |A|·w over the trained tokens (normalizedAdvantages);
   * true does so too. Off by default: under AdamW it is nearly a batch-wide factor, and the cookbook's runs were tuned
   * and measured without it (docs/training.md).
   */
  normalizeAdvantages: boolean;
  beta1: number;
  beta2: number;
  adamEps: number;
  weightDecay: number;
  maxGradNorm: number;
  schedule: Schedule;
  /** see OptimizerSteps */
  optimizerSteps: OptimizerSteps;
  /** tokens per packed row; null: the longest sequence rounded up to a multiple of 2048, at most maxSequenceLength */
  packedSequenceLength: number | null;
  /** sequences per micro-batch; gradients of all micro-batches of a row accumulate before its update */
  microBatchSize: number;
  /** store a prompt shared by several sequences of a micro-batch once (a GRPO group's prompt) */
  sharePrompts: boolean;
  /** longer sequences are dropped, with a warning naming their trajectory */
  maxSequenceLength: number;
  /** train sampled turns that carry no logprobs as on-policy (ratio 1); otherwise they are an error */
  allowTrainingWithoutLogprobs: boolean;
  /**
   * recompute each layer in the backward from its input instead of keeping its activations: true (memory ∝ one
   * layer), false, or "auto": keep them while the backend's memory has room (DifferentiableTransformer)
   */
  recomputeActivations: RecomputeActivations;
  seed: number;
}

export type TrainConfigInit = Partial<Omit<TrainConfig, "lora" | "schedule">> & {
  lora?: Partial<LoraConfig> | null;
  schedule?: Partial<Schedule>;
};

export function resolveTrainConfig(init: TrainConfigInit = {}): TrainConfig {
  const policyLoss = init.policyLoss ?? "cispo";
  const epsilon = init.epsilon ?? (policyLoss === "cispo" ? 1.0 : 0.2);
  const config: TrainConfig = {
    learningRate: init.learningRate ?? 5e-6,
    lora: init.lora === null ? null : { ...DEFAULT_LORA, ...init.lora },
    policyLoss,
    importanceSampling: init.importanceSampling ?? "token",
    epsilon,
    epsilonHigh: init.epsilonHigh ?? (policyLoss === "cispo" ? 4.0 : epsilon),
    truncatedImportanceSampling: init.truncatedImportanceSampling ?? null,
    klCoef: init.klCoef ?? 0,
    klPenaltyCoef: init.klPenaltyCoef ?? 0,
    scaleRewards: init.scaleRewards ?? true,
    normalizeAdvantages: init.normalizeAdvantages ?? false,
    beta1: init.beta1 ?? 0.9,
    beta2: init.beta2 ?? 0.99,
    adamEps: init.adamEps ?? 1e-8,
    weightDecay: init.weightDecay ?? 0.1,
    maxGradNorm: init.maxGradNorm ?? 0.1,
    schedule: { kind: "constant", warmupSteps: 0, totalSteps: 0, minLearningRate: 0, ...init.schedule },
    optimizerSteps: init.optimizerSteps ?? "packed_rows",
    packedSequenceLength: init.packedSequenceLength ?? null,
    microBatchSize: init.microBatchSize ?? 4,
    sharePrompts: init.sharePrompts ?? true,
    maxSequenceLength: init.maxSequenceLength ?? 32768,
    allowTrainingWithoutLogprobs: init.allowTrainingWithoutLogprobs ?? false,
    recomputeActivations: init.recomputeActivations ?? "auto",
    seed: init.seed ?? 0,
  };
  validate(config);
  return config;
}

function validate(c: TrainConfig): void {
  const bad = (key: string, want: string, got: unknown) => {
    throw new ArtError("bad_train_config", `TrainConfig.${key} must be ${want}, got ${JSON.stringify(got)}`);
  };
  const positive = (key: string, value: number) => {
    if (!(Number.isFinite(value) && value > 0)) bad(key, "a positive number", value);
  };
  const nonNegative = (key: string, value: number) => {
    if (!(Number.isFinite(value) && value >= 0)) bad(key, "a number >= 0", value);
  };
  positive("learningRate", c.learningRate);
  nonNegative("epsilon", c.epsilon);
  nonNegative("epsilonHigh", c.epsilonHigh);
  nonNegative("klCoef", c.klCoef);
  nonNegative("klPenaltyCoef", c.klPenaltyCoef);
  if (c.truncatedImportanceSampling !== null) positive("truncatedImportanceSampling", c.truncatedImportanceSampling);
  nonNegative("weightDecay", c.weightDecay);
  positive("maxGradNorm", c.maxGradNorm);
  positive("adamEps", c.adamEps);
  for (const key of ["beta1", "beta2"] as const) {
    if (!(c[key] >= 0 && c[key] < 1)) bad(key, "in [0, 1)", c[key]);
  }
  if (!Number.isInteger(c.microBatchSize) || c.microBatchSize < 1) bad("microBatchSize", "an integer >= 1", c.microBatchSize);
  if (!Number.isInteger(c.maxSequenceLength) || c.maxSequenceLength < 2) bad("maxSequenceLength", "an integer >= 2", c.maxSequenceLength);
  if (c.recomputeActivations !== true && c.recomputeActivations !== false && c.recomputeActivations !== "auto") {
    bad("recomputeActivations", 'true, false or "auto"', c.recomputeActivations);
  }
  if (c.policyLoss !== "ppo" && c.policyLoss !== "cispo") bad("policyLoss", '"ppo" or "cispo"', c.policyLoss);
  if (!["token", "sequence", "average", "geometric_average"].includes(c.importanceSampling)) {
    bad("importanceSampling", '"token", "sequence", "average" or "geometric_average"', c.importanceSampling);
  }
  if (c.optimizerSteps !== "packed_rows" && c.optimizerSteps !== "one") bad("optimizerSteps", '"packed_rows" or "one"', c.optimizerSteps);
  if (c.packedSequenceLength !== null && (!Number.isInteger(c.packedSequenceLength) || c.packedSequenceLength < 2)) {
    bad("packedSequenceLength", "an integer >= 2 or null", c.packedSequenceLength);
  }
  if (!["constant", "cosine", "linear"].includes(c.schedule.kind)) bad("schedule.kind", '"constant", "cosine" or "linear"', c.schedule.kind);
  if (c.schedule.kind !== "constant" && !(c.schedule.totalSteps > c.schedule.warmupSteps)) {
    bad("schedule.totalSteps", `greater than schedule.warmupSteps for a ${c.schedule.kind} schedule`, c.schedule.totalSteps);
  }
  if (c.lora !== null) {
    if (!Number.isInteger(c.lora.rank) || c.lora.rank < 1) bad("lora.rank", "an integer >= 1", c.lora.rank);
    positive("lora.alpha", c.lora.alpha);
    if (c.lora.targetModules.length === 0) bad("lora.targetModules", `a non-empty subset of ${PROJECTIONS.join(", ")}`, []);
    for (const m of c.lora.targetModules) {
      if (!PROJECTIONS.includes(m)) bad("lora.targetModules", `a subset of ${PROJECTIONS.join(", ")}`, m);
    }
  }
}

/** Learning rate at step `step` (0-based; a Trainer counts its calls): linear warm-up, then constant, cosine or linear decay. */
export function learningRateAt(config: TrainConfig, step: number): number {
  const { kind, warmupSteps, totalSteps, minLearningRate } = config.schedule;
  if (step < warmupSteps) return (config.learningRate * (step + 1)) / (warmupSteps + 1);
  if (kind === "constant") return config.learningRate;
  const progress = Math.min(1, (step - warmupSteps) / (totalSteps - warmupSteps));
  const fraction = kind === "cosine" ? 0.5 * (1 + Math.cos(Math.PI * progress)) : 1 - progress;
  return minLearningRate + (config.learningRate - minLearningRate) * fraction;
}
