/**
 * The CPU's row-wise and elementwise kernels over Float32Array, each forward beside its backward (llm.c style): the
 * bodies of the CpuBackend's ops, and the readable reference the CUDA kernels are checked against. The products are
 * in matmul.ts (and the WASM SIMD kernel), attention in attention.ts, the target logprobs in logprobs.ts.
 * Backward functions ACCUMULATE (+=) into gradients the caller zeroed; a null gradient is skipped.
 */
import type { AdamWScalars } from "../backend.ts";
import type { Gemm } from "./gemm.ts";

/**
 * RMSNorm of each consecutive group of `weight.length` values: out = x / sqrt(mean(x²) + eps) · weight (out may be
 * x). The inverse is rounded to f32 before scaling, as Hugging Face's f32 RMSNorm does; `rstd` keeps it per group.
 */
export function rmsNormRows(x: Float32Array, weight: Float32Array, eps: number, out: Float32Array, rstd: Float32Array | null = null): void {
  const d = weight.length;
  for (let start = 0, group = 0; start < x.length; start += d, group++) {
    let sumSquares = 0;
    for (let j = 0; j < d; j++) sumSquares += x[start + j] * x[start + j];
    const inverse = Math.fround(1 / Math.sqrt(Math.fround(sumSquares / d) + eps));
    if (rstd) rstd[group] = inverse;
    for (let j = 0; j < d; j++) out[start + j] = weight[j] * Math.fround(x[start + j] * inverse);
  }
}

/** Backward of rmsNormRows. With x̂ = x·s and g = dOut·w: dx += s · (g − x̂ · mean(g · x̂)); dWeight += Σ dOut · x̂. */
export function rmsNormRowsBackward(
  x: Float32Array, weight: Float32Array, rstd: Float32Array, dOut: Float32Array, dx: Float32Array, dWeight: Float32Array | null,
): void {
  const d = weight.length;
  for (let start = 0, group = 0; start < x.length; start += d, group++) {
    const s = rstd[group];
    let dot = 0;
    for (let j = 0; j < d; j++) dot += dOut[start + j] * weight[j] * x[start + j] * s;
    const meanDot = dot / d;
    for (let j = 0; j < d; j++) {
      const xhat = x[start + j] * s;
      dx[start + j] += s * (dOut[start + j] * weight[j] - xhat * meanDot);
      if (dWeight !== null) dWeight[j] += dOut[start + j] * xhat;
    }
  }
}

/**
 * RoPE's angles per row: cos of positions[row] · invFreq[j] then sign · its sin, `half` of each, the angle rounded
 * to f32 as Hugging Face's f32 rotary table is. sign −1 is the backward (a rotation's transpose is its inverse).
 */
export function ropeTable(positions: Int32Array, invFreq: Float32Array, sign: 1 | -1): Float32Array {
  const half = invFreq.length;
  const table = new Float32Array(positions.length * 2 * half);
  for (let row = 0; row < positions.length; row++) {
    for (let j = 0; j < half; j++) {
      const angle = Math.fround(positions[row] * invFreq[j]);
      table[row * 2 * half + j] = Math.cos(angle);
      table[row * 2 * half + half + j] = sign * Math.sin(angle);
    }
  }
  return table;
}

/** Rotate-half RoPE in place: pairs (j, j + half) of every head of each row rotate by the row's angles (ropeTable). */
export function ropeRows(x: Float32Array, rowWidth: number, table: Float32Array, headDim: number): void {
  const half = headDim / 2;
  for (let row = 0; row < x.length / rowWidth; row++) {
    const cos = row * 2 * half, sin = cos + half;
    for (let head = row * rowWidth; head < (row + 1) * rowWidth; head += headDim) {
      for (let j = 0; j < half; j++) {
        const a = x[head + j], b = x[head + half + j];
        x[head + j] = a * table[cos + j] - b * table[sin + j];
        x[head + half + j] = b * table[cos + j] + a * table[sin + j];
      }
    }
  }
}

/** out = silu(gate) · up, elementwise, gate and up the two halves of each row of gateUp [rows, 2 · inter]. */
export function swigluRows(gateUp: Float32Array, out: Float32Array, inter: number): void {
  for (let row = 0, i = 0; i < out.length; row++) {
    // Row r's gate starts at 2 · inter · r, its up inter further.
    for (let gate = 2 * row * inter, end = i + inter; i < end; i++, gate++) {
      const g = gateUp[gate];
      out[i] = (g / (1 + Math.exp(-g))) * gateUp[gate + inter];
    }
  }
}

/** Backward of swigluRows: d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))); dOut, dGate, dUp [rows, inter]. */
export function swigluRowsBackward(gateUp: Float32Array, dOut: Float32Array, dGate: Float32Array, dUp: Float32Array, inter: number): void {
  for (let row = 0, i = 0; i < dOut.length; row++) {
    for (let gate = 2 * row * inter, end = i + inter; i < end; i++, gate++) {
      const g = gateUp[gate];
      const sig = 1 / (1 + Math.exp(-g));
      dUp[i] += dOut[i] * g * sig;
      dGate[i] += dOut[i] * gateUp[gate + inter] * sig * (1 + g * (1 - sig));
    }
  }
}

