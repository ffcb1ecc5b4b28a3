// Log-softmax and sampling on the device, one block per row of logits:[rows, vocab], so only the chosen ids and
// their logprobs (and the top alternatives) cross to the host. lib/model/cpu/sample.ts is the readable reference of
// this exact algorithm (equal uniforms give equal ids); its header says where float rounding can still differ.
//
// Sampling keeps the tokens of the top-k and then of the nucleus (top-p) by *threshold*, never by sorting: with
// w_i = exp((logit_i - max) / T) in (0, 1] (sampling_exp: the same bits as on the CPU), the kept set is
// {i : w_i >= t}. For top-k, t is the largest value with count(w >= t) >= k; for top-p, the largest t with
// sum(w >= t) >= top_p · Z (Z the mass left by top-k). Both are found exactly by bisection on the bit pattern of t
// (positive floats order like their bits): 31 block reductions. Ties at the threshold are all kept; without either
// limit t is the smallest positive float (every weight that is not 0). The draw walks the kept tokens in
// vocabulary order until the running mass exceeds u · Z_kept (u from the host's seeded generator; masses summed in
// f64): an exact sample of the renormalised distribution. Temperature 0 is greedy (argmax, lowest id on ties). The
// returned logprob is always under the unmodified model (log-softmax of the raw logits over the whole vocabulary),
// as training needs.
//
// Constrained decoding: an optional packed bitset per row (ceil(vocab / 32) words, bit id % 32 of word id / 32)
// names the allowed tokens. Everything but the returned logprobs sees masked logits (-inf where disallowed): the
// max of the weights, the draw, the greedy pick and the top alternatives (which list the allowed tokens first).
#include "common.cuh"

#define SAMPLE_THREADS 1024

// Block-wide log-sum-exp pieces of one row: max and sum of exp(x - max).
__device__ void row_max_and_sum(const float* __restrict__ row, int vocab, float* scratch, float* out_max, float* out_sum) {
  float local_max = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) local_max = fmaxf(local_max, row[i]);
  const float max_value = block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) local_sum += __expf(row[i] - max_value);
  *out_max = max_value;
  *out_sum = block_sum(local_sum, scratch);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) log_softmax(const float* __restrict__ logits,
                                                                          float* __restrict__ out, int vocab) {
  __shared__ float scratch[32];
  const float* row = logits + (long long)blockIdx.x * vocab;
  float max_value, sum;
  row_max_and_sum(row, vocab, scratch, &max_value, &sum);
  const float log_z = max_value + logf(sum);
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) out[(long long)blockIdx.x * vocab + i] = row[i] - log_z;
}

// The logit as the draw and the ranking see it: -inf for a token the row's mask disallows (no mask: all allowed).
__device__ __forceinline__ float masked_logit(const float* __restrict__ row, const unsigned* __restrict__ allowed, int i) {
  return allowed == nullptr || ((allowed[i >> 5] >> (i & 31)) & 1u) ? row[i] : -INFINITY;
}

// The (value, index) pair ordered first: larger value, then smaller index.
__device__ __forceinline__ bool before(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// Block argmax of the masked row over entries strictly after (bound_value, bound_index) in that order; returns the index.
__device__ int block_argmax_after(const float* __restrict__ row, const unsigned* __restrict__ allowed, int vocab,
                                  float bound_value, int bound_index, float* s_value, int* s_index) {
  float best = -INFINITY;
  int best_index = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = masked_logit(row, allowed, i);
    if (before(bound_value, bound_index, v, i) && before(v, i, best, best_index)) {
      best = v;
      best_index = i;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int i = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (before(v, i, best, best_index)) { best = v; best_index = i; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) { s_value[warp] = best; s_index[warp] = best_index; }
  __syncthreads();
  best = lane < warps ? s_value[lane] : -INFINITY;
  best_index = lane < warps ? s_index[lane] : 0x7fffffff;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int i = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (before(v, i, best, best_index)) { best = v; best_index = i; }
  }
  return best_index;
}

// exp(x) for x <= 0 from f32 multiplies and adds only, each rounded to nearest (the _rn intrinsics are never fused
// into FMAs), so the CPU reference computes the very same bits: the sampling weights, and with them the thresholds
// and the draws, agree exactly between the backends (__expf would differ from the CPU's exp by ulps, enough to move
// a draw now and then). x = n ln 2 + f with n = round(x log2 e) and ln 2 split in a short high part (n · high is
// exact) and a low part; e^f, |f| <= 0.35, by its degree-7 Taylor polynomial (truncation 5e-9); times 2^n. Within
// 1.2 ulp of exp. Weights below 2^-125 are 0, so everything stays in the normal range.
__device__ float sampling_exp(float x) {
  const float t = __fmul_rn(x, 1.44269502162933349609375f);  // log2(e) rounded to f32, written exactly
  if (!(t > -125.0f)) return 0.0f;                            // also -inf (a disallowed token) and NaN
  const float n = floorf(__fadd_rn(t, 0.5f));
  const float f = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693145751953125f)), __fmul_rn(n, 0.000001428606765330187045037746429443359375f));
  float p = 1.0f / 5040.0f;
  const float coefficients[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
#pragma unroll
  for (int c = 0; c < 7; c++) p = __fadd_rn(__fmul_rn(p, f), coefficients[c]);
  return __fmul_rn(p, __int_as_float(((int)n + 127) << 23));  // · 2^n, exact (n >= -125 keeps it normal)
}

