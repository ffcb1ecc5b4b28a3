// Small row-wise and elementwise ops around the GEMMs: embedding lookup, bias add, residual add, SwiGLU and row
// gather, with the backwards of the last two. CPU references: lib/model/cpu/kernels.ts and backend.ts.
#include "common.cuh"

// out[i, :] = table[ids[i], :]. One block per row.
template <typename T>
__device__ void embedding(const T* __restrict__ table, const int* __restrict__ ids, float* __restrict__ out, int d) {
  const long long row = ids[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[(long long)blockIdx.x * d + j] = to_f32(table[row * d + j]);
}
extern "C" __global__ void embedding_f32(const float* table, const int* ids, float* out, int d) { embedding(table, ids, out, d); }
extern "C" __global__ void embedding_bf16(const bf16* table, const int* ids, float* out, int d) { embedding(table, ids, out, d); }

// y[i, j] += bias[j] for y:[rows, cols].
template <typename T>
__device__ void add_bias(float* __restrict__ y, const T* __restrict__ bias, long long rows, int cols) {
  const long long n = rows * cols;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] += to_f32(bias[i % cols]);
}
extern "C" __global__ void add_bias_f32(float* y, const float* bias, long long rows, int cols) { add_bias(y, bias, rows, cols); }
extern "C" __global__ void add_bias_bf16(float* y, const bf16* bias, long long rows, int cols) { add_bias(y, bias, rows, cols); }

// out = a + b; `out` may be `a` or `b` (each element is read before the same thread writes it).
extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}

// out = silu(gate) * up, silu(g) = g / (1 + e^-g); out_bf16 (when not null) the same rounded to bf16.
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up, float* __restrict__ out,
                                  bf16* __restrict__ out_bf16, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float g = gate[i];
    const float h = g / (1.0f + __expf(-g)) * up[i];
    out[i] = h;
    if (out_bf16) out_bf16[i] = __float2bfloat16_rn(h);  // the down projection's bf16 operand
  }
}

// out[i, :] = x[row_index[i], :]. One block per output row.
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ row_index,
                                       float* __restrict__ out, int d) {
  const long long source = row_index[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[(long long)blockIdx.x * d + j] = x[source * d + j];
}

// d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))); dGate += dout · up · that, dUp += dout · silu(g).
extern "C" __global__ void swiglu_backward(const float* __restrict__ gate, const float* __restrict__ up, const float* __restrict__ dout,
                                           float* __restrict__ d_gate, float* __restrict__ d_up, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + expf(-g));
    d_up[i] += dout[i] * g * sig;
    d_gate[i] += dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

// dx[row_index[i], :] += dout[i, :]: the backward of gather_rows. One block per gathered row; the rows are distinct
// (a row is gathered at most once), so no two blocks add to the same element.
extern "C" __global__ void gather_rows_backward(const int* __restrict__ row_index, const float* __restrict__ dout,
                                                float* __restrict__ dx, int d) {
  const long long target = row_index[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) dx[target * d + j] += dout[(long long)blockIdx.x * d + j];
}
