// The unmerged LoRAs of the projections that read one input (q, k, v; gate, up; or one projection alone), for the rows
// of an inference pass: part p adds scale_p · (x A_pᵀ) B_pᵀ into its output. Through cuBLAS that is two GEMMs per
// projection, each tiny (rank 8) and launch-bound at these sizes; here it is two launches per group of up to three
// projections: lora_down computes x A_pᵀ of every part, lora_up adds every part's product into its output, a block per
// 256 columns and 64 rows; for the fewest rows (at most LORA_MAX_FUSED_PAIRS row-rank pairs: a decode pass of a few
// sequences) one launch, lora_fused, whose every block computes its part's x A_pᵀ itself (the same warp sums, so the
// same bits) before adding its columns. Training takes GEMMs, which keep x A_pᵀ for the backward (gate's and up's
// up products then ride the SwiGLU: elementwise.cu's swiglu_kept_lora). The sums are
// lora.cuh's, which the kernels that add their input's LoRAs on the way in share (split_rope_lora, swiglu_lora,
// add_rmsnorm_lora: the CUDA backend uses them for the fewest rows).
#include "lora.cuh"

constexpr int LORA_TILE_ROWS = 64;
constexpr int LORA_MAX_FUSED_PAIRS = 64;
constexpr int LORA_WARPS = 8;      // lora_down: a block of 8 warps, a warp per (row, rank) pair
constexpr int LORA_COLUMNS = 256;  // lora_up, lora_fused: a block per 256 output columns of a part, a thread per column

// Part blockIdx.y's pointer of three.
template <typename P>
__device__ P lora_part(P p0, P p1, P p2) {
  return blockIdx.y == 0 ? p0 : blockIdx.y == 1 ? p1 : p2;
}

// out[r, c] += scale · Σ_j down[r, j] · B[c, j] for every row r, down [rows, rank] staged in shared memory.
template <typename T>
__device__ void lora_add(const float* staged, const T* __restrict__ b, float* out, int c, int ld, float scale, int rows, int rank) {
  for (int r = 0; r < rows; r++) out[(long long)r * ld + c] += scale * lora_column(staged + r * rank, b, c, rank);
}

// down[p, r, j] = Σ_i x[r, i] · A_p[j, i] for part p = blockIdx.y (A_p [rank, in], x [rows, in]): a warp per (r, j).
template <typename T>
__device__ void lora_down(const float* __restrict__ x, const T* a0, const T* a1, const T* a2, float* __restrict__ down, int rows,
                          int in, int rank) {
  const int pair = blockIdx.x * LORA_WARPS + threadIdx.x / 32;
  if (pair >= rows * rank) return;
  const float sum = lora_dot(x, lora_part(a0, a1, a2), pair / rank, pair % rank, in);
  if (threadIdx.x % 32 == 0) down[(long long)blockIdx.y * rows * rank + pair] = sum;
}

// out_p[r, c] += scale_p · Σ_j down[p, r, j] · B_p[c, j] for part p = blockIdx.y, c < features_p, out_p's rows ld_p
// apart (out_p already points at the part's first column: its half of the gate/up product), r in the block's tile of
// LORA_TILE_ROWS rows (blockIdx.z). The tile's down rows are staged in shared memory; a thread per column walks them.
template <typename T>
__device__ void lora_up(const float* __restrict__ down, const T* b0, const T* b1, const T* b2, float* out0, float* out1, float* out2,
                        int features0, int features1, int features2, int ld0, int ld1, int ld2, float scale0, float scale1,
                        float scale2, int rows, int rank) {
  __shared__ float staged[LORA_TILE_ROWS * LORA_MAX_RANK];
  const int p = blockIdx.y;
  const int features = p == 0 ? features0 : p == 1 ? features1 : features2;
  if (blockIdx.x * LORA_COLUMNS >= features) return;  // the whole block: this part is narrower than the widest
  const int first = blockIdx.z * LORA_TILE_ROWS, count = min(rows - first, LORA_TILE_ROWS);
  const float* tile = down + (long long)p * rows * rank + (long long)first * rank;
  for (int i = threadIdx.x; i < count * rank; i += blockDim.x) staged[i] = tile[i];
  __syncthreads();
  const int c = blockIdx.x * LORA_COLUMNS + threadIdx.x;
  if (c >= features) return;
  const int ld = p == 0 ? ld0 : p == 1 ? ld1 : ld2;
  lora_add(staged, lora_part(b0, b1, b2), lora_part(out0, out1, out2) + (long long)first * ld, c, ld,
           p == 0 ? scale0 : p == 1 ? scale1 : scale2, count, rank);
}

