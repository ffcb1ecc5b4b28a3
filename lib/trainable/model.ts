/**
 * TrainableModel: one engine for rollouts and training.
 *
 * The base model is loaded once. The OpenAI-compatible server (lib/serve) samples from those weights plus the live
 * LoRA of the training pass (DifferentiableTransformer, on the backend the model was loaded on, CPU or GPU): the
 * engine's LoRA tensors are the very tensors AdamW updates, so after `train()` the next request already uses the new
 * adapter — no weight copy, no save-and-reload. Training pauses new decode passes while it runs and resumes them
 * afterwards.
 *
 * On disk, in ART's layout under `{artDir}/{project}/models/{name}/`:
 *   model.json                          name, project, base model, LoRA settings
 *   history.jsonl                       one row of metrics per train()/log() call, keyed by `step`
 *   trajectories/{split}/{step:04d}.jsonl   the trajectories behind those rows
 *   checkpoints/{step:04d}/             PEFT adapter + optimizer state + trainer state after each train()
 *   state.json                          the user's own state (readState / overwriteState / mergeState)
 * `step` in history and trajectories is the step of the model that produced the rollouts (the checkpoint they
 * were sampled from); train() then writes checkpoint step + 1. A new TrainableModel resumes from the latest
 * checkpoint: the adapter, the AdamW moments and the step. Past checkpoints answer as `{name}@{step}`.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import process from "node:process";
import OpenAI from "openai";
import { ArtError } from "../core/errors.ts";
import { seededRandom, shuffleInPlace } from "../core/random.ts";
import type { Message, Tool, Trajectory, TrajectoryGroup } from "../core/trajectory.ts";
import { interruptScope, throwIfInterrupted } from "../core/interrupt.ts";
import { createAdamWState, type AdamWState } from "../grpo/adamw.ts";
import { resolveTrainConfig, type TrainConfigInit } from "../grpo/config.ts";
import { tokenizeForSft, type TrainingSequence } from "../grpo/tokenize.ts";
import { Trainer, checkpointDir, type StepResult } from "../grpo/train.ts";
import { loadCausalLM, type CausalLM, type Device } from "../load/causal-lm.ts";
import type { DType, Tensor } from "../model/backend.ts";
import { DEFAULT_LORA, type LayerLoras, type LoraConfig } from "../model/lora.ts";
import { loadAdapter } from "../model/peft.ts";
import { DifferentiableTransformer } from "../model/training.ts";
import { ApiError } from "../serve/api-error.ts";
import type { BatcherOptions } from "../serve/batcher.ts";
import type { HttpServerHandle, HttpServerOptions } from "../serve/http.ts";
import { ReplicaFleet, type PushResult, type Replica } from "../serve/fleet.ts";
import { IN_PROCESS_BASE_URL, ModelServer } from "../serve/model-server.ts";
import { checkMode, evaluateScenarios, type EvaluateOptions, type EvaluationMode, type ScenarioRollout } from "./evaluate.ts";
import { alarms, stopDecision, type Alarm, type AlarmOptions, type StopDecision, type StoppingRule } from "./monitor.ts";
import {
  appendHistory, flatGroup, readHistory, readTrajectories, summarizeGroups, trajectoriesFile, writeTrajectories, type HistoryRow,
} from "./store.ts";

export interface TrainableModelOptions {
  /** The trained model's id: requests for this model use the latest adapter. */
  name: string;
  project: string;
  /** A checkpoint directory or a Hugging Face id in the local hub cache; it answers under this id too. */
  baseModel: string;
  /** Default "auto". LoRA training runs on the backend the model is loaded on (CUDA: verified on the kernel emulator). */
  device?: Device;
  /**
   * How the base weights are stored: default "bf16" on CUDA, "f32" on the CPU. "bf16" on the CPU rounds them as a GPU
   * does and, beside the system BLAS, decodes rollouts from a bf16 copy, half the bytes a step, 1.1–1.2× faster than f32
   * on the 20M bench model (docs/engine.md); the LoRA trains in f32 either way.
   */
  dtype?: DType;
  /** LoRA rank, alpha, target modules; defaults are ART's (r 8, alpha 16, all seven projections). */
  lora?: Partial<LoraConfig>;
  /** Root of the on-disk layout; default ".art". */
  artDir?: string;
  /** Seed of a new adapter's initialisation. Default 0. */
  seed?: number;
  /** KV-cache slots, context length and queue bound of the server's batcher. */
  batcher?: BatcherOptions;
  /** Notes about loading, resuming and pruning checkpoints. Default console.info. */
  log?: (message: string) => void;
  /**
   * Inference servers to keep on the latest adapter (art-ts serve --allow-runtime-lora, or vLLM with runtime LoRA
   * updating): each checkpoint is pushed to them under `name`, and `model.replicas.openai()` spreads rollouts over
   * them (docs/scale.md). The checkpoints' paths must be readable on their machines.
   */
  replicas?: Replica[];
}

/** A conversation for supervised fine-tuning: its messages (assistant turns are trained) and the tools it offers. */
export interface SftConversation { messages: Message[]; tools?: Tool[] }

export interface SftOptions {
  /** passes over the conversations; default 1 */
  epochs?: number;
  /** conversations per AdamW step; default 8 */
  batchSize?: number;
  /** peak learning rate; default 2e-4 */
  learningRate?: number;
  /** after the warm-up: default "linear" decay to 0, "cosine" to 0, or "constant" */
  schedule?: "linear" | "cosine" | "constant";
  /** share of the steps spent warming up linearly; default 0.1 */
  warmupRatio?: number;
  /** every assistant turn ("all", default) or only each conversation's last */
  trainOn?: "all" | "last";
  /** of the shuffle; default 0 */
  seed?: number;
}

