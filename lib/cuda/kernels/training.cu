// The training pass's kernels (lib/cuda/training-ops.ts): forward ops that keep what the backward needs, and the
// backward ops, for LoRA training over frozen f32 or bf16 base weights. The GEMMs (linear and LoRA products, the
// logits blocks) run on cuBLAS; these are the row-wise and elementwise pieces around them. The CPU reference of each
// is in lib/grpo/ops.ts and logprobs.ts.
#include "common.cuh"

// out[rows[i], :] = x[i, :]. One block per source row (the backward of a row gather; rows are distinct).
extern "C" __global__ void scatter_rows(const float* __restrict__ x, const int* __restrict__ rows, float* __restrict__ out, int d) {
  const long long target = rows[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[target * d + j] = x[(long long)blockIdx.x * d + j];
}

// RMSNorm of one group of d per block that also keeps rstd = 1/rms (the backward needs it).
template <typename W>
__device__ void rmsnorm_keep(const float* __restrict__ x, const W* __restrict__ weight, float eps, float* __restrict__ out,
                             float* __restrict__ rstd, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) sum_sq += x[base + j] * x[base + j];
  const float s = rsqrtf(block_sum(sum_sq, scratch) / d + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[base + j] = x[base + j] * s * to_f32(weight[j]);
}
extern "C" __global__ void rmsnorm_keep_f32(const float* x, const float* w, float eps, float* out, float* rstd, int d) {
  rmsnorm_keep(x, w, eps, out, rstd, d);
}
extern "C" __global__ void rmsnorm_keep_bf16(const float* x, const bf16* w, float eps, float* out, float* rstd, int d) {
  rmsnorm_keep(x, w, eps, out, rstd, d);
}

// dx += s · (g − x̂ · mean(g · x̂)) with g = dout · w, x̂ = x · s. One block per group.
template <typename W>
__device__ void rmsnorm_backward(float* __restrict__ dx, const float* __restrict__ dout, const float* __restrict__ x,
                                 const float* __restrict__ rstd, const W* __restrict__ weight, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  const float s = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dot += dout[base + j] * to_f32(weight[j]) * x[base + j] * s;
  const float mean_dot = block_sum(dot, scratch) / d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    dx[base + j] += s * (dout[base + j] * to_f32(weight[j]) - x[base + j] * s * mean_dot);
  }
}
extern "C" __global__ void rmsnorm_backward_f32(float* dx, const float* dout, const float* x, const float* rstd, const float* w, int d) {
  rmsnorm_backward(dx, dout, x, rstd, w, d);
}
extern "C" __global__ void rmsnorm_backward_bf16(float* dx, const float* dout, const float* x, const float* rstd, const bf16* w, int d) {
  rmsnorm_backward(dx, dout, x, rstd, w, d);
}

// Rotate-half RoPE in place by the angles of precomputed tables cos/sin [rows, half]; sign −1 rotates back (the
// backward: a rotation's transpose is its inverse). One block per row.
extern "C" __global__ void rope_rotate(float* __restrict__ x, const float* __restrict__ cos_table, const float* __restrict__ sin_table,
                                       int heads, int half, float sign) {
  const long long row = blockIdx.x;
  for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int head = i / half, j = i % half;
    const float c = cos_table[row * half + j], s = sign * sin_table[row * half + j];
    float* pair = x + (row * heads + head) * 2 * half;
    const float a = pair[j], b = pair[half + j];
    pair[j] = a * c - b * s;
    pair[half + j] = b * c + a * s;
  }
}

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
// (head size ≤ 32 · TRAIN_DIMS_PER_LANE): a key's dot product is a warp sum and nothing depends on the number of keys
// but the loop, so any sequence length fits. Pairs run head-fastest, so a block's warps share a row and, under
// grouped-query attention, mostly its keys (loaded once into L1).
constexpr int TRAIN_DIMS_PER_LANE = 8;

// Loads the lane's dimensions of a head_dim vector (zeros past its end).
__device__ __forceinline__ void load_lane_dims(float (&dims)[TRAIN_DIMS_PER_LANE], const float* vector, int lane, int head_dim) {
#pragma unroll
  for (int t = 0; t < TRAIN_DIMS_PER_LANE; t++) dims[t] = lane + 32 * t < head_dim ? vector[lane + 32 * t] : 0.0f;
}

__device__ __forceinline__ float lane_dot(const float (&a)[TRAIN_DIMS_PER_LANE], const float (&b)[TRAIN_DIMS_PER_LANE]) {
  float dot = 0.0f;
#pragma unroll
  for (int t = 0; t < TRAIN_DIMS_PER_LANE; t++) dot += a[t] * b[t];
  return warp_sum(dot);
}