/** Scatter-add of each row's gradient into its token's embedding row (repeated ids accumulate). */
export function embeddingRowsBackward(ids: ArrayLike<number>, dOut: Float32Array, dim: number, dTable: Float32Array): void {
  for (let n = 0; n < ids.length; n++) {
    const tOff = ids[n] * dim;
    const dOff = n * dim;
    for (let i = 0; i < dim; i++) dTable[tOff + i] += dOut[dOff + i];
  }
}

/**
 * out += scale · (x Aᵀ) Bᵀ with A [rank, in], B [out, rank], out's rows `outStride` apart (a block of columns of a
 * wider output); `down` [rows, rank] receives x Aᵀ.
 */
export function loraRows(
  gemm: Gemm, x: Float32Array, a: Float32Array, b: Float32Array, scale: number, rows: number, inFeatures: number, outFeatures: number,
  rank: number, out: Float32Array, outStride: number, down: Float32Array, downStride = rank,
): void {
  gemm.nt(x, a, rows, inFeatures, rank, down, { outStride: downStride });
  gemm.nt(down, b, rows, rank, outFeatures, out, { alpha: scale, accumulate: true, outStride, xStride: downStride });
}

/** Backward of out = x Wᵀ + b: dx += dOut · W; dWeight += dOutᵀ · x; dBias += Σ_rows dOut. */
export function linearRowsBackward(
  gemm: Gemm, x: Float32Array, weight: Float32Array, dOut: Float32Array, rows: number, inFeatures: number, outFeatures: number,
  dx: Float32Array | null, dWeight: Float32Array | null, dBias: Float32Array | null,
): void {
  if (dx !== null) gemm.nnAccumulate(dx, dOut, weight, rows, outFeatures, inFeatures);
  if (dWeight !== null) gemm.tnAccumulate(dWeight, dOut, x, rows, outFeatures, inFeatures);
  if (dBias !== null) {
    for (let n = 0; n < rows; n++) for (let o = 0; o < outFeatures; o++) dBias[o] += dOut[n * outFeatures + o];
  }
}

/** Backward of loraRows (down's rows `downStride` apart): dB += scale · dOutᵀ · down; g = scale · dOut B; dA += gᵀ · x; dx += g · A. */
export function loraRowsBackward(
  gemm: Gemm, x: Float32Array, a: Float32Array, b: Float32Array, scale: number, down: Float32Array, downStride: number, dOut: Float32Array,
  rows: number, inFeatures: number, outFeatures: number, rank: number, dx: Float32Array | null, dA: Float32Array, dB: Float32Array,
): void {
  // The scale rides on the [rows, rank] operands, the small ones.
  const scaledDown = new Float32Array(rows * rank);
  for (let r = 0; r < rows; r++) for (let j = 0; j < rank; j++) scaledDown[r * rank + j] = down[r * downStride + j] * scale;
  gemm.tnAccumulate(dB, dOut, scaledDown, rows, outFeatures, rank);
  const dDown = new Float32Array(rows * rank);
  gemm.nnAccumulate(dDown, dOut, b, rows, outFeatures, rank);
  for (let i = 0; i < dDown.length; i++) dDown[i] *= scale;
  linearRowsBackward(gemm, x, a, dDown, rows, inFeatures, rank, dx, dA, null);
}

/** Log-softmax of the `length` values of x at `start`, written to out at `outStart` (may be the same array). */
export function logSoftmaxRow(x: Float32Array, start: number, length: number, out: Float32Array, outStart: number): void {
  let max = -Infinity;
  for (let j = 0; j < length; j++) if (x[start + j] > max) max = x[start + j];
  let sum = 0;
  for (let j = 0; j < length; j++) sum += Math.exp(x[start + j] - max);
  const logZ = max + Math.log(sum);
  for (let j = 0; j < length; j++) out[outStart + j] = x[start + j] - logZ;
}

/** Σ x² over every element of every array, in float64 (what the global gradient norm is the root of). */
export function sumOfSquares(arrays: readonly Float32Array[]): number {
  let sum = 0;
  for (const x of arrays) for (let i = 0; i < x.length; i++) sum += x[i] * x[i];
  return sum;
}

/**
 * One AdamW update in place, as torch.optim.AdamW does it: the clipped gradient feeds the moments, decoupled weight
 * decay (p −= lr·wd·p) comes before the bias-corrected Adam step.
 */
export function adamwUpdate(
  value: Float32Array, grad: Float32Array, m: Float32Array, v: Float32Array,
  { clip, learningRate: lr, beta1, beta2, eps, weightDecay, correction1, correction2 }: AdamWScalars,
): void {
  for (let i = 0; i < value.length; i++) {
    const g = grad[i] * clip;
    m[i] = beta1 * m[i] + (1 - beta1) * g;
    v[i] = beta2 * v[i] + (1 - beta2) * g * g;
    value[i] -= lr * weightDecay * value[i];
    value[i] -= (lr * (m[i] / correction1)) / (Math.sqrt(v[i] / correction2) + eps);
  }
}
