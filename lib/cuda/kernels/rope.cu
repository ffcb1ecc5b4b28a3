// Rotary position embedding, rotate-half layout: within each head, element j pairs with j + hd/2 and both rotate by
// angle = sign · position · inv_freq[j] (the product in f32, as the CPU's ropeRows rounds it). The inverse-frequency
// table comes from the host (it carries Llama-3 scaling), so the kernel needs no knowledge of the scaling rule.
// sign −1 is the backward: a rotation's transpose is its inverse. In place on x:[rows, heads·hd]; one block per row.
#include "common.cuh"

template <typename F>
__device__ void rope(float* __restrict__ x, const int* __restrict__ positions, const F* __restrict__ inv_freq,
                     int heads, int head_dim, float sign) {
  const int half = head_dim / 2;
  const float position = (float)positions[blockIdx.x];
  float* row = x + (long long)blockIdx.x * heads * head_dim;
  for (int t = threadIdx.x; t < heads * half; t += blockDim.x) {
    const int head = t / half, j = t % half;
    float s, c;
    sincosf(position * to_f32(inv_freq[j]), &s, &c);
    s *= sign;
    float* h = row + head * head_dim;
    const float a = h[j], b = h[j + half];
    h[j] = a * c - b * s;
    h[j + half] = b * c + a * s;
  }
}
extern "C" __global__ void rope_f32(float* x, const int* pos, const float* f, int heads, int hd, float sign) {
  rope(x, pos, f, heads, hd, sign);
}
extern "C" __global__ void rope_bf16(float* x, const int* pos, const bf16* f, int heads, int hd, float sign) {
  rope(x, pos, f, heads, hd, sign);
}
