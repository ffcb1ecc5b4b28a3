/**
 * Host-side planning of one attention launch (pure functions, tested without a GPU): which batch rows share a
 * block (a tile), which kernel instantiation fits the head size, and how to split long key ranges across blocks.
 * The constants mirror attention.cu.
 */
import { ArtError } from "../core/errors.ts";
import type { KvCacheSpec, RowPlacement } from "../model/backend.ts";

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
