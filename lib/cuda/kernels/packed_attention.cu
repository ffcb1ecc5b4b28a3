// Attention within the packed sequences of a training batch (PackedSegment in lib/model/backend.ts): causal
// grouped-query attention whose rows see their own segment up to themselves, after every row of the segment's shared
// prefix when it has one; the forward keeps the log-sum-exp per (row, head), and the backward recomputes the
// probabilities from it. The CPU reference is packedAttention in lib/model/cpu/attention.ts.
#include "common.cuh"

// The keys of a training row: row_keys[3·row] = its segment's first row, [+1] = the first row of the segment's shared
// prefix, [+2] = the prefix's length (0: none). The row sees every prefix row, then its segment's rows up to itself.
__device__ __forceinline__ int key_count(const int* row_keys, int row) {
  return row_keys[3 * row + 2] + row - row_keys[3 * row] + 1;
}
__device__ __forceinline__ long long key_row(const int* row_keys, int row, int j) {
  const int prefix_length = row_keys[3 * row + 2];
  return j < prefix_length ? row_keys[3 * row + 1] + j : row_keys[3 * row] + (j - prefix_length);
}

// The backward kernels give each (row, head) pair to one warp, each lane the dimensions lane, lane + 32, … (head size
// ≤ 32 · DIMS_PER_LANE): a key's dot product is a warp sum and nothing depends on the number of keys but the loop, so
// any sequence length fits. Pairs run head-fastest, so a block's warps share a row and, under grouped-query attention,
// mostly its keys (loaded once into L1). They read q, k and v rounded to bf16, as the tensor-core forward does, so
// they differentiate the very function the forward computed (up to the order of its sums) and their probabilities,
// rebuilt from the forward's log-sum-exp, sum to one.
constexpr int DIMS_PER_LANE = 8;

// Loads the lane's dimensions of a head_dim vector (zeros past its end).
__device__ __forceinline__ void load_lane_dims(float (&dims)[DIMS_PER_LANE], const float* vector, int lane, int head_dim) {
#pragma unroll
  for (int t = 0; t < DIMS_PER_LANE; t++) dims[t] = lane + 32 * t < head_dim ? vector[lane + 32 * t] : 0.0f;
}

// The same, each value rounded to bf16 (the forward's operands).
__device__ __forceinline__ void load_lane_dims_bf16(float (&dims)[DIMS_PER_LANE], const float* vector, int lane, int head_dim) {
#pragma unroll
  for (int t = 0; t < DIMS_PER_LANE; t++) {
    dims[t] = lane + 32 * t < head_dim ? __bfloat162float(__float2bfloat16_rn(vector[lane + 32 * t])) : 0.0f;
  }
}

__device__ __forceinline__ float lane_dot(const float (&a)[DIMS_PER_LANE], const float (&b)[DIMS_PER_LANE]) {
  float dot = 0.0f;
#pragma unroll
  for (int t = 0; t < DIMS_PER_LANE; t++) dot += a[t] * b[t];
  return warp_sum(dot);
}

// The forward on tensor cores, FlashAttention-2 style. A block takes one query tile (at most 64 rows of one segment,
// 16 per warp; the host's packedQueryTiles) and one query head. Q of the tile, then K and V of each key tile, are
// rounded to bf16 into shared memory (head_dim padded with zeros to HD); each warp computes S = Q·Kᵀ for its 16 rows
// with mma, keeps each row's running max and sum (online softmax, in f32 and base 2), and accumulates O += P·V with
// mma, P rounded to bf16. Scores, statistics and O stay in registers and f32; no score matrix goes to memory.
// lse[row, head] = log Σ exp(q·k/√d) is what the backward needs. A tile's keys are its segment's prefix, then its
// segment's rows up to the tile's last row: "virtual" key j is prefix row j, or segment row j − prefix length, and row
// r of the segment sees virtual keys 0 .. prefix length + r.
// tiles: per tile {first row, rows, segment start, prefix start, prefix length}. Grid: (tiles, heads). Block: 128.
// Dynamic shared memory: (64 + 2·KEY_TILE) rows of HD + 8 bf16 (the padding spreads a warp's fragment loads over the banks).
constexpr int PACKED_QUERY_TILE = 64;

