/**
 * The training step: sequences → micro-batches → forward (and a base-model pass for KL) → per-token loss →
 * backward → one AdamW update. Gradients of all micro-batches of a step accumulate; token weights are computed over
 * the whole step first, so splitting into micro-batches never changes the result.
 *
 * Checkpoints: one directory per step holding the adapter (PEFT) or the full weights, the AdamW moments and the
 * step counters, so a resumed run continues exactly where the uninterrupted one would be.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";
import { type Rng, seededRandom, shuffleInPlace } from "../core/random.ts";
import type { TrajectoryGroup } from "../core/trajectory.ts";
import type { PackedSegment } from "../model/backend.ts";
import { readAdapter } from "../model/peft.ts";
import { openSafetensors, writeSafetensors, type TensorToWrite } from "../model/safetensors.ts";
import { DifferentiableTransformer, type SequenceBatch } from "../model/training.ts";
import type { Transformer } from "../model/transformer.ts";
import { adamwStep, createAdamWState, type AdamWState } from "./adamw.ts";
import { learningRateAt, resolveTrainConfig, type TrainConfig, type TrainConfigInit } from "./config.ts";
import { crossEntropyLoss, klShapedAdvantages, policyLoss, trajectoryTokenWeights } from "./loss.ts";
import { tokenizeGroups, type ChatTokenizer, type TrainingSequence } from "./tokenize.ts";

export interface StepMetrics {
  /** the loss of the step (with several optimizer steps, the mean of theirs) */
  loss: number;
  /** trained tokens that went into the loss */
  trainedTokens: number;
  sequences: number;
  /** share of trained tokens whose ratio was clipped */
  clipFraction: number;
  /** mean k3 KL to the base model per trained token (0 without a reference pass) */
  kl: number;
  /** mean entropy of the policy over the trained tokens */
  entropy: number;
}

export interface StepResult extends StepMetrics {
  /** the step count after this call (one per call, as ART's checkpoint steps) */
  step: number;
  trained: boolean;
  /** why nothing was trained, when so */
  message?: string;
  /** AdamW updates this call took: one per packed row (TrainConfig.optimizerSteps) */
  gradientSteps: number;
  /** the gradient norm before clipping (with several optimizer steps, the mean of theirs) */
  gradNorm: number;
  learningRate: number;
}

export type Objective = "grpo" | "sft";

/** The metrics of a step that trained nothing. */
const NO_METRICS: StepMetrics = { loss: 0, trainedTokens: 0, sequences: 0, clipFraction: 0, kl: 0, entropy: 0 };

const STATE_FILE = "trainer_state.json";
const OPTIMIZER_FILE = "optimizer.safetensors";
const FULL_WEIGHTS_FILE = "model.safetensors";

/** `.art/{project}/models/{name}/checkpoints/{step:04d}` */
export function checkpointDir(project: string, name: string, step: number, root = ".art"): string {
  return path.join(root, project, "models", name, "checkpoints", String(step).padStart(4, "0"));
}

export class Trainer {
  readonly network: DifferentiableTransformer;
  readonly config: TrainConfig;
  optimizer: AdamWState;
  /** optimiser steps taken, plus steps that had nothing to train (ART advances those too) */
  step: number;

  constructor(network: DifferentiableTransformer, config: TrainConfig | TrainConfigInit = {}, state?: { step: number; optimizer: AdamWState }) {
    this.network = network;
    this.config = resolveTrainConfig(config);
    this.step = state?.step ?? 0;
    this.optimizer = state?.optimizer ?? createAdamWState();
    if ((this.config.klCoef > 0 || this.config.klPenaltyCoef > 0) && network.lora === null) {
      throw new ArtError("bad_train_config", "TrainConfig.klCoef > 0 and klPenaltyCoef > 0 need LoRA training: the KL reference is the base model with the adapter disabled");
    }
    network.recomputeActivations = this.config.recomputeActivations;
  }