/** Device copies of what a training step changes, to put back when the step fails. */
interface TrainingSnapshot {
  params: Map<string, Tensor>;
  m: Map<string, Tensor>;
  v: Map<string, Tensor>;
  optimizerStep: number;
}

/** What trainSft() reports. */
export interface SftResult {
  /** the checkpoint step it saved */
  step: number;
  /** the loss of each AdamW step, in order */
  losses: number[];
  /** conversations truncated or without an assistant message */
  warnings: string[];
  metrics: HistoryRow;
}

/** What train() reports: the step's training result and the mean reward and metrics of its rollouts. */
export interface TrainResult extends StepResult {
  warnings: string[];
  skippedTrajectories: number;
  /** the history row written for this call */
  metrics: HistoryRow;
}

/** What validate() runs, and when. */
export interface ValidateOptions<S> extends EvaluateOptions {
  /** Validate when the model's step is a multiple of this (step 0, the base model, included). */
  every: number;
  /** The held-out scenarios, the same at every validation so the values compare. */
  scenarios: readonly S[];
  /** Training's rollout, playing the model under training (`model.name`), told the mode to sample in. */
  rollout: ScenarioRollout<S>;
  /** Default "val". One mode per split: log the other under its own split, e.g. "val_greedy". */
  split?: string;
  /** After logging, delete checkpoints but the latest and the best by `{split}/reward` (deleteCheckpoints). */
  keepBest?: boolean;
}

/** What validate() did when it was due. */
export interface Validation {
  /** the step evaluated: checkpoint `step` (0: the base model) */
  step: number;
  /** the history row it wrote */
  row: HistoryRow;
  /** one group per scenario, e.g. for stepRecord(step, groups, "val") */
  groups: TrajectoryGroup[];
  /** checkpoints deleted by keepBest */
  deleted: number[];
}

/** A JSON value, as model state holds them. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };
/** The user's state of a model, e.g. where a dataset iterator stopped: a JSON object. */
export type ModelState = { [key: string]: JsonValue };

const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

function checkName(key: string, value: unknown): string {
  if (typeof value !== "string" || !NAME_PATTERN.test(value)) {
    throw new ArtError("bad_model_name", `TrainableModel: ${key} must be a non-empty name of letters, digits, ".", "_" or "-" (it becomes a folder), got ${JSON.stringify(value)}`);
  }
  return value;
}

/** Checkpoint steps present under `dir`, ascending. */
function checkpointSteps(dir: string): number[] {
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir).filter((entry) => /^\d{4,}$/.test(entry)).map(Number).sort((a, b) => a - b);
}

export class TrainableModel {
  readonly name: string;
  readonly project: string;
  readonly baseModel: string;
  /** `{artDir}/{project}/models/{name}` */
  readonly dir: string;
  readonly lm: CausalLM;
  readonly server: ModelServer;
  /** The differentiable transformer over the served weights: the adapter it trains is the one requests sample with. */
  readonly network: DifferentiableTransformer;
  private readonly artDir: string;
  private readonly optimizer: AdamWState;
  private currentStep: number;
  /** train() calls run one after another */
  private queue: Promise<unknown> = Promise.resolve();
  /** when the last train() call ended (performance.now()), for the next step's wall time */
  private lastTrainEnd: number | null = null;
  /** whether a step with nothing to train has been logged: once a session (history's train/flat_groups counts them) */
  private nothingToTrainLogged = false;
  /** adapters of past checkpoints loaded for `name@step` requests; freed by close() */
  private readonly pastAdapters: LayerLoras[][] = [];
  /** The replicas given in the options, kept on the latest adapter; null without them. */
  readonly replicas: ReplicaFleet | null;
  /** where notes go (options.log, default console.info) */
  private readonly info: (message: string) => void;
  /** set by close(): the weights are freed, so every later use must say so rather than fail somewhere deeper */
  private closed = false;

  private constructor(init: {
    options: TrainableModelOptions; lm: CausalLM; network: DifferentiableTransformer; optimizer: AdamWState; step: number;
  }) {
    const { options } = init;
    this.name = options.name;
    this.project = options.project;
    this.baseModel = options.baseModel;
    this.artDir = options.artDir ?? ".art";
    this.dir = path.join(this.artDir, this.project, "models", this.name);
    this.lm = init.lm;
    this.network = init.network;
    this.optimizer = init.optimizer;
    this.currentStep = init.step;
    this.info = options.log ?? console.info;
    this.replicas = options.replicas ? new ReplicaFleet(options.replicas) : null;
    this.server = new ModelServer({ batcher: options.batcher });
    this.server.addBaseModel(this.baseModel, init.lm);
    // One LoRA set for the model's lifetime: the batcher groups requests by this object, and its tensors are the
    // ones AdamW updates in place, so each update is visible to the next forward pass.
    const loras: LayerLoras[] = init.network.engineLoras();
    this.server.addAdapter(this.name, this.baseModel, loras);
    this.server.addAdapterSource({ resolve: (id) => this.resolveCheckpointId(id), ids: () => [0, ...this.checkpoints()].map((s) => this.inferenceName(s)) });
  }

  /** Loads the base model once, then resumes from the latest checkpoint under `artDir` if there is one. */
  static async load(options: TrainableModelOptions): Promise<TrainableModel> {
    checkName("name", options.name);
    checkName("project", options.project);
    if (typeof options.baseModel !== "string" || options.baseModel === "") {
      throw new ArtError("bad_model_name", "TrainableModel: baseModel must be a checkpoint directory or a Hugging Face id");
    }
    if (options.baseModel === options.name) {
      throw new ArtError("bad_model_name", `TrainableModel: name "${options.name}" equals the base model's id; the two answer under different ids, so pick another name`);
    }
    const log = options.log ?? console.info;
    const lora: LoraConfig = resolveTrainConfig({ lora: options.lora ?? DEFAULT_LORA }).lora!;
    const device = options.device ?? "auto";
    const lm = await loadCausalLM(options.baseModel, { device, dtype: options.dtype, log });
    let trainerState: TrainerState;
    try {
      trainerState = attachTrainer(lm, options, lora, log);
    } catch (error) {
      lm.free();
      throw error;
    }
    const { network, optimizer, step } = trainerState;
    const model = new TrainableModel({ options, lm, network, optimizer, step });
    model.writeModelJson();
    if (model.replicas) await model.pushToReplicas();
    return model;
  }

