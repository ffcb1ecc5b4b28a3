/**
 * Training kernels on Float32Array, llm.c style: every op has an explicit forward and backward.
 *
 * Layout is row-major; a "row" is one token. Conventions shared by every backward here:
 * - gradients of parameters (dW, db, dA, dB, norm weights, embeddings) ACCUMULATE (+=), because one
 *   parameter is used by many micro-batches and, for tied embeddings, by two ops;
 * - gradients of activations also accumulate (+=) into a buffer the caller zeroes, because the residual
 *   stream sends the same activation to two consumers and their gradients must add.
 * Parameters may be null in a backward call when they are frozen: their gradient is then skipped, which is
 * what makes LoRA training cheap (no dW for the frozen base).
 */
import { ATTENTION_BLOCK, attendBlock, matmulNT, transposeRows } from "../model/cpu/kernels.ts";
import type { AdamWScalars } from "./training-ops.ts";

/**
 * out[n, o] = Σ_i x[n, i] · W[o, i] (+ b[o]). W is stored as PyTorch's Linear: [out, in]. The product is the
 * JavaScript tiled matmul; the engine's linear runs the WASM SIMD kernel, which groups the sums differently, so the
 * two forwards agree to f32 rounding, not bit for bit.
 */
export function linearForward(
  out: Float32Array, x: Float32Array, weight: Float32Array, bias: Float32Array | null,
  rows: number, inFeatures: number, outFeatures: number,
): void {
  matmulNT(x, weight, rows, inFeatures, outFeatures, out);
  if (bias === null) return;
  for (let n = 0; n < rows; n++) for (let o = 0; o < outFeatures; o++) out[n * outFeatures + o] += bias[o];
}

/**
 * out[n, m] += a[n, k] · b[k, m]  (both row-major). The activation gradient dx = dout · W has this form.
 * A 4-row × 4-column register tile per pass over k: each loaded b value feeds four rows, each a value four columns.
 */
export function matmulNNAccumulate(out: Float32Array, a: Float32Array, b: Float32Array, n: number, k: number, m: number): void {
  let i = 0;
  for (; i + 3 < n; i += 4) {
    const a0 = i * k, a1 = a0 + k, a2 = a1 + k, a3 = a2 + k;
    let j = 0;
    for (; j + 3 < m; j += 4) {
      let s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
      let s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
      for (let p = 0; p < k; p++) {
        const bOff = p * m + j;
        const b0 = b[bOff], b1 = b[bOff + 1], b2 = b[bOff + 2], b3 = b[bOff + 3];
        const x0 = a[a0 + p], x1 = a[a1 + p], x2 = a[a2 + p], x3 = a[a3 + p];
        s00 += x0 * b0; s01 += x0 * b1; s02 += x0 * b2; s03 += x0 * b3;
        s10 += x1 * b0; s11 += x1 * b1; s12 += x1 * b2; s13 += x1 * b3;
        s20 += x2 * b0; s21 += x2 * b1; s22 += x2 * b2; s23 += x2 * b3;
        s30 += x3 * b0; s31 += x3 * b1; s32 += x3 * b2; s33 += x3 * b3;
      }
      const o0 = i * m + j, o1 = o0 + m, o2 = o1 + m, o3 = o2 + m;
      out[o0] += s00; out[o0 + 1] += s01; out[o0 + 2] += s02; out[o0 + 3] += s03;
      out[o1] += s10; out[o1 + 1] += s11; out[o1 + 2] += s12; out[o1 + 3] += s13;
      out[o2] += s20; out[o2 + 1] += s21; out[o2 + 2] += s22; out[o2 + 3] += s23;
      out[o3] += s30; out[o3 + 1] += s31; out[o3 + 2] += s32; out[o3 + 3] += s33;
    }
    for (; j < m; j++) {
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let p = 0; p < k; p++) {
        const bv = b[p * m + j];
        s0 += a[a0 + p] * bv; s1 += a[a1 + p] * bv; s2 += a[a2 + p] * bv; s3 += a[a3 + p] * bv;
      }
      out[i * m + j] += s0; out[(i + 1) * m + j] += s1; out[(i + 2) * m + j] += s2; out[(i + 3) * m + j] += s3;
    }
  }
  for (; i < n; i++) {
    const aOff = i * k;
    const oOff = i * m;
    for (let p = 0; p < k; p++) {
      const x = a[aOff + p];
      if (x === 0) continue;
      const bOff = p * m;
      for (let j = 0; j < m; j++) out[oOff + j] += x * b[bOff + j];
    }
  }
}