  /**
   * The low-level API: loss and gradients for `sequences` as one optimizer step (one row), without touching the
   * weights. Gradients are keyed by parameter name (PEFT names for LoRA:
   * base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight).
   */
  computeGradients(all: TrainingSequence[], objective: Objective = "grpo"): StepMetrics & { gradients: Map<string, Float32Array> } {
    this.network.zeroGradients();
    const sequences = this.trainedSequences(all, objective);
    const metrics = sequences.length === 0 ? { ...NO_METRICS } : this.accumulate(sequences, tokenWeights(sequences, objective), objective);
    const gradients = new Map(this.network.parameterTensors().map((p) => [p.name, this.network.backend.download(p.grad)]));
    return { ...metrics, gradients };
  }

  /** One GRPO step (one or more optimizer steps: TrainConfig.optimizerSteps) over the sequences of a batch. */
  trainStep(sequences: TrainingSequence[]): StepResult {
    return this.optimizerStep(sequences, "grpo");
  }

  /**
   * One GRPO step straight from trajectory groups: advantages per group, tokenisation around the sampled ids,
   * then trainStep. Warnings (truncation) and the count of skipped zero-advantage trajectories come back with it.
   */
  trainOnGroups(tokenizer: ChatTokenizer, groups: TrajectoryGroup[]): StepResult & { warnings: string[]; skippedTrajectories: number } {
    const { sequences, warnings, skippedTrajectories } = tokenizeGroups(tokenizer, groups, this.config);
    return { ...this.trainStep(sequences), warnings, skippedTrajectories };
  }

  /** One SFT step: cross-entropy on the trainable (assistant) tokens. */
  sftStep(sequences: TrainingSequence[]): StepResult {
    return this.optimizerStep(sequences, "sft");
  }

  /**
   * The batch's sequences in packed rows (TrainConfig.optimizerSteps), one AdamW update per row with the row's loss
   * normalised by its own trained tokens, as ART's local backend trains; the token weights are the whole batch's.
   */
  private optimizerStep(all: TrainingSequence[], objective: Objective): StepResult {
    const learningRate = learningRateAt(this.config, this.step);
    let sequences = this.trainedSequences(all, objective);
    const totalTokens = sequences.reduce((a, s) => a + trainedCount(s), 0);
    if (totalTokens === 0) {
      this.step += 1;
      const message = objective === "grpo"
        ? `step ${this.step}: nothing to train — every trajectory has advantage 0 (all rewards equal within each group, or no sampled tokens); the step advances without changing the weights`
        : `step ${this.step}: nothing to train — no assistant tokens in the batch`;
      return { ...NO_METRICS, step: this.step, trained: false, message, gradientSteps: 0, gradNorm: 0, learningRate };
    }
    if (objective === "grpo" && this.config.normalizeAdvantages) sequences = normalizedAdvantages(sequences);
    const weights = tokenWeights(sequences, objective);
    const rows = this.config.optimizerSteps === "one" ? [sequences] : packRows(sequences, this.rowLength(sequences), seededRandom(this.config.seed + this.step));
    const { beta1, beta2, adamEps: eps, weightDecay, maxGradNorm } = this.config;
    let loss = 0, kl = 0, clipped = 0, entropy = 0, gradNorm = 0;
    rows.forEach((row, r) => {
      this.network.zeroGradients();
      const metrics = this.accumulate(row, weights, objective);
      if (!Number.isFinite(metrics.loss)) {
        this.network.zeroGradients();
        throw new ArtError(
          "non_finite_loss",
          `training step refused at packed row ${r + 1} of ${rows.length}: its loss is ${metrics.loss}; ${r === 0 ? "no weights were changed" : `the ${r} rows before it were applied, this one and later ones were not`}. Check rewards and logprobs for NaN/Infinity, or lower the learning rate.`,
        );
      }
      gradNorm += adamwStep(this.network.backend, this.network.parameterTensors(), this.optimizer, { learningRate, beta1, beta2, eps, weightDecay, maxGradNorm }) / rows.length;
      loss += metrics.loss / rows.length;
      kl += metrics.kl / rows.length;
      clipped += metrics.clipFraction * metrics.trainedTokens;
      entropy += metrics.entropy * metrics.trainedTokens;
    });
    this.step += 1;
    return {
      loss, trainedTokens: totalTokens, sequences: sequences.length, clipFraction: clipped / totalTokens, kl, entropy: entropy / totalTokens,
      step: this.step, trained: true, gradientSteps: rows.length, gradNorm, learningRate,
    };
  }

