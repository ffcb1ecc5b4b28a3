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
 *   every token whose weight did not underflow to 0;
 * - the draw walks the kept tokens in vocabulary order and takes the first whose running mass exceeds u · Z_kept,
 *   or the last kept token when rounding leaves u · Z_kept at or above the total;
 * - temperature 0 is greedy: the largest allowed logit, lowest id on ties.
 * The two backends can still disagree where float rounding decides: the device's __expf is within 2 ulp of exp, and
 * it sums masses in float over a block-parallel order where this sums in double. A draw differs only when u · Z
 * falls within ~1e-6 relative of a boundary between two tokens' mass (or the top-p mass lands that close to p · Z),
 * or when two weights within 2 ulp of each other straddle the top-k cut: about one draw in a million.
 *
 * The reported logprob is the model's own (raw log-softmax over the whole vocabulary, mask or not), which is what a
 * trainer recomputes. Top alternatives rank the allowed tokens by logit (lowest id on ties); disallowed tokens come
 * after them with logprob -Infinity, as if masked logits were -Infinity.
 */
import { type SampleResult, type SamplingParams, allowedTokenWords, checkSamplingParams } from "../backend.ts";

export function sampleRows(logits: Float32Array, vocab: number, params: SamplingParams): SampleResult {
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
  const weights = new Float32Array(vocab); // scratch, reused by every row
  for (let r = 0; r < rows; r++) {
    const row = logits.subarray(r * vocab, (r + 1) * vocab);
    const allowed = params.allowedTokens ? params.allowedTokens.subarray(r * words, (r + 1) * words) : null;
    const logZ = logSumExp(row);
    const id = params.temperature[r] === 0
      ? argmaxAfter(row, allowed, Infinity, -1)
      : draw(row, allowed, params.temperature[r], params.topK[r], params.topP[r], params.uniforms[r], weights);
    result.ids[r] = id;
    result.logprobs[r] = row[id] - logZ;
    // Top alternatives: successive argmaxes, each strictly after the previous in (value desc, id asc).
    let boundValue = Infinity, boundIndex = -1;
    for (let n = 0; n < top; n++) {
      boundIndex = argmaxAfter(row, allowed, boundValue, boundIndex);
      boundValue = maskedLogit(row, allowed, boundIndex);
      result.topIds[r * top + n] = boundIndex;
      result.topLogprobs[r * top + n] = boundValue - logZ;
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

function logSumExp(row: Float32Array): number {
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

/** The id ranked first among those ranked strictly after (boundValue, boundIndex), by masked logit. */
function argmaxAfter(row: Float32Array, allowed: Uint32Array | null, boundValue: number, boundIndex: number): number {
  let best = -Infinity, bestIndex = row.length;
  for (let i = 0; i < row.length; i++) {
    const v = maskedLogit(row, allowed, i);
    if (before(boundValue, boundIndex, v, i) && before(v, i, best, bestIndex)) {
      best = v;
      bestIndex = i;
    }
  }
  return bestIndex;
}

/** The smallest positive float, as a threshold: keeps every weight that did not underflow to 0. */
const SMALLEST_POSITIVE = 2 ** -149;

function draw(row: Float32Array, allowed: Uint32Array | null, temperature: number, topK: number, topP: number,
              uniform: number, weights: Float32Array): number {
  const vocab = row.length;
  let max = -Infinity;
  for (let i = 0; i < vocab; i++) max = Math.max(max, maskedLogit(row, allowed, i));
  // f32 arithmetic as on the device: (logit - max) · (1 / T), then exp rounded to f32.
  const inverseTemperature = Math.fround(1 / temperature);
  for (let i = 0; i < vocab; i++) {
    weights[i] = isAllowed(allowed, i) ? Math.exp(Math.fround(Math.fround(row[i] - max) * inverseTemperature)) : 0;
  }
  let threshold = SMALLEST_POSITIVE;
  if (topK > 0 && topK < vocab) threshold = largestThreshold((t) => keptCount(weights, t) >= topK);
  let mass = keptMass(weights, threshold);
  if (topP < 1) {
    const target = topP * mass, floor = threshold;
    threshold = Math.max(floor, largestThreshold((t) => keptMass(weights, Math.max(t, floor)) >= target));
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

function keptCount(weights: Float32Array, threshold: number): number {
  let count = 0;
  for (let i = 0; i < weights.length; i++) if (weights[i] >= threshold) count++;
  return count;
}

function keptMass(weights: Float32Array, threshold: number): number {
  let mass = 0;
  for (let i = 0; i < weights.length; i++) if (weights[i] >= threshold) mass += weights[i];
  return mass;
}

const bitPattern = new Uint32Array(1);
const bitPatternFloat = new Float32Array(bitPattern.buffer);
function floatWithBits(bits: number): number {
  bitPattern[0] = bits;
  return bitPatternFloat[0];
}

/**
 * The largest float t in [smallest positive, 1] with holds(t), for a predicate true at small t and false beyond
 * some point: bisection over the bit patterns, exact in at most 31 steps. The smallest positive float is taken to
 * hold (the caller's rules start there).
 */
function largestThreshold(holds: (threshold: number) => boolean): number {
  let low = 1, high = 0x3f800000; // bit patterns of 2^-149 and 1.0
  if (holds(1)) return 1;
  while (high - low > 1) {
    const middle = low + Math.floor((high - low) / 2);
    if (holds(floatWithBits(middle))) low = middle;
    else high = middle;
  }
  return floatWithBits(low);
}
