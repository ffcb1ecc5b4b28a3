// The optimiser's kernels, each over a list of tensors in one launch: zeroing the gradients, partial sums of squares
// (the global gradient norm) and the AdamW update. The CPU reference is sumOfSquares and adamwUpdate in
// lib/model/cpu/kernels.ts.
//
// A LoRA adapter is hundreds of small tensors (336 for Qwen2.5-0.5B); one launch each left the GPU idle between
// them. The host uploads a table of 64-bit values: per tensor its FIELDS addresses, then every tensor's element
// count. blockIdx.y picks the tensor and the blocks along x stride over it.
#include "common.cuh"

template <int FIELDS>
struct TensorTable {
  const unsigned long long* table;
  int count;
  __device__ float* field(int tensor, int f) const { return reinterpret_cast<float*>(table[tensor * FIELDS + f]); }
  __device__ long long size(int tensor) const { return (long long)table[count * FIELDS + tensor]; }
};

// The elements of tensor blockIdx.y this thread handles: i = start, start + stride, ... < size.
#define FOR_EACH_ELEMENT(i, size) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (size); i += (long long)gridDim.x * blockDim.x)

// table: {x}. Every element of every tensor becomes 0.
extern "C" __global__ void zero_tensors(const unsigned long long* __restrict__ table, int count) {
  const TensorTable<1> tensors{table, count};
  float* x = tensors.field(blockIdx.y, 0);
  FOR_EACH_ELEMENT(i, tensors.size(blockIdx.y)) x[i] = 0.0f;
}

// table: {x}. partials[tensor · gridDim.x + block] = Σ x² over the block's share of the tensor (the host adds the
// partials in float64).
extern "C" __global__ void sum_squares(const unsigned long long* __restrict__ table, int count, float* __restrict__ partials) {
  __shared__ float scratch[32];
  const TensorTable<1> tensors{table, count};
  const float* x = tensors.field(blockIdx.y, 0);
  float local = 0.0f;
  FOR_EACH_ELEMENT(i, tensors.size(blockIdx.y)) local += x[i] * x[i];
  const float total = block_sum(local, scratch);
  if (threadIdx.x == 0) partials[blockIdx.y * gridDim.x + blockIdx.x] = total;
}

// table: {value, grad, m, v}. One AdamW update (torch.optim.AdamW) of each tensor: clipped gradient into the moments,
// decoupled decay, bias-corrected step.
extern "C" __global__ void adamw_update(const unsigned long long* __restrict__ table, int count, float clip, float lr, float beta1,
                                        float beta2, float eps, float weight_decay, float correction1, float correction2) {
  const TensorTable<4> tensors{table, count};
  const int t = blockIdx.y;
  float* value = tensors.field(t, 0);
  const float* grad = tensors.field(t, 1);
  float* m = tensors.field(t, 2);
  float* v = tensors.field(t, 3);
  FOR_EACH_ELEMENT(i, tensors.size(t)) {
    const float g = grad[i] * clip;
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float p = value[i];
    p -= lr * weight_decay * p;
    p -= lr * (m[i] / correction1) / (sqrtf(v[i] / correction2) + eps);
    value[i] = p;
  }
}
