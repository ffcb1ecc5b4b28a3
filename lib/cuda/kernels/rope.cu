// Rotary position embedding, rotate-half layout: within each head, element j pairs with j + hd/2 and both rotate by
// angle = sign · position · inv_freq[j] (the product in f32, as the CPU's ropeRows rounds it). The inverse-frequency
// table comes from the host (it carries Llama-3 scaling), so the kernel needs no knowledge of the scaling rule.
// sign −1 is the backward: a rotation's transpose is its inverse. In place on q:[rows, q_heads·hd] and
// k:[rows, k_heads·hd] together (one launch where there were two); one block per row.
#include "common.cuh"

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
    const float a = h[j], b = h[j + half];
    h[j] = a * c - b * s;
    h[j + half] = b * c + a * s;
  }
}
extern "C" __global__ void rope_f32(float* q, float* k, const int* pos, const float* f, int q_heads, int k_heads, int hd, float sign) {
  rope(q, k, pos, f, q_heads, k_heads, hd, sign);
}
extern "C" __global__ void rope_bf16(float* q, float* k, const int* pos, const bf16* f, int q_heads, int k_heads, int hd, float sign) {
  rope(q, k, pos, f, q_heads, k_heads, hd, sign);
}
