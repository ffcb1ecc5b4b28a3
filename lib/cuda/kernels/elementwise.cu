// Small row-wise and elementwise ops around the GEMMs: embedding lookup, bias add, residual add, SwiGLU and row
// gather, with the backwards of the last two (SwiGLU also with gate's and up's LoRAs added on the way in). CPU
// references: lib/model/cpu/kernels.ts and backend.ts.
#include "lora.cuh"

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

// outs[j][r, c] = x[r, c_j + c] (+ bias[c_j + c]) for the parts j of widths w0, w1, w2 (w2 = 0 for two parts), c_j
// the widths before part j: q, k and v (with their biases) from their one product x [rows, w0 + w1 + w2].
extern "C" __global__ void split_columns(const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ out0,
                                         float* __restrict__ out1, float* __restrict__ out2, int w0, int w1, int w2, long long rows) {
  const int width = w0 + w1 + w2;
  const long long n = rows * width;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / width;
    const int c = (int)(i - r * width);
    const float v = bias ? x[i] + bias[c] : x[i];
    if (c < w0) out0[r * w0 + c] = v;
    else if (c < w0 + w1) out1[r * w1 + (c - w0)] = v;
    else out2[r * w2 + (c - w0 - w1)] = v;
  }
}

// split_columns' inverse, rounded to bf16: out[r, c_j + c] = in_j[r, c] for the parts j of widths w0, w1, w2 (w2 = 0 for
// two parts): the output gradients of q, k and v (or gate and up) side by side, the one bf16 operand of the product
// with their stacked weight that gives the input's gradient.
extern "C" __global__ void merge_columns_bf16(const float* __restrict__ in0, const float* __restrict__ in1, const float* __restrict__ in2,
                                              bf16* __restrict__ out, int w0, int w1, int w2, long long rows) {
  const int width = w0 + w1 + w2;
  const long long n = rows * width;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / width;
    const int c = (int)(i - r * width);
    const float v = c < w0 ? in0[r * w0 + c] : c < w0 + w1 ? in1[r * w1 + (c - w0)] : in2[r * w2 + (c - w0 - w1)];
    out[i] = __float2bfloat16_rn(v);
  }
}

// out = a + b; `out` may be `a` or `b` (each element is read before the same thread writes it).
extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = a[i] + b[i];
}

// out = silu(gate) * up, silu(g) = g / (1 + e^-g), out [rows, inter] and n = rows · inter; gate and up are the two
// halves of each row of gate_up [rows, 2 · inter] (the one product of both projections). out_bf16 (when not null) the
// same rounded to bf16.
__device__ __forceinline__ void swiglu_store(float g, float up, float* __restrict__ out, bf16* __restrict__ out_bf16, long long i) {
  const float h = g / (1.0f + __expf(-g)) * up;
  out[i] = h;
  if (out_bf16) out_bf16[i] = __float2bfloat16_rn(h);  // the down projection's bf16 operand
}
extern "C" __global__ void swiglu(const float* __restrict__ gate_up, float* __restrict__ out, bf16* __restrict__ out_bf16,
                                  int inter, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long gate = i + (i / inter) * inter;  // row r, column c: at 2 · inter · r + c
    swiglu_store(gate_up[gate], gate_up[gate + inter], out, out_bf16, i);
  }
}

