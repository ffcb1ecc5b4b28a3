// Shared helpers for the art-ts kernels. Every kernel is extern "C" (stable names for cuModuleGetFunction) and
// computes in f32; tensors are stored as f32 (activations) or bf16 (weights, KV cache, and the q, k and v a training
// pass hands the tensor-core attention, which reads bf16 tiles anyway). A kernel that reads a
// weight comes in two instantiations, suffixed _f32 and _bf16, picked by the host from the tensor's dtype.
#pragma once
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

#ifndef INFINITY  // NVRTC compiles without the C math headers that define it
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }

// An f32 result stored as its tensor's type: as it is, or rounded to the nearest bf16 (ties to even).
__device__ __forceinline__ void store_f32(float* at, float x) { *at = x; }
__device__ __forceinline__ void store_f32(bf16* at, float x) { *at = __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one float per warp (32 suffice).
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  x = warp_max(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(x);
}

// Two floats as one 32-bit register of two bf16 (each rounded to nearest even), the first in the lower half: the
// layout of an mma operand register.
__device__ __forceinline__ unsigned pack_bf16x2(float low, float high) {
  return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(low)) | ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(high)) << 16);
}

// D = A·B + C on the tensor cores of one warp (sm_80+): mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, A 16×16
// bf16, B 16×8 bf16, C and D 16×8 f32. Fragments as the PTX ISA lays them out over the warp, with g = lane / 4 and
// t = lane % 4 (each register two bf16, the lower half first):
//   a = { A[g][2t..2t+1], A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9] }
//   b = { B[2t..2t+1][g], B[2t+8..2t+9][g] }
//   c, d = { C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1] }
// Every lane of the warp must call it together. The CPU emulator runs the same layout (test/cuda/emulator).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
#ifdef ART_EMULATOR
  emu_mma_bf16_16816(d, a, b, c);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (sm_75+): four 8×8 b16 matrices from shared memory into the warp's
// registers in mma's fragment layout. Lane l gives the address of row l % 8 of matrix l / 8 (8 b16, 16-byte aligned)
// and gets in r[i] matrix i's row l / 4, elements 2(l % 4) and 2(l % 4) + 1 (the lower half first); with TRANS the
// transposed matrix's: column l / 4, rows 2(l % 4) and 2(l % 4) + 1. One instruction where fragment loads took four
// to sixteen. Every lane of the warp must call it together.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* row) {
#ifdef ART_EMULATOR
  emu_ldmatrix_x4(r, row, TRANS);
#else
  const unsigned address = (unsigned)__cvta_generic_to_shared(row);
  if (TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
  }
#endif
}