/**
 * out[m, k] += a[n, m]ᵀ · b[n, k]  (both row-major, reduced over rows n). The weight gradient dW = doutᵀ · x has
 * this form. Same 4 × 4 register tile, the reduction running down the rows of both operands.
 */
export function matmulTNAccumulate(out: Float32Array, a: Float32Array, b: Float32Array, n: number, m: number, k: number): void {
  let i = 0;
  for (; i + 3 < m; i += 4) {
    let j = 0;
    for (; j + 3 < k; j += 4) {
      let s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
      let s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
      for (let r = 0; r < n; r++) {
        const aOff = r * m + i, bOff = r * k + j;
        const x0 = a[aOff], x1 = a[aOff + 1], x2 = a[aOff + 2], x3 = a[aOff + 3];
        const b0 = b[bOff], b1 = b[bOff + 1], b2 = b[bOff + 2], b3 = b[bOff + 3];
        s00 += x0 * b0; s01 += x0 * b1; s02 += x0 * b2; s03 += x0 * b3;
        s10 += x1 * b0; s11 += x1 * b1; s12 += x1 * b2; s13 += x1 * b3;
        s20 += x2 * b0; s21 += x2 * b1; s22 += x2 * b2; s23 += x2 * b3;
        s30 += x3 * b0; s31 += x3 * b1; s32 += x3 * b2; s33 += x3 * b3;
      }
      const o0 = i * k + j, o1 = o0 + k, o2 = o1 + k, o3 = o2 + k;
      out[o0] += s00; out[o0 + 1] += s01; out[o0 + 2] += s02; out[o0 + 3] += s03;
      out[o1] += s10; out[o1 + 1] += s11; out[o1 + 2] += s12; out[o1 + 3] += s13;
      out[o2] += s20; out[o2 + 1] += s21; out[o2 + 2] += s22; out[o2 + 3] += s23;
      out[o3] += s30; out[o3 + 1] += s31; out[o3 + 2] += s32; out[o3 + 3] += s33;
    }
    for (; j < k; j++) {
      for (let c = i; c < i + 4; c++) {
        let sum = 0;
        for (let r = 0; r < n; r++) sum += a[r * m + c] * b[r * k + j];
        out[c * k + j] += sum;
      }
    }
  }
  for (; i < m; i++) {
    for (let r = 0; r < n; r++) {
      const g = a[r * m + i];
      if (g === 0) continue;
      const bOff = r * k;
      const oOff = i * k;
      for (let j = 0; j < k; j++) out[oOff + j] += g * b[bOff + j];
    }
  }
}

/**
 * Backward of linearForward. dx += dout · W; dW += doutᵀ · x; db += Σ_n dout. Any of dx, dW, db may be null
 * (input needs no gradient, or the weight is frozen).
 */
export function linearBackward(
  dx: Float32Array | null, dWeight: Float32Array | null, dBias: Float32Array | null,
  dout: Float32Array, x: Float32Array, weight: Float32Array,
  rows: number, inFeatures: number, outFeatures: number,
): void {
  if (dx !== null) matmulNNAccumulate(dx, dout, weight, rows, outFeatures, inFeatures);
  if (dWeight !== null) matmulTNAccumulate(dWeight, dout, x, rows, outFeatures, inFeatures);
  if (dBias !== null) {
    for (let n = 0; n < rows; n++) for (let o = 0; o < outFeatures; o++) dBias[o] += dout[n * outFeatures + o];
  }
}

/**
 * Unmerged LoRA: out += scale · (x Aᵀ) Bᵀ with A [rank, in] and B [out, rank] (PEFT's shapes).
 * `xa` [rows, rank] receives x Aᵀ, which the backward needs.
 */
export function loraForward(
  out: Float32Array, xa: Float32Array, x: Float32Array, a: Float32Array, b: Float32Array, scale: number,
  rows: number, inFeatures: number, outFeatures: number, rank: number,
): void {
  matmulNT(x, a, rows, inFeatures, rank, xa);
  matmulNT(xa, b, rows, rank, outFeatures, out, { alpha: scale, accumulate: true });
}

