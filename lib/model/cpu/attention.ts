/**
 * Attention on the CPU as tiled matmuls. `attendBlock` is the one attention block both passes run: the engine's
 * attention over the KV cache (CpuBackend.attention) and the training pass's attention over packed sequences
 * (`packedAttention` here; its backward reads the probabilities the forward kept, or, where keeping them would
 * take more than KEPT_PROBABILITY_FLOATS, recomputes them: the block's first half). Per query head and block of 32
 * query rows, the scores against every key the block sees are one matmulNT, and after the softmax the output is one
 * matmulNT against the values transposed; the backward is tiled the same way over the blocks the causal mask leaves. The training pass's work comes in units (a segment's query heads of one KV head, attentionUnits) that
 * share nothing they write, which attention-threads.ts spreads over worker threads.
 */
import type { PackedSegment } from "../backend.ts";
import type { Gemm } from "./gemm.ts";
import type { WasmElementwise } from "./wasm-elementwise.ts";
import { transposeRows } from "./matmul.ts";

/**
 * Softmax of row[at .. at+last] in place, row[at+last+1 .. at+end) = 0: one attention row over the keys its query
 * sees, zero for the keys a block's later rows see (so a product over the whole block adds nothing for them).
 * The reference; the fast path runs the same formula a block at a time (WasmElementwise.softmaxRows).
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
 * Without `valuesT` (a single decoding row, where transposing would cost as much as the product) p·v is the
 * Gemm's weightedRowSum over the cached values. Decoding (CpuBackend.attention) and training (packedAttention) both attend through this.
 */
export function attendBlock(
  gemm: Gemm, fast: WasmElementwise | null, q: Float32Array, keys: Float32Array, values: Float32Array, valuesT: Float32Array | null, out: Float32Array, positions: Int32Array,
  headDim: number, qStride: number, kvStride: number, runKeys: number, scores: Float32Array,
): void {
  blockProbabilities(gemm, fast, q, keys, positions, headDim, qStride, kvStride, runKeys, scores);
  blockValues(gemm, scores, values, valuesT, out, positions, headDim, qStride, kvStride, runKeys);
}

/** Keys a block of query rows at `positions` sees: up to its last row's. */
function blockKeyCount(positions: Int32Array): number {
  let keys = 0;
  for (let r = 0; r < positions.length; r++) keys = Math.max(keys, positions[r] + 1);
  return keys;
}

/**
 * attendBlock's first half: the softmax probabilities of a block of query rows into `scores` (row r at r·runKeys,
 * up to the block's last key). The training backward recomputes only this (groupProbabilities).
 */
function blockProbabilities(
  gemm: Gemm, fast: WasmElementwise | null, q: Float32Array, keys: Float32Array, positions: Int32Array,
  headDim: number, qStride: number, kvStride: number, runKeys: number, scores: Float32Array,
): void {
  const blockRows = positions.length, blockKeys = blockKeyCount(positions);
  gemm.nt(q, keys, blockRows, headDim, blockKeys, scores,
    { alpha: 1 / Math.sqrt(headDim), xStride: qStride, wStride: kvStride, outStride: runKeys });
  if (fast) fast.softmaxRows(scores, 0, runKeys, positions, blockKeys);
  else for (let r = 0; r < blockRows; r++) causalSoftmax(scores, r * runKeys, positions[r], blockKeys);
}

/** attendBlock's second half: out = p·v for the block's probabilities in `scores`. */
function blockValues(
  gemm: Gemm, scores: Float32Array, values: Float32Array, valuesT: Float32Array | null, out: Float32Array, positions: Int32Array,
  headDim: number, qStride: number, kvStride: number, runKeys: number,
): void {
  if (valuesT) {
    gemm.nt(scores, valuesT, positions.length, blockKeyCount(positions), headDim, out, { xStride: runKeys, wStride: runKeys, outStride: qStride });
    return;
  }
  for (let r = 0; r < positions.length; r++) {
    gemm.weightedRowSum(scores.subarray(r * runKeys), values, positions[r] + 1, headDim, kvStride, out.subarray(r * qStride));
  }
}