template <int HD, int KEY_TILE>
__device__ void packed_attention_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                         const int* __restrict__ tiles, float* __restrict__ out, float* __restrict__ lse,
                                         int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8;  // bf16 elements per shared row
  bf16* qs = reinterpret_cast<bf16*>(shared);
  bf16* ks = qs + PACKED_QUERY_TILE * STRIDE;
  bf16* vs = ks + KEY_TILE * STRIDE;
  const int* tile = tiles + 5 * blockIdx.x;
  const int first_row = tile[0], rows = tile[1], segment_start = tile[2], prefix_start = tile[3], prefix_length = tile[4];
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;

  for (int i = threadIdx.x; i < PACKED_QUERY_TILE * HD; i += blockDim.x) {
    const int r = i / HD, c = i % HD;
    const float x = r < rows && c < head_dim ? q[(first_row + r) * q_stride + head * head_dim + c] : 0.0f;
    qs[r * STRIDE + c] = __float2bfloat16_rn(x);
  }
  // The virtual keys each of this warp's two rows (g and g + 8) sees; padding rows past the tile see what its last does.
  const int local0 = min(warp * 16 + g, rows - 1), local1 = min(warp * 16 + g + 8, rows - 1);
  const int seen0 = prefix_length + first_row + local0 - segment_start + 1, seen1 = prefix_length + first_row + local1 - segment_start + 1;
  const int warp_seen = prefix_length + first_row + min(warp * 16 + 15, rows - 1) - segment_start + 1;
  const int keys = prefix_length + first_row + rows - segment_start;
  const float scale = rsqrtf((float)head_dim) * 1.4426950408889634f;  // scores in base 2: exp2f
  float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int key0 = 0; key0 < keys; key0 += KEY_TILE) {
    __syncthreads();  // the previous tile's K and V are no longer read
    for (int i = threadIdx.x; i < KEY_TILE * HD; i += blockDim.x) {
      const int r = i / HD, c = i % HD, j = key0 + r;
      float kx = 0.0f, vx = 0.0f;
      if (j < keys && c < head_dim) {
        const long long row = j < prefix_length ? prefix_start + j : segment_start + (j - prefix_length);
        kx = k[row * kv_stride + kv_head * head_dim + c];
        vx = v[row * kv_stride + kv_head * head_dim + c];
      }
      ks[r * STRIDE + c] = __float2bfloat16_rn(kx);
      vs[r * STRIDE + c] = __float2bfloat16_rn(vx);
    }
    __syncthreads();
    if (key0 >= warp_seen) continue;  // every key of this tile lies past this warp's rows (uniform over the warp)

    // S = Q·Kᵀ: A = the warp's 16 rows of Q, B[kk][n] = K[n][kk] (K rows are B's columns: pairs along k are contiguous).
    float s[KEY_TILE / 8][4];
#pragma unroll
    for (int n = 0; n < KEY_TILE / 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < HD / 16; kc++) {
        const bf16* qa = qs + (warp * 16 + g) * STRIDE + kc * 16 + 2 * t;
        const unsigned a[4] = {*reinterpret_cast<const unsigned*>(qa), *reinterpret_cast<const unsigned*>(qa + 8 * STRIDE),
                               *reinterpret_cast<const unsigned*>(qa + 8), *reinterpret_cast<const unsigned*>(qa + 8 * STRIDE + 8)};
        const bf16* kb = ks + (n * 8 + g) * STRIDE + kc * 16 + 2 * t;
        const unsigned b[2] = {*reinterpret_cast<const unsigned*>(kb), *reinterpret_cast<const unsigned*>(kb + 8)};
        mma_bf16_16816(s[n], a, b, s[n]);
      }
    }
    // Scale, mask the keys a row does not see, and fold the tile into the running max and sum.
    float tile_max0 = -INFINITY, tile_max1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < KEY_TILE / 8; n++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = key0 + n * 8 + 2 * t + (i & 1);
        s[n][i] = j < (i < 2 ? seen0 : seen1) ? s[n][i] * scale : -INFINITY;
      }
      tile_max0 = fmaxf(tile_max0, fmaxf(s[n][0], s[n][1]));
      tile_max1 = fmaxf(tile_max1, fmaxf(s[n][2], s[n][3]));
    }
    // A row's 8-key columns are spread over the 4 lanes of its group (lanes differing in bits 0 and 1).
    tile_max0 = fmaxf(tile_max0, __shfl_xor_sync(0xffffffffu, tile_max0, 1));
    tile_max0 = fmaxf(tile_max0, __shfl_xor_sync(0xffffffffu, tile_max0, 2));
    tile_max1 = fmaxf(tile_max1, __shfl_xor_sync(0xffffffffu, tile_max1, 1));
    tile_max1 = fmaxf(tile_max1, __shfl_xor_sync(0xffffffffu, tile_max1, 2));
    const float new_max0 = fmaxf(max0, tile_max0), new_max1 = fmaxf(max1, tile_max1);
    // A row that has seen no key yet keeps max −inf: its factors are 1 and its p 0, never NaN.
    const float base0 = new_max0 == -INFINITY ? 0.0f : new_max0, base1 = new_max1 == -INFINITY ? 0.0f : new_max1;
    const float rescale0 = exp2f(max0 - base0), rescale1 = exp2f(max1 - base1);
    max0 = new_max0;
    max1 = new_max1;
    sum0 *= rescale0;
    sum1 *= rescale1;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      o[n][0] *= rescale0; o[n][1] *= rescale0;
      o[n][2] *= rescale1; o[n][3] *= rescale1;
    }
