// Rotary position embedding, rotate-half layout: within each head, element j pairs with j + hd/2 and both rotate by
// angle = sign · position · inv_freq[j] (the product in f32, as the CPU's ropeRows rounds it). The inverse-frequency
// table comes from the host (it carries Llama-3 scaling), so the kernel needs no knowledge of the scaling rule.
// sign −1 is the backward: a rotation's transpose is its inverse. In place on q:[rows, q_heads·hd] and
// k:[rows, k_heads·hd] together (one launch where there were two); one block per row. split_rope does the same
// rotation on its way out of the q/k/v product.
#include "lora.cuh"

// Element j < hd/2 of a head and its partner j + hd/2, rotated by angle position · inv_freq[j] (s: its sine, times
// sign).
__device__ __forceinline__ void rotate_pair(float a, float b, float c, float s, float* low, float* high) {
  *low = a * c - b * s;
  *high = b * c + a * s;
}

template <typename F>
__device__ void rope(float* __restrict__ q, float* __restrict__ k, const int* __restrict__ positions, const F* __restrict__ inv_freq,
                     int q_heads, int k_heads, int head_dim, float sign) {
  const int half = head_dim / 2;
  const float position = (float)positions[blockIdx.x];
  float* q_row = q + (long long)blockIdx.x * q_heads * head_dim;
  float* k_row = k + (long long)blockIdx.x * k_heads * head_dim;
  for (int t = threadIdx.x; t < (q_heads + k_heads) * half; t += blockDim.x) {
    const int head = t / half, j = t % half;
    float s, c;
    sincosf(position * to_f32(inv_freq[j]), &s, &c);
    s *= sign;
    float* h = head < q_heads ? q_row + head * head_dim : k_row + (head - q_heads) * head_dim;
    rotate_pair(h[j], h[j + half], c, s, &h[j], &h[j + half]);
  }
}
extern "C" __global__ void rope_f32(float* q, float* k, const int* pos, const float* f, int q_heads, int k_heads, int hd, float sign) {
  rope(q, k, pos, f, q_heads, k_heads, hd, sign);
}
extern "C" __global__ void rope_bf16(float* q, float* k, const int* pos, const bf16* f, int q_heads, int k_heads, int hd, float sign) {
  rope(q, k, pos, f, q_heads, k_heads, hd, sign);
}