// lora_down then lora_up for part p = blockIdx.y in one launch: the block's warps compute the part's rows · rank dot
// products into shared memory (each as lora_down's warp does), then each thread adds its column as lora_up does.
template <typename T>
__device__ void lora_fused(const float* __restrict__ x, const T* a0, const T* a1, const T* a2, const T* b0, const T* b1, const T* b2,
                           float* out0, float* out1, float* out2, int features0, int features1, int features2, int ld0, int ld1,
                           int ld2, float scale0, float scale1, float scale2, int rows, int in, int rank) {
  __shared__ float staged[LORA_MAX_FUSED_PAIRS];
  const int p = blockIdx.y;
  const int features = p == 0 ? features0 : p == 1 ? features1 : features2;
  if (blockIdx.x * LORA_COLUMNS >= features) return;  // the whole block: this part is narrower than the widest
  const T* a = lora_part(a0, a1, a2);
  for (int pair = threadIdx.x / 32; pair < rows * rank; pair += blockDim.x / 32) {
    const float sum = lora_dot(x, a, pair / rank, pair % rank, in);
    if (threadIdx.x % 32 == 0) staged[pair] = sum;
  }
  __syncthreads();
  const int c = blockIdx.x * LORA_COLUMNS + threadIdx.x;
  if (c >= features) return;
  lora_add(staged, lora_part(b0, b1, b2), lora_part(out0, out1, out2), c, p == 0 ? ld0 : p == 1 ? ld1 : ld2,
           p == 0 ? scale0 : p == 1 ? scale1 : scale2, rows, rank);
}

#define LORA_KERNELS(suffix, T)                                                                                         \
  extern "C" __global__ void lora_down_##suffix(const float* x, const T* a0, const T* a1, const T* a2, float* down, int rows, \
                                                int in, int rank) {                                                      \
    lora_down(x, a0, a1, a2, down, rows, in, rank);                                                                      \
  }                                                                                                                      \
  extern "C" __global__ void lora_up_##suffix(const float* down, const T* b0, const T* b1, const T* b2, float* out0,      \
                                              float* out1, float* out2, int features0, int features1, int features2,    \
                                              int ld0, int ld1, int ld2, float scale0, float scale1, float scale2,      \
                                              int rows, int rank) {                                                      \
    lora_up(down, b0, b1, b2, out0, out1, out2, features0, features1, features2, ld0, ld1, ld2, scale0, scale1, scale2,   \
            rows, rank);                                                                                                 \
  }                                                                                                                      \
  extern "C" __global__ void lora_fused_##suffix(const float* x, const T* a0, const T* a1, const T* a2, const T* b0,      \
                                                 const T* b1, const T* b2, float* out0, float* out1, float* out2,       \
                                                 int features0, int features1, int features2, int ld0, int ld1, int ld2, \
                                                 float scale0, float scale1, float scale2, int rows, int in, int rank) { \
    lora_fused(x, a0, a1, a2, b0, b1, b2, out0, out1, out2, features0, features1, features2, ld0, ld1, ld2, scale0,      \
               scale1, scale2, rows, in, rank);                                                                          \
  }
LORA_KERNELS(f32, float)
LORA_KERNELS(bf16, bf16)