#pragma unroll
    for (int n = 0; n < KEY_TILE / 8; n++) {
      s[n][0] = exp2f(s[n][0] - base0); s[n][1] = exp2f(s[n][1] - base0);
      s[n][2] = exp2f(s[n][2] - base1); s[n][3] = exp2f(s[n][3] - base1);
      sum0 += s[n][0] + s[n][1];
      sum1 += s[n][2] + s[n][3];
    }
    // O += P·V: two 8-key column blocks of S are one A fragment of P (rows g and g + 8, keys 2t.. and 2t + 8..);
    // B[kk][n] = V[key kk][dim n]: pairs along k are two V rows.
#pragma unroll
    for (int kc = 0; kc < KEY_TILE / 16; kc++) {
      const unsigned a[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                             pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]), pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
      for (int n = 0; n < HD / 8; n++) {
        const bf16* vb = vs + (kc * 16 + 2 * t) * STRIDE + n * 8 + g;
        const unsigned b[2] = {
          (unsigned)__bfloat16_as_ushort(vb[0]) | ((unsigned)__bfloat16_as_ushort(vb[STRIDE]) << 16),
          (unsigned)__bfloat16_as_ushort(vb[8 * STRIDE]) | ((unsigned)__bfloat16_as_ushort(vb[9 * STRIDE]) << 16)};
        mma_bf16_16816(o[n], a, b, o[n]);
      }
    }
  }
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
  const int row0 = warp * 16 + g, row1 = row0 + 8;
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = i < 2 ? row0 : row1, c = n * 8 + 2 * t + (i & 1);
      if (r < rows && c < head_dim) out[(first_row + r) * q_stride + head * head_dim + c] = o[n][i] / (i < 2 ? sum0 : sum1);
    }
  }
  if (t == 0) {
    const float ln2 = 0.6931471805599453f;
    if (row0 < rows) lse[(long long)(first_row + row0) * heads + head] = (max0 + log2f(sum0)) * ln2;
    if (row1 < rows) lse[(long long)(first_row + row1) * heads + head] = (max1 + log2f(sum1)) * ln2;
  }
}

#define PACKED_ATTENTION_FORWARD(HD, KEY_TILE)                                                                          \
  extern "C" __global__ void __launch_bounds__(128, 2) packed_attention_forward_hd##HD(                                 \
      const float* q, const float* k, const float* v, const int* tiles, float* out, float* lse, int heads, int kv_heads, \
      int head_dim) {                                                                                                    \
    packed_attention_forward<HD, KEY_TILE>(q, k, v, tiles, out, lse, heads, kv_heads, head_dim);                        \
  }
PACKED_ATTENTION_FORWARD(16, 64)
PACKED_ATTENTION_FORWARD(32, 64)
PACKED_ATTENTION_FORWARD(64, 64)
PACKED_ATTENTION_FORWARD(128, 64)
PACKED_ATTENTION_FORWARD(256, 32)

// Backward of packed_attention_forward, first half: dq, one (row, head) pair per warp. With p_j = exp(q·k_j/√d − lse),
// dP_j = dout · v_j and Δ = Σ p dP, dq = Σ p_j (dP_j − Δ) k_j / √d = (Σ p_j dP_j k_j − Δ Σ p_j k_j) / √d: both sums
// and Δ come out of one pass over the keys. Δ goes to `delta` for the second half (packed_attention_backward_dkdv),
// which owns every key row and so needs no atomics.
extern "C" __global__ void packed_attention_backward_dq(float* __restrict__ dq, float* __restrict__ delta,
                                                       const float* __restrict__ dout, const float* __restrict__ q,
                                                       const float* __restrict__ k, const float* __restrict__ v,
                                                       const float* __restrict__ lse, const int* __restrict__ row_keys,
                                                       int heads, int kv_heads, int head_dim, int pairs) {
  constexpr int D = DIMS_PER_LANE;
  const int pair = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pair >= pairs) return;
  const int row = pair / heads, kv_head = pair % heads / (heads / kv_heads);
  const float scale = rsqrtf((float)head_dim), row_lse = lse[pair];
  float query[D], grad_out[D], key[D], value[D], weighted_keys[D], prob_keys[D];
  load_lane_dims_bf16(query, q + (long long)pair * head_dim, lane, head_dim);
  load_lane_dims(grad_out, dout + (long long)pair * head_dim, lane, head_dim);