/** Query rows of one product when a GQA group's heads are stacked (attendGroup): their scores stay in cache. */
const STACKED_ROWS = 128;

/** Query rows per block of attendGroup for a group of `group` heads: up to ATTENTION_BLOCK, at most STACKED_ROWS stacked. */
function groupBlockRows(group: number): number {
  return Math.max(1, Math.min(ATTENTION_BLOCK, Math.floor(STACKED_ROWS / group)));
}

/** attendGroup's scratch, grown as needed and reused across calls. */
export class GroupScratch {
  q = new Float32Array(0);
  out = new Float32Array(0);
  scores = new Float32Array(0);
  positions = new Int32Array(0);
}

/**
 * Query heads firstHead..firstHead+group−1 (one GQA group) over a block of query rows at `positions` (q and out rows
 * `qStride` apart), against one KV head: their rows stacked head-major into one block, so each product of
 * attendBlock is `group` times taller than one head's, and the results scattered back. Returns the stacked
 * probabilities (row g·rows + r is head firstHead + g's row r, `runKeys` apart), valid until the next call.
 * A row's numbers do not depend on what is stacked with it (attendBlock's rows are independent).
 */
function attendGroup(
  gemm: Gemm, fast: WasmElementwise | null, scratch: GroupScratch, q: Float32Array, out: Float32Array, qStride: number, firstHead: number,
  group: number, positions: Int32Array, headDim: number, keys: Float32Array, values: Float32Array, valuesT: Float32Array, kvStride: number,
  runKeys: number,
): Float32Array {
  const scores = groupProbabilities(gemm, fast, scratch, q, qStride, firstHead, group, positions, headDim, keys, kvStride, runKeys);
  const rows = positions.length, stackedOut = scratch.out;
  blockValues(gemm, scores, values, valuesT, stackedOut, scratch.positions.subarray(0, rows * group), headDim, headDim, kvStride, runKeys);
  for (let g = 0, row = 0; g < group; g++) {
    const column = (firstHead + g) * headDim;
    for (let r = 0; r < rows; r++, row++) {
      const from = row * headDim, to = r * qStride + column;
      for (let j = 0; j < headDim; j++) out[to + j] = stackedOut[from + j];
    }
  }
  return scores;
}

/**
 * attendGroup without the values: the group's query rows stacked as there and their probabilities, returned as
 * there. The training backward recomputes these and needs no output rows.
 */
function groupProbabilities(
  gemm: Gemm, fast: WasmElementwise | null, scratch: GroupScratch, q: Float32Array, qStride: number, firstHead: number,
  group: number, positions: Int32Array, headDim: number, keys: Float32Array, kvStride: number, runKeys: number,
): Float32Array {
  const rows = positions.length, stacked = rows * group;
  if (scratch.q.length < stacked * headDim) {
    scratch.q = new Float32Array(stacked * headDim);
    scratch.out = new Float32Array(stacked * headDim);
  }
  if (scratch.positions.length < stacked) scratch.positions = new Int32Array(stacked);
  if (!fast && scratch.scores.length < stacked * runKeys) scratch.scores = new Float32Array(stacked * runKeys);
  const scores = fast ? fast.scratchView(stacked * runKeys) : scratch.scores;
  const stackedQ = scratch.q, stackedPositions = scratch.positions.subarray(0, stacked);
  // Plain loops: a subarray per row and head would allocate more than the copy costs.
  for (let g = 0, row = 0; g < group; g++) {
    const column = (firstHead + g) * headDim;
    for (let r = 0; r < rows; r++, row++) {
      stackedPositions[row] = positions[r];
      const from = r * qStride + column, to = row * headDim;
      for (let j = 0; j < headDim; j++) stackedQ[to + j] = q[from + j];
    }
  }
  blockProbabilities(gemm, fast, stackedQ, keys, stackedPositions, headDim, headDim, kvStride, runKeys, scores);
  return scores;
}

