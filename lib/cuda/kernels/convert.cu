// Storage conversions: weights arrive from the host as f32 and are stored as bf16 (round to nearest even);
// bf16 tensors are widened to f32 for download; f32 activations are narrowed to bf16 to feed bf16 GEMMs.
#include "common.cuh"

// out_p[i] = in_p[i] for i < n_p, for up to four parts p (n_p = 0 for parts not given): several small tensors (a LoRA
// group's B matrices and its x Aᵀ) narrowed in one launch rather than one each.
extern "C" __global__ void f32_to_bf16(const float* __restrict__ in0, bf16* __restrict__ out0, long long n0,
                                       const float* __restrict__ in1, bf16* __restrict__ out1, long long n1,
                                       const float* __restrict__ in2, bf16* __restrict__ out2, long long n2,
                                       const float* __restrict__ in3, bf16* __restrict__ out3, long long n3) {
  const long long end1 = n0 + n1, end2 = end1 + n2, n = end2 + n3;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    if (i < n0) out0[i] = __float2bfloat16_rn(in0[i]);
    else if (i < end1) out1[i - n0] = __float2bfloat16_rn(in1[i - n0]);
    else if (i < end2) out2[i - end1] = __float2bfloat16_rn(in2[i - end1]);
    else out3[i - end2] = __float2bfloat16_rn(in3[i - end2]);
  }
}

extern "C" __global__ void bf16_to_f32(const bf16* __restrict__ in, float* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}
