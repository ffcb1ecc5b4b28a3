// Attention within the packed sequences of a training batch (PackedSegment in lib/model/backend.ts): causal
// grouped-query attention whose rows see their own segment up to themselves, after every row of the segment's shared
// prefix when it has one; the forward keeps the log-sum-exp per (row, head), and the backward recomputes the
// probabilities from it. The CPU reference is packedAttention in lib/model/cpu/attention.ts.
#include "common.cuh"

// The keys of a training row: row_keys[3·row] = its segment's first row, [+1] = the first row of the segment's shared
// prefix, [+2] = the prefix's length (0: none). The row sees every prefix row, then its segment's rows up to itself.
__device__ __forceinline__ int key_count(const int* row_keys, int row) {
  return row_keys[3 * row + 2] + row - row_keys[3 * row] + 1;
}
__device__ __forceinline__ long long key_row(const int* row_keys, int row, int j) {
  const int prefix_length = row_keys[3 * row + 2];
  return j < prefix_length ? row_keys[3 * row + 1] + j : row_keys[3 * row] + (j - prefix_length);
}

// The training attention kernels give each (row, head) pair to one warp, each lane the dimensions lane, lane + 32, …
// (head size ≤ 32 · DIMS_PER_LANE): a key's dot product is a warp sum and nothing depends on the number of keys
// but the loop, so any sequence length fits. Pairs run head-fastest, so a block's warps share a row and, under
// grouped-query attention, mostly its keys (loaded once into L1).
constexpr int DIMS_PER_LANE = 8;

// Loads the lane's dimensions of a head_dim vector (zeros past its end).
__device__ __forceinline__ void load_lane_dims(float (&dims)[DIMS_PER_LANE], const float* vector, int lane, int head_dim) {
#pragma unroll
  for (int t = 0; t < DIMS_PER_LANE; t++) dims[t] = lane + 32 * t < head_dim ? vector[lane + 32 * t] : 0.0f;
}

__device__ __forceinline__ float lane_dot(const float (&a)[DIMS_PER_LANE], const float (&b)[DIMS_PER_LANE]) {
  float dot = 0.0f;
#pragma unroll
  for (int t = 0; t < DIMS_PER_LANE; t++) dot += a[t] * b[t];
  return warp_sum(dot);
}

// Causal grouped-query attention with an online softmax (running max and sum, the accumulator rescaled when the
// max grows): out = softmax(q·k/√d) v, and lse[row, head] = log Σ exp(scores), all the backward needs to rebuild
// the probabilities. `pairs` = rows · heads.
extern "C" __global__ void packed_attention_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                                   const int* __restrict__ row_keys, float* __restrict__ out, float* __restrict__ lse,
                                                   int heads, int kv_heads, int head_dim, int pairs) {
  constexpr int D = DIMS_PER_LANE;
  const int pair = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pair >= pairs) return;
  const int row = pair / heads, kv_head = pair % heads / (heads / kv_heads);
  const float scale = rsqrtf((float)head_dim);
  float query[D], acc[D], key[D], value[D];
  load_lane_dims(query, q + (long long)pair * head_dim, lane, head_dim);
#pragma unroll
  for (int t = 0; t < D; t++) acc[t] = 0.0f;
  float max_score = -INFINITY, sum = 0.0f;
  const int keys = key_count(row_keys, row);
  for (int j = 0; j < keys; j++) {
    const long long kv_offset = (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    load_lane_dims(key, k + kv_offset, lane, head_dim);
    load_lane_dims(value, v + kv_offset, lane, head_dim);
    const float score = lane_dot(query, key) * scale;
    const float new_max = fmaxf(max_score, score);
    const float rescale = expf(max_score - new_max), weight = expf(score - new_max);
    sum = sum * rescale + weight;
#pragma unroll
    for (int t = 0; t < D; t++) acc[t] = acc[t] * rescale + weight * value[t];
    max_score = new_max;
  }
  float* o = out + (long long)pair * head_dim;
#pragma unroll
  for (int t = 0; t < D; t++) if (lane + 32 * t < head_dim) o[lane + 32 * t] = acc[t] / sum;
  if (lane == 0) lse[pair] = max_score + logf(sum);
}

// Backward of packed_attention_forward, first half: dq, one (row, head) pair per warp. With p_j = exp(q·k_j/√d − lse),
// dP_j = dout · v_j and Δ = Σ p dP, dq = Σ p_j (dP_j − Δ) k_j / √d = (Σ p_j dP_j k_j − Δ Σ p_j k_j) / √d: both sums
// and Δ come out of one pass over the keys. Δ goes to `delta` for the second half (packed_attention_backward_dkdv),
// which owns every key row and so needs no atomics.
extern "C" __global__ void packed_attention_backward_dq(float* __restrict__ dq, float* __restrict__ delta,
                                                       const float* __restrict__ dout, const float* __restrict__ q,
                                                       const float* __restrict__ k, const float* __restrict__ v,
                                                       const float* __restrict__ lse, const int* __restrict__ row_keys,
                                                       int heads, int kv_heads, int head_dim, int pairs) {
  constexpr int D = DIMS_PER_LANE;
  const int pair = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pair >= pairs) return;
  const int row = pair / heads, kv_head = pair % heads / (heads / kv_heads);
  const float scale = rsqrtf((float)head_dim), row_lse = lse[pair];
  float query[D], grad_out[D], key[D], value[D], weighted_keys[D], prob_keys[D];
  load_lane_dims(query, q + (long long)pair * head_dim, lane, head_dim);
  load_lane_dims(grad_out, dout + (long long)pair * head_dim, lane, head_dim);