  /**
   * Loads the current adapter on every replica under `name` (the latest checkpoint; before the first step, the new
   * adapter written to `{dir}/initial-adapter`). train() calls this after each step; a replica it does not reach is
   * left out of rollouts until a later push does (noted in the log), and the step is kept either way.
   */
  async pushToReplicas(): Promise<PushResult[]> {
    this.checkOpen("pushToReplicas()");
    if (!this.replicas) throw new ArtError("no_replicas", "pushToReplicas(): this model has no replicas; give TrainableModel.load({ replicas: [{ baseURL }] })");
    let adapter = path.resolve(checkpointDir(this.project, this.name, this.currentStep, this.artDir));
    if (!fs.existsSync(adapter)) {
      adapter = path.resolve(this.dir, "initial-adapter");
      this.network.saveAdapter(adapter, this.baseModel);
    }
    const results = await this.replicas.pushAdapter(this.name, adapter);
    for (const failed of results.filter((r) => !r.ok)) {
      this.info(`art-ts: replica ${failed.baseURL} did not take step ${this.currentStep}'s adapter (${failed.error}); rollouts skip it until a later push reaches it`);
    }
    return results;
  }

  /** The step of the current adapter: how many train() calls it has seen, across resumes. */
  get step(): number {
    return this.currentStep;
  }

  /**
   * The model id to request: `name` (the live adapter, which each train() updates) or, given a step, `name@step`,
   * which answers with that checkpoint's adapter however far training has gone since (step 0 is the new
   * adapter, which answers like the base model).
   */
  inferenceName(step?: number): string {
    return step === undefined ? this.name : `${this.name}@${step}`;
  }