  /** The sequences that train (some tokens, and a non-zero advantage for GRPO), checked. */
  private trainedSequences(all: TrainingSequence[], objective: Objective): TrainingSequence[] {
    const sequences = all.filter((s) => trainedCount(s) > 0 && (objective === "sft" || s.advantage !== 0));
    for (const s of sequences) {
      if (s.tokens.length > this.config.maxSequenceLength) {
        throw new ArtError("sequence_too_long", `a training sequence has ${s.tokens.length} tokens, more than TrainConfig.maxSequenceLength (${this.config.maxSequenceLength}); tokenizeGroups with the same config drops such sequences`);
      }
      if (!Number.isFinite(s.advantage)) {
        throw new ArtError("non_finite_loss", `training step refused: a sequence of trajectory ${s.trajectory} has advantage ${s.advantage}; no weights were changed. Check the rewards for NaN/Infinity.`);
      }
    }
    return sequences;
  }

  /** ART's packed sequence length: the longest sequence rounded up to a multiple of 2048, at most maxSequenceLength. */
  private rowLength(sequences: TrainingSequence[]): number {
    if (this.config.packedSequenceLength !== null) return this.config.packedSequenceLength;
    const longest = Math.max(...sequences.map((s) => s.tokens.length));
    return Math.min(this.config.maxSequenceLength, Math.ceil(longest / 2048) * 2048);
  }

  /**
   * Loss and accumulated gradients of one optimizer step's sequences (already checked), in micro-batches: each
   * token's loss is weights.get(sequence) / (the trained tokens of these sequences), so micro-batching never
   * changes the result. With a KL penalty, a first pass finds the mean KL of these tokens.
   */
  private accumulate(sequences: TrainingSequence[], weights: Map<TrainingSequence, number>, objective: Objective): StepMetrics {
    const tokens = sequences.reduce((a, s) => a + trainedCount(s), 0);
    const metrics: StepMetrics = { loss: 0, trainedTokens: tokens, sequences: sequences.length, clipFraction: 0, kl: 0, entropy: 0 };
    const micro: TrainingSequence[][] = [];
    for (let start = 0; start < sequences.length; start += this.config.microBatchSize) micro.push(sequences.slice(start, start + this.config.microBatchSize));
    const grpo = objective === "grpo";
    const needsReference = grpo && (this.config.klCoef > 0 || this.config.klPenaltyCoef > 0);
    const reference = (batch: SequenceBatch) => this.network.forward(batch, { useAdapter: false, keepActivations: false }).logprobs;
    const batches = micro.map((m) => toBatch(m, this.config.sharePrompts));
    const references = needsReference ? batches.map(reference) : null;
    let meanKl = 0;
    if (grpo && this.config.klPenaltyCoef > 0) {
      batches.forEach((batch, b) => {
        const policy = this.network.forward(batch, { keepActivations: false }).logprobs;
        for (let i = 0; i < policy.length; i++) meanKl += (policy[i] - references![b][i]) / tokens;
      });
    }
    let clipped = 0;
    batches.forEach((batch, b) => {
      const pass = this.network.forward(batch);
      const dLogprobs = new Float32Array(pass.logprobs.length);
      let offset = 0;
      // The backward frees the pass, also when it fails; until it runs, a failure here must.
      try {
        for (const s of micro[b]) {
          const count = trainedCount(s);
          const newLogprobs = pass.logprobs.subarray(offset, offset + count);
          const weight = weights.get(s)! / tokens;
          let result: { loss: number; dNewLogprobs: Float32Array; clippedTokens?: number; kl?: number };
          if (!grpo) {
            result = crossEntropyLoss(newLogprobs, weight);
          } else {
            const oldLogprobs = new Float32Array(count);
            let i = 0;
            for (let t = 1; t < s.tokens.length; t++) if (s.trainable[t]) oldLogprobs[i++] = s.logprobs[t];
            const refLogprobs = references ? references[b].subarray(offset, offset + count) : null;
            const advantages = this.config.klPenaltyCoef > 0
              ? klShapedAdvantages(s.advantage, newLogprobs, refLogprobs!, this.config.klPenaltyCoef, meanKl)
              : new Float32Array(count).fill(s.advantage);
            result = policyLoss({ newLogprobs, oldLogprobs, refLogprobs, advantages, weight }, this.config);
          }
          dLogprobs.set(result.dNewLogprobs, offset);
          metrics.loss += result.loss;
          metrics.kl += result.kl ?? 0;
          clipped += result.clippedTokens ?? 0;
          offset += count;
        }
      } catch (error) {
        this.network.release(pass);
        throw error;
      }
      for (const e of pass.entropies) metrics.entropy += e / tokens;
      this.network.backward(pass, dLogprobs);
    });
    metrics.clipFraction = clipped / tokens;
    return metrics;
  }

