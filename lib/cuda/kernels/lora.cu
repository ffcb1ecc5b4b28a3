// The unmerged LoRAs of the projections that read one input (q, k, v; gate, up; or one projection alone), for the few
// rows of a decode pass: part p adds scale_p · (x A_pᵀ) B_pᵀ into its output. Through cuBLAS that is two GEMMs per
// projection, each tiny (rank 8) and launch-bound at these sizes; here it is two launches per group of up to three
// projections: lora_down computes x A_pᵀ of every part, lora_up adds every part's product into its output. More rows
// (prefill, training) take the GEMMs, which use the tensor cores and keep x A_pᵀ for the backward.
#include "common.cuh"

constexpr int LORA_MAX_ROWS = 64;
constexpr int LORA_MAX_RANK = 64;
constexpr int LORA_WARPS = 8;      // lora_down: a block of 8 warps, a warp per (row, rank) pair
constexpr int LORA_COLUMNS = 256;  // lora_up: a block per 256 output columns of a part, a thread per column

// down[p, r, j] = Σ_i x[r, i] · A_p[j, i] for part p = blockIdx.y (A_p [rank, in], x [rows, in]): a warp per (r, j),
// its lanes striding over i, then a warp sum.
template <typename T>
__device__ void lora_down(const float* __restrict__ x, const T* __restrict__ a0, const T* __restrict__ a1, const T* __restrict__ a2,
                          float* __restrict__ down, int rows, int in, int rank) {
  const T* a = blockIdx.y == 0 ? a0 : blockIdx.y == 1 ? a1 : a2;
  const int pair = blockIdx.x * LORA_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pair >= rows * rank) return;
  const int r = pair / rank, j = pair % rank;
  float sum = 0.0f;
  for (int i = lane; i < in; i += 32) sum += x[(long long)r * in + i] * to_f32(a[(long long)j * in + i]);
  sum = warp_sum(sum);
  if (lane == 0) down[(long long)blockIdx.y * rows * rank + pair] = sum;
}

// out_p[r, c] += scale_p · Σ_j down[p, r, j] · B_p[c, j] for part p = blockIdx.y, c < features_p, out_p's rows ld_p
// apart (out_p already points at the part's first column: its half of the gate/up product). The part's down rows are
// staged in shared memory; a thread per column walks every row.
template <typename T>
__device__ void lora_up(const float* __restrict__ down, const T* __restrict__ b0, const T* __restrict__ b1, const T* __restrict__ b2,
                        float* out0, float* out1, float* out2, int features0, int features1, int features2, int ld0, int ld1, int ld2,
                        float scale0, float scale1, float scale2, int rows, int rank) {
  __shared__ float staged[LORA_MAX_ROWS * LORA_MAX_RANK];
  const int p = blockIdx.y;
  const T* b = p == 0 ? b0 : p == 1 ? b1 : b2;
  float* out = p == 0 ? out0 : p == 1 ? out1 : out2;
  const int features = p == 0 ? features0 : p == 1 ? features1 : features2, ld = p == 0 ? ld0 : p == 1 ? ld1 : ld2;
  const float scale = p == 0 ? scale0 : p == 1 ? scale1 : scale2;
  if (blockIdx.x * LORA_COLUMNS >= features) return;  // the whole block: this part is narrower than the widest
  for (int i = threadIdx.x; i < rows * rank; i += blockDim.x) staged[i] = down[(long long)p * rows * rank + i];
  __syncthreads();
  const int c = blockIdx.x * LORA_COLUMNS + threadIdx.x;
  if (c >= features) return;
  for (int r = 0; r < rows; r++) {
    float sum = 0.0f;
    for (int j = 0; j < rank; j++) sum += staged[r * rank + j] * to_f32(b[(long long)c * rank + j]);
    out[(long long)r * ld + c] += scale * sum;
  }
}

#define LORA_DOWN(suffix, T)                                                                                            \
  extern "C" __global__ void lora_down_##suffix(const float* x, const T* a0, const T* a1, const T* a2, float* down, int rows, \
                                                int in, int rank) {                                                      \
    lora_down(x, a0, a1, a2, down, rows, in, rank);                                                                      \
  }
#define LORA_UP(suffix, T)                                                                                              \
  extern "C" __global__ void lora_up_##suffix(const float* down, const T* b0, const T* b1, const T* b2, float* out0,      \
                                              float* out1, float* out2, int features0, int features1, int features2,    \
                                              int ld0, int ld1, int ld2, float scale0, float scale1, float scale2,      \
                                              int rows, int rank) {                                                      \
    lora_up(down, b0, b1, b2, out0, out1, out2, features0, features1, features2, ld0, ld1, ld2, scale0, scale1, scale2,   \
            rows, rank);                                                                                                 \
  }
LORA_DOWN(f32, float)
LORA_DOWN(bf16, bf16)
LORA_UP(f32, float)
LORA_UP(bf16, bf16)
