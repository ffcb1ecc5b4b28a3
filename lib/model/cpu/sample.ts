/**
 * Sampling one token per row of logits on the CPU: the readable reference of the CUDA kernel
 * (lib/cuda/kernels/sampling.cu), step for step, so that equal uniforms give equal ids on both backends.
 *
 * Over the row's allowed tokens (all of them unless `allowedTokens` masks the row), with
 * w_i = exp((logit_i - max) / T) in (0, 1] (max over the allowed logits, so the largest weight is exactly 1):
 * - top-k keeps {i : w_i >= t_k}, t_k the largest threshold with count(w >= t_k) >= k — the k-th largest weight, so
 *   every token tied with the k-th is kept too;
 * - top-p then keeps {i : w_i >= t_p}, t_p the largest threshold (at least t_k) with mass(w >= t_p) >= p · Z_k, Z_k
 *   the mass top-k kept — the smallest most-likely set reaching the mass, again with ties kept whole;
 * - both thresholds are found by bisection over the bit patterns of positive floats (they order like their bits),
 *   exactly as the kernel does; without either limit the threshold is the smallest positive float, which keeps
 *   every token whose weight is not 0 (samplingExp gives 0 below 2^-125: 87 nats under the max at T = 1);
 * - the draw walks the kept tokens in vocabulary order and takes the first whose running mass exceeds u · Z_kept,
 *   or the last kept token when rounding leaves u · Z_kept at or above the total;
 * - temperature 0 is greedy: the largest allowed logit, lowest id on ties (the first of the ranking below).
 * Rounding: the weights are the same f32 bits on both backends (samplingExp, the kernel's sampling_exp, uses only
 * correctly rounded f32 operations) and masses are summed in f64 on both, in different orders: the totals differ by
 * ~1e-16 relative. A draw can differ only when u · Z lands that close to a boundary between two tokens' mass, or
 * the top-p mass that close to p · Z: with a whole 150k vocabulary kept, ~1e-11 of draws — never, in practice.
 *
 * The reported logprob is the model's own (raw log-softmax over the whole vocabulary, mask or not), which is what a
 * trainer recomputes. Top alternatives rank the allowed tokens by logit (lowest id on ties); disallowed tokens come
 * after them with logprob -Infinity, as if masked logits were -Infinity.
 */
import { type SampleResult, type SamplingParams, allowedTokenWords, checkSamplingParams } from "../backend.ts";

/** The per-row arithmetic a sampler takes from its backend: the references here, or the WebAssembly kernels. */
export interface SamplerKernels {
  /** ln Σ exp(row), the normaliser of the reported logprobs (the fast path is a few f32 ulps from the reference). */
  logSumExp(row: Float32Array): number;
  /** out[i] = samplingExp(f32((row[i] − max) · inverseTemperature)), bit for bit on every path. */
  samplingWeights(row: Float32Array, max: number, inverseTemperature: number, out: Float32Array): void;
}

export const referenceSamplerKernels: SamplerKernels = {
  logSumExp: referenceLogSumExp,
  samplingWeights(row, max, inverseTemperature, out) {
    for (let i = 0; i < row.length; i++) out[i] = samplingExp(f32(f32(row[i] - max) * inverseTemperature));
  },
};

export function sampleRows(logits: Float32Array, vocab: number, params: SamplingParams, kernels: SamplerKernels = referenceSamplerKernels): SampleResult {
  const rows = logits.length / vocab;
  checkSamplingParams("cpu backend", params, rows, vocab);
  const top = params.numTopLogprobs;
  const result: SampleResult = {
    ids: new Int32Array(rows),
    logprobs: new Float32Array(rows),
    topIds: new Int32Array(rows * top),
    topLogprobs: new Float32Array(rows * top),
  };
  const words = allowedTokenWords(vocab);
  const weights = new Float32Array(vocab), pool = new Float32Array(vocab); // scratch, reused by every row
  const ranked = new Int32Array(Math.max(top, 1));
  for (let r = 0; r < rows; r++) {
    const row = logits.subarray(r * vocab, (r + 1) * vocab);
    const allowed = params.allowedTokens ? params.allowedTokens.subarray(r * words, (r + 1) * words) : null;
    const greedy = params.temperature[r] === 0;
    if (greedy || top > 0) rankFirst(row, allowed, ranked);
    const id = greedy ? ranked[0]
      : draw(row, allowed, params.temperature[r], params.topK[r], params.topP[r], params.uniforms[r], weights, pool, kernels);
    const logZ = kernels.logSumExp(row);
    result.ids[r] = id;
    result.logprobs[r] = row[id] - logZ;
    for (let n = 0; n < top; n++) {
      result.topIds[r * top + n] = ranked[n];
      result.topLogprobs[r * top + n] = maskedLogit(row, allowed, ranked[n]) - logZ;
    }
  }
  return result;
}

