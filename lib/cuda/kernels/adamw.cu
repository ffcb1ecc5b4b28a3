// The optimiser's two reductions: partial sums of squares (the global gradient norm) and the AdamW update. The CPU
// reference is sumOfSquares and adamwUpdate in lib/model/cpu/kernels.ts.
#include "common.cuh"

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