// swiglu with gate's and up's LoRAs (A_p, B_p; null where that projection has none; one rank over x [rows, in]) added
// on the way in, gate_up + scale_p · (x A_pᵀ) B_pᵀ, in lora.cu's order (lora.cuh): the same bits as lora_fused or
// lora_down + lora_up adding into gate_up first, one launch fewer. One block per row, which stages its x A_pᵀ.
template <typename T>
__device__ void swiglu_lora(const float* __restrict__ gate_up, float* __restrict__ out, bf16* __restrict__ out_bf16, int inter,
                            const float* __restrict__ x, const T* a_gate, const T* a_up, const T* b_gate, const T* b_up,
                            float scale_gate, float scale_up, int in, int rank) {
  __shared__ float down[2][LORA_MAX_RANK];
  const int row = blockIdx.x;
  if (a_gate) lora_stage_row(x, a_gate, row, in, rank, down[0]);
  if (a_up) lora_stage_row(x, a_up, row, in, rank, down[1]);
  const float* gates = gate_up + 2LL * inter * row;
  for (int c = threadIdx.x; c < inter; c += blockDim.x) {
    const float g = a_gate ? gates[c] + scale_gate * lora_column(down[0], b_gate, c, rank) : gates[c];
    const float up = a_up ? gates[inter + c] + scale_up * lora_column(down[1], b_up, c, rank) : gates[inter + c];
    swiglu_store(g, up, out, out_bf16, (long long)inter * row + c);
  }
}
#define SWIGLU_LORA(suffix, T)                                                                                          \
  extern "C" __global__ void swiglu_lora_##suffix(const float* gate_up, float* out, bf16* out_bf16, int inter, const float* x, \
                                                  const T* a_gate, const T* a_up, const T* b_gate, const T* b_up,       \
                                                  float scale_gate, float scale_up, int in, int rank) {                  \
    swiglu_lora(gate_up, out, out_bf16, inter, x, a_gate, a_up, b_gate, b_up, scale_gate, scale_up, in, rank);            \
  }
SWIGLU_LORA(f32, float)
SWIGLU_LORA(bf16, bf16)

// out[i, :] = x[row_index[i], :], and out_bf16's row i from x_bf16's where both are given (not null): the rows of a
// GEMM operand keep their bf16 copy. One block per output row.
extern "C" __global__ void gather_rows(const float* __restrict__ x, const bf16* __restrict__ x_bf16, const int* __restrict__ row_index,
                                       float* __restrict__ out, bf16* __restrict__ out_bf16, int d) {
  const long long source = row_index[blockIdx.x], target = (long long)blockIdx.x * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[target + j] = x[source * d + j];
  if (x_bf16 && out_bf16) {
    for (int j = threadIdx.x; j < d; j += blockDim.x) out_bf16[target + j] = x_bf16[source * d + j];
  }
}

// d silu(g)/dg = σ(g) · (1 + g · (1 − σ(g))); dGate += dout · up · that, dUp += dout · silu(g) (written, not added,
// when accumulate is 0: the gradients' first writer, so nothing zeroes them first); gate and up read from gate_up as
// in swiglu, the gradients [rows, inter] each. `merged` (when not null) gets both rounded to bf16 side by side,
// [rows, 2 · inter] as gate_up lays them out (merge_columns_bf16's values): the operand of their product with the
// stacked gate/up weight. `gate` is element i's index in gate_up, and so in merged.
__device__ __forceinline__ void swiglu_grad(float g, float up, float dout, float* __restrict__ d_gate, float* __restrict__ d_up,
                                            bf16* __restrict__ merged, int inter, int accumulate, long long i, long long gate) {
  const float sig = 1.0f / (1.0f + expf(-g));
  const float du = dout * g * sig, dg = dout * up * sig * (1.0f + g * (1.0f - sig));
  const float gate_gradient = accumulate ? d_gate[i] + dg : dg, up_gradient = accumulate ? d_up[i] + du : du;
  d_gate[i] = gate_gradient;
  d_up[i] = up_gradient;
  if (merged) {
    merged[gate] = __float2bfloat16_rn(gate_gradient);
    merged[gate + inter] = __float2bfloat16_rn(up_gradient);
  }
}
extern "C" __global__ void swiglu_backward(const float* __restrict__ gate_up, const float* __restrict__ dout, float* __restrict__ d_gate,
                                           float* __restrict__ d_up, bf16* __restrict__ merged, int inter, int accumulate, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long gate = i + (i / inter) * inter;
    swiglu_grad(gate_up[gate], gate_up[gate + inter], dout[i], d_gate, d_up, merged, inter, accumulate, i, gate);
  }
}