  /** The `openai` package's client, answering in-process (no network, no port). Model ids: name, name@step and baseModel. */
  openai(options: { maxRetries?: number; timeout?: number } = {}): OpenAI {
    this.checkOpen("openai()");
    return new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "art-ts-in-process", fetch: this.server.fetch, ...options });
  }

  /** Serves the same engine over HTTP (loopback by default) for agents in other processes. */
  serve(options: HttpServerOptions = {}): Promise<HttpServerHandle> {
    this.checkOpen("serve()");
    return this.server.listen(options);
  }

  /**
   * One GRPO step on `groups` (advantages per group, ART's semantics): pauses new decode passes, trains the
   * adapter in place, saves checkpoint step + 1, logs history and trajectories, and resumes serving.
   * `config` is a TrainConfig without `lora` (the adapter's shape is fixed at load).
   */
  train(groups: TrajectoryGroup[], config: Omit<TrainConfigInit, "lora"> = {}): Promise<TrainResult> {
    this.checkOpen("train()");
    if ("lora" in config) {
      throw new ArtError("bad_train_config", "TrainableModel.train: config.lora cannot change between steps; set lora when loading the model");
    }
    const run = this.queue.then(() => this.trainNow(groups, config));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async trainNow(groups: TrajectoryGroup[], config: Omit<TrainConfigInit, "lora">): Promise<TrainResult> {
    const sampledAt = this.currentStep;
    throwIfInterrupted(`train(), before step ${sampledAt + 1}`);
    // The rollouts are on disk before anything can fail; a retried step rewrites them.
    writeTrajectories(this.dir, "train", sampledAt, groups, "replace");
    const { result, row } = await this.trainStep("train()", () => {
      const trainer = new Trainer(this.network, { ...config, lora: this.network.lora }, { step: sampledAt, optimizer: this.optimizer });
      return { trainer, result: trainer.trainOnGroups(this.lm.tokenizer, groups) };
    }, (result, trainerSeconds) => {
      const now = performance.now();
      // The step's wall time runs from the end of the previous train() call (rollouts and judging included).
      const wallSeconds = this.lastTrainEnd === null ? null : (now - this.lastTrainEnd) / 1000;
      return {
        step: sampledAt,
        recorded_at: new Date().toISOString(),
        training_step: sampledAt + 1,
        ...summarizeGroups("train", groups),
        "train/skipped_trajectories": result.skippedTrajectories,
        "loss/train": result.loss,
        "loss/grad_norm": result.gradNorm,
        "loss/learning_rate": result.learningRate,
        "loss/entropy": result.entropy,
        "loss/kl_div": result.kl,
        "loss/clip_fraction": result.clipFraction,
        "loss/num_gradient_steps": result.gradientSteps,
        "time/step_trainer_s": trainerSeconds,
        ...(wallSeconds === null ? {} : { "time/step_wall_s": wallSeconds }),
        // ART's names for what the step was given and trained on
        "data/step_num_trajectories": groups.reduce((n, g) => n + g.trajectories.length, 0),
        "data/step_num_groups_submitted": groups.length,
        "data/step_num_groups_trainable": groups.filter((g) => g.trajectories.length > 1 && !flatGroup(g)).length,
        "data/step_trainable_assistant_tokens": result.trainedTokens,
        "throughput/trained_tokens": result.trainedTokens,
        "throughput/trainer_tokens_per_s": result.trainedTokens / trainerSeconds,
      };
    });
    this.lastTrainEnd = performance.now();
    // What ART prints: each sequence dropped as too long; a step with nothing to train, the first time (late in a run
    // isolated flat steps are common, and the no_signal alarm speaks for a lasting condition).
    for (const warning of result.warnings) this.info(`art-ts: WARNING: ${this.name} step ${sampledAt + 1}: ${warning}`);
    if (!result.trained && result.message && !this.nothingToTrainLogged) {
      this.info(`art-ts: ${this.name}: ${result.message} (said once; history.jsonl's train/flat_groups counts such groups)`);
      this.nothingToTrainLogged = true;
    }
    return { ...result, metrics: row };
  }

  /**
   * One training step as a unit, sampling paused: `train` updates the adapter and the AdamW state in memory, the
   * checkpoint of the next step is saved with `row` inside it, then `row` is appended to history.jsonl and the step
   * advances. If any
   * of it fails (a bad batch, a full disk), the adapter and AdamW state are put back as they were, a checkpoint the
   * call wrote is removed, the step stays, and the error says so; nothing of earlier steps is touched.
   */
  private async trainStep<T>(what: string, train: () => { trainer: Trainer; result: T }, row: (result: T, trainerSeconds: number) => HistoryRow): Promise<{ result: T; row: HistoryRow }> {
    const step = this.currentStep + 1;
    const checkpoint = checkpointDir(this.project, this.name, step, this.artDir);
    // A step runs to its checkpoint; an interrupt meanwhile stops the loop at its next boundary.
    const interrupt = interruptScope(() => `${what} step ${step}`);
    const started = performance.now();
    await this.server.pause();
    const before = this.snapshotTraining();
    let outcome!: { result: T; row: HistoryRow };
    try {
      const { trainer, result } = train();
      const historyRow = row(result, (performance.now() - started) / 1000);
      // The row rides inside the checkpoint: a crash between its rename and the append below is repaired on load.
      trainer.saveCheckpoint(checkpoint, this.baseModel, { [HISTORY_ROW_FILE]: `${JSON.stringify(historyRow)}\n` });
      try {
        appendHistory(this.dir, historyRow);
      } catch (error) {
        fs.rmSync(checkpoint, { recursive: true, force: true });
        throw error;
      }
      this.currentStep = step;
      outcome = { result, row: historyRow };
    } catch (error) {
      this.restoreTraining(before);
      if (error instanceof ArtError) throw error; // bad input, said where it is; the state is back as it was
      const code = (error as NodeJS.ErrnoException).code;
      throw new ArtError("train_step_failed", `${what}: step ${step} failed while training or saving it under ${checkpoint} (${code ? `${code}: ` : ""}${(error as Error).message ?? String(error)}); it was undone: the adapter and optimizer are as after step ${step - 1}, and the call may be repeated`, { cause: error });
    } finally {
      this.freeSnapshot(before);
      this.server.resume();
      interrupt.end();
    }
    // Serving resumed here first; the replicas follow (a push that fails is logged, the step stands).
    if (this.replicas) await this.pushToReplicas();
    return outcome;
  }

  /** Copies of the trained tensors and the AdamW moments, on the device, to undo a step that failed. */
  private snapshotTraining(): TrainingSnapshot {
    const { backend } = this.network;
    const copies = (tensors: Map<string, Tensor>) => new Map([...tensors].map(([name, t]) => [name, backend.copy(t)]));
    return {
      params: new Map(this.network.parameterTensors().map((p) => [p.name, backend.copy(p.value)])),
      m: copies(this.optimizer.m), v: copies(this.optimizer.v), optimizerStep: this.optimizer.step,
    };
  }

  private restoreTraining(snapshot: TrainingSnapshot): void {
    const { backend } = this.network;
    for (const p of this.network.parameterTensors()) backend.write(p.value, backend.download(snapshot.params.get(p.name)!));
    for (const [moments, saved] of [[this.optimizer.m, snapshot.m], [this.optimizer.v, snapshot.v]] as const) {
      for (const [name, tensor] of moments) {
        const copy = saved.get(name);
        if (copy) backend.write(tensor, backend.download(copy));
        else {
          backend.free(tensor); // created by the failed step
          moments.delete(name);
        }
      }
    }
    this.optimizer.step = snapshot.optimizerStep;
  }

  private freeSnapshot(snapshot: TrainingSnapshot): void {
    for (const tensors of [snapshot.params, snapshot.m, snapshot.v]) for (const t of tensors.values()) this.network.backend.free(t);
  }

  /**
   * Supervised fine-tuning of the same adapter, e.g. before RL (ART's train_sft): the conversations' assistant
   * turns, `batchSize` conversations per AdamW step, `epochs` passes in a seeded shuffled order, the learning rate
   * warming up over `warmupRatio` of the steps to `learningRate`, then following `schedule`. Pauses sampling like
   * train(), saves checkpoint step + 1 and writes a history row.
   */
  trainSft(conversations: SftConversation[], options: SftOptions = {}): Promise<SftResult> {
    this.checkOpen("trainSft()");
    const run = this.queue.then(() => this.trainSftNow(conversations, options));
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** trainSft on a JSONL file: one `{"messages": [...], "tools": [...]}` conversation per line. */
  async trainSftFromFile(file: string, options: SftOptions = {}): Promise<SftResult> {
    return this.trainSft(readSftConversations(file), options);
  }

  private async trainSftNow(conversations: SftConversation[], options: SftOptions): Promise<SftResult> {
    const { epochs = 1, batchSize = 8, learningRate = 2e-4, schedule = "linear", warmupRatio = 0.1, trainOn = "all", seed = 0 } = options;
    for (const [key, value] of [["epochs", epochs], ["batchSize", batchSize]] as const) {
      if (!Number.isInteger(value) || value < 1) throw new ArtError("bad_sft_config", `trainSft: ${key} must be an integer >= 1, got ${JSON.stringify(value)}`);
    }
    if (!(warmupRatio >= 0 && warmupRatio < 1)) throw new ArtError("bad_sft_config", `trainSft: warmupRatio must be in [0, 1), got ${warmupRatio}`);
    if (trainOn !== "all" && trainOn !== "last") throw new ArtError("bad_sft_config", `trainSft: trainOn must be "all" or "last", got ${JSON.stringify(trainOn)}`);
    const { sequences, warnings } = tokenizeForSft(this.lm.tokenizer, conversations, resolveTrainConfig().maxSequenceLength, trainOn);
    if (sequences.length === 0) throw new ArtError("bad_sft_data", `trainSft: no conversation has an assistant message to train (${warnings.length} skipped)`);
    const random = seededRandom(seed);
    const batches: TrainingSequence[][] = [];
    for (let epoch = 0; epoch < epochs; epoch++) {
      const order = shuffleInPlace([...sequences], random);
      for (let start = 0; start < order.length; start += batchSize) batches.push(order.slice(start, start + batchSize));
    }
    const totalSteps = batches.length, warmupSteps = Math.floor(warmupRatio * totalSteps);
    const config: TrainConfigInit = {
      lora: this.network.lora, learningRate, optimizerSteps: "one", seed,
      schedule: schedule === "constant" ? { kind: "constant", warmupSteps } : { kind: schedule, warmupSteps, totalSteps: Math.max(totalSteps, warmupSteps + 1) },
    };
    const sampledAt = this.currentStep;
    throwIfInterrupted(`trainSft(), before step ${sampledAt + 1}`);
    const { result: losses, row } = await this.trainStep("trainSft()", () => {
      const losses: number[] = [];
      // The trainer counts the batches, which is what the schedule runs over; the checkpoint counts the call.
      const trainer = new Trainer(this.network, config, { step: 0, optimizer: this.optimizer });
      for (const batch of batches) losses.push(trainer.sftStep(batch).loss);
      trainer.step = sampledAt + 1;
      return { trainer, result: losses };
    }, (losses, trainerSeconds) => ({
      step: sampledAt,
      recorded_at: new Date().toISOString(),
      training_step: sampledAt + 1,
      "sft/conversations": sequences.length,
      "loss/train": losses.reduce((a, b) => a + b, 0) / losses.length,
      "loss/learning_rate": learningRate,
      "loss/num_gradient_steps": losses.length,
      "time/step_trainer_s": trainerSeconds,
    }));
    return { step: this.currentStep, losses, warnings, metrics: row };
  }

  /**
   * Records evaluation trajectories (or groups) at the current step: trajectories/{split}/ and a history row. With
   * `mode`, the row says how they sampled (`{split}/greedy`: 1 or 0), and a split keeps to one mode.
   */
  log(items: Trajectory[] | TrajectoryGroup[], options: { split?: string; mode?: EvaluationMode } = {}): HistoryRow {
    const split = checkName("split", options.split ?? "val");
    return this.record(split, items, { step: this.currentStep, mode: options.mode, checkpoint: true });
  }

  /**
   * Plays `scenarios` with `rollout` (`repeats` times each, concurrently; default once) and returns one group per
   * scenario, for log(), logBaseline() or a plot. The rollout picks the policy: this model, its base model
   * (`model.baseModel`), a prompted model behind any OpenAI-compatible endpoint, or a scripted player; it is told the
   * `mode` ("sampled", the default, or "greedy": temperature 0) and samples accordingly.
   */
  evaluate<S>(scenarios: readonly S[], rollout: ScenarioRollout<S>, options: EvaluateOptions = {}): Promise<TrajectoryGroup[]> {
    return evaluateScenarios(scenarios, rollout, options);
  }

  /**
   * Records a baseline's evaluation (the base model, a prompted model behind an endpoint, a scripted player) beside
   * the trained model's: trajectories/baseline/{name}/ and a history row of `baseline/{name}/*` metrics. Play it with
   * evaluate() and the rollout validation uses, on the same scenarios, so the two compare.
   */
  logBaseline(name: string, items: Trajectory[] | TrajectoryGroup[], options: { mode?: EvaluationMode } = {}): HistoryRow {
    checkName("baseline name", name);
    // No training_step: a baseline is no checkpoint of this model, whatever step it was measured at.
    return this.record(`baseline/${name}`, items, { step: this.currentStep, mode: options.mode, checkpoint: false });
  }

  /**
   * Validation on a schedule, for a loop to call each step: when the step is a multiple of `every` (and this split has
   * no row at it yet, so a resumed loop does not repeat one), plays `scenarios` with `rollout` in `mode`, logs them
   * under `split` with the mode in the row, and with `keepBest` prunes checkpoints to the latest and the best by
   * `{split}/reward`. Null when not due. After the loop, `every: 1` validates the last checkpoint.
   */
  async validate<S>(options: ValidateOptions<S>): Promise<Validation | null> {
    this.checkOpen("validate()");
    const { every } = options;
    if (!Number.isInteger(every) || every < 1) {
      throw new ArtError("bad_evaluation", `validate: every must be a whole number of steps, 1 or more (1 validates at every step); got ${JSON.stringify(every)}`);
    }
    const split = checkName("split", options.split ?? "val");
    const mode = checkMode(options.mode ?? "sampled", "validate");
    const step = this.currentStep;
    if (step % every !== 0 || this.history().some((row) => row.step === step && typeof row[`${split}/reward`] === "number")) return null;
    this.checkSingleMode(split, mode); // before the rollouts, not after
    const groups = await evaluateScenarios(options.scenarios, options.rollout, {
      mode, repeats: options.repeats, maxExceptions: options.maxExceptions, progress: options.progress,
      description: options.description ?? `${split} at step ${step} (${mode})`,
    });
    const row = this.record(split, groups, { step, mode, checkpoint: true });
    const deleted = options.keepBest ? this.deleteCheckpoints({ keepBestBy: `${split}/reward` }) : [];
    return { step, row, groups, deleted };
  }

  /** Writes a split's trajectories and history row at `step`; `checkpoint`: the row evaluates checkpoint `step`. */
  private record(split: string, items: Trajectory[] | TrajectoryGroup[], options: { step: number; mode?: EvaluationMode; checkpoint: boolean }): HistoryRow {
    const { step, mode } = options;
    if (mode !== undefined) this.checkSingleMode(split, checkMode(mode, "log"));
    const groups = items.map((item) => ("trajectories" in item ? item : { trajectories: [item], exceptions: [] }));
    const row: HistoryRow = {
      step,
      recorded_at: new Date().toISOString(),
      ...(options.checkpoint ? { training_step: step } : {}),
      ...summarizeGroups(split, groups),
      ...(mode === undefined ? {} : { [`${split}/greedy`]: mode === "greedy" ? 1 : 0 }),
    };
    writeTrajectories(this.dir, split, step, groups);
    appendHistory(this.dir, row);
    return row;
  }

  /** Refuses to mix modes in a split: its curve would move with the mode, not the model, and fool the alarms. */
  private checkSingleMode(split: string, mode: EvaluationMode): void {
    const flag = mode === "greedy" ? 1 : 0;
    const other = this.history().find((row) => typeof row[`${split}/greedy`] === "number" && row[`${split}/greedy`] !== flag);
    if (other) {
      const otherMode = flag === 1 ? "sampled" : "greedy";
      const baseline = split.startsWith("baseline/") ? split.slice("baseline/".length) : null;
      const fix = baseline === null ? `under a split of their own, e.g. { split: "${split}_${mode}" }` : `as a baseline of their own, e.g. logBaseline("${baseline}-${mode}", ...)`;
      throw new ArtError("mixed_evaluation_modes", `"${split}" holds ${otherMode} evaluations (step ${other.step} in ${path.join(this.dir, "history.jsonl")}); a ${mode} one beside them would show a change that is only the mode's. Log ${mode} evaluations ${fix}`);
    }
  }

  /** Metrics rows of history.jsonl, oldest first. */
  history(): HistoryRow[] {
    return readHistory(this.dir);
  }

  /**
   * Asks stopping rules about this model's history (a target, a plateau beyond the metric's noise, both of two
   * metrics on a plateau, a budget; docs/stopping.md). The decision and its reason go to the log.
   */
  stopDecision(rules: StoppingRule[]): StopDecision {
    const decision = stopDecision(this.history(), rules);
    this.info(`art-ts: ${this.name} at step ${this.currentStep}: ${decision.reason}`);
    return decision;
  }

  /**
   * The alarms this model's history raises at its latest step (reward hacking, collapse, no signal). Each one new at
   * its step is written to history.jsonl (an `alarm` row naming the step's trajectories) and logged unless it was
   * raised at the step before too; the returned alarms carry that file's split and path, which
   * `model.trajectories(alarm.step, alarm.split)` reads back.
   */
  alarms(options: AlarmOptions = {}): Alarm[] {
    const history = this.history();
    const written = new Set(history.filter((row) => typeof row.alarm === "string").map((row) => `${row.step} ${row.alarm}`));
    return alarms(history, options).map((alarm) => {
      const split = ["train", "val"].find((name) => fs.existsSync(trajectoriesFile(this.dir, name, alarm.step)));
      const file = split === undefined ? undefined : trajectoriesFile(this.dir, split, alarm.step);
      if (!written.has(`${alarm.step} ${alarm.kind}`)) {
        // A lasting condition (no_signal as a policy settles) is raised step after step: the log says it once a run.
        if (!written.has(`${alarm.step - 1} ${alarm.kind}`)) this.info(`art-ts: ALARM ${alarm.kind} at step ${alarm.step}: ${alarm.message}`);
        appendHistory(this.dir, {
          step: alarm.step, recorded_at: new Date().toISOString(), alarm: alarm.kind, alarm_message: alarm.message,
          ...(file ? { alarm_trajectories: path.relative(this.dir, file) } : {}),
        });
      }
      return file && split ? { ...alarm, split, trajectories: file } : alarm;
    });
  }

  /** The trajectories kept for `step` of `split` (train: the rollouts trained on at that step), oldest first. */
  trajectories(step: number, split = "train"): Trajectory[] {
    return readTrajectories(this.dir, split, step);
  }

  /** Checkpoint steps on disk, ascending. */
  checkpoints(): number[] {
    return checkpointSteps(path.join(this.dir, "checkpoints"));
  }

  /**
   * Deletes checkpoints except the latest and the best by `keepBestBy` (a history key such as "val/reward",
   * judged at the step it was logged; `lowerIsBetter` for losses). Returns the deleted steps.
   * A metric never logged is an error (a typo would otherwise delete the best checkpoint); one logged only at steps
   * without a checkpoint (the base model's step 0) keeps the latest alone, as ART's loops expect.
   */
  deleteCheckpoints(options: { keepBestBy?: string; lowerIsBetter?: boolean } = {}): number[] {
    const metric = options.keepBestBy ?? "val/reward";
    const steps = this.checkpoints();
    if (steps.length === 0) return [];
    const keep = new Set([steps.at(-1)!]);
    const present = new Set(steps);
    const history = this.history();
    let logged = false;
    let best: { step: number; value: number } | null = null;
    for (const row of history) {
      const value = row[metric];
      if (typeof value !== "number" || !Number.isFinite(value)) continue;
      logged = true;
      if (!present.has(row.step)) continue;
      const better = best === null || (options.lowerIsBetter ? value < best.value : value > best.value);
      if (better) best = { step: row.step, value };
    }
    if (!logged) {
      const known = [...new Set(history.flatMap((row) => Object.keys(row)))].filter((k) => k !== "step" && k !== "recorded_at");
      throw new ArtError("unknown_metric", `deleteCheckpoints: "${metric}" was never logged in ${path.join(this.dir, "history.jsonl")}; log it with model.log(trajectories, { split: "val" }) or keep by one of: ${known.join(", ") || "(none logged yet)"}`);
    }
    if (best === null) this.info(`${this.name}: no checkpoint on disk has a "${metric}" value yet; keeping the latest (${steps.at(-1)}) only`);
    else keep.add(best.step);
    const deleted = steps.filter((s) => !keep.has(s));
    for (const s of deleted) {
      fs.rmSync(checkpointDir(this.project, this.name, s, this.artDir), { recursive: true, force: true });
      this.server.removeModel(this.inferenceName(s));
    }
    return deleted;
  }

  /** The state last written with overwriteState or mergeState (state.json), or null when there is none. */
  readState(): ModelState | null {
    const file = this.stateFile();
    if (!fs.existsSync(file)) return null;
    try {
      const state: unknown = JSON.parse(fs.readFileSync(file, "utf8"));
      return checkState(state, file);
    } catch (error) {
      if (error instanceof ArtError) throw error;
      throw new ArtError("bad_state", `${file} is not JSON (${(error as Error).message}); fix it, or replace it with model.overwriteState({...})`);
    }
  }

  /** Replaces the model's state with `state` (a JSON object), written atomically beside the checkpoints. */
  overwriteState(state: ModelState): void {
    const checked = checkState(state, "overwriteState");
    fs.mkdirSync(this.dir, { recursive: true });
    const file = this.stateFile(), tmp = `${file}.tmp-${process.pid}`;
    fs.writeFileSync(tmp, JSON.stringify(checked, null, 2) + "\n");
    fs.renameSync(tmp, file);
  }

  /**
   * Merges `update` into the state and saves it: objects merge key by key, at any depth; any other value (arrays
   * included) replaces the one before. Returns the merged state.
   */
  mergeState(update: ModelState): ModelState {
    const merged = mergeJson(this.readState() ?? {}, checkState(update, "mergeState")) as ModelState;
    this.overwriteState(merged);
    return merged;
  }

  /** Stops serving (HTTP servers too) and frees the weights, the adapter it trains with its optimizer state, and the past adapters it loaded. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.queue;
    await this.server.close();
    for (const loras of this.pastAdapters.splice(0)) {
      for (const layer of loras) for (const w of Object.values(layer)) {
        this.lm.backend.free(w.a);
        this.lm.backend.free(w.b);
      }
    }
    this.network.free();
    for (const moments of [this.optimizer.m, this.optimizer.v]) {
      for (const tensor of moments.values()) this.lm.backend.free(tensor);
      moments.clear();
    }
    this.lm.free();
  }

  private checkOpen(method: string): void {
    if (this.closed) {
      throw new ArtError("model_closed", `${method}: the model "${this.name}" was closed (close() freed its weights). Load it again with TrainableModel.load (in a notebook, re-run the cell that loads it); training resumes from its latest checkpoint.`);
    }
  }

  private stateFile(): string {
    return path.join(this.dir, "state.json");
  }

  /** The route of `name@step`: that checkpoint's adapter, loaded once; null for ids of other models. */
  private resolveCheckpointId(id: string): { baseId: string; loras: LayerLoras[] | null } | null {
    const prefix = `${this.name}@`;
    if (!id.startsWith(prefix)) return null;
    const stepText = id.slice(prefix.length);
    const steps = this.checkpoints();
    const present = `checkpoints of ${this.name}: ${[0, ...steps].join(", ")}`;
    if (!/^\d+$/.test(stepText)) {
      throw new ApiError(404, `The model \`${id}\` does not exist: after "@" comes a checkpoint step, a whole number (${present}).`, "invalid_request_error", "model", "model_not_found");
    }
    const step = Number(stepText);
    // No checkpoint 0 is written: step 0 is the new adapter, whose B = 0 leaves the base model unchanged.
    if (step === 0 && !steps.includes(0)) return { baseId: this.baseModel, loras: null };
    if (!steps.includes(step)) {
      throw new ApiError(404, `The model \`${id}\` does not exist: there is no checkpoint ${step} under ${path.join(this.dir, "checkpoints")} (${present}).`, "invalid_request_error", "model", "model_not_found");
    }
    const loras = loadAdapter(checkpointDir(this.project, this.name, step, this.artDir), this.lm.model);
    this.pastAdapters.push(loras);
    return { baseId: this.baseModel, loras };
  }

  private writeModelJson(): void {
    fs.mkdirSync(this.dir, { recursive: true });
    const json = {
      name: this.name, project: this.project, base_model: this.baseModel, trainable: true,
      lora: this.network.lora,
    };
    fs.writeFileSync(path.join(this.dir, "model.json"), JSON.stringify(json, null, 2) + "\n");
  }
}

/** `value` as model state, or an error naming `where` and what is wrong: state is a JSON object. */
function checkState(value: unknown, where: string): ModelState {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new ArtError("bad_state", `${where}: model state is a JSON object ({"key": value, ...}), got ${Array.isArray(value) ? "an array" : JSON.stringify(value)}`);
  }
  const visit = (v: unknown, at: string): void => {
    if (v === null || typeof v === "string" || typeof v === "boolean") return;
    if (typeof v === "number") {
      if (!Number.isFinite(v)) throw new ArtError("bad_state", `${where}: ${at} is ${v}, which JSON cannot hold`);
      return;
    }
    if (Array.isArray(v)) return v.forEach((item, i) => visit(item, `${at}[${i}]`));
    if (typeof v === "object" && [Object.prototype, null].includes(Object.getPrototypeOf(v))) {
      for (const [key, item] of Object.entries(v)) visit(item, `${at}.${key}`);
      return;
    }
    throw new ArtError("bad_state", `${where}: ${at} is ${typeof v === "object" ? v.constructor?.name ?? "an object" : typeof v}, which JSON cannot hold; store plain objects, arrays, strings, numbers, booleans and null`);
  };
  visit(value, "state");
  return value as ModelState;
}

