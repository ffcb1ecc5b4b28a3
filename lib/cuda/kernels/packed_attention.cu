// Attention within the packed sequences of a training batch (PackedSegment in lib/model/backend.ts): causal
// grouped-query attention whose rows see their own segment up to themselves, after every row of the segment's shared
// prefix when it has one. Forward and backward run on tensor cores, FlashAttention-2 style: bf16 tiles of q, k, v
// (and dout) in shared memory, products with mma.sync m16n8k16 into f32 accumulators, softmax statistics in f32, and
// no score matrix in global memory. The forward keeps the log-sum-exp per (row, head); the backward rebuilds the
// probabilities from it. The CPU reference is packedAttention in lib/model/cpu/attention.ts.
//
// Layout: q, out, dout, dq are [rows, heads · head_dim], k, v, dk, dv [rows, kv_heads · head_dim], f32; lse and delta
// [rows, heads]. Kernels come per HD, the head size padded with zeros to a multiple of the mma's k of 16 (≤ 128).
// Shared tiles hold rows of HD + 8 bf16: the padding spreads a warp's fragment loads over the banks.
#include "common.cuh"

// ---- mma fragments (layouts in common.cuh, g = lane / 4, t = lane % 4) --------------------------------------------

// A = tile[row0 .. row0+15][k0 .. k0+15] of a row-major bf16 tile.
__device__ __forceinline__ void load_a(unsigned (&a)[4], const bf16* tile, int stride, int row0, int k0, int g, int t) {
  const bf16* p = tile + (row0 + g) * stride + k0 + 2 * t;
  a[0] = *reinterpret_cast<const unsigned*>(p);
  a[1] = *reinterpret_cast<const unsigned*>(p + 8 * stride);
  a[2] = *reinterpret_cast<const unsigned*>(p + 8);
  a[3] = *reinterpret_cast<const unsigned*>(p + 8 * stride + 8);
}

// B[kk][n] = tile[n0 + n][k0 + kk]: the tile's rows are B's columns (as K in Q·Kᵀ); pairs along k are contiguous.
__device__ __forceinline__ void load_b_transposed(unsigned (&b)[2], const bf16* tile, int stride, int n0, int k0, int g, int t) {
  const bf16* p = tile + (n0 + g) * stride + k0 + 2 * t;
  b[0] = *reinterpret_cast<const unsigned*>(p);
  b[1] = *reinterpret_cast<const unsigned*>(p + 8);
}

// B[kk][n] = tile[k0 + kk][n0 + n] (as V in P·V): pairs along k are two rows.
__device__ __forceinline__ void load_b(unsigned (&b)[2], const bf16* tile, int stride, int k0, int n0, int g, int t) {
  const bf16* p = tile + (k0 + 2 * t) * stride + n0 + g;
  b[0] = (unsigned)__bfloat16_as_ushort(p[0]) | ((unsigned)__bfloat16_as_ushort(p[stride]) << 16);
  b[1] = (unsigned)__bfloat16_as_ushort(p[8 * stride]) | ((unsigned)__bfloat16_as_ushort(p[9 * stride]) << 16);
}

// Two accumulator fragments of adjacent 8-column blocks (columns c0 .. c0+15 of a 16-row product) are, rounded to
// bf16, the A fragment of those 16 columns: the step from P = softmax(Q·Kᵀ) to P·V without leaving registers.
__device__ __forceinline__ void accumulators_as_a(unsigned (&a)[4], const float (&low)[4], const float (&high)[4]) {
  a[0] = pack_bf16x2(low[0], low[1]);
  a[1] = pack_bf16x2(low[2], low[3]);
  a[2] = pack_bf16x2(high[0], high[1]);
  a[3] = pack_bf16x2(high[2], high[3]);
}

// c[n] = A·B for an A of 16 rows × HD (row0.. of tile a) and B = the rows n·8 .. of tile b, transposed: 16 × N scores.
template <int HD, int N>
__device__ __forceinline__ void product_transposed(float (&c)[N / 8][4], const bf16* a_tile, int row0, const bf16* b_tile, int g, int t) {
  constexpr int STRIDE = HD + 8;
#pragma unroll
  for (int n = 0; n < N / 8; n++) {
    c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) {
      unsigned a[4], b[2];
      load_a(a, a_tile, STRIDE, row0, kc * 16, g, t);
      load_b_transposed(b, b_tile, STRIDE, n * 8, kc * 16, g, t);
      mma_bf16_16816(c[n], a, b, c[n]);
    }
  }
}