// Causal grouped-query attention with an online softmax (running max and sum, the accumulator rescaled when the
// max grows): out = softmax(q·k/√d) v, and lse[row, head] = log Σ exp(scores), all the backward needs to rebuild
// the probabilities. `pairs` = rows · heads.
extern "C" __global__ void attention_train_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                                   const int* __restrict__ row_keys, float* __restrict__ out, float* __restrict__ lse,
                                                   int heads, int kv_heads, int head_dim, int pairs) {
  constexpr int D = TRAIN_DIMS_PER_LANE;
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

// Backward of attention_train_forward, first half: dq, one (row, head) pair per warp. With p_j = exp(q·k_j/√d − lse),
// dP_j = dout · v_j and Δ = Σ p dP, dq = Σ p_j (dP_j − Δ) k_j / √d = (Σ p_j dP_j k_j − Δ Σ p_j k_j) / √d: both sums
// and Δ come out of one pass over the keys. Δ goes to `delta` for the second half (attention_train_backward_dkdv),
// which owns every key row and so needs no atomics.
extern "C" __global__ void attention_train_backward_dq(float* __restrict__ dq, float* __restrict__ delta,
                                                       const float* __restrict__ dout, const float* __restrict__ q,
                                                       const float* __restrict__ k, const float* __restrict__ v,
                                                       const float* __restrict__ lse, const int* __restrict__ row_keys,
                                                       int heads, int kv_heads, int head_dim, int pairs) {
  constexpr int D = TRAIN_DIMS_PER_LANE;
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

// Backward of attention_train_forward, second half: dk and dv of one (key row, kv head) per block, from every
// (query row, query head) pair that sees the key: the query rows come as ranges from the host (query_offsets[key]
// .. query_offsets[key + 1] index pairs [first, end) in query_ranges), the heads are the kv head's group. A warp
// takes one pair at a time, each lane the dimensions lane, lane + 32, …: p = exp(q·k/√d − lse), dS = p (dout·v − Δ)/√d,
// dk += dS q, dv += p dout, in registers; the warps' sums meet in shared memory. The block owns its key row, so
// nothing is added atomically.
// Dynamic shared memory: 2 · warps · head_dim floats.
extern "C" __global__ void attention_train_backward_dkdv(float* __restrict__ dk, float* __restrict__ dv,
                                                         const float* __restrict__ dout, const float* __restrict__ q,
                                                         const float* __restrict__ k, const float* __restrict__ v,
                                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                                         const int* __restrict__ query_offsets,
                                                         const int* __restrict__ query_ranges, int heads, int kv_heads,
                                                         int head_dim) {
  extern __shared__ float shared[];
  constexpr int D = TRAIN_DIMS_PER_LANE;
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

// d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))); dGate += dout · up · that, dUp += dout · silu(g).
extern "C" __global__ void swiglu_backward(float* __restrict__ d_gate, float* __restrict__ d_up, const float* __restrict__ dout,
                                           const float* __restrict__ gate, const float* __restrict__ up, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    d_up[i] += dout[i] * g * sig;
    d_gate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

// One block of logits [rows, cols] (vocabulary entries first..first+cols) folded into each row's running online
// log-sum-exp state [max, Σ e^(z−max), Σ e^(z−max)·z, target logit]; the host finishes (logsumexp, entropy, logprob).
extern "C" __global__ void logprob_block_stats(const float* __restrict__ logits, int cols, int first, const int* __restrict__ targets,
                                               float* __restrict__ state) {
  __shared__ float scratch[32];
  const float* row = logits + (long long)blockIdx.x * cols;
  float* s = state + 4 * blockIdx.x;
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) local_max = fmaxf(local_max, row[j]);
  const float old_max = s[0];
  const float new_max = fmaxf(old_max, block_max(local_max, scratch));
  float local_sum = 0.0f, local_sum_z = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = expf(row[j] - new_max);
    local_sum += e;
    local_sum_z += e * row[j];
  }
  const float sum = block_sum(local_sum, scratch);
  const float sum_z = block_sum(local_sum_z, scratch);
  if (threadIdx.x == 0) {
    const float rescale = expf(old_max - new_max);  // 0 on the first block (old_max = −inf)
    s[0] = new_max;
    s[1] = s[1] * rescale + sum;
    s[2] = s[2] * rescale + sum_z;
    const int target = targets[blockIdx.x];
    if (target >= first && target < first + cols) s[3] = row[target - first];
  }
}

// In place over a logits block: dz = g · (onehot(target) − softmax(z)), softmax from the saved log-sum-exp.
// Rows without a target or with g = 0 get 0.
extern "C" __global__ void logprob_block_grad(float* __restrict__ block, int cols, int first, const int* __restrict__ targets,
                                              const float* __restrict__ logsumexp, const float* __restrict__ grad) {
  const int target = targets[blockIdx.x];
  const float g = target >= 0 ? grad[blockIdx.x] : 0.0f, row_lse = logsumexp[blockIdx.x];
  float* row = block + (long long)blockIdx.x * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    row[j] = g == 0.0f ? 0.0f : g * ((first + j == target ? 1.0f : 0.0f) - expf(row[j] - row_lse));
  }
}

// partials[block] = Σ x² over the block's grid-stride share (the host adds the partials in float64).
extern "C" __global__ void sum_squares(const float* __restrict__ x, long long n, float* __restrict__ partials) {
  __shared__ float scratch[32];
  float local = 0.0f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) local += x[i] * x[i];
  const float total = block_sum(local, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One AdamW update (torch.optim.AdamW): clipped gradient into the moments, decoupled decay, bias-corrected step.
extern "C" __global__ void adamw_update(float* __restrict__ value, const float* __restrict__ grad, float* __restrict__ m,
                                        float* __restrict__ v, long long n, float clip, float lr, float beta1, float beta2,
                                        float eps, float weight_decay, float correction1, float correction2) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float g = grad[i] * clip;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float p = value[i];
    p -= lr * weight_decay * p;
    p -= lr * (m[i] / correction1) / (sqrtf(v[i] / correction2) + eps);
    value[i] = p;
  }
}