  /** Writes adapter (or full weights), optimiser moments and counters into `dir`, atomically (temp dir + rename). */
  /** `extraFiles`: more files (name → text) saved inside the checkpoint, atomically with it. */
  saveCheckpoint(dir: string, baseModel = "", extraFiles: Record<string, string> = {}): void {
    const tmp = `${dir}.tmp-${process.pid}`;
    fs.rmSync(tmp, { recursive: true, force: true });
    fs.mkdirSync(tmp, { recursive: true });
    const { backend } = this.network;
    const params = this.network.parameterTensors();
    if (this.network.lora !== null) {
      this.network.saveAdapter(tmp, baseModel);
    } else {
      writeSafetensors(path.join(tmp, FULL_WEIGHTS_FILE), Object.fromEntries(params.map((p) => [p.name, { dtype: "F32", shape: p.shape, data: backend.download(p.value) } as TensorToWrite])));
    }
    const moments: Record<string, TensorToWrite> = {};
    for (const p of params) {
      const m = this.optimizer.m.get(p.name);
      const v = this.optimizer.v.get(p.name);
      if (m && v) {
        moments[`${p.name}.exp_avg`] = { dtype: "F32", shape: p.shape, data: backend.download(m) };
        moments[`${p.name}.exp_avg_sq`] = { dtype: "F32", shape: p.shape, data: backend.download(v) };
      }
    }
    writeSafetensors(path.join(tmp, OPTIMIZER_FILE), moments);
    const state = { step: this.step, optimizerStep: this.optimizer.step, mode: this.network.lora === null ? "full" : "lora", config: this.config };
    fs.writeFileSync(path.join(tmp, STATE_FILE), JSON.stringify(state, null, 2) + "\n");
    for (const [name, text] of Object.entries(extraFiles)) fs.writeFileSync(path.join(tmp, name), text);
    // On disk before it is named: a power cut leaves either the previous checkpoint or this whole one.
    syncTree(tmp);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(dir), { recursive: true });
    fs.renameSync(tmp, dir);
    syncPath(path.dirname(dir));
  }

  /**
   * Continues a run from a checkpoint directory: the adapter (or the full weights, written into the transformer's),
   * the optimiser moments, the step counters and the TrainConfig saved with it (overridable), on the transformer's
   * backend.
   */
  static resume(dir: string, transformer: Transformer, overrides: TrainConfigInit = {}): Trainer {
    const stateFile = path.join(dir, STATE_FILE);
    if (!fs.existsSync(stateFile)) throw new ArtError("not_found", `${stateFile}: missing; is ${dir} a checkpoint written by Trainer.saveCheckpoint?`);
    let state: { step: number; optimizerStep: number; mode: "lora" | "full"; config: TrainConfig };
    try {
      state = JSON.parse(fs.readFileSync(stateFile, "utf8"));
    } catch (error) {
      throw new ArtError("bad_checkpoint", `${stateFile}: not a trainer state (${(error as Error).message}); the checkpoint is damaged`);
    }
    if (!Number.isInteger(state?.step) || !Number.isInteger(state.optimizerStep) || (state.mode !== "lora" && state.mode !== "full")) {
      throw new ArtError("bad_checkpoint", `${stateFile}: lacks step, optimizerStep or mode; the checkpoint is damaged`);
    }
    const trainConfig = resolveTrainConfig({ ...state.config, ...overrides } as TrainConfigInit);
    const backend = transformer.backend;
    let network: DifferentiableTransformer;
    if (state.mode === "lora") {
      network = new DifferentiableTransformer(transformer, { lora: trainConfig.lora, adapter: readAdapter(dir, transformer.config) });
    } else {
      network = new DifferentiableTransformer(transformer, { lora: null });
      const store = openSafetensors(path.join(dir, FULL_WEIGHTS_FILE));
      try {
        for (const p of network.parameterTensors()) backend.write(p.value, store.readF32(p.name, p.shape));
      } finally {
        store.close();
      }
    }
    const optimizer = createAdamWState();
    optimizer.step = state.optimizerStep;
    const store = openSafetensors(path.join(dir, OPTIMIZER_FILE));
    try {
      for (const p of network.parameterTensors()) {
        if (!store.info(`${p.name}.exp_avg`)) continue;
        optimizer.m.set(p.name, backend.upload(store.readF32(`${p.name}.exp_avg`, p.shape), p.shape));
        optimizer.v.set(p.name, backend.upload(store.readF32(`${p.name}.exp_avg_sq`, p.shape), p.shape));
      }
    } finally {
      store.close();
    }
    return new Trainer(network, trainConfig, { step: state.step, optimizer });
  }
}

