/**
 * Attention on the CPU as tiled matmuls. `attendBlock` is the one attention block both passes run: the engine's
 * attention over the KV cache (CpuBackend.attention) and the training pass's attention over packed sequences
 * (`packedAttention` here, with its backward). Per query head and block of 32 query rows, the scores against every
 * key the block sees are one matmulNT, and after the softmax the output is one matmulNT against the values
 * transposed; the backward is tiled the same way over the blocks the causal mask leaves.
 */
import type { PackedSegment } from "../backend.ts";
import type { Gemm } from "./gemm.ts";
import type { WasmElementwise } from "./wasm-elementwise.ts";
import { transposeRows } from "./matmul.ts";

/**
 * Softmax of row[at .. at+last] in place, row[at+last+1 .. at+end) = 0: one attention row over the keys its query
 * sees, zero for the keys a block's later rows see (so a product over the whole block adds nothing for them).
 * `fastExp` (the fast path's) takes the exponentials four at a time in f32; without it each is Math.exp.
 */
export function causalSoftmax(fastExp: WasmElementwise | null, row: Float32Array, at: number, last: number, end: number): void {
  let max = -Infinity;
  for (let s = 0; s <= last; s++) max = Math.max(max, row[at + s]);
  let sum = 0;
  if (fastExp) {
    const seen = row.subarray(at, at + last + 1);
    fastExp.expShifted(seen, max, seen);
    for (let s = 0; s <= last; s++) sum += row[at + s];
  } else {
    for (let s = 0; s <= last; s++) {
      const e = Math.exp(row[at + s] - max);
      row[at + s] = e;
      sum += e;
    }
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
 * Without `valuesT` (a single decoding row, where transposing would cost as much as the product) p·v is the
 * Gemm's weightedRowSum over the cached values. Decoding (CpuBackend.attention) and training (packedAttention) both attend through this.
 */
export function attendBlock(
  gemm: Gemm, fastExp: WasmElementwise | null, q: Float32Array, keys: Float32Array, values: Float32Array, valuesT: Float32Array | null, out: Float32Array, positions: Int32Array,
  headDim: number, qStride: number, kvStride: number, runKeys: number, scores: Float32Array,
): void {
  const blockRows = positions.length;
  let blockKeys = 0;
  for (let r = 0; r < blockRows; r++) blockKeys = Math.max(blockKeys, positions[r] + 1);
  gemm.nt(q, keys, blockRows, headDim, blockKeys, scores,
    { alpha: 1 / Math.sqrt(headDim), xStride: qStride, wStride: kvStride, outStride: runKeys });
  for (let r = 0; r < blockRows; r++) causalSoftmax(fastExp, scores, r * runKeys, positions[r], blockKeys);
  if (valuesT) {
    gemm.nt(scores, valuesT, blockRows, blockKeys, headDim, out, { xStride: runKeys, wStride: runKeys, outStride: qStride });
    return;
  }
  for (let r = 0; r < blockRows; r++) {
    gemm.weightedRowSum(scores.subarray(r * runKeys), values, positions[r] + 1, headDim, kvStride, out.subarray(r * qStride));
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
function segmentAttention(
  gemm: Gemm, fastExp: WasmElementwise | null, out: Float32Array, probs: Float32Array, q: Float32Array, k: Float32Array, v: Float32Array,
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
        attendBlock(gemm, fastExp, q.subarray(t0 * qStride + h * headDim), k.subarray(kvh * headDim), v.subarray(kvh * headDim), valuesT,
          out.subarray(t0 * qStride + h * headDim), positions.subarray(t0, Math.min(queryLen, t0 + ATTENTION_BLOCK)), headDim, qStride,
          kvStride, keyLen, p.subarray(t0 * keyLen));
      }
    }
  }
}

/**
 * Backward of segmentAttention; dq, dk, dv accumulate. Query heads sharing a kv head add into its gradient.
 * With P the softmax: dP = dout·vᵀ, dS = P ∘ (dP − Σ_s P dP)/√d, then dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dout, each
 * a tiled matmul over the blocks the causal mask leaves (key block s sees only queries t ≥ s − offset).
 */
function segmentAttentionBackward(
  gemm: Gemm, dq: Float32Array, dk: Float32Array, dv: Float32Array, dout: Float32Array, probs: Float32Array,
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
        gemm.nt(dout.subarray(t0 * qStride + h * headDim), v.subarray(kvh * headDim), rows, headDim, keys, dScores.subarray(t0 * keyLen),
          { xStride: qStride, wStride: kvStride, outStride: keyLen });
        for (let t = t0; t < t0 + rows; t++) {
          const at = t * keyLen, last = offset + t;
          let weighted = 0;
          for (let s = 0; s <= last; s++) weighted += p[at + s] * dScores[at + s];
          for (let s = 0; s <= last; s++) dScores[at + s] = p[at + s] * (dScores[at + s] - weighted) * scale;
          dScores.fill(0, at + last + 1, at + keys);
        }
        gemm.nt(dScores.subarray(t0 * keyLen), keysT, rows, keys, headDim, dq.subarray(t0 * qStride + h * headDim),
          { accumulate: true, xStride: keyLen, wStride: keyLen, outStride: qStride });
      }
      transposeCausal(dScores, queryLen, keyLen, scoresT);
      transposeRows(q.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
      keyBlockProducts(gemm, scoresT, rowsT, dk.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
      transposeCausal(p, queryLen, keyLen, scoresT);
      transposeRows(dout.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
      keyBlockProducts(gemm, scoresT, rowsT, dv.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
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
  gemm: Gemm, scoresT: Float32Array, rowsT: Float32Array, out: Float32Array, queryLen: number, keyLen: number, headDim: number, outStride: number,
): void {
  const offset = keyLen - queryLen;
  for (let s0 = 0; s0 < keyLen; s0 += ATTENTION_BLOCK) {
    const keys = Math.min(ATTENTION_BLOCK, keyLen - s0), first = Math.max(0, s0 - offset);
    gemm.nt(scoresT.subarray(s0 * queryLen + first), rowsT.subarray(first), keys, queryLen - first, headDim,
      out.subarray(s0 * outStride), { accumulate: true, xStride: queryLen, wStride: queryLen, outStride });
  }
}

/** K or V rows a segment attends to: its own rows, behind a copy of its prefix's rows when it has one. */
function segmentKeys(x: Float32Array, segment: PackedSegment, width: number): Float32Array {
  const own = x.subarray(segment.start * width, (segment.start + segment.length) * width);
  if (!segment.prefix) return own;
  const { start, length } = segment.prefix;
  const keys = new Float32Array((length + segment.length) * width);
  keys.set(x.subarray(start * width, (start + length) * width));
  keys.set(own, length * width);
  return keys;
}

/** Adds a segment's key gradients back to the rows they came from (the prefix's rows and its own). */
function scatterKeyGradients(dx: Float32Array, dKeys: Float32Array, segment: PackedSegment, width: number): void {
  const prefixLength = segment.prefix?.length ?? 0;
  const add = (rowStart: number, from: number, rows: number) => {
    for (let i = 0; i < rows * width; i++) dx[rowStart * width + i] += dKeys[from * width + i];
  };
  if (segment.prefix) add(segment.prefix.start, 0, prefixLength);
  add(segment.start, prefixLength, segment.length);
}

/** Keys a segment's queries see. */
function keyLength(segment: PackedSegment): number {
  return segment.length + (segment.prefix?.length ?? 0);
}


/**
 * Attention within each segment of a packed batch; returns the softmax probabilities the backward needs, per
 * segment [heads, length, keys], segments one after another. q, out: [rows, heads·hd]; k, v: [rows, kvHeads·hd].
 */
export function packedAttention(
  gemm: Gemm, fastExp: WasmElementwise | null, q: Float32Array, k: Float32Array, v: Float32Array, segments: readonly PackedSegment[], heads: number, kvHeads: number, headDim: number,
  out: Float32Array,
): Float32Array {
  const probs = new Float32Array(segments.reduce((total, s) => total + heads * s.length * keyLength(s), 0));
  const qWidth = heads * headDim, kvWidth = kvHeads * headDim;
  let offset = 0;
  for (const segment of segments) {
    const { start, length } = segment;
    const keyLen = keyLength(segment);
    const segmentProbs = probs.subarray(offset, offset + heads * length * keyLen);
    segmentAttention(gemm, fastExp, out.subarray(start * qWidth, (start + length) * qWidth), segmentProbs, q.subarray(start * qWidth, (start + length) * qWidth),
      segmentKeys(k, segment, kvWidth), segmentKeys(v, segment, kvWidth), length, keyLen, heads, kvHeads, headDim);
    offset += segmentProbs.length;
  }
  return probs;
}

/** Backward of packedAttention from its saved probabilities; dq, dk, dv accumulate. */
export function packedAttentionBackward(
  gemm: Gemm, q: Float32Array, k: Float32Array, v: Float32Array, probs: Float32Array, segments: readonly PackedSegment[], heads: number,
  kvHeads: number, headDim: number, dOut: Float32Array, dq: Float32Array, dk: Float32Array, dv: Float32Array,
): void {
  const qWidth = heads * headDim, kvWidth = kvHeads * headDim;
  let offset = 0;
  for (const segment of segments) {
    const { start, length } = segment;
    const rowsOf = (x: Float32Array) => x.subarray(start * qWidth, (start + length) * qWidth);
    const keyLen = keyLength(segment);
    const dKeys = new Float32Array(keyLen * kvWidth);
    const dValues = new Float32Array(keyLen * kvWidth);
    const size = heads * length * keyLen;
    segmentAttentionBackward(gemm, rowsOf(dq), dKeys, dValues, rowsOf(dOut), probs.subarray(offset, offset + size), rowsOf(q),
      segmentKeys(k, segment, kvWidth), segmentKeys(v, segment, kvWidth), length, keyLen, heads, kvHeads, headDim);
    scatterKeyGradients(dk, dKeys, segment, kvWidth);
    scatterKeyGradients(dv, dValues, segment, kvWidth);
    offset += size;
  }
}