// ---- SwiGLU and its backward with a training pass's gate/up LoRAs ------------------------------------------------
// A training pass keeps each LoRA's x A_pᵀ for the backward (`down` [rows, down_width]; gate's rank columns at
// down_gate, up's at down_up, null where that projection has none). Rather than adding scale_p · (x A_pᵀ) B_pᵀ into
// the gate/up product (a read and a write of its 2 · inter columns per row), the SwiGLU adds it on its way in, and so
// does its backward, which reads the product again: g = gate_up[r, c] + scale_gate · Σ_j down_gate[r, j] · B_gate[c, j]
// with the sum in j order from 0 (lora.cuh's lora_column), likewise up. A block of KEPT_COLUMNS threads, a column each,
// over a tile of KEPT_TILE_ROWS rows whose down rows are staged in shared memory; a thread sums KEPT_ROW_GROUP rows at
// a time, so each element of its B rows is loaded once per group. gate_up is left without the LoRAs.
constexpr int KEPT_TILE_ROWS = 64, KEPT_ROW_GROUP = 8, KEPT_COLUMNS = 256;

// Hands each (row, column) of the block's tile to body(row, column, g, up), the LoRAs added.
template <typename Body>
__device__ void for_each_kept_gate_up(const float* __restrict__ gate_up, int inter, int rows, const float* __restrict__ down_gate,
                                      const float* __restrict__ down_up, int down_width, const float* __restrict__ b_gate,
                                      const float* __restrict__ b_up, float scale_gate, float scale_up, int rank, Body body) {
  __shared__ float staged[2][KEPT_TILE_ROWS * LORA_MAX_RANK];
  const int first = blockIdx.y * KEPT_TILE_ROWS, count = min(rows - first, KEPT_TILE_ROWS);
  for (int i = threadIdx.x; i < KEPT_TILE_ROWS * rank; i += blockDim.x) {
    const int r = i / rank, j = i % rank;
    const long long at = (long long)(first + r) * down_width + j;
    staged[0][i] = down_gate && r < count ? down_gate[at] : 0.0f;
    staged[1][i] = down_up && r < count ? down_up[at] : 0.0f;
  }
  __syncthreads();
  const int c = blockIdx.x * KEPT_COLUMNS + threadIdx.x;
  if (c >= inter) return;
  for (int r0 = 0; r0 < count; r0 += KEPT_ROW_GROUP) {
    float sum_gate[KEPT_ROW_GROUP] = {}, sum_up[KEPT_ROW_GROUP] = {};
    for (int j = 0; j < rank; j++) {
      const float bg = b_gate ? b_gate[(long long)c * rank + j] : 0.0f, bu = b_up ? b_up[(long long)c * rank + j] : 0.0f;
#pragma unroll
      for (int i = 0; i < KEPT_ROW_GROUP; i++) {
        sum_gate[i] += staged[0][(r0 + i) * rank + j] * bg;
        sum_up[i] += staged[1][(r0 + i) * rank + j] * bu;
      }
    }
#pragma unroll
    for (int i = 0; i < KEPT_ROW_GROUP; i++) {
      if (r0 + i >= count) break;
      const long long row = first + r0 + i, gate = 2LL * inter * row + c;
      body(row, c, b_gate ? gate_up[gate] + scale_gate * sum_gate[i] : gate_up[gate],
           b_up ? gate_up[gate + inter] + scale_up * sum_up[i] : gate_up[gate + inter]);
    }
  }
}
// Grid: (ceil(inter / KEPT_COLUMNS), ceil(rows / KEPT_TILE_ROWS)). Block: KEPT_COLUMNS.
extern "C" __global__ void swiglu_kept_lora(const float* __restrict__ gate_up, float* __restrict__ out, bf16* __restrict__ out_bf16,
                                            int inter, int rows, const float* down_gate, const float* down_up, int down_width,
                                            const float* b_gate, const float* b_up, float scale_gate, float scale_up, int rank) {
  for_each_kept_gate_up(gate_up, inter, rows, down_gate, down_up, down_width, b_gate, b_up, scale_gate, scale_up, rank,
                        [&](long long row, int c, float g, float up) { swiglu_store(g, up, out, out_bf16, row * inter + c); });
}
extern "C" __global__ void swiglu_backward_kept_lora(const float* __restrict__ gate_up, const float* __restrict__ dout,
                                                     float* __restrict__ d_gate, float* __restrict__ d_up, bf16* __restrict__ merged,
                                                     int inter, int rows, int accumulate, const float* down_gate, const float* down_up,
                                                     int down_width, const float* b_gate, const float* b_up, float scale_gate,
                                                     float scale_up, int rank) {
  for_each_kept_gate_up(gate_up, inter, rows, down_gate, down_up, down_width, b_gate, b_up, scale_gate, scale_up, rank,
                        [&](long long row, int c, float g, float up) {
                          swiglu_grad(g, up, dout[row * inter + c], d_gate, d_up, merged, inter, accumulate, row * inter + c,
                                      2LL * inter * row + c);
                        });
}

