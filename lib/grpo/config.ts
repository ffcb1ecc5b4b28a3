/**
 * TrainConfig: every knob of a training step, with ART's defaults (src/art/unsloth/train.py, src/art/dev/*):
 * lr 5e-6, LoRA rank 8 / alpha 16 on all seven projections, AdamW betas (0.9, 0.99), weight decay 0.1,
 * max grad norm 0.1, constant schedule, PPO clip eps 0.2 (CISPO: 1.0 / 4.0), no KL.
 */
import { ArtError } from "../core/errors.ts";
import { DEFAULT_LORA, PROJECTIONS, type LoraConfig } from "../model/lora.ts";
import type { RecomputeActivations } from "../model/training.ts";

/** "ppo": token-level clipped surrogate; "cispo": clipped, detached ratio times A·logp (ART's later default). */
export type PolicyLoss = "ppo" | "cispo";
/** "token": one ratio per token; "sequence": the geometric mean over a trajectory's trained tokens (GSPO). */
export type ImportanceSampling = "token" | "sequence";

export interface Schedule {
  kind: "constant" | "cosine";
  warmupSteps: number;
  /** cosine only: the step where the rate reaches minLearningRate */
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
  /** KL(k3) coefficient to the base model (adapter disabled); 0 skips the reference pass. */
  klCoef: number;
  scaleRewards: boolean;
  beta1: number;
  beta2: number;
  adamEps: number;
  weightDecay: number;
  maxGradNorm: number;
  schedule: Schedule;
  /** sequences per micro-batch; gradients of all micro-batches of a step accumulate before one update */
  microBatchSize: number;
  /** store a prompt shared by several sequences of a micro-batch once (a GRPO group's prompt) */
  sharePrompts: boolean;
  /** longer sequences are truncated, with a warning */
  maxSequenceLength: number;
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
  const policyLoss = init.policyLoss ?? "ppo";
  const epsilon = init.epsilon ?? (policyLoss === "cispo" ? 1.0 : 0.2);
  const config: TrainConfig = {
    learningRate: init.learningRate ?? 5e-6,
    lora: init.lora === null ? null : { ...DEFAULT_LORA, ...init.lora },
    policyLoss,
    importanceSampling: init.importanceSampling ?? "token",
    epsilon,
    epsilonHigh: init.epsilonHigh ?? (policyLoss === "cispo" ? 4.0 : epsilon),
    klCoef: init.klCoef ?? 0,
    scaleRewards: init.scaleRewards ?? true,
    beta1: init.beta1 ?? 0.9,
    beta2: init.beta2 ?? 0.99,
    adamEps: init.adamEps ?? 1e-8,
    weightDecay: init.weightDecay ?? 0.1,
    maxGradNorm: init.maxGradNorm ?? 0.1,
    schedule: { kind: "constant", warmupSteps: 0, totalSteps: 0, minLearningRate: 0, ...init.schedule },
    microBatchSize: init.microBatchSize ?? 4,
    sharePrompts: init.sharePrompts ?? true,
    maxSequenceLength: init.maxSequenceLength ?? 8192,
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
  if (c.importanceSampling !== "token" && c.importanceSampling !== "sequence") {
    bad("importanceSampling", '"token" or "sequence"', c.importanceSampling);
  }
  if (c.schedule.kind !== "constant" && c.schedule.kind !== "cosine") bad("schedule.kind", '"constant" or "cosine"', c.schedule.kind);
  if (c.schedule.kind === "cosine" && !(c.schedule.totalSteps > c.schedule.warmupSteps)) {
    bad("schedule.totalSteps", "greater than schedule.warmupSteps for a cosine schedule", c.schedule.totalSteps);
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

/** Learning rate at optimiser step `step` (0-based): linear warm-up, then constant or cosine decay. */
export function learningRateAt(config: TrainConfig, step: number): number {
  const { kind, warmupSteps, totalSteps, minLearningRate } = config.schedule;
  if (step < warmupSteps) return (config.learningRate * (step + 1)) / (warmupSteps + 1);
  if (kind === "constant") return config.learningRate;
  const progress = Math.min(1, (step - warmupSteps) / (totalSteps - warmupSteps));
  return minLearningRate + 0.5 * (config.learningRate - minLearningRate) * (1 + Math.cos(Math.PI * progress));
}
