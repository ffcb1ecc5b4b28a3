// A CPU emulation of the CUDA features the art-ts kernels use, to run them unchanged (after two textual
// substitutions the test makes) where no GPU exists. Every CUDA thread of a block is a fiber (its own stack,
// switched cooperatively on one OS thread); __syncthreads and warp shuffles are barriers a fiber waits at until
// every participant has arrived. Blocks run one after another, which makes function-scope __shared__ variables
// (static here) per-block as on a GPU. Slow, and only for tests of the kernels' arithmetic.
#pragma once
#define ART_EMULATOR 1
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__  // a call the GPU compiler keeps out of line; empty here (so a later __attribute__((__noinline__)) still parses)
#define __restrict__
#define __launch_bounds__(...)
#define __shared__ static

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };
extern emu_dim3 threadIdx, blockIdx;  // the running fiber's
extern emu_dim3 blockDim, gridDim;

struct __nv_bfloat16 { uint16_t bits; };
// CUDA's vector types as the kernels use them: 16- and 8-byte aligned, read and written whole.
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };

inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
  return {uint16_t(u >> 16)};
}

inline float __expf(float x) { return std::exp(x); }
// Round-to-nearest f32 arithmetic that CUDA never fuses into FMAs; host C++ without -ffp-contract=fast (and x86-64
// without FMA in the baseline) already computes these exactly so.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
// Fibers switch only at barriers, so a plain read-modify-write is atomic here.
inline float atomicAdd(float* address, float value) { const float old = *address; *address = old + value; return old; }
inline int atomicAdd(int* address, int value) { const int old = *address; *address = old + value; return old; }
// Blocks run one after another, so each sees every earlier block's writes: a fence has nothing to order, and a load
// that bypasses L1 (__ldcg) is a plain load.
inline void __threadfence() {}
inline float __ldcg(const float* address) { return *address; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
using std::max;
using std::min;

void __syncthreads();
float* emu_dynamic_shared();

// Warp exchange: every lane publishes its value, waits for its warp, then reads its partner's.
uint64_t emu_warp_exchange(uint64_t value, int source_lane);

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling warp: every lane publishes its fragments, waits
// for its warp, then computes its four elements of D = A·B + C from the whole warp's fragments (runtime.cpp).
void emu_mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c);

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for the calling warp: every lane publishes its row's address,
// waits for its warp, then reads its four registers from the rows the PTX ISA assigns it (runtime.cpp).
void emu_ldmatrix_x4(uint32_t* r, const void* row, bool trans);

// cp.async.cg.shared.global of 16 bytes (src_bytes of them read, the rest zeros), commit_group and wait_group, for the
// calling thread. Its copies wait in its own queue and land when it waits for their group, as late as a GPU may let
// them: a kernel that reads a tile before waiting for it (or before the barrier after every thread's wait) reads stale
// bytes here as on a GPU. Copies a thread never waits for land when it finishes.
void emu_cp_async(void* shared, const void* global, unsigned src_bytes);
void emu_cp_async_commit();
void emu_cp_async_wait(int pending);

template <typename T>
T emu_exchange(T value, int source_lane, bool keep) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const uint64_t got = emu_warp_exchange(bits, source_lane);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return keep ? value : out;
}

template <typename T> T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu_exchange(v, int(threadIdx.x & 31) ^ mask, false);
}
template <typename T> T __shfl_sync(unsigned, T v, int lane) { return emu_exchange(v, lane, false); }
template <typename T> T __shfl_up_sync(unsigned, T v, int delta) {
  const int lane = int(threadIdx.x & 31);
  return emu_exchange(v, lane >= delta ? lane - delta : lane, lane < delta);
}
