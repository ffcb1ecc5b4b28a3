/**
 * CPU kernels over Float32Array: the readable reference the CUDA kernels are checked against, kept fast within reason.
 * The matmul is `x Wᵀ` with W stored [out, in] as checkpoints store it, so both operands are read along contiguous
 * rows (no transpose). It computes a 4-row × 2-column register tile per pass over k: each loaded weight feeds four
 * rows and each loaded activation two columns, and a block of 32 rows keeps x in cache while W streams by.
 * Leftover rows (decode batches of 1-3) use a 1 × 4 tile instead.
 */

const ROW_BLOCK = 32;

export interface MatmulOptions {
  /** Scale of the product. Default 1. */
  alpha?: number;
  /** Add to `out` instead of overwriting it. Default false. */
  accumulate?: boolean;
  /** Output columns [columnStart, columnEnd) only (a share of the columns is how a second thread would split the work). */
  columnStart?: number;
  columnEnd?: number;
  /**
   * Distance between consecutive rows of x, w and out (BLAS's leading dimensions). Defaults k, k and m: packed.
   * Attention multiplies one head's slice of wider rows (a query head within all heads, a KV head in the cache).
   */
  xStride?: number;
  wStride?: number;
  outStride?: number;
}

/** out[n, m] = (accumulate ? out : 0) + alpha · x[n, k] · w[m, k]ᵀ */
export function matmulNT(x: Float32Array, w: Float32Array, n: number, k: number, m: number, out: Float32Array, options: MatmulOptions = {}): void {
  const { alpha = 1, accumulate = false, columnStart = 0, columnEnd = m, xStride = k, wStride = k, outStride = m } = options;
  for (let rowStart = 0; rowStart < n; rowStart += ROW_BLOCK) {
    const rowEnd = Math.min(n, rowStart + ROW_BLOCK);
    const tiledEnd = rowStart + ((rowEnd - rowStart) & ~3);
    let o = columnStart;
    for (; o + 1 < columnEnd; o += 2) {
      const w0 = o * wStride, w1 = w0 + wStride;
      for (let i = rowStart; i < tiledEnd; i += 4) {
        const x0 = i * xStride, x1 = x0 + xStride, x2 = x1 + xStride, x3 = x2 + xStride;
        let s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
        for (let j = 0; j < k; j++) {
          const a = w[w0 + j], b = w[w1 + j];
          const v0 = x[x0 + j], v1 = x[x1 + j], v2 = x[x2 + j], v3 = x[x3 + j];
          s00 += v0 * a; s01 += v0 * b;
          s10 += v1 * a; s11 += v1 * b;
          s20 += v2 * a; s21 += v2 * b;
          s30 += v3 * a; s31 += v3 * b;
        }
        const o0 = i * outStride + o, o1 = o0 + outStride, o2 = o1 + outStride, o3 = o2 + outStride;
        store(out, o0, s00, alpha, accumulate); store(out, o0 + 1, s01, alpha, accumulate);
        store(out, o1, s10, alpha, accumulate); store(out, o1 + 1, s11, alpha, accumulate);
        store(out, o2, s20, alpha, accumulate); store(out, o2 + 1, s21, alpha, accumulate);
        store(out, o3, s30, alpha, accumulate); store(out, o3 + 1, s31, alpha, accumulate);
      }
    }
    for (let c = o; c < columnEnd; c++) {
      for (let i = rowStart; i < tiledEnd; i++) store(out, i * outStride + c, dot(x, i * xStride, w, c * wStride, k), alpha, accumulate);
    }
    // Rows left over from the 4-row tiles (all of them when decoding 1-3 sequences): a 1-row × 4-column tile
    // loads each activation once for four weights.
    for (let i = tiledEnd; i < rowEnd; i++) {
      const x0 = i * xStride, o0 = i * outStride;
      let c = columnStart;
      for (; c + 3 < columnEnd; c += 4) {
        const w0 = c * wStride, w1 = w0 + wStride, w2 = w1 + wStride, w3 = w2 + wStride;
        let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (let j = 0; j < k; j++) {
          const v = x[x0 + j];
          s0 += v * w[w0 + j];
          s1 += v * w[w1 + j];
          s2 += v * w[w2 + j];
          s3 += v * w[w3 + j];
        }
        store(out, o0 + c, s0, alpha, accumulate); store(out, o0 + c + 1, s1, alpha, accumulate);
        store(out, o0 + c + 2, s2, alpha, accumulate); store(out, o0 + c + 3, s3, alpha, accumulate);
      }
      for (; c < columnEnd; c++) store(out, o0 + c, dot(x, x0, w, c * wStride, k), alpha, accumulate);
    }
  }
}

/** Σ x[xAt + j] · w[wAt + j] over j < k: the tiles' remainders. */
function dot(x: Float32Array, xAt: number, w: Float32Array, wAt: number, k: number): number {
  let s = 0;
  for (let j = 0; j < k; j++) s += x[xAt + j] * w[wAt + j];
  return s;
}

function store(out: Float32Array, index: number, sum: number, alpha: number, accumulate: boolean): void {
  out[index] = accumulate ? out[index] + alpha * sum : alpha * sum;
}