/** `update` merged into `base`: plain objects key by key, everything else replaced. */
function mergeJson(base: JsonValue, update: JsonValue): JsonValue {
  const isObject = (v: JsonValue): v is { [key: string]: JsonValue } => typeof v === "object" && v !== null && !Array.isArray(v);
  if (!isObject(base) || !isObject(update)) return update;
  // A Map and fromEntries keep keys such as "__proto__" as plain keys, as JSON.parse does.
  const merged = new Map(Object.entries(base));
  for (const [key, value] of Object.entries(update)) merged.set(key, merged.has(key) ? mergeJson(merged.get(key)!, value) : value);
  return Object.fromEntries(merged);
}

interface TrainerState {
  network: DifferentiableTransformer;
  optimizer: AdamWState;
  step: number;
}

/** A new adapter over the loaded weights, or the latest checkpoint's adapter, optimizer state and step. */
function attachTrainer(lm: CausalLM, options: TrainableModelOptions, lora: LoraConfig, log: (message: string) => void): TrainerState {
  const artDir = options.artDir ?? ".art";
  const checkpoints = path.join(artDir, options.project, "models", options.name, "checkpoints");
  removeStaleTemporaries(checkpoints, log);
  // Training runs where the engine's weights are: the adapter tensors it trains are the ones the server samples with.
  for (const step of checkpointSteps(checkpoints).reverse()) {
    const dir = checkpointDir(options.project, options.name, step, artDir);
    let trainer: Trainer;
    try {
      trainer = Trainer.resume(dir, lm.model);
    } catch (error) {
      if (!(error instanceof ArtError) || error.code === "full_parameter_checkpoint") throw error;
      // A checkpoint cut short (a crash, a power cut) is set aside and the one before it resumes.
      const aside = `${dir}.damaged-${Date.now()}`;
      fs.renameSync(dir, aside);
      log(`art-ts: WARNING: checkpoint ${dir} is damaged (${error.message}); moved to ${aside}, resuming from the one before`);
      continue;
    }
    if (trainer.network.lora === null) {
      throw new ArtError("full_parameter_checkpoint", `${dir}: a full-parameter checkpoint; TrainableModel trains and serves LoRA adapters over an unchanged base model`);
    }
    repairHistory(path.dirname(checkpoints), dir, log);
    log(`art-ts: ${options.project}/${options.name} resumes at step ${trainer.step} from ${dir}`);
    return { network: trainer.network, optimizer: trainer.optimizer, step: trainer.step };
  }
  return { network: new DifferentiableTransformer(lm.model, { lora, seed: options.seed ?? 0 }), optimizer: createAdamWState(), step: 0 };
}