#pragma unroll
  for (int t = 0; t < D; t++) weighted_keys[t] = prob_keys[t] = 0.0f;
  float weighted = 0.0f;
  const int keys = key_count(row_keys, row);
  for (int j = 0; j < keys; j++) {
    const long long kv_offset = (key_row(row_keys, row, j) * kv_heads + kv_head) * head_dim;
    load_lane_dims_bf16(key, k + kv_offset, lane, head_dim);
    load_lane_dims_bf16(value, v + kv_offset, lane, head_dim);
    const float p = expf(lane_dot(query, key) * scale - row_lse);
    const float dp = lane_dot(grad_out, value);
    weighted += p * dp;
#pragma unroll
    for (int t = 0; t < D; t++) {
      weighted_keys[t] += p * dp * key[t];
      prob_keys[t] += p * key[t];
    }
  }
  float* g = dq + (long long)pair * head_dim;
#pragma unroll
  for (int t = 0; t < D; t++) if (lane + 32 * t < head_dim) g[lane + 32 * t] += (weighted_keys[t] - weighted * prob_keys[t]) * scale;
  if (lane == 0) delta[pair] = weighted;
}

// Backward of packed_attention_forward, second half: dk and dv of one (key row, kv head) per block, from every
// (query row, query head) pair that sees the key: the query rows come as ranges from the host (query_offsets[key]
// .. query_offsets[key + 1] index pairs [first, end) in query_ranges), the heads are the kv head's group. A warp
// takes one pair at a time, each lane the dimensions lane, lane + 32, …: p = exp(q·k/√d − lse), dS = p (dout·v − Δ)/√d,
// dk += dS q, dv += p dout, in registers; the warps' sums meet in shared memory. The block owns its key row, so
// nothing is added atomically.
// Dynamic shared memory: 2 · warps · head_dim floats.
extern "C" __global__ void packed_attention_backward_dkdv(float* __restrict__ dk, float* __restrict__ dv,
                                                         const float* __restrict__ dout, const float* __restrict__ q,
                                                         const float* __restrict__ k, const float* __restrict__ v,
                                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                                         const int* __restrict__ query_offsets,
                                                         const int* __restrict__ query_ranges, int heads, int kv_heads,
                                                         int head_dim) {
  extern __shared__ float shared[];
  constexpr int D = DIMS_PER_LANE;
  const int key = blockIdx.x, kv_head = blockIdx.y, group = heads / kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const float scale = rsqrtf((float)head_dim);
  const long long kv_offset = ((long long)key * kv_heads + kv_head) * head_dim;
  float key_dims[D], value_dims[D], query[D], grad_out[D], dk_sum[D], dv_sum[D];
  load_lane_dims_bf16(key_dims, k + kv_offset, lane, head_dim);
  load_lane_dims_bf16(value_dims, v + kv_offset, lane, head_dim);
#pragma unroll
  for (int t = 0; t < D; t++) dk_sum[t] = dv_sum[t] = 0.0f;
  for (int range = query_offsets[key]; range < query_offsets[key + 1]; range++) {
    const int first = query_ranges[2 * range], pairs = (query_ranges[2 * range + 1] - first) * group;
    for (int pair = warp; pair < pairs; pair += warps) {
      const long long row_head = (long long)(first + pair / group) * heads + kv_head * group + pair % group;
      load_lane_dims_bf16(query, q + row_head * head_dim, lane, head_dim);
      load_lane_dims(grad_out, dout + row_head * head_dim, lane, head_dim);
      const float p = expf(lane_dot(query, key_dims) * scale - lse[row_head]);
      const float ds = p * (lane_dot(grad_out, value_dims) - delta[row_head]) * scale;
#pragma unroll
      for (int t = 0; t < D; t++) {
        dk_sum[t] += ds * query[t];
        dv_sum[t] += p * grad_out[t];
      }
    }
  }
  float* partial_k = shared;
  float* partial_v = shared + warps * head_dim;
#pragma unroll
  for (int t = 0; t < D; t++) {
    const int i = lane + 32 * t;
    if (i < head_dim) {
      partial_k[warp * head_dim + i] = dk_sum[t];
      partial_v[warp * head_dim + i] = dv_sum[t];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float sum_k = 0.0f, sum_v = 0.0f;
    for (int w = 0; w < warps; w++) {
      sum_k += partial_k[w * head_dim + i];
      sum_v += partial_v[w * head_dim + i];
    }
    dk[kv_offset + i] += sum_k;
    dv[kv_offset + i] += sum_v;
  }
}
