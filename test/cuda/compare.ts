// Shared by the CUDA parity suites: deterministic inputs and the one error measure their tolerances are stated in.
import { expect } from "vitest";

/** Deterministic normal-ish values (sum of three uniforms) from a seed. */
export function random(n: number, seed: number, scale = 1): Float32Array {
  let s = seed >>> 0 || 1;
  const next = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  return Float32Array.from({ length: n }, () => (next() + next() + next() - 1.5) * 2 * scale);
}

/**
 * max |reference − actual| / max |reference|: one number per tensor. `floor` bounds the denominator for an
 * all-zero reference; gradients that are legitimately tiny (the training suite) need a lower floor than activations.
 */
export function relativeError(reference: Float32Array, actual: Float32Array, floor = 1e-6): number {
  expect(actual.length).toBe(reference.length);
  let diff = 0, magnitude = floor;
  for (let i = 0; i < reference.length; i++) {
    diff = Math.max(diff, Math.abs(reference[i] - actual[i]));
    magnitude = Math.max(magnitude, Math.abs(reference[i]));
  }
  return diff / magnitude;
}
