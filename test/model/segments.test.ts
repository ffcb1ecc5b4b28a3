// segmentsCoverRows: whether packed segments hold every row of a batch exactly once, which lets packed attention's
// output go unzeroed (DifferentiableTransformer) and the CUDA forward write o_proj's bf16 operand beside it.
import { expect, it } from "vitest";
import { segmentsCoverRows } from "../../lib/model/backend.ts";

it("is true only when the segments, in any order, hold each row exactly once", () => {
  expect(segmentsCoverRows([{ start: 0, length: 3 }, { start: 3, length: 2 }], 5)).toBe(true);
  expect(segmentsCoverRows([{ start: 3, length: 2 }, { start: 0, length: 3, prefix: undefined }], 5)).toBe(true);
  expect(segmentsCoverRows([{ start: 0, length: 0 }, { start: 0, length: 5 }], 5)).toBe(true); // an empty segment holds nothing
  expect(segmentsCoverRows([], 0)).toBe(true);
  expect(segmentsCoverRows([{ start: 0, length: 3 }, { start: 2, length: 3 }], 5)).toBe(false); // row 2 twice
  expect(segmentsCoverRows([{ start: 0, length: 3 }], 5)).toBe(false); // rows 3 and 4 in none
  expect(segmentsCoverRows([{ start: 0, length: 3 }, { start: 4, length: 1 }], 5)).toBe(false); // a gap
  expect(segmentsCoverRows([{ start: 0, length: 6 }], 5)).toBe(false); // past the rows
  expect(segmentsCoverRows([{ start: 1, length: 5 }], 5)).toBe(false);
  expect(segmentsCoverRows([{ start: 0, length: -1 }, { start: 0, length: 5 }], 5)).toBe(false);
});
