// Kernels for the emulator's own tests (test/cuda/emulator.test.ts): the order blocks and threads ran in, a kernel
// with the race the emulator's random orders are there to expose, one tensor-core product, a warp's matrix load, an
// asynchronous copy, and two accesses a GPU refuses (a read past a buffer, a misaligned vector load). Not part of art-ts.
#include "flash.cuh"

// order[block] = its place among the launch's blocks.
extern "C" __global__ void probe_block_order(unsigned* counter, unsigned* order) {
  if (threadIdx.x == 0) order[blockIdx.x] = (*counter)++;
}

// Every thread writes its input to shared memory, then reads its neighbour's. Without the barrier between the two
// (synced = 0) a thread may read before its neighbour wrote: the race.
extern "C" __global__ void probe_neighbour(const float* in, float* out, int synced) {
  __shared__ float values[64];
  values[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  if (synced) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = values[(threadIdx.x + 1) % blockDim.x];
  __syncthreads();  // the next block (shared memory is per block on a GPU, reused here) starts from a clean slate
  values[threadIdx.x] = -1.0f;
}

// One mma_bf16_16816 by one warp, each lane's fragments as given: a [32][4], b [32][2], c and d [32][4].
extern "C" __global__ void probe_mma(const unsigned* a, const unsigned* b, const float* c, float* d) {
  const int lane = threadIdx.x;
  const unsigned fa[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
  const unsigned fb[2] = {b[2 * lane], b[2 * lane + 1]};
  const float fc[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
  float fd[4];
  mma_bf16_16816(fd, fa, fb, fc);
  for (int i = 0; i < 4; i++) d[4 * lane + i] = fd[i];
}

// One ldmatrix_x4 (trans = 0 or 1) by one warp over a 16 × 16 bf16 tile (rows of 16, as in[]), lane l addressing row
// l % 16 at column 8 · (l / 16): out[4 · lane + i] = the lane's register i.
extern "C" __global__ void probe_ldmatrix(const bf16* in, unsigned* out, int trans) {
  __shared__ uint4 tile[32];  // 16 rows of 16 bf16, 16-byte aligned
  const int lane = threadIdx.x;
  tile[lane] = reinterpret_cast<const uint4*>(in)[lane];
  __syncthreads();
  const bf16* row = reinterpret_cast<const bf16*>(tile) + (lane % 16) * 16 + 8 * (lane / 16);
  unsigned r[4];
  if (trans) ldmatrix_x4<true>(r, row);
  else ldmatrix_x4<false>(r, row);
  for (int i = 0; i < 4; i++) out[4 * lane + i] = r[i];
}

// One cp.async of 16 bytes into shared memory that held -1s, src_bytes of them read from `in` (16, or 0: zeros):
// out[0..3] are the shared values before the thread waits for its group, out[4..7] after. (On a GPU the first read
// would race with the copy; here the copy lands at the wait, as late as a GPU may let it.)
extern "C" __global__ void probe_cp_async(const float4* in, float* out, int src_bytes) {
  __shared__ float4 tile;
  tile = float4{-1.0f, -1.0f, -1.0f, -1.0f};
  cp_async_16(&tile, in, (unsigned)src_bytes);
  cp_async_commit();
  out[0] = tile.x, out[1] = tile.y, out[2] = tile.z, out[3] = tile.w;
  cp_async_wait<0>();
  out[4] = tile.x, out[5] = tile.y, out[6] = tile.z, out[7] = tile.w;
}

// out[0] = in[n]: one float past a buffer of n (a GPU's memcheck reports it; the emulator's guard page stops it).
extern "C" __global__ void probe_read_past_end(const float* in, float* out, long long n) {
  out[0] = in[n];
}

// A 16-byte load from 4 bytes into `in` (a GPU faults with "misaligned address"; the alignment sanitizer stops it).
extern "C" __global__ void probe_misaligned_load(const float* in, float* out) {
  out[0] = reinterpret_cast<const float4*>(in + 1)->y;
}