// The sampling weight w_i = exp((masked logit - max) / T) of a row, recomputed where needed (no scratch memory).
struct RowWeights {
  const float* row;
  const unsigned* allowed;
  float max_value, inv_t;
  __device__ float operator()(int i) const {
    return sampling_exp(__fmul_rn(__fsub_rn(masked_logit(row, allowed, i), max_value), inv_t));
  }
};

// Masses are summed in f64, as on the CPU: the two then differ only in summation order (~1e-16 relative), where f32
// block sums would differ by ~1e-7 and move draws near boundaries. Every thread gets the block's total.
__device__ double block_sum_f64(double x, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0;
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// count and mass of {w_i >= threshold} over the row's weights.
__device__ void kept(const RowWeights& weight, int vocab, float threshold, double* scratch, int* count, double* mass) {
  double local_count = 0.0, local_mass = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float w = weight(i);
    if (w >= threshold) { local_count += 1.0; local_mass += w; }
  }
  *count = (int)block_sum_f64(local_count, scratch);
  *mass = block_sum_f64(local_mass, scratch);
}

// The largest positive float t with predicate(t) true, given predicate(smallest positive) is true and the predicate
// is monotone (true below some point). Bisection over bit patterns: exact in 31 steps.
template <typename Predicate>
__device__ float largest_threshold(Predicate predicate) {
  unsigned lo = 1u, hi = 0x3f800000u;  // [smallest subnormal, 1.0]; w_max == 1 always satisfies nothing larger
  if (predicate(__uint_as_float(hi))) return 1.0f;
  while (hi - lo > 1u) {
    const unsigned mid = lo + (hi - lo) / 2u;
    if (predicate(__uint_as_float(mid))) lo = mid; else hi = mid;
  }
  return __uint_as_float(lo);
}