// dx[row_index[i], :] += dout[i, :]: the backward of gather_rows. One block per gathered row; the rows are distinct
// (a row is gathered at most once), so no two blocks add to the same element.
extern "C" __global__ void gather_rows_backward(const int* __restrict__ row_index, const float* __restrict__ dout,
                                                float* __restrict__ dx, int d) {
  const long long target = row_index[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) dx[target * d + j] += dout[(long long)blockIdx.x * d + j];
}

// The parameter gradients of full-parameter training that are sums over rows, in two deterministic passes (no atomics:
// the same inputs give the same bits run after run). column_sums_partial: block (x, y) sums rows y·rows_per_block ..
// of columns x·blockDim.x .., each thread one column in row order (a warp reads consecutive columns of a row), into
// partial[y, column]; a[r, j] is weighted by b[r, j] · scale[r] when b is given (the norm weight's dW = Σ dOut · x̂),
// alone otherwise (a bias's dB = Σ dOut). column_sums_add: out[j] += Σ_y partial[y, j], in order.
extern "C" __global__ void column_sums_partial(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ scale,
                                               float* __restrict__ partial, int width, int rows, int rows_per_block) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= width) return;
  const int first = blockIdx.y * rows_per_block, last = min(rows, first + rows_per_block);
  float sum = 0.0f;
  for (int r = first; r < last; r++) {
    const long long at = (long long)r * width + j;
    sum += b ? a[at] * (b[at] * scale[r]) : a[at];
  }
  partial[(long long)blockIdx.y * width + j] = sum;
}

extern "C" __global__ void column_sums_add(const float* __restrict__ partial, float* __restrict__ out, int width, int blocks) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= width) return;
  float sum = 0.0f;
  for (int y = 0; y < blocks; y++) sum += partial[(long long)y * width + j];
  out[j] += sum;
}

// table[token, :] += Σ dout[i, :] over the rows i holding that token: the embedding's backward. The host groups the
// rows by token (plan: the tokens, then where each token's rows start in `rows` and one past the last, then the rows
// in order), so each block owns one table row and adds into it once: no atomics, the same bits each run.
extern "C" __global__ void embedding_backward(const int* __restrict__ plan, const float* __restrict__ dout, float* __restrict__ table,
                                              int tokens, int d) {
  const int* starts = plan + tokens;
  const int* rows = starts + tokens + 1;
  const long long target = plan[blockIdx.x];
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    float sum = 0.0f;
    for (int i = starts[blockIdx.x]; i < starts[blockIdx.x + 1]; i++) sum += dout[(long long)rows[i] * d + j];
    table[target * d + j] += sum;
  }
}
