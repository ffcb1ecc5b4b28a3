/**
 * Host-side planning of attention launches (pure functions, tested without a GPU). Over the KV cache (attention.cu):
 * which batch rows share a block (a tile), which kernel instantiation fits the head size, and how to split long key
 * ranges across blocks. Over packed sequences (packed_attention.cu): each row's keys, and each key's query rows.
 * The constants mirror the kernels.
 */
import { ArtError } from "../core/errors.ts";
import type { KvCacheSpec, PackedSegment, RowPlacement } from "../model/backend.ts";

export const attentionWarps = 4;
export const attentionChunk = 32;
/** Query vectors per block (tile rows × query heads per kv head). */
export const attentionQueryVectors = 16;

export interface AttentionTiles {
  tileStart: Int32Array;
  tileRows: Int32Array;
}

/**
 * Groups consecutive rows of one slot (positions increasing by one: a prefill chunk) into tiles of at most
 * floor(16 / group) rows, so a block's keys serve every row of its tile. Decode rows become tiles of one row.
 */
export function planTiles(slots: Int32Array, positions: Int32Array, group: number): AttentionTiles {
  const maxRows = Math.max(1, Math.floor(attentionQueryVectors / group));
  const starts: number[] = [], counts: number[] = [];
  for (let i = 0; i < slots.length; i++) {
    const last = starts.length - 1;
    const extends_ = last >= 0 && counts[last] < maxRows && slots[i] === slots[i - 1] && positions[i] === positions[i - 1] + 1;
    if (extends_) counts[last]++;
    else {
      starts.push(i);
      counts.push(1);
    }
  }
  return { tileStart: Int32Array.from(starts), tileRows: Int32Array.from(counts) };
}

/** Throws ArtError unless every row names a slot and position of the cache; returns the last position named. */
export function checkRowsInCache(spec: KvCacheSpec, rows: RowPlacement): number {
  let maxPosition = 0;
  for (let i = 0; i < rows.slots.length; i++) {
    const slot = rows.slots[i], position = rows.positions[i];
    if (!(slot >= 0 && slot < spec.numSlots && position >= 0 && position < spec.maxPositions)) {
      throw new ArtError("kv_cache_range", `row ${i} names slot ${slot} position ${position}; the KV cache has ${spec.numSlots} slots of ${spec.maxPositions} positions`);
    }
    maxPosition = Math.max(maxPosition, position);
  }
  return maxPosition;
}

/** Dims per lane (ceil(headDim / 32)) of the attention_dpl* instantiation that serves `headDim`. */
export function attentionDimsPerLane(headDim: number): 1 | 2 | 3 | 4 | 8 {
  for (const dpl of [1, 2, 3, 4, 8] as const) if (headDim <= dpl * 32) return dpl;
  throw new ArtError("cuda_unsupported", `cuda attention supports head_dim up to 256, got ${headDim}`);
}

/** Dynamic shared memory of attention_dplN: queries, keys (padded rows), values, all f32. */
export function attentionSharedBytes(dimsPerLane: number): number {
  const hd = dimsPerLane * 32;
  return (attentionQueryVectors * hd + attentionChunk * (hd + 1) + attentionChunk * hd) * 4;
}

/**
 * The key count an attention launch is planned for: the longest row's keys rounded up to a power of two (at least
 * 64), capped at the cache's positions. Blocks whose split starts past a row's keys write an empty partial that the
 * combine skips, so planning for more keys than a row has is exact; and a decode pass keeps the same grid and
 * arguments for a whole window of positions, which is what lets it be replayed as a recorded CUDA graph.
 */
export function attentionKeyWindow(keys: number, maxPositions: number): number {
  return Math.min(maxPositions, Math.max(64, 2 ** Math.ceil(Math.log2(keys))));
}

/**
 * Key-range split: enough blocks to fill the GPU twice over (tiles × kv heads × splits ≈ 2 · SMs), each split at
 * least 64 keys and a whole number of 32-key chunks. One split when the grid is already large or keys are few.
 */
