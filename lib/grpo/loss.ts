/**
 * GRPO as ART trains it, one definition per piece: advantages within a group, per-trajectory token weights,
 * and the per-token policy loss (CISPO or PPO's clip, ratios per token, per sequence or both, truncated importance
 * sampling) plus optional k3 KL to the base model and ART's KL penalty on advantages.
 * Each loss returns its value and its gradient with respect to the new logprobs; the model's backward takes it
 * from there. Also the SFT cross-entropy on assistant tokens.
 */
import type { ImportanceSampling, TrainConfig } from "./config.ts";

/** What the policy loss reads of a TrainConfig. */
export type PolicyLossConfig = Pick<TrainConfig, "policyLoss" | "importanceSampling" | "epsilon" | "epsilonHigh" | "klCoef" | "truncatedImportanceSampling">;

/** Whether a group's rewards are all equal: it has nothing for GRPO to learn from. */
export function equalRewards(rewards: readonly number[]): boolean {
  return rewards.every((r) => r === rewards[0]);
}

/**
 * reward − group mean, divided by (population std + 1e-6) when scaleRewards. Equal rewards give exact zeros: the mean
 * of [0.1, 0.1, 0.1] is not exactly 0.1 in floating point, and AdamW (or normalizeAdvantages) would turn the rounding
 * residue's gradient into a full-size update.
 */
export function groupAdvantages(rewards: number[], scaleRewards: boolean): number[] {
  if (rewards.length === 0) return [];
  if (equalRewards(rewards)) return rewards.map(() => 0);
  const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
  const centred = rewards.map((r) => r - mean);
  if (!scaleRewards) return centred;
  const std = Math.sqrt(centred.reduce((a, c) => a + c * c, 0) / rewards.length);
  return centred.map((c) => c / (std + 1e-6));
}

/**
 * One token weight per trajectory: 1 / (its trained tokens), normalised so the mean weight over all trained
 * tokens of the step is 1. Every trajectory then counts the same however long it is.
 */
export function trajectoryTokenWeights(trainedTokens: number[]): number[] {
  const totalTokens = trainedTokens.reduce((a, b) => a + b, 0);
  const counted = trainedTokens.filter((n) => n > 0).length;
  return trainedTokens.map((n) => (n > 0 ? totalTokens / (counted * n) : 0));
}

/** The logprobs of one sequence's trained tokens and what the loss needs beside them. */
export interface PolicyTokens {
  newLogprobs: Float32Array;
  /** the sampler's logprobs; NaN where unknown (the ratio is then 1, with the new logprob's gradient, as in ART) */
  oldLogprobs: Float32Array;
  /** base-model logprobs (adapter disabled), only when klCoef > 0 */
  refLogprobs: Float32Array | null;
  /** per token: the trajectory's advantage, shaped by the KL penalty when klPenaltyCoef > 0 */
  advantages: Float32Array;
  /** multiplies every token's loss (the token weight / trained tokens of the optimizer step) */
  weight: number;
}

export interface PolicyLossResult {
  loss: number;
  /** d loss / d newLogprobs[i] */
  dNewLogprobs: Float32Array;
  /** tokens whose ratio was clipped (PPO: the clipped branch was taken; CISPO: the ratio lay outside the range) */
  clippedTokens: number;
  /** Σ weight · k3 (0 without KL) */
  kl: number;
}

const clamp = (x: number, lo: number, hi: number) => Math.min(Math.max(x, lo), hi);

/**
 * The importance ratio of each token at a level, and its derivative: dρ_i/dnew_j = self_i·[i = j] + shared_i / n.
 * With r_i = exp(new_i − old_i) and s = exp(mean_j (new_j − old_j)) (GSPO's sequence ratio): "token" ρ = r,
 * "sequence" ρ = s, "average" ρ = (r + s) / 2, "geometric_average" ρ = √(r·s).
 */
