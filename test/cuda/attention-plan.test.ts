import { describe, expect, it } from "vitest";
import { attentionDimsPerLane, attentionKeyWindow, attentionSharedBytes, planSplits, planTiles } from "../../lib/cuda/attention-plan.ts";
import { keyQueryRanges, packedForwardKernel, packedQueryTiles } from "../../lib/cuda/attention-plan.ts";

describe("attention launch planning", () => {
  it("tiles consecutive prefill rows of one slot, up to 16 query vectors per block", () => {
    // slot 0 prefills positions 0..4, slot 1 decodes at 9, slot 2 prefills 3..4
    const slots = Int32Array.from([0, 0, 0, 0, 0, 1, 2, 2]);
    const positions = Int32Array.from([0, 1, 2, 3, 4, 9, 3, 4]);
    const group7 = planTiles(slots, positions, 7); // 2 rows per tile
    expect([...group7.tileStart]).toEqual([0, 2, 4, 5, 6]);
    expect([...group7.tileRows]).toEqual([2, 2, 1, 1, 2]);
    const group1 = planTiles(slots, positions, 1); // 16 rows per tile
    expect([...group1.tileStart]).toEqual([0, 5, 6]);
    expect([...group1.tileRows]).toEqual([5, 1, 2]);
  });

  it("starts a new tile where positions jump (a slot seen again, not one chunk)", () => {
    const tiles = planTiles(Int32Array.from([3, 3, 3]), Int32Array.from([5, 7, 8]), 2);
    expect([...tiles.tileStart]).toEqual([0, 1]);
    expect([...tiles.tileRows]).toEqual([1, 2]);
  });

  it("picks the kernel instantiation by head size and refuses heads over 256", () => {
    expect([16, 32, 64, 80, 128, 256].map(attentionDimsPerLane)).toEqual([1, 1, 2, 3, 4, 8]);
    expect(() => attentionDimsPerLane(512)).toThrowError(/head_dim up to 256, got 512/);
    expect(attentionSharedBytes(4)).toBe((16 * 128 + 32 * 129 + 32 * 128) * 4);
  });

  it("splits long key ranges when the grid is small (decode) and not when it is large (prefill)", () => {
    // 2 blocks want 132 splits; at most 1000/64 = 15, rounded to 96-key splits: 11 of them.
    expect(planSplits(1, 2, 1000, 132)).toEqual({ splits: 11, splitLength: 96 });
    expect(planSplits(256, 2, 512, 132)).toEqual({ splits: 1, splitLength: 512 });
    expect(planSplits(1, 2, 40, 132)).toEqual({ splits: 1, splitLength: 64 });
    const { splits, splitLength } = planSplits(8, 2, 4097, 132);
    expect(splitLength % 32).toBe(0);
    expect((splits - 1) * splitLength).toBeLessThan(4097);
    expect(splits * splitLength).toBeGreaterThanOrEqual(4097);
  });

  it("plans for a window of keys: a power of two from 64, capped at the cache", () => {
    expect([1, 64, 65, 128, 129, 1000, 1024, 1025].map((keys) => attentionKeyWindow(keys, 32768))).toEqual([64, 64, 128, 128, 256, 1024, 1024, 2048]);
    expect(attentionKeyWindow(1025, 1500)).toBe(1500);
    expect(attentionKeyWindow(10, 40)).toBe(40);
  });
});

describe("training attention forward: query tiles and the kernel per head size", () => {
  it("tiles each segment's rows 64 at a time, never across segments, each tile carrying its segment's keys", () => {
    const segments = [{ start: 0, length: 130 }, { start: 130, length: 5, prefix: { start: 0, length: 100 } }, { start: 135, length: 0 }];
    expect([...packedQueryTiles(segments)]).toEqual([
      0, 64, 0, 0, 0, 64, 64, 0, 0, 0, 128, 2, 0, 0, 0, // a 130-row segment: 64 + 64 + 2 rows
      130, 5, 130, 0, 100, // a completion reading 100 prefix rows
    ]);
  });

  it("pads head sizes to the next instantiation and sizes shared memory for Q and one key tile of K and V", () => {
    expect([8, 16, 17, 64, 80, 128, 256].map((size) => packedForwardKernel(size).hd)).toEqual([16, 16, 32, 64, 128, 128, 256]);
    expect(packedForwardKernel(64).sharedBytes).toBe((64 + 2 * 64) * 72 * 2);
    expect(packedForwardKernel(256).sharedBytes).toBe((64 + 2 * 32) * 264 * 2); // smaller key tiles keep it under 96 KiB
    expect(() => packedForwardKernel(320)).toThrowError(/head size 320 is over 256/);
  });
});

describe("training attention backward: the query rows of each key row", () => {
  it("lists its own segment's rows from the key on, and every row of each segment reading it as a shared prefix", () => {
    // rows 0-2: a prompt stored once; rows 3-4 and 5-7: two completions that read it; row 8: a sequence of its own.
    const segments = [{ start: 0, length: 3 }, { start: 3, length: 2, prefix: { start: 0, length: 3 } },
      { start: 5, length: 3, prefix: { start: 0, length: 2 } }, { start: 8, length: 1 }];
    const { offsets, ranges } = keyQueryRanges(segments, 9);
    const of = (key: number) => Array.from(ranges.subarray(2 * offsets[key], 2 * offsets[key + 1]));
    expect(of(0)).toEqual([0, 3, 3, 5, 5, 8]);
    expect(of(2)).toEqual([2, 3, 3, 5]); // the second completion reads only 2 prompt rows
    expect(of(4)).toEqual([4, 5]);
    expect(of(5)).toEqual([5, 8]);
    expect(of(8)).toEqual([8, 9]);
    expect(offsets[9]).toBe(ranges.length / 2);
  });
});