// q, k and v from their one product qkv [rows, (q_heads + 2·k_heads)·hd] plus its bias (null: none), q and k rotated:
// elementwise.cu's split_columns then rope_* in one launch (a decode pass is launch-bound), with the same roundings
// (the biased values, then the rotation). One block per row. With LoRAs (the _lora kernels: A_p, B_p of part p = q,
// k, v, null where that projection has none, all of one rank over x [rows, in]), each column first gets its part's
// LoRA, qkv + scale_p · (x A_pᵀ) B_pᵀ, in lora.cu's order (lora.cuh): the same bits as lora_fused or lora_down +
// lora_up adding into qkv before the split, one launch fewer.
template <typename F, typename T, typename O>
__device__ void split_rope(const float* __restrict__ qkv, const float* __restrict__ bias, O* __restrict__ q, O* __restrict__ k,
                           O* __restrict__ v, const int* __restrict__ positions, const F* __restrict__ inv_freq, int q_heads,
                           int k_heads, int head_dim, const float* __restrict__ lora_x, const T* a0, const T* a1, const T* a2,
                           const T* b0, const T* b1, const T* b2, float scale0, float scale1, float scale2, int in, int rank) {
  __shared__ float down[3][LORA_MAX_RANK];
  const int half = head_dim / 2, k_start = q_heads * head_dim, rotated = (q_heads + k_heads) * head_dim;
  const long long row = blockIdx.x;
  if (a0) lora_stage_row(lora_x, a0, (int)row, in, rank, down[0]);
  if (a1) lora_stage_row(lora_x, a1, (int)row, in, rank, down[1]);
  if (a2) lora_stage_row(lora_x, a2, (int)row, in, rank, down[2]);
  const float* x = qkv + row * (rotated + k_heads * head_dim);
  // Part p's LoRA of column `column`, p's first column `start` (selects, not arrays: no local memory without LoRAs).
  const auto lora = [&](const T* a, const T* b, float scale, int p, int column, int start) {
    return a ? x[column] + scale * lora_column(down[p], b, column - start, rank) : x[column];
  };
  const auto biased = [&](int column) {
    const float projected = column < k_start ? lora(a0, b0, scale0, 0, column, 0)
                          : column < rotated ? lora(a1, b1, scale1, 1, column, k_start) : lora(a2, b2, scale2, 2, column, rotated);
    return bias ? projected + bias[column] : projected;
  };
  const float position = (float)positions[row];
  for (int t = threadIdx.x; t < (q_heads + k_heads) * half; t += blockDim.x) {
    const int head = t / half, j = t % half, column = head * head_dim + j;  // q's heads, then k's, side by side
    float s, c;
    sincosf(position * to_f32(inv_freq[j]), &s, &c);
    O* h = head < q_heads ? q + (row * q_heads + head) * head_dim : k + (row * k_heads + head - q_heads) * head_dim;
    float low, high;
    rotate_pair(biased(column), biased(column + half), c, s, &low, &high);
    store_f32(&h[j], low);
    store_f32(&h[j + half], high);
  }
  for (int t = threadIdx.x; t < k_heads * head_dim; t += blockDim.x) store_f32(&v[row * k_heads * head_dim + t], biased(rotated + t));
}
// split_rope[_to_bf16]_<inverse frequencies>: q, k and v written as f32, or (_to_bf16) rounded to bf16 as a training
// pass keeps them for the tensor-core attention: the values it would round them to on reading f32 ones.
#define SPLIT_ROPE(name, F, O)                                                                                          \
  extern "C" __global__ void name(const float* qkv, const float* bias, O* q, O* k, O* v, const int* pos, const F* f,    \
                                  int q_heads, int k_heads, int hd) {                                                  \
    split_rope<F, float, O>(qkv, bias, q, k, v, pos, f, q_heads, k_heads, hd, nullptr, nullptr, nullptr, nullptr, nullptr, \
                            nullptr, nullptr, 0.0f, 0.0f, 0.0f, 0, 0);                                                 \
  }
SPLIT_ROPE(split_rope_f32, float, float)
SPLIT_ROPE(split_rope_bf16, bf16, float)
SPLIT_ROPE(split_rope_to_bf16_f32, float, bf16)
SPLIT_ROPE(split_rope_to_bf16_bf16, bf16, bf16)
// split_rope_lora_<inverse frequencies>_<LoRA>: the same with q's, k's and v's LoRAs added on the way in.
#define SPLIT_ROPE_LORA(suffix, F, T)                                                                                    \
  extern "C" __global__ void split_rope_lora_##suffix(const float* qkv, const float* bias, float* q, float* k, float* v,  \
                                                      const int* pos, const F* f, int q_heads, int k_heads, int hd,     \
                                                      const float* x, const T* a0, const T* a1, const T* a2, const T* b0, \
                                                      const T* b1, const T* b2, float scale0, float scale1, float scale2, \
                                                      int in, int rank) {                                               \
    split_rope<F, T, float>(qkv, bias, q, k, v, pos, f, q_heads, k_heads, hd, x, a0, a1, a2, b0, b1, b2, scale0, scale1,    \
                            scale2, in, rank);                                                                           \
  }
SPLIT_ROPE_LORA(f32_f32, float, float)
SPLIT_ROPE_LORA(f32_bf16, float, bf16)
SPLIT_ROPE_LORA(bf16_f32, bf16, float)
SPLIT_ROPE_LORA(bf16_bf16, bf16, bf16)
