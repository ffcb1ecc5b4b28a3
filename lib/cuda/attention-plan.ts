/**
 * Host-side planning of attention launches (pure functions, tested without a GPU). Over the KV cache (attention.cu):
 * which rows go to the tensor-core prefill and which to the decode kernel, which batch rows share a block (a tile),
 * which kernel instantiation fits the head size, and how to split long key ranges across blocks. Over packed
 * sequences (packed_attention.cu): query tiles with their keys, key tiles with the query rows that see them.
 * The constants mirror the kernels.
 */
import { ArtError } from "../core/errors.ts";
import type { KvCacheSpec, PackedSegment, RowPlacement } from "../model/backend.ts";

export const attentionWarps = 4;
export const attentionChunk = 32;
/** Query vectors per block (tile rows × query heads per kv head). */
export const attentionQueryVectors = 16;

/** Shortest run of a slot's consecutive positions that the tensor-core prefill (attention_prefill_hdN) takes. */
export const prefillMinRun = 16;

export interface AttentionPlan {
  /** attention_dplN's tiles: each tile's first row and row count. */
  tileStart: Int32Array;
  tileRows: Int32Array;
  /** The rows of the tiles before each tile: where its rows' split partials go (they cover the tiles' rows only). */
  tileOffset: Int32Array;
  /** attention_prefill_hdN's tiles: per tile {first row, rows, slot, first position}. */
  prefill: Int32Array;
  /**
   * Every row is the only row of its slot in the call (a decode pass): no row reads a key another row of the call
   * writes, so attention_dplN may store the rows' keys itself instead of a kv_write launch before it.
   */
  decode: boolean;
}

/**
 * Splits the rows of an attention call between the two kernels. A run of consecutive rows of one slot (positions
 * increasing by one: a prefill chunk) of at least `prefillMinRun` rows goes to the tensor-core prefill in tiles of
 * `tensorCoreTileRows`, when the head size allows (at most 128); the other rows (decode rows, short chunks) go to
 * attention_dplN in tiles of at most floor(16 / group) consecutive rows, so a block's keys serve every row of its tile.
 */
