// The CPU sampler (lib/model/cpu/sample.ts), the reference of the CUDA kernel, against independent definitions:
// hand-computed distributions, and a sort-based definition of top-k / top-p (ties kept whole) that predicts every
// draw of the vocabulary-order walk; then allowed-token masks and their edge cases.
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import { allowedTokenMask, type SamplingParams } from "../../lib/model/backend.ts";
import { sampleRows, samplingExp } from "../../lib/model/cpu/sample.ts";
import { maxAbsDiff } from "./helpers.ts";

describe("sampling", () => {
  const logits = Float32Array.from([2, 1, 0.5, -1, 3, 0]);
  const probabilities = (temperature: number, keep: number[]) => {
    const w = Array.from(logits, (l, j) => (keep.includes(j) ? Math.exp(l / temperature) : 0));
    const total = w.reduce((s, v) => s + v, 0);
    return w.map((v) => v / total);
  };
  // Evenly spread uniforms turn sampling into an exact quantile count: frequencies equal probabilities within 1/N.
  const frequencies = (temperature: number, topP: number, topK: number) => {
    const n = 20000;
    const counts = new Array(logits.length).fill(0);
    const ids = sampleRows(new Float32Array(n * 6).map((_, i) => logits[i % 6]), 6, {
      temperature: new Float32Array(n).fill(temperature), topP: new Float32Array(n).fill(topP), topK: new Int32Array(n).fill(topK),
      uniforms: Float32Array.from({ length: n }, (_, i) => (i + 0.5) / n), numTopLogprobs: 0,
    }).ids;
    for (const id of ids) counts[id]++;
    return counts.map((c) => c / n);
  };

  it("temperature scales the softmax", () => {
    for (const t of [1, 0.5, 2]) expect(maxAbsDiff(frequencies(t, 1, 0), probabilities(t, [0, 1, 2, 3, 4, 5]))).toBeLessThan(2e-4);
  });
  it("top-k keeps the k most likely", () => {
    expect(maxAbsDiff(frequencies(1, 1, 2), probabilities(1, [4, 0]))).toBeLessThan(2e-4);
  });
  it("top-p keeps the smallest set reaching the mass", () => {
    // p(4) = 0.605, p(0) = 0.222: 0.7 needs both, 0.6 only the first.
    expect(maxAbsDiff(frequencies(1, 0.7, 0), probabilities(1, [4, 0]))).toBeLessThan(2e-4);
    expect(frequencies(1, 0.6, 0)[4]).toBe(1);
  });
  it("top-p over a flat vocabulary (a nucleus of more than the 64 most likely) is exact", () => {
    const vocab = 300, n = 30000;
    const flat = Float32Array.from({ length: vocab }, (_, j) => -0.004 * ((j * 7) % vocab)); // a permuted ramp
    const order = Array.from({ length: vocab }, (_, j) => j).sort((a, b) => flat[b] - flat[a]);
    const p = Array.from(flat, (l) => Math.exp(l / 0.8));
    const total = p.reduce((s, v) => s + v, 0);
    let mass = 0, size = 0;
    while (mass < 0.9 * total) mass += p[order[size++]];
    expect(size).toBeGreaterThan(64);
    const counts = new Array(vocab).fill(0);
    const ids = sampleRows(new Float32Array(n * vocab).map((_, i) => flat[i % vocab]), vocab, {
      temperature: new Float32Array(n).fill(0.8), topP: new Float32Array(n).fill(0.9), topK: new Int32Array(n),
      uniforms: Float32Array.from({ length: n }, (_, i) => (i + 0.5) / n), numTopLogprobs: 0,
    }).ids;
    for (const id of ids) counts[id]++;
    const kept = new Set(order.slice(0, size));
    const expected = p.map((v, j) => (kept.has(j) ? v / mass : 0));
    expect(maxAbsDiff(counts.map((c) => c / n), expected)).toBeLessThan(1e-4);
  });

  it("temperature 0 is greedy and logprobs are the raw log-softmax", () => {
    const result = sampleRows(logits, 6, {
      temperature: Float32Array.of(0), topP: Float32Array.of(1), topK: Int32Array.of(0), uniforms: Float32Array.of(0.99), numTopLogprobs: 2,
    });
    const logZ = Math.log(logits.reduce((s, v) => s + Math.exp(v), 0));
    expect(result.ids[0]).toBe(4);
    expect(result.logprobs[0]).toBeCloseTo(3 - logZ, 5);
    expect(Array.from(result.topIds)).toEqual([4, 0]);
  });
});


