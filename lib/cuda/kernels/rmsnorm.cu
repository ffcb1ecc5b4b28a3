// RMSNorm over consecutive groups of `d` elements (a row, or one head of a row for Qwen3's q/k norm), the fused
// residual add + RMSNorm that sits between every pair of sublayers, and the backward. One block per group; the group
// is read by stride, reduced in f32, then written scaled. `out_bf16`, when not null, gets the same values rounded to
// bf16: the operand of the bf16 GEMM that reads `out` next, without a conversion kernel of its own. `rstd`, when not
// null, keeps 1/rms per group for the backward (training). The CPU reference is rmsNormRows in lib/model/cpu/kernels.ts.
#include "lora.cuh"

__device__ __forceinline__ void store(float* __restrict__ out, bf16* __restrict__ out_bf16, long long at, float value) {
  out[at] = value;
  if (out_bf16) out_bf16[at] = __float2bfloat16_rn(value);
}

// `out` may be `x` (an in-place per-head norm): each element is read before the same thread writes it.
template <typename W>
__device__ void rmsnorm(const float* x, const W* __restrict__ weight, float eps, float* out, bf16* __restrict__ out_bf16,
                        float* __restrict__ rstd, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) sum_sq += x[base + j] * x[base + j];
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / d + eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = inv_rms;
  for (int j = threadIdx.x; j < d; j += blockDim.x) store(out, out_bf16, base + j, x[base + j] * inv_rms * to_f32(weight[j]));
}
extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float eps, float* out, bf16* out_bf16, float* rstd, int d) {
  rmsnorm(x, w, eps, out, out_bf16, rstd, d);
}
extern "C" __global__ void rmsnorm_bf16(const float* x, const bf16* w, float eps, float* out, bf16* out_bf16, float* rstd, int d) {
  rmsnorm(x, w, eps, out, out_bf16, rstd, d);
}

// sum = a + b; out = rmsnorm(sum). `sum` may be `a` (decoding updates the residual in place). Each thread re-reads
// only what it wrote, so no barrier is needed between the add and the sum of squares. With `lora_a` (the _lora
// kernels), b is a projection's output whose unmerged LoRA is added on the way in, b + scale · (x Aᵀ) Bᵀ for this row
// (x [rows, in], A [rank, in], B [d, rank]): lora.cu's sums in lora.cu's order, so the same bits as lora_fused or
// lora_down + lora_up writing into b first, one launch fewer (a decode pass's o and down LoRAs).
template <typename W, typename T>
__device__ void add_rmsnorm(const float* a, const float* __restrict__ b, float* sum, const W* __restrict__ weight, float eps,
                            float* __restrict__ out, bf16* __restrict__ out_bf16, float* __restrict__ rstd, int d,
                            const float* __restrict__ lora_x, const T* __restrict__ lora_a, const T* __restrict__ lora_b,
                            float lora_scale, int lora_in, int lora_rank) {
  __shared__ float scratch[32];
  __shared__ float down[LORA_MAX_RANK];
  if (lora_a) lora_stage_row(lora_x, lora_a, blockIdx.x, lora_in, lora_rank, down);
  const long long base = (long long)blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float projected = lora_a ? b[base + j] + lora_scale * lora_column(down, lora_b, j, lora_rank) : b[base + j];
    const float r = a[base + j] + projected;
    sum[base + j] = r;
    sum_sq += r * r;
  }
  const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / d + eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = inv_rms;
  for (int j = threadIdx.x; j < d; j += blockDim.x) store(out, out_bf16, base + j, sum[base + j] * inv_rms * to_f32(weight[j]));
}
extern "C" __global__ void add_rmsnorm_f32(const float* a, const float* b, float* sum, const float* w, float eps, float* out,
                                           bf16* out_bf16, float* rstd, int d) {
  add_rmsnorm<float, float>(a, b, sum, w, eps, out, out_bf16, rstd, d, nullptr, nullptr, nullptr, 0.0f, 0, 0);
}
extern "C" __global__ void add_rmsnorm_bf16(const float* a, const float* b, float* sum, const bf16* w, float eps, float* out,
                                            bf16* out_bf16, float* rstd, int d) {
  add_rmsnorm<bf16, float>(a, b, sum, w, eps, out, out_bf16, rstd, d, nullptr, nullptr, nullptr, 0.0f, 0, 0);
}
// add_rmsnorm_lora_<norm weight>_<LoRA>: the same with b's LoRA added on the way in.
#define ADD_RMSNORM_LORA(suffix, W, T)                                                                                  \
  extern "C" __global__ void add_rmsnorm_lora_##suffix(const float* a, const float* b, float* sum, const W* w, float eps, \
                                                       float* out, bf16* out_bf16, float* rstd, int d, const float* x,  \
                                                       const T* lora_a, const T* lora_b, float scale, int in, int rank) { \
    add_rmsnorm<W, T>(a, b, sum, w, eps, out, out_bf16, rstd, d, x, lora_a, lora_b, scale, in, rank);                    \
  }
ADD_RMSNORM_LORA(f32_f32, float, float)
ADD_RMSNORM_LORA(f32_bf16, float, bf16)
ADD_RMSNORM_LORA(bf16_f32, bf16, float)
ADD_RMSNORM_LORA(bf16_bf16, bf16, bf16)

// Backward: dx += s · (g − x̂ · mean(g · x̂)) with g = dout · w, x̂ = x · s, s the saved rstd. One block per group.
// dx_bf16 (when not null) gets the new dx rounded to bf16: the residual stream's gradient is the next projection's
// output gradient, the operand of its product with a bf16 weight. (The weight's own gradient exists only for
// full-parameter training, which runs on the CPU.)
template <typename W>
__device__ void rmsnorm_backward(const float* __restrict__ x, const W* __restrict__ weight, const float* __restrict__ rstd,
                                 const float* __restrict__ dout, float* __restrict__ dx, bf16* __restrict__ dx_bf16, int d) {
  __shared__ float scratch[32];
  const long long base = (long long)blockIdx.x * d;
  const float s = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dot += dout[base + j] * to_f32(weight[j]) * x[base + j] * s;
  const float mean_dot = block_sum(dot, scratch) / d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float value = dx[base + j] + s * (dout[base + j] * to_f32(weight[j]) - x[base + j] * s * mean_dot);
    dx[base + j] = value;
    if (dx_bf16) dx_bf16[base + j] = __float2bfloat16_rn(value);
  }
}
extern "C" __global__ void rmsnorm_backward_f32(const float* x, const float* w, const float* rstd, const float* dout, float* dx, bf16* dx_bf16, int d) {
  rmsnorm_backward(x, w, rstd, dout, dx, dx_bf16, d);
}
extern "C" __global__ void rmsnorm_backward_bf16(const float* x, const bf16* w, const float* rstd, const float* dout, float* dx, bf16* dx_bf16, int d) {
  rmsnorm_backward(x, w, rstd, dout, dx, dx_bf16, d);
}