function isAllowed(allowed: Uint32Array | null, id: number): boolean {
  return allowed === null || ((allowed[id >>> 5] >>> (id & 31)) & 1) === 1;
}

/** The logit as the draw and the ranking see it: -Infinity for a disallowed token. */
function maskedLogit(row: Float32Array, allowed: Uint32Array | null, id: number): number {
  return isAllowed(allowed, id) ? row[id] : -Infinity;
}

/** ln Σ exp(row), each exponential Math.exp's in float64. */
export function referenceLogSumExp(row: Float32Array): number {
  let max = -Infinity;
  for (let i = 0; i < row.length; i++) if (row[i] > max) max = row[i];
  let sum = 0;
  for (let i = 0; i < row.length; i++) sum += Math.exp(row[i] - max);
  return max + Math.log(sum);
}

/** (v, i) ranks before (w, j): larger value first, then smaller id. */
function before(v: number, i: number, w: number, j: number): boolean {
  return v > w || (v === w && i < j);
}

/**
 * The first ranked.length ids by masked logit, largest first, lower id first among equals: the order the kernel's
 * successive block argmaxes produce, found here in one pass by insertion.
 */
function rankFirst(row: Float32Array, allowed: Uint32Array | null, ranked: Int32Array): void {
  const count = ranked.length;
  let filled = 0;
  for (let i = 0; i < row.length; i++) {
    const v = maskedLogit(row, allowed, i);
    if (filled === count && !before(v, i, maskedLogit(row, allowed, ranked[count - 1]), ranked[count - 1])) continue;
    let at = filled < count ? filled++ : count - 1;
    for (; at > 0 && before(v, i, maskedLogit(row, allowed, ranked[at - 1]), ranked[at - 1]); at--) {
      ranked[at] = ranked[at - 1];
    }
    ranked[at] = i;
  }
}

/** The smallest positive float, as a threshold: keeps every weight that is not 0. */
const SMALLEST_POSITIVE = 2 ** -149;

const f32 = Math.fround;
// The kernel's constants, f32 values written exactly: log2(e), and ln 2 split so that n · LN_2_HIGH is exact.
const LOG2_E = 1.44269502162933349609375;
const LN_2_HIGH = 0.693145751953125;
const LN_2_LOW = 0.000001428606765330187045037746429443359375;
// The polynomial's coefficients, 1/7! down to 1, as f32 values.
const C7 = f32(1 / 5040), C6 = f32(1 / 720), C5 = f32(1 / 120), C4 = f32(1 / 24), C3 = f32(1 / 6), C2 = 0.5, C1 = 1, C0 = 1;
/** 2^n for the n samplingExp scales by (-125..0), at index n + 125: a table, since 2 ** n costs a call to pow. */
const POWERS_OF_TWO = Float64Array.from({ length: 126 }, (_, i) => 2 ** (i - 125));

/**
 * exp(x) for x <= 0, the kernel's sampling_exp bit for bit: f32 multiplies and adds only, each rounded to nearest
 * (f32 of the double product or sum of two f32 values is the correctly rounded f32 result). x = n ln 2 + f with
 * n = round(x log2 e); e^f by its degree-7 Taylor polynomial (truncation 5e-9), written out (the sampler calls this
 * once per vocabulary entry per sampled token); times 2^n; 0 below 2^-125.
 */
