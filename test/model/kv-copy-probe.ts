// copyKvSlot checked through attention, on any backend. The reference needs no copy op: a second cache gets the
// same keys and values written directly where the copy should have put them. Used by the CPU backend test and by
// the CUDA parity suite (GPU and emulator).
import type { Backend, KvCache, KvCacheSpec } from "../../lib/model/backend.ts";
import { seededRandom } from "../../lib/core/random.ts";

export interface KvCopyProbe {
  /** Per layer, probe rows at the next position of slots 0, 1 and 2, after the copy. */
  copied: Float32Array[];
  /** The same from the cache written directly. */
  direct: Float32Array[];
  /** Per layer, identical probe rows at position `numPositions` of the source (slot 0) and of the target (slot 2). */
  sourceRow: Float32Array[];
  targetRow: Float32Array[];
}

/**
 * Slot 0 holds `sourceLength` positions, slot 1 `otherLength` and slot 2 `targetLength`, each of their own random
 * keys and values; then positions 0..numPositions-1 of slot 0 are copied into slot 2. Slot 2 should then hold
 * slot 0's values below numPositions and its own above; slot 1 must not change.
 */
export function probeKvSlotCopy(backend: Backend, shape: { numLayers: number; numHeads: number; numKvHeads: number; headDim: number },
                                lengths: { sourceLength: number; otherLength: number; targetLength: number; numPositions: number }): KvCopyProbe {
  const { numLayers, numHeads, numKvHeads, headDim } = shape;
  const { sourceLength, otherLength, targetLength, numPositions } = lengths;
  const spec: KvCacheSpec = { numLayers, numKvHeads, headDim, numSlots: 3, maxPositions: Math.max(sourceLength, otherLength, targetLength) + 1 };
  const random = seededRandom(11);
  const rows = (n: number, width: number) => Float32Array.from({ length: n * width }, () => random() * 2 - 1);
  const kvWidth = numKvHeads * headDim, qWidth = numHeads * headDim;
  // Per layer and slot, the keys and values each slot's positions get.
  const contents = Array.from({ length: numLayers }, () => [sourceLength, otherLength, targetLength].map((n) => ({ k: rows(n, kvWidth), v: rows(n, kvWidth) })));

  /** One attention pass over the given rows (which also writes their keys and values); returns its output. */
  const attend = (cache: KvCache, layer: number, slots: number[], positions: number[], q: Float32Array, k: Float32Array, v: Float32Array) => {
    const n = slots.length;
    const tensors = [backend.upload(q, [n, qWidth]), backend.upload(k, [n, kvWidth]), backend.upload(v, [n, kvWidth]), backend.zeros([n, qWidth])];
    const [tq, tk, tv, out] = tensors;
    backend.attention(tq, tk, tv, cache, layer, { slots: Int32Array.from(slots), positions: Int32Array.from(positions) }, out);
    const result = backend.download(out);
    for (const t of tensors) backend.free(t);
    return result;
  };
  /** Writes (slot, positions 0..n-1) of one layer with the given keys and values; the attention output is dropped. */
  const write = (cache: KvCache, layer: number, slot: number, k: Float32Array, v: Float32Array) => {
    const n = k.length / kvWidth;
    attend(cache, layer, new Array(n).fill(slot), Array.from({ length: n }, (_, p) => p), rows(n, qWidth), k, v);
  };

  const withCopy = backend.createKvCache(spec), direct = backend.createKvCache(spec);
  for (let layer = 0; layer < numLayers; layer++) {
    const [source, other, target] = contents[layer];
    for (const [slot, { k, v }] of [source, other, target].entries()) write(withCopy, layer, slot, k, v);
    // The target as the copy should leave it: the source's first numPositions, then its own.
    const spliced = (own: Float32Array, from: Float32Array) => Float32Array.from(own, (x, i) => (i < numPositions * kvWidth ? from[i] : x));
    for (const [slot, { k, v }] of [source, other, { k: spliced(target.k, source.k), v: spliced(target.v, source.v) }].entries()) {
      write(direct, layer, slot, k, v);
    }
  }
  backend.copyKvSlot(withCopy, 0, 2, numPositions);

  const probe: KvCopyProbe = { copied: [], direct: [], sourceRow: [], targetRow: [] };
  for (let layer = 0; layer < numLayers; layer++) {
    const q = rows(3, qWidth), k = rows(3, kvWidth), v = rows(3, kvWidth);
    const next = [sourceLength, otherLength, targetLength];
    probe.copied.push(attend(withCopy, layer, [0, 1, 2], next, q, k, v));
    probe.direct.push(attend(direct, layer, [0, 1, 2], next, q, k, v));
    // The same query, key and value at position numPositions of both slots see the same keys and values.
    const q1 = rows(1, qWidth), k1 = rows(1, kvWidth), v1 = rows(1, kvWidth);
    const twice = (x: Float32Array) => Float32Array.from([...x, ...x]);
    const pair = attend(withCopy, layer, [0, 2], [numPositions, numPositions], twice(q1), twice(k1), twice(v1));
    probe.sourceRow.push(pair.slice(0, qWidth));
    probe.targetRow.push(pair.slice(qWidth));
  }
  withCopy.free();
  direct.free();
  return probe;
}
