/** Shared checks for the gradient tests: central finite differences and norm-wise relative error. */
import { readFileSync } from "node:fs";
import type { Backend, Tensor } from "../../lib/model/backend.ts";
export { seededRandom } from "../../lib/core/random.ts";

/** ‖a − b‖ / max(‖b‖, tiny): one number per tensor, robust to single entries near zero. */
export function relativeError(actual: ArrayLike<number>, expected: ArrayLike<number>): number {
  if (actual.length !== expected.length) throw new Error(`length ${actual.length} vs ${expected.length}`);
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < actual.length; i++) {
    diff += (actual[i] - expected[i]) ** 2;
    norm += expected[i] ** 2;
  }
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-12);
}

/**
 * Five-point central finite differences (error O(eps⁴)) of a scalar loss with respect to every entry of `param`
 * (perturbed in place and restored). The loss runs through the float32 kernels, so eps stays large (1e-2) to keep
 * float32 rounding far below the 1e-3 tolerance; the fourth-order stencil keeps the truncation error there too.
 */
export function finiteDifferences(param: Float32Array, loss: () => number, eps = 1e-2): Float64Array {
  const grad = new Float64Array(param.length);
  const at = (i: number, saved: number, offset: number) => {
    param[i] = saved + offset;
    return loss();
  };
  for (let i = 0; i < param.length; i++) {
    const saved = param[i];
    const near = at(i, saved, eps) - at(i, saved, -eps);
    const far = at(i, saved, 2 * eps) - at(i, saved, -2 * eps);
    param[i] = saved;
    grad[i] = (8 * near - far) / (12 * eps);
  }
  return grad;
}

/**
 * finiteDifferences of a backend tensor's values: each perturbed copy is written to the tensor before the loss runs
 * (the tensor ends with its original values).
 */
export function tensorFiniteDifferences(backend: Backend, tensor: Tensor, loss: () => number, eps?: number): Float64Array {
  const values = backend.download(tensor);
  const grad = finiteDifferences(values, () => {
    backend.write(tensor, values);
    return loss();
  }, eps);
  backend.write(tensor, values);
  return grad;
}

/** Σ out · upstream in float64: the scalar whose gradient a backward with dout = upstream computes. */
export function dotLoss(out: ArrayLike<number>, upstream: ArrayLike<number>): number {
  let sum = 0;
  for (let i = 0; i < out.length; i++) sum += out[i] * upstream[i];
  return sum;
}

/** A JSON fixture under test/fixtures/ (`training/ops.json`, `grpo/losses.json`). */
export function loadFixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`../fixtures/${name}`, import.meta.url), "utf8")) as T;
}

export function randomArray(size: number, random: () => number, scale = 1): Float32Array {
  const out = new Float32Array(size);
  for (let i = 0; i < size; i++) out[i] = (random() * 2 - 1) * scale;
  return out;
}