// acc += P·tile for P (16 × K, accumulator fragments) and tile rows 0 .. K − 1: 16 × HD.
template <int HD, int K>
__device__ __forceinline__ void accumulate_product(float (&acc)[HD / 8][4], const float (&p)[K / 8][4], const bf16* tile, int g, int t) {
  constexpr int STRIDE = HD + 8;
#pragma unroll
  for (int kc = 0; kc < K / 16; kc++) {
    unsigned a[4];
    accumulators_as_a(a, p[2 * kc], p[2 * kc + 1]);
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      unsigned b[2];
      load_b(b, tile, STRIDE, kc * 16, n * 8, g, t);
      mma_bf16_16816(acc[n], a, b, acc[n]);
    }
  }
}

// Rows 0 .. TILE − 1 of a shared tile from one head's columns of an f32 tensor, rounded to bf16: row r is
// source row row_of(r), or zeros where that is negative; columns past head_dim are zeros.
template <int HD, int TILE, typename RowOf>
__device__ __forceinline__ void load_tile(bf16* tile, const float* source, long long row_stride, int column, int head_dim, RowOf row_of) {
  for (int i = threadIdx.x; i < TILE * HD; i += blockDim.x) {
    const int r = i / HD, c = i % HD;
    const long long row = row_of(r);
    tile[r * (HD + 8) + c] = __float2bfloat16_rn(row >= 0 && c < head_dim ? source[row * row_stride + column + c] : 0.0f);
  }
}

// ---- query tiles: the forward and the dq pass ---------------------------------------------------------------------
// A block takes one query tile (at most 64 rows of one segment, 16 per warp: the host's packedQueryTiles, per tile
// {first row, rows, segment start, prefix start, prefix length}) and one query head. The tile's keys are its segment's
// prefix, then its segment's rows up to the tile's last row: "virtual" key j is prefix row j, or segment row
// j − prefix length, and segment row r sees virtual keys 0 .. prefix length + r.
constexpr int QUERY_TILE = 64;

struct QueryTile {
  int first_row, rows, segment_start, prefix_start, prefix_length;
  __device__ QueryTile(const int* tiles, int index) {
    const int* tile = tiles + 5 * index;
    first_row = tile[0], rows = tile[1], segment_start = tile[2], prefix_start = tile[3], prefix_length = tile[4];
  }
  // Virtual keys row `local` of the tile sees (padding rows past the tile see what its last row does).
  __device__ int seen(int local) const { return prefix_length + first_row + min(local, rows - 1) - segment_start + 1; }
  __device__ int keys() const { return seen(rows - 1); }
  __device__ long long key_row(int j) const { return j < prefix_length ? prefix_start + j : segment_start + (j - prefix_length); }
};

// Loads key tile `key0` of K and (`second`) V into shared memory; keys past the tile's are zeros.
template <int HD, int KEY_TILE>
__device__ __forceinline__ void load_key_tile(bf16* first_tile, bf16* second_tile, const float* first, const float* second,
                                              const QueryTile& tile, int key0, long long kv_stride, int column, int head_dim) {
  const int keys = tile.keys();
  const auto row_of = [&](int r) { return key0 + r < keys ? tile.key_row(key0 + r) : -1LL; };
  load_tile<HD, KEY_TILE>(first_tile, first, kv_stride, column, head_dim, row_of);
  load_tile<HD, KEY_TILE>(second_tile, second, kv_stride, column, head_dim, row_of);
}