/**
 * Backward of one causalSoftmax row scaled by `scale`: with P = probs[at..] and dP = grads[at..] over keys 0..last,
 * grads becomes dS = P · (dP − Σ P·dP) · scale there and 0 from last + 1 up to `end`. The reference;
 * WasmElementwise.softmaxBackwardRows runs it a block at a time.
 */
export function causalSoftmaxBackward(probs: Float32Array, grads: Float32Array, at: number, last: number, end: number, scale: number): void {
  let weighted = 0;
  for (let s = 0; s <= last; s++) weighted += probs[at + s] * grads[at + s];
  for (let s = 0; s <= last; s++) grads[at + s] = probs[at + s] * (grads[at + s] - weighted) * scale;
  grads.fill(0, at + last + 1, at + end);
}

/** What attendKvHead reuses across the KV heads of a segment. */
class SegmentScratch {
  readonly valuesT: Float32Array;
  readonly positions: Int32Array;
  readonly group = new GroupScratch();
  /** `valuesDim`: the head size of the values transposed for p·v, 0 where only probabilities are computed. */
  constructor(queryLen: number, keyLen: number, valuesDim: number) {
    this.valuesT = new Float32Array(valuesDim * keyLen);
    this.positions = Int32Array.from({ length: queryLen }, (_, t) => keyLen - queryLen + t);
  }
}

/**
 * The query heads of KV head `kvh` over query rows at `positions` (row r sees keys 0..positions[r] of `runKeys`): their
 * out rows, one attendGroup per block of rows, the values transposed once into `scratch.valuesT` (at least
 * headDim × runKeys). q and out rows are heads·headDim wide, keys and values rows kvHeads·headDim. A packed segment's
 * unit and a prompt's run over the KV cache (CpuBackend.attention) attend through this. With `probs` ([group, rows,
 * runKeys], every entry written), the probabilities are kept there for the backward, as kvHeadProbabilities would
 * recompute them.
 */
export function attendKvHead(
  gemm: Gemm, fast: WasmElementwise | null, scratch: { valuesT: Float32Array; group: GroupScratch }, kvh: number, out: Float32Array,
  q: Float32Array, k: Float32Array, v: Float32Array, positions: Int32Array, runKeys: number, heads: number, kvHeads: number, headDim: number,
  probs: Float32Array | null = null,
): void {
  const group = heads / kvHeads, qStride = heads * headDim, kvStride = kvHeads * headDim;
  const blockRows = groupBlockRows(group);
  transposeRows(v.subarray(kvh * headDim), runKeys, headDim, kvStride, scratch.valuesT);
  for (let t0 = 0; t0 < positions.length; t0 += blockRows) {
    const rows = Math.min(blockRows, positions.length - t0), blockPositions = positions.subarray(t0, t0 + rows);
    const scores = attendGroup(gemm, fast, scratch.group, q.subarray(t0 * qStride), out.subarray(t0 * qStride), qStride, kvh * group, group,
      blockPositions, headDim, k.subarray(kvh * headDim), v.subarray(kvh * headDim), scratch.valuesT, kvStride, runKeys);
    if (probs) keepBlockProbabilities(scores, probs, group, rows, t0, positions.length, runKeys, blockKeyCount(blockPositions));
  }
}

/**
 * A block's probabilities as groupProbabilities stacks them (head g's row r at (g·rows + r)·keyLen) into `probs`
 * ([group, queryLen, keyLen]) at query row t0, each row whole: up to the block's last key, then zeros (which the
 * backward's key-block products read).
 */
function keepBlockProbabilities(
  scores: Float32Array, probs: Float32Array, group: number, rows: number, t0: number, queryLen: number, keyLen: number, blockKeys: number,
): void {
  for (let g = 0; g < group; g++) {
    for (let r = 0; r < rows; r++) {
      const from = (g * rows + r) * keyLen, to = (g * queryLen + t0 + r) * keyLen;
      probs.set(scores.subarray(from, from + blockKeys), to);
      probs.fill(0, to + blockKeys, to + keyLen);
    }
  }
}