export function samplingExp(x: number): number {
  const t = f32(x * LOG2_E);
  if (!(t > -125)) return 0;
  const n = Math.floor(f32(t + 0.5));
  const f = f32(f32(x - f32(n * LN_2_HIGH)) - f32(n * LN_2_LOW));
  let p = f32(f32(C7 * f) + C6);
  p = f32(f32(p * f) + C5);
  p = f32(f32(p * f) + C4);
  p = f32(f32(p * f) + C3);
  p = f32(f32(p * f) + C2);
  p = f32(f32(p * f) + C1);
  p = f32(f32(p * f) + C0);
  return f32(p * POWERS_OF_TWO[n + 125]);
}

/** `weights` and `pool` are vocabulary-sized scratch, reused across rows. */
function draw(row: Float32Array, allowed: Uint32Array | null, temperature: number, topK: number, topP: number,
              uniform: number, weights: Float32Array, pool: Float32Array, kernels: SamplerKernels): number {
  const vocab = row.length;
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) max = Math.max(max, maskedLogit(row, allowed, i));
  // f32 arithmetic as on the device: (logit - max) · (1 / T), then samplingExp: the kernel's weights, bit for bit.
  // Every entry's, then 0 for the disallowed (whose logits may lie above the allowed max).
  kernels.samplingWeights(row, max, f32(1 / temperature), weights);
  if (allowed) for (let i = 0; i < vocab; i++) if (!isAllowed(allowed, i)) weights[i] = 0;
  let threshold = SMALLEST_POSITIVE;
  if (topK > 0 && topK < vocab) {
    threshold = largestThreshold(pool, gather(weights, threshold, pool), (count) => count >= topK);
  }
  let mass = keptMass(weights, threshold);
  if (topP < 1) {
    const target = topP * mass, floor = threshold;
    // The pool holds only weights >= floor, so a candidate below the floor counts as the floor, as on the device.
    threshold = Math.max(floor, largestThreshold(pool, gather(weights, floor, pool), (_, kept) => kept >= target));
    mass = keptMass(weights, threshold);
  }
  const target = uniform * mass;
  let running = 0, last = -1;
  for (let i = 0; i < vocab; i++) {
    if (weights[i] < threshold) continue;
    running += weights[i];
    last = i;
    if (target < running) return i;
  }
  return last;
}

function keptMass(weights: Float32Array, threshold: number): number {
  let mass = 0;
  for (let i = 0; i < weights.length; i++) if (weights[i] >= threshold) mass += weights[i];
  return mass;
}

/** Copies the weights >= threshold into `pool`, in vocabulary order; returns how many. */
function gather(weights: Float32Array, threshold: number, pool: Float32Array): number {
  let size = 0;
  for (let i = 0; i < weights.length; i++) if (weights[i] >= threshold) pool[size++] = weights[i];
  return size;
}

const bitPattern = new Uint32Array(1);
const bitPatternFloat = new Float32Array(bitPattern.buffer);
function floatWithBits(bits: number): number {
  bitPattern[0] = bits;
  return bitPatternFloat[0];
}

/**
 * The largest float t in [smallest positive, 1] for which holds(count, mass) of the pooled weights >= t, for a
 * predicate true at small t and false beyond some point: bisection over the bit patterns, exact in at most 31
 * steps. The smallest positive float is taken to hold (the caller's rules start there). Whenever the lower end
 * rises, weights below it leave the pool (they count for no larger t), so the passes shrink quickly; the weights
 * kept are summed in the same order as in a full pass, so the masses are the same numbers.
 */
function largestThreshold(pool: Float32Array, size: number, holds: (count: number, mass: number) => boolean): number {
  const holdsAt = (threshold: number): boolean => {
    let count = 0, mass = 0;
    for (let i = 0; i < size; i++) {
      if (pool[i] >= threshold) {
        count++;
        mass += pool[i];
      }
    }
    return holds(count, mass);
  };
  let low = 1, high = 0x3f800000; // bit patterns of 2^-149 and 1.0
  if (holdsAt(1)) return 1;
  while (high - low > 1) {
    const middle = low + Math.floor((high - low) / 2);
    if (!holdsAt(floatWithBits(middle))) {
      high = middle;
      continue;
    }
    low = middle;
    const threshold = floatWithBits(low);
    let kept = 0;
    for (let i = 0; i < size; i++) if (pool[i] >= threshold) pool[kept++] = pool[i];
    size = kept;
  }
  return floatWithBits(low);
}