/** Backward of loraForward: dB += scale · doutᵀ · xa; dA += (scale · dout B)ᵀ · x; dx += (scale · dout B) · A. */
export function loraBackward(
  dx: Float32Array | null, dA: Float32Array, dB: Float32Array,
  dout: Float32Array, x: Float32Array, xa: Float32Array, a: Float32Array, b: Float32Array, scale: number,
  rows: number, inFeatures: number, outFeatures: number, rank: number,
): void {
  const dxa = new Float32Array(rows * rank);
  for (let n = 0; n < rows; n++) {
    const dOff = n * outFeatures;
    const xaOff = n * rank;
    for (let o = 0; o < outFeatures; o++) {
      const g = scale * dout[dOff + o];
      if (g === 0) continue;
      const bOff = o * rank;
      for (let r = 0; r < rank; r++) {
        dB[bOff + r] += g * xa[xaOff + r];
        dxa[xaOff + r] += g * b[bOff + r];
      }
    }
  }
  linearBackward(dx, dA, null, dxa, x, a, rows, inFeatures, rank);
}

/** y = x / rms(x) · w per row; `rstd` [rows] keeps 1/rms for the backward. */
export function rmsnormForward(
  out: Float32Array, rstd: Float32Array, x: Float32Array, weight: Float32Array, rows: number, dim: number, eps: number,
): void {
  for (let n = 0; n < rows; n++) {
    const off = n * dim;
    let sumSq = 0;
    for (let i = 0; i < dim; i++) sumSq += x[off + i] * x[off + i];
    const s = 1 / Math.sqrt(sumSq / dim + eps);
    rstd[n] = s;
    for (let i = 0; i < dim; i++) out[off + i] = x[off + i] * s * weight[i];
  }
}

/**
 * Backward of rmsnormForward. With x̂ = x·s: dx = s · (g − x̂ · mean(g · x̂)) where g = dout · w;
 * dw += Σ_n dout · x̂.
 */
export function rmsnormBackward(
  dx: Float32Array, dWeight: Float32Array | null, dout: Float32Array, x: Float32Array, rstd: Float32Array,
  weight: Float32Array, rows: number, dim: number,
): void {
  for (let n = 0; n < rows; n++) {
    const off = n * dim;
    const s = rstd[n];
    let dot = 0;
    for (let i = 0; i < dim; i++) dot += dout[off + i] * weight[i] * x[off + i] * s;
    const meanDot = dot / dim;
    for (let i = 0; i < dim; i++) {
      const xhat = x[off + i] * s;
      dx[off + i] += s * (dout[off + i] * weight[i] - xhat * meanDot);
      if (dWeight !== null) dWeight[i] += dout[off + i] * xhat;
    }
  }
}

/** cos/sin tables [positions, headDim/2] for the half-split ("rotate_half") rotary embedding HF models use. */
export interface RopeTables { cos: Float32Array; sin: Float32Array; half: number }

export function ropeTables(positions: ArrayLike<number>, inverseFrequencies: ArrayLike<number>): RopeTables {
  const half = inverseFrequencies.length;
  const cos = new Float32Array(positions.length * half);
  const sin = new Float32Array(positions.length * half);
  for (let t = 0; t < positions.length; t++) {
    for (let i = 0; i < half; i++) {
      const angle = positions[t] * inverseFrequencies[i];
      cos[t * half + i] = Math.cos(angle);
      sin[t * half + i] = Math.sin(angle);
    }
  }
  return { cos, sin, half };
}

/**
 * Rotates x [rows, heads, 2·half] in place by each row's angle. `inverse` rotates by the negative angle,
 * which is exactly the backward (a rotation's transpose is its inverse).
 */
export function ropeApply(x: Float32Array, tables: RopeTables, rows: number, heads: number, inverse = false): void {
  const { cos, sin, half } = tables;
  const headDim = 2 * half;
  const sign = inverse ? -1 : 1;
  for (let t = 0; t < rows; t++) {
    for (let h = 0; h < heads; h++) {
      const off = (t * heads + h) * headDim;
      for (let i = 0; i < half; i++) {
        const c = cos[t * half + i];
        const s = sign * sin[t * half + i];
        const x1 = x[off + i];
        const x2 = x[off + half + i];
        x[off + i] = x1 * c - x2 * s;
        x[off + half + i] = x2 * c + x1 * s;
      }
    }
  }
}

