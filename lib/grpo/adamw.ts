/**
 * The optimiser step's policy, as torch.optim.AdamW + clip_grad_norm_ do it: the global gradient norm, clipping,
 * bias-corrected moments and decoupled weight decay (p −= lr·wd·p before the Adam update). A non-finite gradient
 * refuses the whole step before any parameter or moment is touched. The per-element update is the backend's `adamw`
 * op; the moments live beside the parameters, on the same backend.
 */
import { ArtError } from "../core/errors.ts";
import type { Backend, Tensor } from "../model/backend.ts";
import type { ParameterTensors } from "../model/training.ts";

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

/** Clips, then updates every parameter in place on `backend`; returns the gradient norm before clipping. */
export function adamwStep(backend: Backend, params: ParameterTensors[], state: AdamWState, options: AdamWOptions): number {
  const norm = Math.sqrt(backend.sumOfSquares(params.map((p) => p.grad)));
  if (!Number.isFinite(norm)) {
    const culprit = params.find((p) => !Number.isFinite(backend.sumOfSquares([p.grad])));
    throw new ArtError(
      "non_finite_gradient",
      `training step refused: the gradient of ${culprit?.name ?? "a parameter"} is not finite (NaN or Infinity); ` +
        "no weights were changed. Lower the learning rate, check rewards and inputs for NaN, or resume from the last checkpoint.",
    );
  }
  // Every moment exists before any parameter moves, so running out of memory here changes no weight.
  for (const p of params) {
    if (!state.m.has(p.name)) state.m.set(p.name, backend.zeros(p.shape));
    if (!state.v.has(p.name)) state.v.set(p.name, backend.zeros(p.shape));
  }
  state.step += 1;
  const { learningRate, beta1, beta2, eps, weightDecay } = options;
  const scalars = {
    clip: Math.min(1, options.maxGradNorm / (norm + 1e-6)), learningRate, beta1, beta2, eps, weightDecay,
    correction1: 1 - beta1 ** state.step, correction2: 1 - beta2 ** state.step,
  };
  backend.adamw(params.map((p) => ({ value: p.value, grad: p.grad, m: state.m.get(p.name)!, v: state.v.get(p.name)! })), scalars);
  return norm;
}