// Forward: each warp computes S = Q·Kᵀ for its 16 rows and a key tile, keeps each row's running max and sum (online
// softmax, base 2), and accumulates O += P·V with P rounded to bf16. lse[row, head] = log Σ exp(q·k/√d).
// Grid: (query tiles, heads). Block: 128. Dynamic shared memory: (64 + 2·KEY_TILE) rows of HD + 8 bf16.
template <int HD, int KEY_TILE>
__device__ void packed_attention_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                         const int* __restrict__ tiles, float* __restrict__ out, float* __restrict__ lse,
                                         int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8;
  bf16* qs = reinterpret_cast<bf16*>(shared);
  bf16* ks = qs + QUERY_TILE * STRIDE;
  bf16* vs = ks + KEY_TILE * STRIDE;
  const QueryTile tile(tiles, blockIdx.x);
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;

  load_tile<HD, QUERY_TILE>(qs, q, q_stride, head * head_dim, head_dim,
                            [&](int r) { return r < tile.rows ? (long long)tile.first_row + r : -1LL; });
  const int row0 = warp * 16 + g, row1 = row0 + 8;
  const int seen0 = tile.seen(row0), seen1 = tile.seen(row1), warp_seen = tile.seen(warp * 16 + 15);
  const float scale = rsqrtf((float)head_dim) * 1.4426950408889634f;  // scores in base 2: exp2f
  float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;
  float o[HD / 8][4] = {};

  for (int key0 = 0; key0 < tile.keys(); key0 += KEY_TILE) {
    __syncthreads();  // the previous tile's K and V are no longer read
    load_key_tile<HD, KEY_TILE>(ks, vs, k, v, tile, key0, kv_stride, kv_head * head_dim, head_dim);
    __syncthreads();
    // Every key of this tile lies past this warp's rows, or the warp has no rows (uniform over the warp).
    if (key0 >= warp_seen || warp * 16 >= tile.rows) continue;

    float s[KEY_TILE / 8][4];
    product_transposed<HD, KEY_TILE>(s, qs, warp * 16, ks, g, t);
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
    accumulate_product<HD, KEY_TILE>(o, s, vs, g, t);
  }
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = i < 2 ? row0 : row1, c = n * 8 + 2 * t + (i & 1);
      if (r < tile.rows && c < head_dim) out[(tile.first_row + r) * q_stride + head * head_dim + c] = o[n][i] / (i < 2 ? sum0 : sum1);
    }
  }
  if (t == 0) {
    const float ln2 = 0.6931471805599453f;
    if (row0 < tile.rows) lse[(long long)(tile.first_row + row0) * heads + head] = (max0 + log2f(sum0)) * ln2;
    if (row1 < tile.rows) lse[(long long)(tile.first_row + row1) * heads + head] = (max1 + log2f(sum1)) * ln2;
  }
}

// Backward, first pass: dq, per query tile and head as the forward. With p = exp(q·k/√d − lse), dP = dout·vᵀ and
// Δ = Σ_c dout·out per (row, head) (= Σ_j p_j dP_j), dS = p (dP − Δ) and dq += dS·k / √d. Each warp recomputes S and
// p for its 16 rows and a key tile, dP = dO·Vᵀ likewise, and accumulates dS·K. Δ goes to `delta` for the second pass.
// Grid: (query tiles, heads). Block: 128. Dynamic shared memory: (2·64 + 2·KEY_TILE) rows of HD + 8 bf16.
template <int HD, int KEY_TILE>
__device__ void packed_attention_backward_dq(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                             const float* __restrict__ out, const float* __restrict__ dout,
                                             const float* __restrict__ lse, const int* __restrict__ tiles, float* __restrict__ dq,
                                             float* __restrict__ delta, int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8;
  bf16* qs = reinterpret_cast<bf16*>(shared);
  bf16* dos = qs + QUERY_TILE * STRIDE;
  bf16* ks = dos + QUERY_TILE * STRIDE;
  bf16* vs = ks + KEY_TILE * STRIDE;
  const QueryTile tile(tiles, blockIdx.x);
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
  const auto query_row = [&](int r) { return r < tile.rows ? (long long)tile.first_row + r : -1LL; };
  load_tile<HD, QUERY_TILE>(qs, q, q_stride, head * head_dim, head_dim, query_row);
  load_tile<HD, QUERY_TILE>(dos, dout, q_stride, head * head_dim, head_dim, query_row);

  // Δ of the warp's 16 rows from the f32 dout and out (a warp sum per row); lanes g keep rows g and g + 8.
  const int row0 = warp * 16 + g, row1 = row0 + 8;
  float delta0 = 0.0f, delta1 = 0.0f;
  for (int r = warp * 16; r < warp * 16 + 16; r++) {
    float dot = 0.0f;
    if (r < tile.rows) {
      const long long offset = (tile.first_row + r) * q_stride + head * head_dim;
      for (int c = lane; c < head_dim; c += 32) dot += dout[offset + c] * out[offset + c];
    }
    dot = warp_sum(dot);
    if (r == row0) delta0 = dot;
    if (r == row1) delta1 = dot;
    if (lane == 0 && r < tile.rows) delta[(tile.first_row + r) * heads + head] = dot;
  }
  const float log2e = 1.4426950408889634f, scale = rsqrtf((float)head_dim), scale2 = scale * log2e;
  const float lse0 = row0 < tile.rows ? lse[(tile.first_row + row0) * heads + head] * log2e : 0.0f;
  const float lse1 = row1 < tile.rows ? lse[(tile.first_row + row1) * heads + head] * log2e : 0.0f;
  const int seen0 = row0 < tile.rows ? tile.seen(row0) : 0, seen1 = row1 < tile.rows ? tile.seen(row1) : 0;
  const int warp_seen = tile.seen(warp * 16 + 15);
  float grad[HD / 8][4] = {};

  for (int key0 = 0; key0 < tile.keys(); key0 += KEY_TILE) {
    __syncthreads();
    load_key_tile<HD, KEY_TILE>(ks, vs, k, v, tile, key0, kv_stride, kv_head * head_dim, head_dim);
    __syncthreads();
    if (key0 >= warp_seen || warp * 16 >= tile.rows) continue;

    float s[KEY_TILE / 8][4], dp[KEY_TILE / 8][4];
    product_transposed<HD, KEY_TILE>(s, qs, warp * 16, ks, g, t);
    product_transposed<HD, KEY_TILE>(dp, dos, warp * 16, vs, g, t);
#pragma unroll
    for (int n = 0; n < KEY_TILE / 8; n++) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = key0 + n * 8 + 2 * t + (i & 1);
        const bool low = i < 2;
        const float p = j < (low ? seen0 : seen1) ? exp2f(s[n][i] * scale2 - (low ? lse0 : lse1)) : 0.0f;
        s[n][i] = p * (dp[n][i] - (low ? delta0 : delta1));  // dS
      }
    }
    accumulate_product<HD, KEY_TILE>(grad, s, ks, g, t);
  }
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int r = i < 2 ? row0 : row1, c = n * 8 + 2 * t + (i & 1);
      if (r < tile.rows && c < head_dim) dq[(tile.first_row + r) * q_stride + head * head_dim + c] += grad[n][i] * scale;
    }
  }
}