/**
 * out[j, t] = rows[t · stride + j] for t < count, j < width (out is [width, count]): a head's slice of wider rows,
 * transposed so a product over the rows (p·v in attention) runs along contiguous memory in matmulNT.
 */
export function transposeRows(rows: Float32Array, count: number, width: number, stride: number, out: Float32Array): void {
  for (let t = 0; t < count; t++) {
    const at = t * stride;
    for (let j = 0; j < width; j++) out[j * count + t] = rows[at + j];
  }
}

/**
 * Softmax of row[at .. at+last] in place, row[at+last+1 .. at+end) = 0: one attention row over the keys its query
 * sees, zero for the keys a block's later rows see (so a product over the whole block adds nothing for them).
 */
export function causalSoftmax(row: Float32Array, at: number, last: number, end: number): void {
  let max = -Infinity;
  for (let s = 0; s <= last; s++) max = Math.max(max, row[at + s]);
  let sum = 0;
  for (let s = 0; s <= last; s++) {
    const e = Math.exp(row[at + s] - max);
    row[at + s] = e;
    sum += e;
  }
  const inverse = 1 / sum;
  for (let s = 0; s <= last; s++) row[at + s] *= inverse;
  row.fill(0, at + last + 1, at + end);
}

/** Query rows per attention block: a block's scores against every key its rows see stay in cache. */
export const ATTENTION_BLOCK = 32;

/**
 * One query head over a block of query rows, row r seeing keys 0..positions[r]: scores = q·kᵀ/√d for every key up to
 * the block's last (one tiled matmul), a softmax per row over its own keys (zero past them), then out = p·v, one
 * matmul against `valuesT` (the values transposed: `runKeys` columns per dimension). q and out rows lie `qStride`
 * apart, keys and values `kvStride` apart (one KV head's slice of wider rows); score rows lie `runKeys` apart.
 * A row's numbers do not depend on its block: each product is one float64 sum over keys in order (the zeros past a
 * row's keys add nothing), so a prompt prefilled whole, in chunks, or after a reused prefix gives the same tokens.
 * Without `valuesT` (a single decoding row, where transposing would cost as much as the product) p·v is summed the
 * same way into `rowSums`. The engine and the trainer's forward both attend through this.
 */
export function attendBlock(
  q: Float32Array, keys: Float32Array, values: Float32Array, valuesT: Float32Array | null, out: Float32Array, positions: Int32Array,
  headDim: number, qStride: number, kvStride: number, runKeys: number, scores: Float32Array, rowSums: Float64Array,
): void {
  const blockRows = positions.length;
  let blockKeys = 0;
  for (let r = 0; r < blockRows; r++) blockKeys = Math.max(blockKeys, positions[r] + 1);
  matmulNT(q, keys, blockRows, headDim, blockKeys, scores,
    { alpha: 1 / Math.sqrt(headDim), xStride: qStride, wStride: kvStride, outStride: runKeys });
  for (let r = 0; r < blockRows; r++) causalSoftmax(scores, r * runKeys, positions[r], blockKeys);
  if (valuesT) {
    matmulNT(scores, valuesT, blockRows, blockKeys, headDim, out, { xStride: runKeys, wStride: runKeys, outStride: qStride });
    return;
  }
  for (let r = 0; r < blockRows; r++) {
    const row = r * runKeys, at = r * qStride;
    rowSums.fill(0, 0, headDim);
    for (let t = 0; t <= positions[r]; t++) {
      const p = scores[row + t], v = t * kvStride;
      for (let j = 0; j < headDim; j++) rowSums[j] += p * values[v + j];
    }
    for (let j = 0; j < headDim; j++) out[at + j] = rowSums[j];
  }
}

/** RMSNorm of each consecutive group of `weight.length` values: out = x / sqrt(mean(x²) + eps) · weight. */
export function rmsNormRows(x: Float32Array, weight: Float32Array, eps: number, out: Float32Array): void {
  const d = weight.length;
  for (let start = 0; start < x.length; start += d) {
    let sumSquares = 0;
    for (let j = 0; j < d; j++) sumSquares += x[start + j] * x[start + j];
    // Round the inverse to f32 like the reference does before scaling.
    const inverse = Math.fround(1 / Math.sqrt(Math.fround(sumSquares / d) + eps));
    for (let j = 0; j < d; j++) out[start + j] = weight[j] * Math.fround(x[start + j] * inverse);
  }
}

/** Rotate-half RoPE in place: pairs (j, j + headDim/2) of every head rotate by positions[row] · invFreq[j]. */
export function ropeRows(x: Float32Array, rowWidth: number, positions: Int32Array, invFreq: Float32Array, headDim: number): void {
  const half = headDim / 2;
  const cos = new Float32Array(half);
  const sin = new Float32Array(half);
  for (let row = 0; row < positions.length; row++) {
    const position = positions[row];
    for (let j = 0; j < half; j++) {
      const angle = Math.fround(position * invFreq[j]);
      cos[j] = Math.cos(angle);
      sin[j] = Math.sin(angle);
    }
    for (let head = row * rowWidth; head < (row + 1) * rowWidth; head += headDim) {
      for (let j = 0; j < half; j++) {
        const a = x[head + j], b = x[head + half + j];
        x[head + j] = a * cos[j] - b * sin[j];
        x[head + half + j] = b * cos[j] + a * sin[j];
      }
    }
  }
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
