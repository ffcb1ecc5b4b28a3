// Kernels for the emulator's own test (test/cuda/emulator-order.test.ts): they show the order blocks and threads ran
// in, and one has the race the emulator's random orders are there to expose. Not part of art-ts.
#include <cuda_bf16.h>

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