// ---- key tiles: the dk/dv pass ------------------------------------------------------------------------------------
// Backward, second pass: dk and dv of one key tile (at most 64 rows of one segment, 16 per warp: the host's
// packedKeyTiles, per tile {first key row, keys, first range, ranges}) and one kv head, from every query row that
// sees those keys, for every query head of the kv head's group. The query rows come as ranges {first row, end,
// prefix start, prefix end, causal}: a causal range (the key's own segment) sees a key at or before the row; a prefix
// range (a segment reading the keys' segment as its prefix) sees the keys in [prefix start, prefix end). The ranges
// are read QUERY_CHUNK rows at a time. Each warp computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for its 16 keys, then
// dv += Pᵀ·dO and dk += dSᵀ·Q / √d with dSᵀ = Pᵀ (dPᵀ − Δ), in registers. The block owns its key rows: no atomics.
// Grid: (key tiles, kv heads). Block: 128. Dynamic shared memory: (2·64 + 2·QUERY_CHUNK) rows of HD + 8 bf16, then
// 2·QUERY_CHUNK floats.
constexpr int KEY_TILE = 64;

template <int HD, int QUERY_CHUNK>
__device__ void packed_attention_backward_dkdv(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                               const float* __restrict__ dout, const float* __restrict__ lse,
                                               const float* __restrict__ delta, const int* __restrict__ key_tiles,
                                               const int* __restrict__ ranges, float* __restrict__ dk, float* __restrict__ dv,
                                               int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8;
  bf16* ks = reinterpret_cast<bf16*>(shared);
  bf16* vs = ks + KEY_TILE * STRIDE;
  bf16* qs = vs + KEY_TILE * STRIDE;
  bf16* dos = qs + QUERY_CHUNK * STRIDE;
  float* chunk_lse = reinterpret_cast<float*>(dos + QUERY_CHUNK * STRIDE);  // in base 2
  float* chunk_delta = chunk_lse + QUERY_CHUNK;
  const int* tile = key_tiles + 4 * blockIdx.x;
  const int first_key = tile[0], keys = tile[1], first_range = tile[2], range_count = tile[3];
  const int kv_head = blockIdx.y, group = heads / kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
  const auto key_row = [&](int r) { return r < keys ? (long long)first_key + r : -1LL; };
  load_tile<HD, KEY_TILE>(ks, k, kv_stride, kv_head * head_dim, head_dim, key_row);
  load_tile<HD, KEY_TILE>(vs, v, kv_stride, kv_head * head_dim, head_dim, key_row);
  // This lane's two keys (rows g and g + 8 of the warp's 16) and the warp's key rows.
  const int key_lo = first_key + warp * 16, key0 = key_lo + g, key1 = key0 + 8;
  const int key_hi = first_key + min(warp * 16 + 16, keys);  // past the warp's last real key
  const float log2e = 1.4426950408889634f, scale = rsqrtf((float)head_dim), scale2 = scale * log2e;
  float grad_k[HD / 8][4] = {}, grad_v[HD / 8][4] = {};

  for (int member = 0; member < group; member++) {
    const int head = kv_head * group + member;
    for (int range = first_range; range < first_range + range_count; range++) {
      const int* bounds = ranges + 5 * range;
      const int first = bounds[0], end = bounds[1], prefix_start = bounds[2], prefix_end = bounds[3];
      const bool causal = bounds[4] != 0;
      for (int chunk = first; chunk < end; chunk += QUERY_CHUNK) {
        __syncthreads();  // the previous chunk is no longer read
        const auto query_row = [&](int r) { return chunk + r < end ? (long long)chunk + r : -1LL; };
        load_tile<HD, QUERY_CHUNK>(qs, q, q_stride, head * head_dim, head_dim, query_row);
        load_tile<HD, QUERY_CHUNK>(dos, dout, q_stride, head * head_dim, head_dim, query_row);
        for (int r = threadIdx.x; r < QUERY_CHUNK; r += blockDim.x) {
          const bool real = chunk + r < end;
          chunk_lse[r] = real ? lse[(long long)(chunk + r) * heads + head] * log2e : 0.0f;
          chunk_delta[r] = real ? delta[(long long)(chunk + r) * heads + head] : 0.0f;
        }
        __syncthreads();
        // Skip when no row of the chunk sees any of the warp's keys (uniform over the warp).
        const int chunk_last = min(chunk + QUERY_CHUNK, end) - 1;
        const bool any = key_lo < key_hi && (causal ? key_lo <= chunk_last : key_lo < prefix_end && key_hi > prefix_start);
        if (!any) continue;

        float p[QUERY_CHUNK / 8][4], ds[QUERY_CHUNK / 8][4];
        product_transposed<HD, QUERY_CHUNK>(p, ks, warp * 16, qs, g, t);   // Sᵀ
        product_transposed<HD, QUERY_CHUNK>(ds, vs, warp * 16, dos, g, t);  // dPᵀ
#pragma unroll
        for (int n = 0; n < QUERY_CHUNK / 8; n++) {
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int local = n * 8 + 2 * t + (i & 1), query = chunk + local, key = i < 2 ? key0 : key1;
            const bool seen = query < end && key < key_hi && (causal ? key <= query : key >= prefix_start && key < prefix_end);
            p[n][i] = seen ? exp2f(p[n][i] * scale2 - chunk_lse[local]) : 0.0f;
            ds[n][i] = p[n][i] * (ds[n][i] - chunk_delta[local]);
          }
        }
        accumulate_product<HD, QUERY_CHUNK>(grad_v, p, dos, g, t);
        accumulate_product<HD, QUERY_CHUNK>(grad_k, ds, qs, g, t);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int key = i < 2 ? key0 : key1, c = n * 8 + 2 * t + (i & 1);
      if (key < key_hi && c < head_dim) {
        const long long offset = key * kv_stride + kv_head * head_dim + c;
        dk[offset] += grad_k[n][i] * scale;
        dv[offset] += grad_v[n][i];
      }
    }
  }
}