// One row per block. allowed_tokens is null (no constraint) or [rows, ceil(vocab / 32)] words.
// Outputs: ids[rows], logprobs[rows], top_ids/top_logprobs[rows, num_top].
// Asking for one resident block per SM (not more) lets ptxas use the registers it needs (48) instead of spilling at 32.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1) sample(
    const float* __restrict__ logits, int vocab, const float* __restrict__ temperature, const float* __restrict__ top_p,
    const int* __restrict__ top_k, const float* __restrict__ uniforms, const unsigned* __restrict__ allowed_tokens,
    int num_top, int* __restrict__ ids, float* __restrict__ logprobs, int* __restrict__ top_ids,
    float* __restrict__ top_logprobs) {
  __shared__ float scratch[32];
  __shared__ double s_sums[32];
  __shared__ float s_value[32];
  __shared__ int s_index[32];
  __shared__ int s_chosen;
  const int r = blockIdx.x;
  const float* row = logits + (long long)r * vocab;
  const unsigned* allowed = allowed_tokens == nullptr ? nullptr : allowed_tokens + (long long)r * ((vocab + 31) / 32);
  float max_value, sum;
  row_max_and_sum(row, vocab, scratch, &max_value, &sum);
  const float log_z = max_value + logf(sum);

  int chosen;
  const float t = temperature[r];
  if (t <= 0.0f) {
    chosen = block_argmax_after(row, allowed, vocab, INFINITY, -1, s_value, s_index);
  } else {
    float allowed_max = max_value;
    if (allowed != nullptr) {
      float local_max = -INFINITY;
      for (int i = threadIdx.x; i < vocab; i += blockDim.x) local_max = fmaxf(local_max, masked_logit(row, allowed, i));
      allowed_max = block_max(local_max, scratch);
    }
    const RowWeights weight{row, allowed, allowed_max, __frcp_rn(t)};
    int count;
    double mass;
    float threshold = __uint_as_float(1u);  // the smallest positive float: keeps every weight that is not 0
    const int k = top_k[r];
    if (k > 0 && k < vocab) {
      threshold = largest_threshold([&](float candidate) {
        kept(weight, vocab, candidate, s_sums, &count, &mass);
        return count >= k;
      });
    }
    kept(weight, vocab, threshold, s_sums, &count, &mass);
    const float p = top_p[r];
    if (p < 1.0f) {
      const double target = (double)p * mass;
      const float floor_threshold = threshold;
      threshold = largest_threshold([&](float candidate) {
        int c;
        double m2;
        kept(weight, vocab, fmaxf(candidate, floor_threshold), s_sums, &c, &m2);
        return m2 >= target;
      });
      threshold = fmaxf(threshold, floor_threshold);
      kept(weight, vocab, threshold, s_sums, &count, &mass);
    }
    // Walk kept tokens in vocabulary order: each thread owns a contiguous range; a block scan of the range masses
    // finds the range that crosses u · mass, then that thread walks its range.
    const double target = (double)uniforms[r] * mass;
    const int per_thread = (vocab + blockDim.x - 1) / blockDim.x;
    const int begin = threadIdx.x * per_thread, end = min(vocab, begin + per_thread);
    double local = 0.0;
    int last_kept = -1;
    for (int i = begin; i < end; i++) {
      const float w = weight(i);
      if (w >= threshold) { local += w; last_kept = i; }
    }
    // Prefix sums over threads: warp scan, then warp totals added in a fixed order, so one thread's end is
    // bit-for-bit the next thread's start and the ranges partition [0, mass) with no gap or overlap.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double inclusive = local;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const double other = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += other;
    }
    double exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
    if (lane == 0) exclusive = 0.0;
    __syncthreads();
    if (lane == 31) s_sums[warp] = inclusive;
    __syncthreads();
    double warp_base = 0.0;
    for (int w = 0; w < warp; w++) warp_base += s_sums[w];
    if (threadIdx.x == 0) s_chosen = -1;
    __syncthreads();
    const double start = warp_base + exclusive, prefix = warp_base + inclusive;
    if (local > 0.0 && start <= target && target < prefix) {
      double running = start;
      int pick = last_kept;
      for (int i = begin; i < end; i++) {
        const float w = weight(i);
        if (w >= threshold) {
          running += w;
          if (target < running) { pick = i; break; }
        }
      }
      s_chosen = pick;
    }
    __syncthreads();
    // Rounding can leave target >= the total: take the last kept token then (the one holding the top of the mass).
    if (s_chosen < 0 && threadIdx.x == 0) {
      for (int i = vocab - 1; i >= 0; i--)
        if (weight(i) >= threshold) { s_chosen = i; break; }
    }
    __syncthreads();
    chosen = s_chosen;
  }
  if (threadIdx.x == 0) {
    ids[r] = chosen;
    logprobs[r] = row[chosen] - log_z;
  }
  // Top alternatives: num_top successive argmaxes of the masked row, each strictly after the previous in
  // (value desc, index asc); a disallowed token's logprob is -inf.
  float bound_value = INFINITY;
  int bound_index = -1;
  for (int n = 0; n < num_top; n++) {
    const int index = block_argmax_after(row, allowed, vocab, bound_value, bound_index, s_value, s_index);
    bound_value = masked_logit(row, allowed, index);
    bound_index = index;
    if (threadIdx.x == 0) {
      top_ids[(long long)r * num_top + n] = index;
      top_logprobs[(long long)r * num_top + n] = bound_value - log_z;
    }
  }
}
