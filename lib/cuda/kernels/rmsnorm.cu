// RMSNorm over consecutive groups of `d` elements (a row, or one head of a row for Qwen3's q/k norm), and the fused
// residual add + RMSNorm that sits between every pair of sublayers. One block per group; the group is read once
// into registers-by-stride, reduced in f32, then written scaled. `out_bf16`, when not null, gets the same values
// rounded to bf16: the operand of the bf16 GEMM that reads `out` next, without a conversion kernel of its own.
#include "common.cuh"

__device__ __forceinline__ void store(float* __restrict__ out, bf16* __restrict__ out_bf16, long long at, float value) {
  out[at] = value;
  if (out_bf16) out_bf16[at] = __float2bfloat16_rn(value);
}

template <typename W>
__device__ void rmsnorm(const float* __restrict__ x, const W* __restrict__ weight, float eps, float* __restrict__ out,
                        bf16* __restrict__ out_bf16, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) sum_sq += x[base + j] * x[base + j];
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / d + eps);
  for (int j = threadIdx.x; j < d; j += blockDim.x) store(out, out_bf16, base + j, x[base + j] * inv_rms * to_f32(weight[j]));
}
extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float eps, float* out, bf16* out_bf16, int d) {
  rmsnorm(x, w, eps, out, out_bf16, d);
}
extern "C" __global__ void rmsnorm_bf16(const float* x, const bf16* w, float eps, float* out, bf16* out_bf16, int d) {
  rmsnorm(x, w, eps, out, out_bf16, d);
}

// residual += x; out = rmsnorm(residual). Each thread re-reads only what it wrote, so no barrier is needed
// between the add and the sum of squares.
template <typename W>
__device__ void add_rmsnorm(float* __restrict__ residual, const float* __restrict__ x, const W* __restrict__ weight,
                            float eps, float* __restrict__ out, bf16* __restrict__ out_bf16, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float r = residual[base + j] + x[base + j];
    residual[base + j] = r;
    sum_sq += r * r;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / d + eps);
  for (int j = threadIdx.x; j < d; j += blockDim.x) store(out, out_bf16, base + j, residual[base + j] * inv_rms * to_f32(weight[j]));
}
extern "C" __global__ void add_rmsnorm_f32(float* r, const float* x, const float* w, float eps, float* out, bf16* out_bf16, int d) {
  add_rmsnorm(r, x, w, eps, out, out_bf16, d);
}
extern "C" __global__ void add_rmsnorm_bf16(float* r, const float* x, const bf16* w, float eps, float* out, bf16* out_bf16, int d) {
  add_rmsnorm(r, x, w, eps, out, out_bf16, d);
}
