/**
 * The CPU's JavaScript matmuls over Float32Array: the readable reference of every product, what the WASM SIMD kernels
 * (matmul.wat) are checked against (its matmulF64 bit for bit: every output a float64 sum in order, as here), and what
 * runs where they do not (small decoding products, operands past its 4 GiB memory, runtimes without WebAssembly SIMD).
 *
 * `matmulNT` is `x Wᵀ` with W stored [out, in] as checkpoints store it, so both operands are read along contiguous
 * rows (no transpose). It computes a 4-row × 2-column register tile per pass over k: each loaded weight feeds four
 * rows and each loaded activation two columns, and a block of 32 rows keeps x in cache while W streams by.
 * Leftover rows (decode batches of 1-3) use a 1 × 4 tile instead. The two accumulating products of the backward,
 * `matmulNNAccumulate` (dx = dOut · W) and `matmulTNAccumulate` (dW = dOutᵀ · x), use 4 × 4 tiles.
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

let rowSums = new Float64Array(0);

/**
 * out[j] = Σ_{t < count} weights[t] · rows[t · stride + j] for j < width: one attention row's p·v over the cached
 * values, a float64 sum over t in order (so a row's result does not depend on anything else in its batch).
 */
export function weightedRowSum(weights: Float32Array, rows: Float32Array, count: number, width: number, stride: number, out: Float32Array): void {
  if (rowSums.length < width) rowSums = new Float64Array(width);
  rowSums.fill(0, 0, width);
  for (let t = 0; t < count; t++) {
    const p = weights[t], v = t * stride;
    for (let j = 0; j < width; j++) rowSums[j] += p * rows[v + j];
  }
  for (let j = 0; j < width; j++) out[j] = rowSums[j];
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

/** Row distances of the operands of matmulTNAccumulate (BLAS's leading dimensions); defaults m, k and k: packed. */
export interface TNStrides {
  aStride?: number;
  bStride?: number;
  outStride?: number;
}

/**
 * out[m, k] += a[n, m]ᵀ · b[n, k]  (both row-major, reduced over rows n). The weight gradient dW = doutᵀ · x has
 * this form, and attention's key gradients (a block of dSᵀ · q). Same 4 × 4 register tile, the reduction running
 * down the rows of both operands.
 */
export function matmulTNAccumulate(out: Float32Array, a: Float32Array, b: Float32Array, n: number, m: number, k: number, strides: TNStrides = {}): void {
  const { aStride = m, bStride = k, outStride = k } = strides;
  let i = 0;
  for (; i + 3 < m; i += 4) {
    let j = 0;
    for (; j + 3 < k; j += 4) {
      let s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
      let s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
      for (let r = 0; r < n; r++) {
        const aOff = r * aStride + i, bOff = r * bStride + j;
        const x0 = a[aOff], x1 = a[aOff + 1], x2 = a[aOff + 2], x3 = a[aOff + 3];
        const b0 = b[bOff], b1 = b[bOff + 1], b2 = b[bOff + 2], b3 = b[bOff + 3];
        s00 += x0 * b0; s01 += x0 * b1; s02 += x0 * b2; s03 += x0 * b3;
        s10 += x1 * b0; s11 += x1 * b1; s12 += x1 * b2; s13 += x1 * b3;
        s20 += x2 * b0; s21 += x2 * b1; s22 += x2 * b2; s23 += x2 * b3;
        s30 += x3 * b0; s31 += x3 * b1; s32 += x3 * b2; s33 += x3 * b3;
      }
      const o0 = i * outStride + j, o1 = o0 + outStride, o2 = o1 + outStride, o3 = o2 + outStride;
      out[o0] += s00; out[o0 + 1] += s01; out[o0 + 2] += s02; out[o0 + 3] += s03;
      out[o1] += s10; out[o1 + 1] += s11; out[o1 + 2] += s12; out[o1 + 3] += s13;
      out[o2] += s20; out[o2 + 1] += s21; out[o2 + 2] += s22; out[o2 + 3] += s23;
      out[o3] += s30; out[o3 + 1] += s31; out[o3 + 2] += s32; out[o3 + 3] += s33;
    }
    for (; j < k; j++) {
      for (let c = i; c < i + 4; c++) {
        let sum = 0;
        for (let r = 0; r < n; r++) sum += a[r * aStride + c] * b[r * bStride + j];
        out[c * outStride + j] += sum;
      }
    }
  }
  for (; i < m; i++) {
    for (let r = 0; r < n; r++) {
      const g = a[r * aStride + i];
      if (g === 0) continue;
      const bOff = r * bStride;
      const oOff = i * outStride;
      for (let j = 0; j < k; j++) out[oOff + j] += g * b[bOff + j];
    }
  }
}
