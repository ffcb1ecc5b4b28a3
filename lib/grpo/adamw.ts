/**
 * AdamW with global grad-norm clipping, as torch.optim.AdamW + clip_grad_norm_ do it: bias-corrected moments,
 * decoupled weight decay (p −= lr·wd·p before the Adam update). A non-finite gradient refuses the whole step
 * before any parameter or moment is touched. The step runs on the parameters' backend through TrainingOps (the
 * per-element update is `adamwUpdate` in ops.ts on the CPU).
 */
import { ArtError } from "../core/errors.ts";
import type { Tensor } from "../model/backend.ts";
import { CpuTensor } from "../model/cpu/backend.ts";
import { cpuTrainingOps } from "./cpu-training-ops.ts";
import type { TrainingOps } from "./training-ops.ts";

/** A parameter as host arrays (CPU training). */
export interface TrainableParameter {
  /** PEFT / Hugging Face name, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight */
  name: string;
  value: Float32Array;
  grad: Float32Array;
  shape: number[];
}

/** A parameter as tensors of the backend it trains on. */
export interface ParameterTensors {
  name: string;
  value: Tensor;
  grad: Tensor;
  shape: number[];
}

/** Step count and the moments, as tensors beside the parameters they belong to. */
export interface AdamWState {
  step: number;
  m: Map<string, Tensor>;
  v: Map<string, Tensor>;
}

export interface AdamWOptions { learningRate: number; beta1: number; beta2: number; eps: number; weightDecay: number; maxGradNorm: number }

export function createAdamWState(): AdamWState {
  return { step: 0, m: new Map(), v: new Map() };
}

/** The global L2 norm of all gradients (float64 accumulation). */
export function gradientNorm(params: TrainableParameter[]): number {
  return Math.sqrt(cpuTrainingOps.sumOfSquares(params.map((p) => hostTensor(p, p.grad))));
}

/** Clips, then updates every (host array) parameter in place; returns the gradient norm before clipping. */
export function adamwStep(params: TrainableParameter[], state: AdamWState, options: AdamWOptions): number {
  const tensors = params.map((p) => ({ name: p.name, value: hostTensor(p, p.value), grad: hostTensor(p, p.grad), shape: p.shape }));
  return adamwStepOn(cpuTrainingOps, tensors, state, options);
}

/** adamwStep on any backend: parameters, gradients and moments stay where `ops` runs. */
export function adamwStepOn(ops: TrainingOps, params: ParameterTensors[], state: AdamWState, options: AdamWOptions): number {
  const norm = Math.sqrt(ops.sumOfSquares(params.map((p) => p.grad)));
  if (!Number.isFinite(norm)) {
    const culprit = params.find((p) => !Number.isFinite(ops.sumOfSquares([p.grad])));
    throw new ArtError(
      "non_finite_gradient",
      `training step refused: the gradient of ${culprit?.name ?? "a parameter"} is not finite (NaN or Infinity); ` +
        "no weights were changed. Lower the learning rate, check rewards and inputs for NaN, or resume from the last checkpoint.",
    );
  }
  state.step += 1;
  const { learningRate, beta1, beta2, eps, weightDecay } = options;
  const scalars = {
    clip: Math.min(1, options.maxGradNorm / (norm + 1e-6)), learningRate, beta1, beta2, eps, weightDecay,
    correction1: 1 - beta1 ** state.step, correction2: 1 - beta2 ** state.step,
  };
  for (const p of params) {
    let m = state.m.get(p.name);
    let v = state.v.get(p.name);
    if (m === undefined || v === undefined) {
      m = ops.zeros(p.shape);
      v = ops.zeros(p.shape);
      state.m.set(p.name, m);
      state.v.set(p.name, v);
    }
    ops.adamw(p.value, p.grad, m, v, scalars);
  }
  return norm;
}

function hostTensor(p: TrainableParameter, data: Float32Array): Tensor {
  return new CpuTensor(p.shape, "f32", data);
}