/** Samples `row` once per uniform (one batch row each) with the same parameters. */
function sampleRow(row: Float32Array, uniforms: readonly number[], options: { temperature: number; topK?: number; topP?: number;
  allowed?: readonly number[] | null; numTopLogprobs?: number }) {
  const n = uniforms.length, vocab = row.length;
  const logits = new Float32Array(n * vocab);
  for (let r = 0; r < n; r++) logits.set(row, r * vocab);
  const params: SamplingParams = {
    temperature: new Float32Array(n).fill(options.temperature), topK: new Int32Array(n).fill(options.topK ?? 0),
    topP: new Float32Array(n).fill(options.topP ?? 1), uniforms: Float32Array.from(uniforms), numTopLogprobs: options.numTopLogprobs ?? 0,
  };
  if (options.allowed) params.allowedTokens = allowedTokenMask(vocab, Array(n).fill(options.allowed));
  return sampleRows(logits, vocab, params);
}

/**
 * The sort-based definition, in float64: the allowed tokens by weight exp((l - max) / T), largest first; top-k keeps
 * every token whose weight reaches the k-th; top-p then keeps every token whose weight reaches that of the token at
 * which the running mass first reaches p of what top-k kept. Returns each token's probability (0 where not kept).
 */
function referenceProbabilities(row: Float32Array, temperature: number, topK: number, topP: number,
                                allowed: readonly number[] | null): Float64Array {
  const ids = allowed ? [...allowed] : [...row.keys()];
  const max = Math.max(...ids.map((i) => row[i]));
  const weight = (i: number) => Math.exp((row[i] - max) / temperature);
  const sum = (kept: number[]) => kept.reduce((s, i) => s + weight(i), 0);
  let kept = ids.sort((a, b) => weight(b) - weight(a));
  if (topK > 0 && topK < kept.length) {
    const cut = weight(kept[topK - 1]);
    kept = kept.filter((i) => weight(i) >= cut);
  }
  if (topP < 1) {
    const target = topP * sum(kept);
    let mass = 0, count = 0;
    while (mass < target) mass += weight(kept[count++]);
    const cut = weight(kept[count - 1]);
    kept = kept.filter((i) => weight(i) >= cut);
  }
  const total = sum(kept);
  const probabilities = new Float64Array(row.length);
  for (const i of kept) probabilities[i] = weight(i) / total;
  return probabilities;
}

/** Upper ends of each kept token's share of [0, 1) when walking in vocabulary order. */
function cumulative(probabilities: Float64Array): { id: number; end: number }[] {
  let end = 0;
  return [...probabilities.keys()].filter((i) => probabilities[i] > 0).map((id) => ({ id, end: (end += probabilities[id]) }));
}