function importanceRatios(newLogprobs: Float32Array, oldLogprobs: Float32Array, level: ImportanceSampling) {
  const n = newLogprobs.length;
  const logRatio = Float64Array.from(newLogprobs, (lp, i) => (Number.isNaN(oldLogprobs[i]) ? 0 : lp - oldLogprobs[i]));
  const s = n > 0 ? Math.exp(logRatio.reduce((a, b) => a + b, 0) / n) : 1;
  const ratio = new Float64Array(n), self = new Float64Array(n), shared = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    const r = Math.exp(logRatio[i]);
    if (level === "token") [ratio[i], self[i], shared[i]] = [r, r, 0];
    else if (level === "sequence") [ratio[i], self[i], shared[i]] = [s, 0, s];
    else if (level === "average") [ratio[i], self[i], shared[i]] = [(r + s) / 2, r / 2, s / 2];
    else {
      const g = Math.sqrt(r * s);
      [ratio[i], self[i], shared[i]] = [g, g / 2, g / 2];
    }
  }
  return { ratio, self, shared };
}

/**
 * The policy loss of one sequence's trained tokens, ART's loss_fn term by term: the ratio at the configured level;
 * PPO's clipped surrogate −min(ρA, clip(ρ)A) (gradient through ρ) or CISPO's −clip(ρ)·A·logp (ρ detached); times
 * min(ρ, cap) detached under truncated importance sampling; plus klCoef · k3 to the base model.
 */
export function policyLoss(tokens: PolicyTokens, config: PolicyLossConfig): PolicyLossResult {
  const { newLogprobs, oldLogprobs, refLogprobs, advantages, weight } = tokens;
  const n = newLogprobs.length;
  const dNew = new Float32Array(n);
  const lo = 1 - config.epsilon;
  const hi = 1 + config.epsilonHigh;
  const cap = config.truncatedImportanceSampling;
  const { ratio, self, shared } = importanceRatios(newLogprobs, oldLogprobs, config.importanceSampling);
  let loss = 0;
  let clippedTokens = 0;
  // Σ_i (coefficient of dρ_i) · shared_i: what every token's gradient gets through the sequence ratio.
  let sharedGradient = 0;
  for (let i = 0; i < n; i++) {
    const rho = ratio[i], clipped = clamp(rho, lo, hi), a = advantages[i];
    const truncation = cap === null ? 1 : Math.min(rho, cap);
    if (config.policyLoss === "cispo") {
      loss += -weight * truncation * clipped * a * newLogprobs[i];
      dNew[i] = -weight * truncation * clipped * a;
      if (clipped !== rho) clippedTokens++;
    } else if (rho * a <= clipped * a) {
      loss += -weight * truncation * rho * a;
      const coefficient = -weight * truncation * a;
      dNew[i] = coefficient * self[i];
      sharedGradient += coefficient * shared[i];
    } else {
      loss += -weight * truncation * clipped * a;
      clippedTokens++;
    }
  }
  for (let j = 0; j < n; j++) dNew[j] += sharedGradient / n;

  let kl = 0;
  if (config.klCoef > 0 && refLogprobs !== null) {
    // k3 = e^δ − δ − 1 with δ = ref − new: unbiased, always ≥ 0; dk3/dnew = 1 − e^δ
    for (let i = 0; i < n; i++) {
      const delta = refLogprobs[i] - newLogprobs[i];
      const k3 = Math.exp(delta) - delta - 1;
      kl += weight * k3;
      loss += config.klCoef * weight * k3;
      dNew[i] += config.klCoef * weight * (1 - Math.exp(delta));
    }
  }
  return { loss, dNewLogprobs: dNew, clippedTokens, kl };
}

/**
 * ART's KL penalty on advantages: each token's advantage gains coef · (mean KL − its KL), with its KL the log-ratio
 * of the policy to the reference (new − ref, no gradient) and `meanKl` its mean over the optimizer step's trained
 * tokens: tokens the policy drifted on more than average lose advantage, the others gain it.
 */
export function klShapedAdvantages(advantage: number, newLogprobs: Float32Array, refLogprobs: Float32Array, coef: number, meanKl: number): Float32Array {
  return Float32Array.from(newLogprobs, (lp, i) => advantage + coef * (meanKl - (lp - refLogprobs[i])));
}

/** SFT: −Σ weight · logp over the trained (assistant) tokens. */
export function crossEntropyLoss(newLogprobs: Float32Array, weight: number): { loss: number; dNewLogprobs: Float32Array } {
  let loss = 0;
  const d = new Float32Array(newLogprobs.length);
  for (let i = 0; i < newLogprobs.length; i++) {
    loss -= weight * newLogprobs[i];
    d[i] = -weight;
  }
  return { loss, dNewLogprobs: d };
}