/** Trained tokens of a sequence; the first token has no row before it to predict it, so it never counts. */
export function trainedCount(s: TrainingSequence): number {
  let count = 0;
  for (let t = 1; t < s.tokens.length; t++) count += s.trainable[t] ? 1 : 0;
  return count;
}

/** The prompt rows sequences can share: all untrained tokens before the first trained one but the last, which predicts it. */
function sharedLength(s: TrainingSequence): number {
  let first = 1;
  while (first < s.tokens.length && !s.trainable[first]) first++;
  return first - 1;
}

const keyOf = (s: TrainingSequence) => s.tokens.slice(0, sharedLength(s)).join(",");

/**
 * Per sequence, the weight of each of its trained tokens: GRPO weighs every trajectory by 1 / (its trained tokens),
 * normalised to mean 1 over the batch's tokens (ART's weights); SFT weighs every token 1.
 */
export function tokenWeights(sequences: TrainingSequence[], objective: Objective): Map<TrainingSequence, number> {
  if (objective === "sft") return new Map(sequences.map((s) => [s, 1]));
  const trajectories = [...new Set(sequences.map((s) => s.trajectory))];
  const tokensPerTrajectory = trajectories.map((t) => sequences.filter((s) => s.trajectory === t).reduce((a, s) => a + trainedCount(s), 0));
  const weights = trajectoryTokenWeights(tokensPerTrajectory);
  return new Map(sequences.map((s) => [s, weights[trajectories.indexOf(s.trajectory)]]));
}

/**
 * ART's batch-level advantage normalisation (its packer does it to every batch): each advantage divided by the mean,
 * over the batch's trained tokens, of |advantage| times the token weight (tokenWeights, mean 1), so that a train
 * call's gradient has the same scale whatever the spread of its groups' rewards. Copies of the sequences.
 */