#pragma unroll
  for (int t = 0; t < D; t++) weighted_keys[t] = prob_keys[t] = 0.0f;
  float weighted = 0.0f;
  const int keys = key_count(row_keys, row);
  for (int j = 0; j < keys; j++) {
    const long long kv_offset = (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    load_lane_dims(key, k + kv_offset, lane, head_dim);
    load_lane_dims(value, v + kv_offset, lane, head_dim);
    const float p = expf(lane_dot(query, key) * scale - row_lse);
    const float dp = lane_dot(grad_out, value);
    weighted += p * dp;
#pragma unroll
    for (int t = 0; t < D; t++) {
      weighted_keys[t] += p * dp * key[t];
      prob_keys[t] += p * key[t];
    }
  }
  float* g = dq + (long long)pair * head_dim;
#pragma unroll
  for (int t = 0; t < D; t++) if (lane + 32 * t < head_dim) g[lane + 32 * t] += (weighted_keys[t] - weighted * prob_keys[t]) * scale;
  if (lane == 0) delta[pair] = weighted;
}

// Backward of packed_attention_forward, second half: dk and dv of one (key row, kv head) per block, from every
// (query row, query head) pair that sees the key: the query rows come as ranges from the host (query_offsets[key]
// .. query_offsets[key + 1] index pairs [first, end) in query_ranges), the heads are the kv head's group. A warp
// takes one pair at a time, each lane the dimensions lane, lane + 32, …: p = exp(q·k/√d − lse), dS = p (dout·v − Δ)/√d,
// dk += dS q, dv += p dout, in registers; the warps' sums meet in shared memory. The block owns its key row, so
// nothing is added atomically.
// Dynamic shared memory: 2 · warps · head_dim floats.
extern "C" __global__ void packed_attention_backward_dkdv(float* __restrict__ dk, float* __restrict__ dv,
                                                         const float* __restrict__ dout, const float* __restrict__ q,
                                                         const float* __restrict__ k, const float* __restrict__ v,
                                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                                         const int* __restrict__ query_offsets,
                                                         const int* __restrict__ query_ranges, int heads, int kv_heads,
                                                         int head_dim) {
  extern __shared__ float shared[];
  constexpr int D = DIMS_PER_LANE;
  const int key = blockIdx.x, kv_head = blockIdx.y, group = heads / kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const float scale = rsqrtf((float)head_dim);
  const long long kv_offset = ((long long)key * kv_heads + kv_head) * head_dim;
  float key_dims[D], value_dims[D], query[D], grad_out[D], dk_sum[D], dv_sum[D];
  load_lane_dims(key_dims, k + kv_offset, lane, head_dim);
  load_lane_dims(value_dims, v + kv_offset, lane, head_dim);
#pragma unroll
  for (int t = 0; t < D; t++) dk_sum[t] = dv_sum[t] = 0.0f;
  for (int range = query_offsets[key]; range < query_offsets[key + 1]; range++) {
    const int first = query_ranges[2 * range], pairs = (query_ranges[2 * range + 1] - first) * group;
    for (int pair = warp; pair < pairs; pair += warps) {
      const long long row_head = (long long)(first + pair / group) * heads + kv_head * group + pair % group;
      load_lane_dims(query, q + row_head * head_dim, lane, head_dim);
      load_lane_dims(grad_out, dout + row_head * head_dim, lane, head_dim);
      const float p = expf(lane_dot(query, key_dims) * scale - lse[row_head]);
      const float ds = p * (lane_dot(grad_out, value_dims) - delta[row_head]) * scale;
#pragma unroll
      for (int t = 0; t < D; t++) {
        dk_sum[t] += ds * query[t];
        dv_sum[t] += p * grad_out[t];
      }
    }
  }
  float* partial_k = shared;
  float* partial_v = shared + warps * head_dim;
#pragma unroll
  for (int t = 0; t < D; t++) {
    const int i = lane + 32 * t;
    if (i < head_dim) {
      partial_k[warp * head_dim + i] = dk_sum[t];
      partial_v[warp * head_dim + i] = dv_sum[t];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float sum_k = 0.0f, sum_v = 0.0f;
    for (int w = 0; w < warps; w++) {
      sum_k += partial_k[w * head_dim + i];
      sum_v += partial_v[w * head_dim + i];
    }
    dk[kv_offset + i] += sum_k;
    dv[kv_offset + i] += sum_v;
  }
}