/**
 * attendKvHead's softmax probabilities into `probs` ([group, queryLen, keyLen]), each row written whole (zero past the
 * row's own last key), without the out rows. The backward recomputes them where the forward
 * kept none: the same blocks and calls as the forward's on the same inputs, so the probabilities are the forward's bit
 * for bit (a [heads × queryLen × keyLen] array per layer is kept only while small: KEPT_PROBABILITY_FLOATS; at a few
 * thousand tokens it is gigabytes).
 */
function kvHeadProbabilities(
  gemm: Gemm, fast: WasmElementwise | null, scratch: SegmentScratch, kvh: number, probs: Float32Array,
  q: Float32Array, k: Float32Array, queryLen: number, keyLen: number, heads: number, kvHeads: number, headDim: number,
): void {
  const group = heads / kvHeads, qStride = heads * headDim, kvStride = kvHeads * headDim, offset = keyLen - queryLen;
  const blockRows = groupBlockRows(group);
  for (let t0 = 0; t0 < queryLen; t0 += blockRows) {
    const rows = Math.min(blockRows, queryLen - t0), blockKeys = offset + t0 + rows;
    const scores = groupProbabilities(gemm, fast, scratch.group, q.subarray(t0 * qStride), qStride, kvh * group, group,
      scratch.positions.subarray(t0, t0 + rows), headDim, k.subarray(kvh * headDim), kvStride, keyLen);
    keepBlockProbabilities(scores, probs, group, rows, t0, queryLen, keyLen, blockKeys);
  }
}

/** Query rows, and keys, per block of the fast path's backward products. */
const BACKWARD_BLOCK = 128;

/**
 * Backward of attendKvHead over a segment, for KV head `kvh` and its query heads; dq, dk, dv accumulate. Query heads
 * sharing a kv head add into its gradient, in order. With P the softmax: dP = dout·vᵀ, dS = P ∘ (dP − Σ_s P dP)/√d,
 * then dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dout, each a tiled matmul over the blocks the causal mask leaves (key block
 * s sees only queries t ≥ s − offset). The fast path (with `fast`, the WebAssembly kernels) takes dS a block of rows
 * at a time in WebAssembly and reads dSᵀ and Pᵀ through the BLAS's transposed operands; the reference transposes them
 * in JavaScript, a product per head and block of ATTENTION_BLOCK, so that its float64 sums keep their order.
 */