export function normalizedAdvantages(sequences: TrainingSequence[]): TrainingSequence[] {
  const weights = tokenWeights(sequences, "grpo");
  let tokens = 0, weighted = 0;
  for (const s of sequences) {
    const count = trainedCount(s);
    tokens += count;
    weighted += count * Math.abs(s.advantage) * weights.get(s)!;
  }
  if (weighted === 0) return sequences;
  return sequences.map((s) => ({ ...s, advantage: (s.advantage * tokens) / weighted }));
}

/**
 * ART's packing: sequences in order into rows of at most `rowLength` tokens, a sequence whose prompt a sequence of
 * the row already has counting without it (stored once, as toBatch does), never split; then the rows in a random
 * order, as ART shuffles them. A sequence longer than a row gets a row of its own.
 */
export function packRows(sequences: TrainingSequence[], rowLength: number, random: Rng): TrainingSequence[][] {
  const rows: TrainingSequence[][] = [];
  let row: TrainingSequence[] = [], used = 0, prompts = new Set<string>();
  const length = (s: TrainingSequence) => s.tokens.length - (prompts.has(keyOf(s)) ? sharedLength(s) : 0);
  for (const s of sequences) {
    if (row.length > 0 && used + length(s) > rowLength) {
      rows.push(row);
      [row, used, prompts] = [[], 0, new Set()];
    }
    used += length(s);
    prompts.add(keyOf(s));
    row.push(s);
  }
  rows.push(row);
  return shuffleInPlace(rows, random);
}

/**
 * Concatenates sequences into one batch; row t of a sequence scores token t+1 when that token is trained.
 * With `sharePrompts`, sequences whose untrained prompts are identical (a GRPO group) store that prompt once: the
 * prompt (all but its last token) becomes one segment, and each sequence keeps only its last prompt token and its
 * completion, attending to the shared rows. Scored rows stay in the order of `sequences`.
 */
export function toBatch(sequences: TrainingSequence[], sharePrompts = false): SequenceBatch {
  const counts = new Map<string, number>();
  if (sharePrompts) for (const s of sequences) if (sharedLength(s) > 0) counts.set(keyOf(s), (counts.get(keyOf(s)) ?? 0) + 1);

  const tokens: number[] = [];
  const positions: number[] = [];
  const targets: number[] = [];
  const segments: PackedSegment[] = [];
  const prefixes = new Map<string, { start: number; length: number }>();
  const pushRows = (s: TrainingSequence, from: number, to: number, position0: number, scored: boolean) => {
    for (let t = from; t < to; t++) {
      tokens.push(s.tokens[t]);
      positions.push(position0 + t - from);
      targets.push(scored && t + 1 < s.tokens.length && s.trainable[t + 1] ? s.tokens[t + 1] : -1);
    }
  };
  for (const s of sequences) {
    const key = keyOf(s);
    if ((counts.get(key) ?? 0) >= 2) {
      const length = sharedLength(s);
      let prefix = prefixes.get(key);
      if (!prefix) {
        prefix = { start: tokens.length, length };
        segments.push({ ...prefix });
        pushRows(s, 0, length, 0, false);
        prefixes.set(key, prefix);
      }
      segments.push({ start: tokens.length, length: s.tokens.length - length, prefix });
      pushRows(s, length, s.tokens.length, length, true);
    } else {
      segments.push({ start: tokens.length, length: s.tokens.length });
      pushRows(s, 0, s.tokens.length, 0, true);
    }
  }
  return { tokens: Int32Array.from(tokens), positions: Int32Array.from(positions), segments, targets: Int32Array.from(targets) };
}

/** fsync of a file or a directory (a directory's entries are durable only once it is synced itself). */
function syncPath(target: string): void {
  const fd = fs.openSync(target, "r");
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** fsync of every file in a directory, then of the directory. */
function syncTree(dir: string): void {
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) if (entry.isFile()) syncPath(path.join(dir, entry.name));
  syncPath(dir);
}