/**
 * Causal grouped-query attention of `queryLen` queries over `keyLen` keys, the queries being the LAST queryLen
 * positions of the key sequence: query t sees keys 0..(keyLen − queryLen + t). keyLen = queryLen is ordinary causal
 * attention; keyLen > queryLen lets completions attend to a shared prompt stored once (packing).
 * q [queryLen, heads, d], k/v [keyLen, kvHeads, d]; out [queryLen, heads, d]; probs [heads, queryLen, keyLen] keeps
 * the softmax for the backward (zero past each row's last key, up to its block's last key; beyond that unwritten).
 * Per head and block of query rows through the engine's attendBlock (tiled matmuls; v transposed once per KV head),
 * the same code as the engine's attention.
 */
export function attentionForward(
  out: Float32Array, probs: Float32Array, q: Float32Array, k: Float32Array, v: Float32Array,
  queryLen: number, keyLen: number, heads: number, kvHeads: number, headDim: number,
): void {
  const group = heads / kvHeads;
  const qStride = heads * headDim;
  const kvStride = kvHeads * headDim;
  const offset = keyLen - queryLen;
  const valuesT = new Float32Array(headDim * keyLen);
  const positions = Int32Array.from({ length: queryLen }, (_, t) => offset + t);
  for (let kvh = 0; kvh < kvHeads; kvh++) {
    transposeRows(v.subarray(kvh * headDim), keyLen, headDim, kvStride, valuesT);
    for (let h = kvh * group; h < (kvh + 1) * group; h++) {
      const p = probs.subarray(h * queryLen * keyLen, (h + 1) * queryLen * keyLen);
      for (let t0 = 0; t0 < queryLen; t0 += ATTENTION_BLOCK) {
        attendBlock(q.subarray(t0 * qStride + h * headDim), k.subarray(kvh * headDim), v.subarray(kvh * headDim), valuesT,
          out.subarray(t0 * qStride + h * headDim), positions.subarray(t0, Math.min(queryLen, t0 + ATTENTION_BLOCK)), headDim, qStride,
          kvStride, keyLen, p.subarray(t0 * keyLen), new Float64Array(0));
      }
    }
  }
}

/**
 * Backward of attentionForward; dq, dk, dv accumulate. Query heads sharing a kv head add into its gradient.
 * With P the softmax: dP = dout·vᵀ, dS = P ∘ (dP − Σ_s P dP)/√d, then dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dout, each
 * a tiled matmul over the blocks the causal mask leaves (key block s sees only queries t ≥ s − offset).
 */