export function planAttention(slots: Int32Array, positions: Int32Array, group: number, headDim: number): AttentionPlan {
  const maxRows = Math.max(1, Math.floor(attentionQueryVectors / group));
  const starts: number[] = [], counts: number[] = [], prefill: number[] = [];
  for (let first = 0; first < slots.length;) {
    let end = first + 1;
    while (end < slots.length && slots[end] === slots[first] && positions[end] === positions[end - 1] + 1) end++;
    const tensorCores = end - first >= prefillMinRun && flashHeadSize(headDim) !== null;
    const tileRows = tensorCores ? tensorCoreTileRows : maxRows;
    for (let start = first; start < end; start += tileRows) {
      const rows = Math.min(tileRows, end - start);
      if (tensorCores) prefill.push(start, rows, slots[start], positions[start]);
      else {
        starts.push(start);
        counts.push(rows);
      }
    }
    first = end;
  }
  let offset = 0;
  const offsets = counts.map((rows) => (offset += rows) - rows);
  return {
    tileStart: Int32Array.from(starts), tileRows: Int32Array.from(counts), tileOffset: Int32Array.from(offsets), prefill: Int32Array.from(prefill),
    decode: new Set(slots).size === slots.length,
  };
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
 * (tile, kv head) pairs below which planSplits splits keys: twice the multiprocessors. So a pass with split keys has
 * fewer pairs than this, and as many split counters (attention.cu) serve every such pass.
 */
export function splitPairsBound(multiprocessors: number): number {
  return 2 * multiprocessors;
}

/**
 * Key-range split: enough blocks to fill the GPU twice over (tiles × kv heads × splits ≈ 2 · SMs), each split at
 * least 64 keys and a whole number of 32-key chunks. One split when the grid is already large or keys are few.
 */
export function planSplits(tiles: number, kvHeads: number, maxKeys: number, multiprocessors: number):
  { splits: number; splitLength: number } {
  const blocks = tiles * kvHeads;
  const wanted = Math.ceil(splitPairsBound(multiprocessors) / blocks);
  const splits = Math.max(1, Math.min(wanted, Math.floor(maxKeys / 64)));
  const splitLength = Math.ceil(Math.ceil(maxKeys / splits) / attentionChunk) * attentionChunk;
  return { splits: Math.ceil(maxKeys / splitLength), splitLength };
}

/**
 * Head sizes the packed attention's kernels take: up to 128 (Qwen2/2.5, Qwen3 and Llama use 64 or 128). Larger heads
 * would need the dk/dv pass's accumulators split across blocks.
 */
export function checkPackedHeadDim(headDim: number): void {
  if (headDim > 128) {
    throw new ArtError("cuda_unsupported", `cuda packed attention: head size ${headDim} is over 128; train this model on the CPU backend`);
  }
}

/**
 * Rows of a tile of the tensor-core kernels (flash.cuh, 4 warps × 16 rows): the training attention's query tiles
 * (forward and dq pass) and key tiles (dk/dv pass), and the prefill's query tiles.
 */
export const tensorCoreTileRows = 64;

/** The instantiation of flash.cuh's kernels for a head size: padded with zeros to a multiple of 16; none past 128. */
export function flashHeadSize(headDim: number): 16 | 32 | 64 | 128 | null {
  return ([16, 32, 64, 128] as const).find((size) => headDim <= size) ?? null;
}

/**
 * Dynamic shared memory of flash.cuh's forward, in bf16 rows of HD + 8: a query tile, and two buffers of a key tile of
 * K and of V (the next tile's copies run while the warps work on this one). 85 KiB at head size 128: within the
 * opt-in limit of every sm_80+ GPU (99 KiB on sm_86/89).
 */
export function flashForwardBytes(hd: number): number {
  return 5 * tensorCoreTileRows * (hd + 8) * 2;
}

/**
 * The training attention's kernels for a head size (flashHeadSize) on a device whose blocks may hold
 * `sharedBytesPerBlock` (DeviceInfo), and their dynamic shared memory, in bf16 rows of HD + 8: the forward's
 * (flashForwardBytes); the dq pass a query tile of Q and dO and a key tile of K and V, double-buffered where the block
 * holds two (every head size up to 64; at 128 the 102 KiB of two pass sm_86/89's 99 KiB, so those take the one-buffer
 * instantiation, and sm_80/90 `…_hd128_two_buffers`); the dk/dv pass a key tile of K and V and a query chunk of Q and
 * dO (64 rows, 32 at head size 128; two buffers of each) with its rows' log-sum-exp and Δ in f32.
 */
export function packedAttentionKernels(headDim: number, sharedBytesPerBlock: number): {
  forwardKernel: string; forwardBytes: number; dqKernel: string; dqBytes: number; dkdvKernel: string; dkdvBytes: number;
} {
  checkPackedHeadDim(headDim);
  const hd = flashHeadSize(headDim)!;
  const row = (hd + 8) * 2, tile = tensorCoreTileRows, chunk = hd === 128 ? 32 : 64;
  const dqBytes = (buffers: number) => (2 + 2 * buffers) * tile * row;
  const twoBuffers = hd <= 64 || dqBytes(2) <= sharedBytesPerBlock;
  return {
    forwardKernel: `packed_attention_forward_hd${hd}`, forwardBytes: flashForwardBytes(hd),
    dqKernel: `packed_attention_backward_dq_hd${hd}${hd === 128 && twoBuffers ? "_two_buffers" : ""}`, dqBytes: dqBytes(twoBuffers ? 2 : 1),
    dkdvKernel: `packed_attention_backward_dkdv_hd${hd}`, dkdvBytes: (2 * tile + 4 * chunk) * row + 2 * chunk * 4,
  };
}

/**
 * The query tiles of the forward and the dq pass: each segment's rows, at most `tensorCoreTileRows` at a time, as {first
 * row, rows, segment start, prefix start, prefix length} (a tile never spans two segments, so its rows share their keys).
 */
export function packedQueryTiles(segments: readonly PackedSegment[]): Int32Array {
  const tiles: number[] = [];
  for (const { start, length, prefix } of segments) {
    for (let first = start; first < start + length; first += tensorCoreTileRows) {
      tiles.push(first, Math.min(tensorCoreTileRows, start + length - first), start, prefix?.start ?? 0, prefix?.length ?? 0);
    }
  }
  return Int32Array.from(tiles);
}

/**
 * The key tiles of the dk/dv pass and the query rows that see them. Each segment's rows, at most `tensorCoreTileRows` at
 * a time, are a tile {first key row, keys, first range, ranges}; its ranges of query rows are {first row, end, prefix
 * start, prefix end, causal}: the rest of its own segment from the tile on (causal: a row sees the keys at or before
 * it), then every segment whose prefix overlaps the tile (its rows see the keys in [prefix start, prefix end)).
 */
export function packedKeyTiles(segments: readonly PackedSegment[]): { tiles: Int32Array; ranges: Int32Array } {
  const tiles: number[] = [], ranges: number[] = [];
  for (const { start, length } of segments) {
    for (let first = start; first < start + length; first += tensorCoreTileRows) {
      const keys = Math.min(tensorCoreTileRows, start + length - first), rangesBefore = ranges.length / 5;
      ranges.push(first, start + length, 0, 0, 1);
      for (const reader of segments) {
        const prefix = reader.prefix;
        if (prefix && reader.length > 0 && prefix.start < first + keys && prefix.start + prefix.length > first) {
          ranges.push(reader.start, reader.start + reader.length, prefix.start, prefix.start + prefix.length, 0);
        }
      }
      tiles.push(first, keys, rangesBefore, ranges.length / 5 - rangesBefore);
    }
  }
  return { tiles: Int32Array.from(tiles), ranges: Int32Array.from(ranges) };
}
