// The target logprobs of the training pass (Backend.targetLogprobs): logits blocks come from cuBLAS, these fold
// each block into every row's online log-sum-exp and turn a block into its gradient. The CPU reference is
// lib/model/cpu/logprobs.ts.
#include "common.cuh"

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

// Over a logits block: dz = g · (onehot(target) − softmax(z)), softmax from the saved log-sum-exp. Rows without a
// target or with g = 0 get 0. In place, or (dz_bf16 not null: beside a bf16 head, whose product reads dz rounded)
// rounded to bf16 into dz_bf16 [rows, cols] only: half the bytes written, and no narrowing pass reading them back.
extern "C" __global__ void logprob_block_grad(float* __restrict__ block, bf16* __restrict__ dz_bf16, int cols, int first,
                                              const int* __restrict__ targets, const float* __restrict__ logsumexp,
                                              const float* __restrict__ grad) {
  const int target = targets[blockIdx.x];
  const float g = target >= 0 ? grad[blockIdx.x] : 0.0f, row_lse = logsumexp[blockIdx.x];
  const long long offset = (long long)blockIdx.x * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float dz = g == 0.0f ? 0.0f : g * ((first + j == target ? 1.0f : 0.0f) - expf(block[offset + j] - row_lse));
    if (dz_bf16) dz_bf16[offset + j] = __float2bfloat16_rn(dz);
    else block[offset + j] = dz;
  }
}