export function attentionBackward(
  dq: Float32Array, dk: Float32Array, dv: Float32Array, dout: Float32Array, probs: Float32Array,
  q: Float32Array, k: Float32Array, v: Float32Array,
  queryLen: number, keyLen: number, heads: number, kvHeads: number, headDim: number,
): void {
  const group = heads / kvHeads;
  const scale = 1 / Math.sqrt(headDim);
  const qStride = heads * headDim;
  const kvStride = kvHeads * headDim;
  const offset = keyLen - queryLen;
  const keysT = new Float32Array(headDim * keyLen);
  const dScores = new Float32Array(queryLen * keyLen);
  const scoresT = new Float32Array(keyLen * queryLen); // Pᵀ or dSᵀ, zero where the mask hides a key
  const rowsT = new Float32Array(headDim * queryLen); // q or dout of one head, transposed
  for (let kvh = 0; kvh < kvHeads; kvh++) {
    transposeRows(k.subarray(kvh * headDim), keyLen, headDim, kvStride, keysT);
    for (let h = kvh * group; h < (kvh + 1) * group; h++) {
      const p = probs.subarray(h * queryLen * keyLen, (h + 1) * queryLen * keyLen);
      for (let t0 = 0; t0 < queryLen; t0 += ATTENTION_BLOCK) {
        const rows = Math.min(ATTENTION_BLOCK, queryLen - t0), keys = offset + t0 + rows;
        matmulNT(dout.subarray(t0 * qStride + h * headDim), v.subarray(kvh * headDim), rows, headDim, keys, dScores.subarray(t0 * keyLen),
          { xStride: qStride, wStride: kvStride, outStride: keyLen });
        for (let t = t0; t < t0 + rows; t++) {
          const at = t * keyLen, last = offset + t;
          let weighted = 0;
          for (let s = 0; s <= last; s++) weighted += p[at + s] * dScores[at + s];
          for (let s = 0; s <= last; s++) dScores[at + s] = p[at + s] * (dScores[at + s] - weighted) * scale;
          dScores.fill(0, at + last + 1, at + keys);
        }
        matmulNT(dScores.subarray(t0 * keyLen), keysT, rows, keys, headDim, dq.subarray(t0 * qStride + h * headDim),
          { accumulate: true, xStride: keyLen, wStride: keyLen, outStride: qStride });
      }
      transposeCausal(dScores, queryLen, keyLen, scoresT);
      transposeRows(q.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
      keyBlockProducts(scoresT, rowsT, dk.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
      transposeCausal(p, queryLen, keyLen, scoresT);
      transposeRows(dout.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
      keyBlockProducts(scoresT, rowsT, dv.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
    }
  }
}

/** out[s, t] = scores[t, s] where query t sees key s, else 0: [keyLen, queryLen] from [queryLen, keyLen]. */
function transposeCausal(scores: Float32Array, queryLen: number, keyLen: number, out: Float32Array): void {
  const offset = keyLen - queryLen;
  out.fill(0, 0, keyLen * queryLen);
  for (let t = 0; t < queryLen; t++) {
    for (let s = 0; s <= offset + t; s++) out[s * queryLen + t] = scores[t * keyLen + s];
  }
}

/**
 * out[s, ·] += Σ_t scoresT[s, t] · rowsT[·, t] for every key s (out rows `outStride` apart), per block of keys over
 * only the queries that see them (t ≥ s − offset): the causal zeros are skipped, not multiplied.
 */
function keyBlockProducts(
  scoresT: Float32Array, rowsT: Float32Array, out: Float32Array, queryLen: number, keyLen: number, headDim: number, outStride: number,
): void {
  const offset = keyLen - queryLen;
  for (let s0 = 0; s0 < keyLen; s0 += ATTENTION_BLOCK) {
    const keys = Math.min(ATTENTION_BLOCK, keyLen - s0), first = Math.max(0, s0 - offset);
    matmulNT(scoresT.subarray(s0 * queryLen + first), rowsT.subarray(first), keys, queryLen - first, headDim,
      out.subarray(s0 * outStride), { accumulate: true, xStride: queryLen, wStride: queryLen, outStride });
  }
}

/** out = silu(gate) · up, elementwise. */
export function swigluForward(out: Float32Array, gate: Float32Array, up: Float32Array, size: number): void {
  for (let i = 0; i < size; i++) {
    const g = gate[i];
    out[i] = (g / (1 + Math.exp(-g))) * up[i];
  }
}

/** Backward of swigluForward: d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))). */
export function swigluBackward(
  dGate: Float32Array, dUp: Float32Array, dout: Float32Array, gate: Float32Array, up: Float32Array, size: number,
): void {
  for (let i = 0; i < size; i++) {
    const g = gate[i];
    const sig = 1 / (1 + Math.exp(-g));
    dUp[i] += dout[i] * g * sig;
    dGate[i] += dout[i] * up[i] * sig * (1 + g * (1 - sig));
  }
}

export function embeddingForward(out: Float32Array, table: Float32Array, ids: ArrayLike<number>, dim: number): void {
  for (let n = 0; n < ids.length; n++) out.set(table.subarray(ids[n] * dim, ids[n] * dim + dim), n * dim);
}

/** Scatter-add of each row's gradient into its token's embedding row. */
export function embeddingBackward(dTable: Float32Array, dout: Float32Array, ids: ArrayLike<number>, dim: number): void {
  for (let n = 0; n < ids.length; n++) {
    const tOff = ids[n] * dim;
    const dOff = n * dim;
    for (let i = 0; i < dim; i++) dTable[tOff + i] += dout[dOff + i];
  }
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
