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

// Causal grouped-query attention of one (row, head) per block, scores in shared memory: out = softmax(q·k/√d) v,
// and lse[row, head] = log Σ exp(scores), all the backward needs to rebuild the probabilities.
// Dynamic shared memory: head_dim + keys floats.
extern "C" __global__ void attention_train_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                                   const int* __restrict__ row_keys, float* __restrict__ out, float* __restrict__ lse,
                                                   int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const int row = blockIdx.x, head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int keys = key_count(row_keys, row);
  float* query = shared;
  float* scores = shared + head_dim;
  const long long q_offset = ((long long)row * heads + head) * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) query[j] = q[q_offset + j];
  __syncthreads();
  const float scale = rsqrtf((float)head_dim);
  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const float* key = k + (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    float dot = 0.0f;
    for (int i = 0; i < head_dim; i++) dot += query[i] * key[i];
    scores[j] = dot * scale;
    local_max = fmaxf(local_max, dot * scale);
  }
  const float max_score = block_max(local_max, scratch);
  float local_sum = 0.0f;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const float e = expf(scores[j] - max_score);
    scores[j] = e;
    local_sum += e;
  }
  const float sum = block_sum(local_sum, scratch);  // its barriers also publish every scores[j]
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < keys; j++) acc += scores[j] * v[(key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim + i];
    out[q_offset + i] = acc / sum;
  }
  if (threadIdx.x == 0) lse[(long long)row * heads + head] = max_score + logf(sum);
}

// Backward of attention_train_forward for one (row, head) per block. With p = softmax, dP_j = dout · v_j and
// dS_j = p_j (dP_j − Σ p dP) / √d: dq = Σ dS_j k_j here; dk_j += dS_j q and dv_j += p_j dout go to rows other
// blocks share (other queries, other heads of the group), so they are added atomically.
// Dynamic shared memory: 2 · head_dim + 2 · keys floats.
extern "C" __global__ void attention_train_backward(float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                                                    const float* __restrict__ dout, const float* __restrict__ q,
                                                    const float* __restrict__ k, const float* __restrict__ v,
                                                    const float* __restrict__ lse, const int* __restrict__ row_keys,
                                                    int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const int row = blockIdx.x, head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int keys = key_count(row_keys, row);
  float* query = shared;
  float* grad_out = shared + head_dim;
  float* probs = shared + 2 * head_dim;
  float* dscores = probs + keys;
  const long long q_offset = ((long long)row * heads + head) * head_dim;
  for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
    query[j] = q[q_offset + j];
    grad_out[j] = dout[q_offset + j];
  }
  __syncthreads();
  const float scale = rsqrtf((float)head_dim);
  const float row_lse = lse[(long long)row * heads + head];
  float local_weighted = 0.0f;
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const long long kv_offset = (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    float dot = 0.0f, dp = 0.0f;
    for (int i = 0; i < head_dim; i++) {
      dot += query[i] * k[kv_offset + i];
      dp += grad_out[i] * v[kv_offset + i];
    }
    const float p = expf(dot * scale - row_lse);
    probs[j] = p;
    dscores[j] = dp;
    local_weighted += p * dp;
  }
  const float weighted = block_sum(local_weighted, scratch);
  for (int j = threadIdx.x; j < keys; j += blockDim.x) dscores[j] = probs[j] * (dscores[j] - weighted) * scale;
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < keys; j++) acc += dscores[j] * k[(key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim + i];
    dq[q_offset + i] += acc;
  }
  for (int j = threadIdx.x; j < keys; j += blockDim.x) {
    const long long kv_offset = (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    for (int i = 0; i < head_dim; i++) {
      atomicAdd(dk + kv_offset + i, dscores[j] * query[i]);
      atomicAdd(dv + kv_offset + i, probs[j] * grad_out[i]);
    }
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