describe("the CUDA kernel's algorithm: thresholds, vocabulary-order walk, ties, masks", () => {
  it("draws exactly what the sort-based top-k / top-p definition predicts, draw by draw, on random rows with ties", () => {
    const rng = seededRandom(11);
    let compared = 0, total = 0;
    for (let trial = 0; trial < 30; trial++) {
      const vocab = 20 + Math.floor(rng() * 70);
      // Logits on a grid of 1/4: many exact ties, also at the top-k and top-p cuts.
      const row = Float32Array.from({ length: vocab }, () => Math.round((rng() + rng() + rng() - 1.5) * 12) / 4);
      const temperature = [0.5, 1, 1.7][trial % 3], topK = [0, 1, 2, 5, 17][trial % 5], topP = [1, 0.95, 0.6, 0.3][trial % 4];
      const allowed = trial % 2 === 0 ? null : [...row.keys()].filter(() => rng() < 0.4);
      if (allowed?.length === 0) allowed.push(vocab - 1);
      const label = `trial ${trial}: vocab ${vocab}, T ${temperature}, top-k ${topK}, top-p ${topP}, ${allowed ? allowed.length : "all"} allowed`;
      const shares = cumulative(referenceProbabilities(row, temperature, topK, topP, allowed));
      // Stratified uniforms: each kept token gets its probability's share of them, to within one draw.
      const n = 1000;
      const counts = new Map<number, number>();
      for (const id of sampleRow(row, Array.from({ length: n }, (_, i) => (i + 0.5) / n), { temperature, topK, topP, allowed }).ids) {
        counts.set(id, (counts.get(id) ?? 0) + 1);
      }
      for (const id of counts.keys()) expect(shares.some((s) => s.id === id), `${label}: drew ${id}, which is not kept`).toBe(true);
      shares.forEach(({ id, end }, j) => {
        const expected = (end - (j > 0 ? shares[j - 1].end : 0)) * n;
        expect(Math.abs((counts.get(id) ?? 0) - expected), `${label}: token ${id}`).toBeLessThanOrEqual(1);
      });
      // Random uniforms, draw by draw (skipping those within rounding of a boundary between two tokens' shares).
      const uniforms = Array.from({ length: 200 }, () => rng());
      const ids = sampleRow(row, uniforms, { temperature, topK, topP, allowed }).ids;
      uniforms.forEach((u, d) => {
        total++;
        if (shares.some(({ end }) => Math.abs(u - end) < 1e-6)) return;
        compared++;
        expect(ids[d], `${label}: uniform ${u}`).toBe((shares.find(({ end }) => u < end) ?? shares[shares.length - 1]).id);
      });
    }
    expect(compared).toBeGreaterThan(0.99 * total);
  });

  it("keeps every token tied at the top-k and top-p cuts", () => {
    const row = Float32Array.from([3, 2, 2, 0, 2, 1]);
    const n = 3000, uniforms = Array.from({ length: n }, (_, i) => (i + 0.5) / n);
    const frequencies = (topK: number, topP: number) => {
      const counts = new Array(row.length).fill(0);
      for (const id of sampleRow(row, uniforms, { temperature: 1, topK, topP }).ids) counts[id]++;
      return counts.map((c) => c / n);
    };
    const e = Math.E, tied = e ** 3 + 3 * e ** 2; // token 0 and the three tokens tied at logit 2
    const keptTop4 = [e ** 3 / tied, e ** 2 / tied, e ** 2 / tied, 0, e ** 2 / tied, 0];
    expect(maxAbsDiff(frequencies(2, 1), keptTop4)).toBeLessThan(1 / n); // top-2 cuts inside the tie: all three kept
    // p(0) = 0.42 of the whole; 0.5 is reached inside the tie at 2: all three kept, not just the first.
    expect(maxAbsDiff(frequencies(0, 0.5), keptTop4)).toBeLessThan(1 / n);
    expect(frequencies(0, 0.4)[0]).toBe(1);
  });

  it("greedy takes the largest allowed logit, the lowest id among ties", () => {
    const row = Float32Array.from([1, 5, 5, 2, 2]);
    expect(sampleRow(row, [0.5], { temperature: 0 }).ids[0]).toBe(1);
    expect(sampleRow(row, [0.5], { temperature: 0, allowed: [0, 3, 4] }).ids[0]).toBe(3);
  });

  it("a masked row: allowed tokens only, raw logprobs, top alternatives allowed first then the rest at -Infinity", () => {
    const vocab = 45; // not a multiple of 32: allowed ids sit in the last, partial word
    const rng = seededRandom(3);
    const row = Float32Array.from({ length: vocab }, () => rng() * 4);
    const allowed = [2, 7, 33, 40, 44];
    const logZ = Math.log(row.reduce((s, l) => s + Math.exp(l), 0));
    const n = 2000;
    const result = sampleRow(row, Array.from({ length: n }, (_, i) => (i + 0.5) / n), { temperature: 1.2, allowed, numTopLogprobs: 7 });
    const counts = new Array(vocab).fill(0);
    for (const id of result.ids) counts[id]++;
    const weights = row.map((l, i) => (allowed.includes(i) ? Math.exp(l / 1.2) : 0));
    const z = weights.reduce((s, w) => s + w, 0);
    expect(maxAbsDiff(counts.map((c) => c / n), Array.from(weights, (w) => w / z))).toBeLessThanOrEqual(1 / n);
    for (let d = 0; d < n; d++) expect(result.logprobs[d]).toBeCloseTo(row[result.ids[d]] - logZ, 5);
    const byLogit = [...allowed].sort((a, b) => row[b] - row[a]);
    expect([...result.topIds.subarray(0, 7)]).toEqual([...byLogit, 0, 1]);
    expect([...result.topLogprobs.subarray(0, 5)].map((l, t) => l - (row[byLogit[t]] - logZ)).every((d) => Math.abs(d) < 1e-5)).toBe(true);
    expect([...result.topLogprobs.subarray(5, 7)]).toEqual([-Infinity, -Infinity]);
  });

  it("a row allowing one token always gives it; rows without a constraint are not changed by the mask", () => {
    const rng = seededRandom(4);
    const row = Float32Array.from({ length: 70 }, () => rng() * 6);
    const uniforms = Array.from({ length: 50 }, () => rng());
    for (const [temperature, topK, topP] of [[0, 0, 1], [1, 0, 1], [0.7, 3, 0.5], [2, 1, 0.1]]) {
      expect(new Set(sampleRow(row, uniforms, { temperature, topK, topP, allowed: [65] }).ids)).toEqual(new Set([65]));
      const plain = sampleRow(row, uniforms, { temperature, topK, topP, numTopLogprobs: 3 });
      const everything = sampleRow(row, uniforms, { temperature, topK, topP, numTopLogprobs: 3, allowed: [...row.keys()] });
      expect(everything).toEqual(plain);
    }
    const unconstrained = allowedTokenMask(70, [null, [3]]);
    expect([...unconstrained]).toEqual([0xffffffff, 0xffffffff, 0x3f, 8, 0, 0]); // 70 tokens: 3 words a row
  });

  it("bad masks and parameters are clear errors", () => {
    const row = new Float32Array(45);
    const params = (allowedTokens?: Uint32Array, numTopLogprobs = 0): SamplingParams => ({
      temperature: Float32Array.of(1), topK: Int32Array.of(0), topP: Float32Array.of(1), uniforms: Float32Array.of(0.5), numTopLogprobs, allowedTokens,
    });
    const noToken = /cpu backend: row 0's allowed-token mask allows no token; allow at least one, or give the row no constraint/;
    expect(() => sampleRows(row, 45, params(allowedTokenMask(45, [[]])))).toThrow(noToken);
    expect(() => sampleRows(row, 45, params(Uint32Array.of(0, 1 << 13)))).toThrow(noToken); // only id 45, past the vocabulary
    expect(() => allowedTokenMask(45, [[3, 45]])).toThrow("allowed-token mask of row 0: id 45 is outside the vocabulary 0..44");
    expect(() => sampleRows(row, 45, params(Uint32Array.of(1))))
      .toThrow("cpu backend: allowedTokens has 1 words; 1 rows of vocabulary 45 need 2 (build it with allowedTokenMask)");
    expect(() => sampleRows(row, 45, params(undefined, 46))).toThrow("cpu backend: numTopLogprobs 46 must be an integer in 0..45 (the vocabulary)");
    expect(() => sampleRows(new Float32Array(90), 45, params())).toThrow("cpu backend: sampling temperature has 1 entries for 2 rows");
  });
});

describe("samplingExp (the kernel's sampling_exp, bit for bit)", () => {
  it("is exp to about one f32 ulp over the range a weight can take, exactly 1 at 0, and 0 below 2^-125", () => {
    let worst = 0;
    for (let x = -86.64; x <= 0; x += 0.000731) { // from where 2^-125 scales e^f (below, 0)
      const xf = Math.fround(x);
      worst = Math.max(worst, Math.abs(samplingExp(xf) / Math.exp(xf) - 1));
    }
    expect(worst).toBeLessThan(1.5e-7); // about one f32 ulp (6e-8 … 1.2e-7 relative)
    expect(samplingExp(0)).toBe(1);
    expect(samplingExp(-87)).toBe(0);
    expect(samplingExp(-Infinity)).toBe(0);
    expect(samplingExp(Number.NaN)).toBe(0);
  });
});
