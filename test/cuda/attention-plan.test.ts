import { describe, expect, it } from "vitest";
import { attentionDimsPerLane, attentionKeyWindow, attentionSharedBytes, planAttention, planSplits, prefillMinRun } from "../../lib/cuda/attention-plan.ts";
import { packedAttentionKernels, packedKeyTiles, packedQueryTiles } from "../../lib/cuda/attention-plan.ts";

describe("attention launch planning", () => {
  it("tiles consecutive prefill rows of one slot, up to 16 query vectors per block", () => {
    // slot 0 prefills positions 0..4, slot 1 decodes at 9, slot 2 prefills 3..4
    const slots = Int32Array.from([0, 0, 0, 0, 0, 1, 2, 2]);
    const positions = Int32Array.from([0, 1, 2, 3, 4, 9, 3, 4]);
    const group7 = planAttention(slots, positions, 7, 64); // 2 rows per tile
    expect([...group7.tileStart]).toEqual([0, 2, 4, 5, 6]);
    expect([...group7.tileRows]).toEqual([2, 2, 1, 1, 2]);
    const group1 = planAttention(slots, positions, 1, 64); // 16 rows per tile
    expect([...group1.tileStart]).toEqual([0, 5, 6]);
    expect([...group1.tileRows]).toEqual([5, 1, 2]);
    expect(group1.prefill.length).toBe(0); // no run is long enough for the tensor-core prefill
  });

  it("starts a new tile where positions jump (a slot seen again, not one chunk)", () => {
    const tiles = planAttention(Int32Array.from([3, 3, 3]), Int32Array.from([5, 7, 8]), 2, 64);
    expect([...tiles.tileStart]).toEqual([0, 1]);
    expect([...tiles.tileRows]).toEqual([1, 2]);
    expect(tiles.decode).toBe(false); // rows of one slot: the later ones read keys the earlier ones write
  });

  it("calls a pass whose rows are each their slot's only row a decode pass (the attention kernel stores the keys)", () => {
    const decode = planAttention(Int32Array.from([4, 0, 7, 2]), Int32Array.from([9, 30, 0, 5]), 7, 64);
    expect(decode.decode).toBe(true);
    expect([...decode.tileRows]).toEqual([1, 1, 1, 1]);
    expect(decode.prefill.length).toBe(0);
    expect(planAttention(Int32Array.from([4, 0, 4]), Int32Array.from([9, 30, 10]), 7, 64).decode).toBe(false);
  });

  it("sends runs of at least prefillMinRun rows to the tensor-core prefill in 64-row tiles, the rest to the decode kernel", () => {
    // slot 4 prefills positions 10..159 (150 rows), slot 1 decodes at 7, slot 2 prefills a short chunk
    const slots = Int32Array.from([...Array(150).fill(4), 1, ...Array(prefillMinRun - 1).fill(2)]);
    const positions = Int32Array.from([...Array.from({ length: 150 }, (_, i) => 10 + i), 7, ...Array.from({ length: prefillMinRun - 1 }, (_, i) => i)]);
    const plan = planAttention(slots, positions, 2, 128);
    expect([...plan.prefill]).toEqual([0, 64, 4, 10, 64, 64, 4, 74, 128, 22, 4, 138]); // {first row, rows, slot, first position}
    expect([...plan.tileStart]).toEqual([150, 151, 159]);
    expect([...plan.tileRows]).toEqual([1, 8, 7]);
    expect([...plan.tileOffset]).toEqual([0, 1, 9]); // the split partials hold the tiles' 16 rows, not the call's 166
    const wide = planAttention(slots, positions, 2, 256); // no tensor-core instantiation for head size 256
    expect(wide.prefill.length).toBe(0);
    expect(wide.tileRows.reduce((a, b) => a + b, 0)).toBe(slots.length);
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

describe("training attention: tiles and kernels", () => {
  // rows 0-129: a prompt stored once; 130-134 read its first 100 rows; 135-139 all of it; an empty segment; 140-144 alone.
  const segments = [{ start: 0, length: 130 }, { start: 130, length: 5, prefix: { start: 0, length: 100 } },
    { start: 135, length: 5, prefix: { start: 0, length: 130 } }, { start: 140, length: 0 }, { start: 140, length: 5 }];

  it("query tiles: each segment's rows 64 at a time, never across segments, each tile carrying its segment's keys", () => {
    expect([...packedQueryTiles(segments)]).toEqual([
      0, 64, 0, 0, 0, 64, 64, 0, 0, 0, 128, 2, 0, 0, 0, // the prompt: 64 + 64 + 2 rows
      130, 5, 130, 0, 100, 135, 5, 135, 0, 130, 140, 5, 140, 0, 0,
    ]);
  });

  it("key tiles: each segment's rows 64 at a time, with the rest of their segment (causal) and every segment whose prefix overlaps them", () => {
    const { tiles, ranges } = packedKeyTiles(segments);
    const of = (tile: number) => {
      const [, , first, count] = tiles.subarray(4 * tile, 4 * tile + 4);
      return Array.from({ length: count }, (_, i) => [...ranges.subarray(5 * (first + i), 5 * (first + i) + 5)]);
    };
    expect(tiles.length / 4).toBe(6);
    expect([...tiles.subarray(0, 2)]).toEqual([0, 64]);
    expect(of(0)).toEqual([[0, 130, 0, 0, 1], [130, 135, 0, 100, 0], [135, 140, 0, 130, 0]]);
    expect(of(1)).toEqual([[64, 130, 0, 0, 1], [130, 135, 0, 100, 0], [135, 140, 0, 130, 0]]);
    expect([...tiles.subarray(8, 10)]).toEqual([128, 2]);
    expect(of(2)).toEqual([[128, 130, 0, 0, 1], [135, 140, 0, 130, 0]]); // past the first reader's 100 rows
    expect(of(3)).toEqual([[130, 135, 0, 0, 1]]);
    expect(of(5)).toEqual([[140, 145, 0, 0, 1]]);
  });

  it("pads head sizes to the next instantiation, sizes shared memory by the device, and refuses heads over 128", () => {
    const sm90 = 227 * 1024, sm86 = 99 * 1024; // the opt-in shared memory per block of an H100 and of an RTX 3090/4090
    expect([8, 16, 17, 64, 80, 128].map((size) => packedAttentionKernels(size, sm90).forwardKernel))
      .toEqual([16, 16, 32, 64, 128, 128].map((hd) => `packed_attention_forward_hd${hd}`));
    const row = 72 * 2; // head size 64: rows of 64 + 8 bf16
    for (const device of [sm90, sm86]) {
      expect(packedAttentionKernels(64, device)).toMatchObject({ forwardBytes: 5 * 64 * row, dqKernel: "packed_attention_backward_dq_hd64",
        dqBytes: 6 * 64 * row, dkdvKernel: "packed_attention_backward_dkdv_hd64", dkdvBytes: 6 * 64 * row + 2 * 64 * 4 });
      expect(packedAttentionKernels(128, device).dkdvBytes).toBe((2 * 64 + 4 * 32) * 136 * 2 + 2 * 32 * 4); // two buffers of query chunks of 32
      expect(packedAttentionKernels(128, device).forwardBytes).toBe(87_040); // Q, two buffers of K and of V: within sm_86's 99 KiB
    }
    // The dq pass at head size 128: two buffers of K and V (102 KiB) where a block may hold them, else one.
    expect(packedAttentionKernels(128, sm90)).toMatchObject({ dqKernel: "packed_attention_backward_dq_hd128_two_buffers", dqBytes: 6 * 64 * 136 * 2 });
    expect(packedAttentionKernels(128, sm86)).toMatchObject({ dqKernel: "packed_attention_backward_dq_hd128", dqBytes: 4 * 64 * 136 * 2 });
    expect(packedAttentionKernels(128, 6 * 64 * 136 * 2)).toMatchObject({ dqKernel: "packed_attention_backward_dq_hd128_two_buffers" });
    expect(() => packedAttentionKernels(256, sm90)).toThrowError(/head size 256 is over 128/);
  });
});