/** Each checkpoint holds its step's history row, written with it (history.jsonl gets it right after). */
const HISTORY_ROW_FILE = "history_row.json";

/** Appends the checkpoint's history row when history.jsonl lacks it: the process died between the two writes. */
function repairHistory(modelDir: string, checkpoint: string, log: (message: string) => void): void {
  const file = path.join(checkpoint, HISTORY_ROW_FILE);
  if (!fs.existsSync(file)) return;
  let row: HistoryRow;
  try {
    row = JSON.parse(fs.readFileSync(file, "utf8")) as HistoryRow;
  } catch (error) {
    log(`art-ts: WARNING: ${file} is not JSON (${(error as Error).message}); history.jsonl is left as it is`);
    return;
  }
  if (readHistory(modelDir).some((r) => r.training_step === row.training_step && r.recorded_at === row.recorded_at)) return;
  appendHistory(modelDir, row);
  log(`art-ts: history.jsonl lacked the row of ${checkpoint} (the process stopped between the two writes); appended it from the checkpoint`);
}

/** Removes what a save cut short by a crash left behind (`NNNN.tmp-PID` of a process that is gone). */
function removeStaleTemporaries(checkpoints: string, log: (message: string) => void): void {
  if (!fs.existsSync(checkpoints)) return;
  const gone = (pid: number) => {
    try {
      process.kill(pid, 0);
      return false;
    } catch (error) {
      return (error as NodeJS.ErrnoException).code === "ESRCH";
    }
  };
  for (const entry of fs.readdirSync(checkpoints).filter((e) => /^\d{4,}\.tmp-\d+$/.test(e) && gone(Number(e.split("-").at(-1))))) {
    fs.rmSync(path.join(checkpoints, entry), { recursive: true, force: true });
    log(`art-ts: removed ${path.join(checkpoints, entry)}, left by a save that did not finish`);
  }
}

/**
 * The conversations of a JSONL file, one `{"messages": [...], "tools"?: [...]}` per line; errors name the line.
 * trainSftFromFile() reads with it; a notebook reads with it to hold some lines out for evaluation.
 */
export function readSftConversations(file: string): SftConversation[] {
  if (!fs.existsSync(file)) throw new ArtError("not_found", `${file} does not exist; give a JSONL file of {"messages": [...], "tools": [...]} lines`);
  return fs.readFileSync(file, "utf8").split("\n").flatMap((line, i) => {
    if (line.trim() === "") return [];
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (error) {
      throw new ArtError("bad_sft_data", `${file}: line ${i + 1} is not JSON (${(error as Error).message})`);
    }
    const conversation = value as SftConversation;
    if (typeof value !== "object" || value === null || !Array.isArray(conversation.messages)) {
      throw new ArtError("bad_sft_data", `${file}: line ${i + 1} has no "messages" list; each line is {"messages": [...], "tools": [...]}`);
    }
    return [{ messages: conversation.messages, tools: conversation.tools }];
  });
}
