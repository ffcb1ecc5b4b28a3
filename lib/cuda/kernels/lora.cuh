// The two sums of an unmerged LoRA's inference products, shared by lora.cu's kernels and by the kernels that add
// their input's LoRAs on the way in (rope.cu's split_rope_lora: q, k, v; elementwise.cu's swiglu_lora: gate, up;
// rmsnorm.cu's add_rmsnorm_lora: o, down), so that every path rounds a LoRA's contribution alike:
// out[r, c] + scale · Σ_j (x[r] · A[j]) · B[c, j].
#pragma once
#include "common.cuh"

constexpr int LORA_MAX_RANK = 64;

// x[r] · A[j] by one warp: its lanes stride over the `in` columns, then a warp sum (every lane gets it).
template <typename T>
__device__ float lora_dot(const float* __restrict__ x, const T* __restrict__ a, int r, int j, int in) {
  float sum = 0.0f;
  for (int i = threadIdx.x % 32; i < in; i += 32) sum += x[(long long)r * in + i] * to_f32(a[(long long)j * in + i]);
  return warp_sum(sum);
}

// Σ_j down[j] · B[c, j] over the rank (B [features, rank]), in order: column c's share of a row's LoRA product.
template <typename T>
__device__ float lora_column(const float* down, const T* __restrict__ b, int c, int rank) {
  float sum = 0.0f;
  for (int j = 0; j < rank; j++) sum += down[j] * to_f32(b[(long long)c * rank + j]);
  return sum;
}

// down[j] = x[r] · A[j] for j < rank into shared memory, a warp per j; the block then synchronises, so every thread
// may read all of `down`. Every thread of the block must call it.
template <typename T>
__device__ void lora_stage_row(const float* __restrict__ x, const T* __restrict__ a, int r, int in, int rank, float* down) {
  for (int j = threadIdx.x / 32; j < rank; j += blockDim.x / 32) {
    const float sum = lora_dot(x, a, r, j, in);
    if (threadIdx.x % 32 == 0) down[j] = sum;
  }
  __syncthreads();
}