export function planSplits(tiles: number, kvHeads: number, maxKeys: number, multiprocessors: number):
  { splits: number; splitLength: number } {
  const blocks = tiles * kvHeads;
  const wanted = Math.ceil((2 * multiprocessors) / blocks);
  const splits = Math.max(1, Math.min(wanted, Math.floor(maxKeys / 64)));
  const splitLength = Math.ceil(Math.ceil(maxKeys / splits) / attentionChunk) * attentionChunk;
  return { splits: Math.ceil(maxKeys / splitLength), splitLength };
}

/** The packed attention's backward kernels run one (row, head) pair per warp, this many warps per block. */
export const packedAttentionWarps = 4;

/** Their lanes hold up to 8 dimensions each (DIMS_PER_LANE in packed_attention.cu); the forward's instantiations go to 256. */
export function checkPackedHeadDim(headDim: number): void {
  if (headDim > 32 * 8) throw new ArtError("cuda_unsupported", `cuda packed attention: head size ${headDim} is over 256`);
}

/** Query rows of one block of the tensor-core forward (PACKED_QUERY_TILE: 4 warps × 16 rows). */
export const packedQueryTile = 64;

/**
 * The forward's instantiation for a head size (head_dim padded with zeros to a multiple of the mma's k of 16) and
 * its dynamic shared memory: Q of a query tile and K, V of a key tile in bf16, rows of HD + 8.
 */
export function packedForwardKernel(headDim: number): { hd: 16 | 32 | 64 | 128 | 256; sharedBytes: number } {
  checkPackedHeadDim(headDim);
  const hd = ([16, 32, 64, 128, 256] as const).find((size) => headDim <= size)!;
  const keyTile = hd === 256 ? 32 : 64;
  return { hd, sharedBytes: (packedQueryTile + 2 * keyTile) * (hd + 8) * 2 };
}

/**
 * The forward's query tiles: each segment's rows, at most `packedQueryTile` at a time, as {first row, rows, segment
 * start, prefix start, prefix length} (a tile never spans two segments, so its rows share their keys).
 */
export function packedQueryTiles(segments: readonly PackedSegment[]): Int32Array {
  const tiles: number[] = [];
  for (const { start, length, prefix } of segments) {
    for (let first = start; first < start + length; first += packedQueryTile) {
      tiles.push(first, Math.min(packedQueryTile, start + length - first), start, prefix?.start ?? 0, prefix?.length ?? 0);
    }
  }
  return Int32Array.from(tiles);
}

/** Per row: its segment's first row, its prefix's first row, its prefix's length (see packed_attention_forward). */
export function packedRowKeys(segments: readonly PackedSegment[], rows: number): Int32Array {
  const keys = new Int32Array(rows * 3);
  for (const segment of segments) {
    for (let row = segment.start; row < segment.start + segment.length; row++) {
      keys.set([segment.start, segment.prefix?.start ?? 0, segment.prefix?.length ?? 0], row * 3);
    }
  }
  return keys;
}

/**
 * For every key row, the query rows that attend to it, as [first, end) ranges in CSR form (offsets[key] ..
 * offsets[key + 1] index the pairs in `ranges`): the rows of its own segment from the key on (causal), and every
 * row of each segment that reads it as part of a shared prefix.
 */
export function keyQueryRanges(segments: readonly PackedSegment[], rows: number): { offsets: Int32Array; ranges: Int32Array } {
  const perKey: number[][] = Array.from({ length: rows }, () => []);
  for (const { start, length, prefix } of segments) {
    const end = start + length;
    for (let key = start; key < end; key++) perKey[key].push(key, end);
    if (prefix) for (let key = prefix.start; key < prefix.start + prefix.length; key++) perKey[key].push(start, end);
  }
  const offsets = new Int32Array(rows + 1);
  perKey.forEach((pairs, key) => (offsets[key + 1] = offsets[key] + pairs.length / 2));
  return { offsets, ranges: Int32Array.from(perKey.flat()) };
}