// Instantiations per head size: the forward and dq passes with key tiles of 64, the dk/dv pass with query chunks of
// 64, or 32 at head size 128, where its two 16 × 128 accumulators per warp take 128 registers per thread.
#define PACKED_ATTENTION(HD, QUERY_CHUNK)                                                                               \
  extern "C" __global__ void __launch_bounds__(128) packed_attention_forward_hd##HD(                                    \
      const float* q, const float* k, const float* v, const int* tiles, float* out, float* lse, int heads, int kv_heads, \
      int head_dim) {                                                                                                    \
    packed_attention_forward<HD, 64>(q, k, v, tiles, out, lse, heads, kv_heads, head_dim);                              \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(128) packed_attention_backward_dq_hd##HD(                                \
      const float* q, const float* k, const float* v, const float* out, const float* dout, const float* lse,            \
      const int* tiles, float* dq, float* delta, int heads, int kv_heads, int head_dim) {                               \
    packed_attention_backward_dq<HD, 64>(q, k, v, out, dout, lse, tiles, dq, delta, heads, kv_heads, head_dim);         \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(128) packed_attention_backward_dkdv_hd##HD(                              \
      const float* q, const float* k, const float* v, const float* dout, const float* lse, const float* delta,          \
      const int* key_tiles, const int* ranges, float* dk, float* dv, int heads, int kv_heads, int head_dim) {           \
    packed_attention_backward_dkdv<HD, QUERY_CHUNK>(q, k, v, dout, lse, delta, key_tiles, ranges, dk, dv, heads,       \
                                                    kv_heads, head_dim);                                                 \
  }
PACKED_ATTENTION(16, 64)
PACKED_ATTENTION(32, 64)
PACKED_ATTENTION(64, 64)
PACKED_ATTENTION(128, 32)