function kvHeadBackward(
  gemm: Gemm, fast: WasmElementwise | null, kvh: number, dq: Float32Array, dk: Float32Array, dv: Float32Array, dout: Float32Array,
  q: Float32Array, k: Float32Array, v: Float32Array,
  queryLen: number, keyLen: number, heads: number, kvHeads: number, headDim: number, kept: Float32Array | null,
): void {
  const group = heads / kvHeads;
  // The KV head's probabilities, as the forward kept them or recomputed (kvHeadProbabilities); past each block's last
  // key they are zero, as the key-block products read them.
  const probs = kept ?? new Float32Array(group * queryLen * keyLen);
  const scale = 1 / Math.sqrt(headDim);
  const qStride = heads * headDim;
  const kvStride = kvHeads * headDim;
  const offset = keyLen - queryLen;
  const queryBlock = fast ? BACKWARD_BLOCK : ATTENTION_BLOCK;
  const keysT = new Float32Array(headDim * keyLen);
  // Every head writes the same entries of dScores (each query block up to its last key); keys past a block stay zero
  // from here on, as the key-block products read them.
  const dScores = new Float32Array(queryLen * keyLen);
  const scoresT = new Float32Array(fast ? 0 : keyLen * queryLen); // Pᵀ or dSᵀ, zero where the mask hides a key
  const rowsT = new Float32Array(fast ? 0 : headDim * queryLen); // q or dout of one head, transposed
  if (!kept) kvHeadProbabilities(gemm, fast, new SegmentScratch(queryLen, keyLen, 0), kvh, probs, q, k, queryLen, keyLen, heads, kvHeads, headDim);
  transposeRows(k.subarray(kvh * headDim), keyLen, headDim, kvStride, keysT);
  for (let g = 0; g < group; g++) {
    const h = kvh * group + g, p = probs.subarray(g * queryLen * keyLen, (g + 1) * queryLen * keyLen);
    for (let t0 = 0; t0 < queryLen; t0 += queryBlock) {
      const rows = Math.min(queryBlock, queryLen - t0), keys = offset + t0 + rows;
      gemm.nt(dout.subarray(t0 * qStride + h * headDim), v.subarray(kvh * headDim), rows, headDim, keys, dScores.subarray(t0 * keyLen),
        { xStride: qStride, wStride: kvStride, outStride: keyLen });
      if (fast) fast.softmaxBackwardRows(p, dScores, t0 * keyLen, keyLen, Int32Array.from({ length: rows }, (_, r) => offset + t0 + r), keys, scale);
      else for (let t = t0; t < t0 + rows; t++) causalSoftmaxBackward(p, dScores, t * keyLen, offset + t, keys, scale);
      gemm.nt(dScores.subarray(t0 * keyLen), keysT, rows, keys, headDim, dq.subarray(t0 * qStride + h * headDim),
        { accumulate: true, xStride: keyLen, wStride: keyLen, outStride: qStride });
    }
    if (fast) {
      for (let s0 = 0; s0 < keyLen; s0 += BACKWARD_BLOCK) {
        const keys = Math.min(BACKWARD_BLOCK, keyLen - s0), first = Math.max(0, s0 - offset);
        const strides = { aStride: keyLen, bStride: qStride, outStride: kvStride };
        gemm.tnAccumulate(dk.subarray(s0 * kvStride + kvh * headDim), dScores.subarray(first * keyLen + s0), q.subarray(first * qStride + h * headDim),
          queryLen - first, keys, headDim, strides);
        gemm.tnAccumulate(dv.subarray(s0 * kvStride + kvh * headDim), p.subarray(first * keyLen + s0), dout.subarray(first * qStride + h * headDim),
          queryLen - first, keys, headDim, strides);
      }
      continue;
    }
    transposeCausal(dScores, queryLen, keyLen, scoresT);
    transposeRows(q.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
    keyBlockProducts(gemm, scoresT, rowsT, dk.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
    transposeCausal(p, queryLen, keyLen, scoresT);
    transposeRows(dout.subarray(h * headDim), queryLen, headDim, qStride, rowsT);
    keyBlockProducts(gemm, scoresT, rowsT, dv.subarray(kvh * headDim), queryLen, keyLen, headDim, kvStride);
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

/** Adds the key gradients of a segment with a prefix back to the rows they came from: the prefix's, then its own. */
function scatterKeyGradients(dx: Float32Array, dKeys: Float32Array, start: number, length: number, prefix: { start: number; length: number }, width: number): void {
  const add = (rowStart: number, from: number, rows: number) => {
    for (let i = 0; i < rows * width; i++) dx[rowStart * width + i] += dKeys[from * width + i];
  };
  add(prefix.start, 0, prefix.length);
  add(start, prefix.length, length);
}

/** Keys a segment's queries see. */
function keyLength(segment: PackedSegment): number {
  return segment.length + (segment.prefix?.length ?? 0);
}


/** What a packed attention attends over: the batch's segments, and its heads. */
export interface PackedAttentionShape {
  segments: readonly PackedSegment[];
  heads: number;
  kvHeads: number;
  headDim: number;
}

/**
 * Units of a packed attention: (segment, KV head) pairs, unit u being segment ⌊u / kvHeads⌋'s query heads of KV head
 * u mod kvHeads. A unit writes only its own columns of its own segment's rows (of out; of dq, and of dk and dv or of
 * its segment's prefix gradients), reading nothing another unit writes, so units run in any order, on any thread,
 * with the same bits (CpuBackend's attention threads run them across workers).
 */
export function attentionUnits(shape: PackedAttentionShape): number {
  return shape.segments.length * shape.kvHeads;
}

/** The multiply-adds of a packed attention's forward (q·kᵀ and p·v over the keys each query sees). */
export function attentionMultiplyAdds(shape: PackedAttentionShape): number {
  let total = 0;
  for (const segment of shape.segments) total += segment.length * (keyLength(segment) - (segment.length - 1) / 2);
  return 2 * total * shape.heads * shape.headDim;
}

/** A unit's segment and KV head. */
function unitOf(shape: PackedAttentionShape, unit: number): { segment: PackedSegment; index: number; kvh: number } {
  const index = Math.floor(unit / shape.kvHeads);
  return { segment: shape.segments[index], index, kvh: unit % shape.kvHeads };
}

/**
 * The most probabilities a packed attention keeps for its backward, in floats (32 MiB a layer); past it the backward
 * recomputes them. The 20M model's batches of 2 and 4 × 512 tokens keep theirs (12.6 and 25 MB a layer, beside
 * about 27 and 54 MB of the layer's other activations), which spares the backward a third of its attention work; a
 * 4096-token sequence's would take 400 MB a layer.
 */
export const KEPT_PROBABILITY_FLOATS = 8 << 20;

/**
 * Where each unit's probabilities lie in the array a forward keeps for its backward: unit u's [group, rows, keys]
 * from offsets[u], the whole array offsets[units] floats.
 */
export function probabilityOffsets(shape: PackedAttentionShape): number[] {
  const group = shape.heads / shape.kvHeads, offsets = [0];
  for (let unit = 0; unit < attentionUnits(shape); unit++) {
    const { segment } = unitOf(shape, unit);
    offsets.push(offsets[unit] + group * segment.length * keyLength(segment));
  }
  return offsets;
}

/** Each call's probabilityOffsets, made once for all of its units (a call's shape is one object on each thread). */
const offsetsByShape = new WeakMap<PackedAttentionShape, number[]>();

/** A unit's block of the kept probabilities (probabilityOffsets), or null where none were kept. */
function unitProbabilities(shape: PackedAttentionShape, unit: number, probs: Float32Array | null): Float32Array | null {
  if (!probs) return null;
  let offsets = offsetsByShape.get(shape);
  if (!offsets) offsetsByShape.set(shape, offsets = probabilityOffsets(shape));
  return probs.subarray(offsets[unit], offsets[unit + 1]);
}

/**
 * Unit `unit` of the attention within each segment of a packed batch: q, out [rows, heads·hd]; k, v [rows, kvHeads·hd].
 * With `probs` (probabilityOffsets' floats, written whole), the unit's probabilities are kept there for the backward, which
 * otherwise recomputes them (kvHeadProbabilities).
 */
export function packedAttentionUnit(
  gemm: Gemm, fast: WasmElementwise | null, shape: PackedAttentionShape, unit: number, q: Float32Array, k: Float32Array, v: Float32Array, out: Float32Array,
  probs: Float32Array | null = null,
): void {
  const { heads, kvHeads, headDim } = shape, { segment, kvh } = unitOf(shape, unit);
  const { start, length } = segment, qWidth = heads * headDim, kvWidth = kvHeads * headDim, keyLen = keyLength(segment);
  const scratch = new SegmentScratch(length, keyLen, headDim);
  attendKvHead(gemm, fast, scratch, kvh, out.subarray(start * qWidth, (start + length) * qWidth), q.subarray(start * qWidth, (start + length) * qWidth),
    segmentKeys(k, segment, kvWidth), segmentKeys(v, segment, kvWidth), scratch.positions, keyLen, heads, kvHeads, headDim,
    unitProbabilities(shape, unit, probs));
}

/** Attention within each segment of a packed batch, unit by unit (packedAttentionUnit). */
export function packedAttention(
  gemm: Gemm, fast: WasmElementwise | null, shape: PackedAttentionShape, q: Float32Array, k: Float32Array, v: Float32Array, out: Float32Array,
  probs: Float32Array | null = null,
): void {
  for (let unit = 0; unit < attentionUnits(shape); unit++) packedAttentionUnit(gemm, fast, shape, unit, q, k, v, out, probs);
}

/** Gradients of the key and value rows a segment with a prefix attends to (its prefix's, then its own). */
export interface PrefixGradients {
  keys: Float32Array;
  values: Float32Array;
}

/** What a backward unit reads and accumulates into; `prefixes` from prefixGradients. */
export interface AttentionBackwardArrays {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  /** The probabilities the forward kept (packedAttentionUnit), or null: recomputed. */
  probs: Float32Array | null;
  dOut: Float32Array;
  dq: Float32Array;
  dk: Float32Array;
  dv: Float32Array;
  prefixes: readonly (PrefixGradients | null)[];
}

/**
 * Zeroed gradients for every segment with a prefix (null for the others), from `allocate`. A prefix's rows gather the
 * shares of every segment reading them, so each such segment's units accumulate into its own copy, and
 * scatterPrefixGradients adds the copies back in segment order once all units are done; a segment without a prefix
 * accumulates in place, into its own rows.
 */
export function prefixGradients<T = Float32Array>(
  shape: PackedAttentionShape, allocate: (length: number) => T = (length) => new Float32Array(length) as T,
): ({ keys: T; values: T } | null)[] {
  const kvWidth = shape.kvHeads * shape.headDim;
  return shape.segments.map((segment) =>
    segment.prefix ? { keys: allocate(keyLength(segment) * kvWidth), values: allocate(keyLength(segment) * kvWidth) } : null);
}

/** Adds each prefix segment's key and value gradients back to the rows they came from, in segment order. */
export function scatterPrefixGradients(shape: PackedAttentionShape, prefixes: readonly (PrefixGradients | null)[], dk: Float32Array, dv: Float32Array): void {
  const kvWidth = shape.kvHeads * shape.headDim;
  shape.segments.forEach(({ start, length, prefix }, i) => {
    const gradients = prefixes[i];
    if (!prefix || !gradients) return;
    scatterKeyGradients(dk, gradients.keys, start, length, prefix, kvWidth);
    scatterKeyGradients(dv, gradients.values, start, length, prefix, kvWidth);
  });
}

/** Unit `unit` of packedAttention's backward, its probabilities kept or recomputed; dq, dk, dv (or the prefix gradients) accumulate. */
export function packedAttentionBackwardUnit(
  gemm: Gemm, fast: WasmElementwise | null, shape: PackedAttentionShape, unit: number, arrays: AttentionBackwardArrays,
): void {
  const { heads, kvHeads, headDim } = shape, { segment, index, kvh } = unitOf(shape, unit);
  const { start, length } = segment, qWidth = heads * headDim, kvWidth = kvHeads * headDim, keyLen = keyLength(segment);
  const rowsOf = (x: Float32Array) => x.subarray(start * qWidth, (start + length) * qWidth);
  const prefix = arrays.prefixes[index];
  const dKeys = prefix ? prefix.keys : segmentKeys(arrays.dk, segment, kvWidth);
  const dValues = prefix ? prefix.values : segmentKeys(arrays.dv, segment, kvWidth);
  kvHeadBackward(gemm, fast, kvh, rowsOf(arrays.dq), dKeys, dValues, rowsOf(arrays.dOut), rowsOf(arrays.q),
    segmentKeys(arrays.k, segment, kvWidth), segmentKeys(arrays.v, segment, kvWidth), length, keyLen, heads, kvHeads, headDim,
    unitProbabilities(shape, unit, arrays.probs));
}

/** Backward of packedAttention, unit by unit, then the prefix gradients scattered; dq, dk, dv accumulate. */
export function packedAttentionBackward(
  gemm: Gemm, fast: WasmElementwise | null, shape: PackedAttentionShape, operands: Omit<AttentionBackwardArrays, "prefixes">,
): void {
  const arrays = { ...operands, prefixes: prefixGradients(shape) };
  for (let unit = 0; unit < attentionUnits(shape); unit++) packedAttentionBackwardUnit(gemm, fast, shape, unit, arrays);
  scatterPrefixGradients(shape, arrays.prefixes, operands.dk, operands.dv);
}
