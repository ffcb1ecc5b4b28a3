// Attention within the packed sequences of a training batch (PackedSegment in lib/model/backend.ts): causal
// grouped-query attention whose rows see their own segment up to themselves, after every row of the segment's shared
// prefix when it has one. Forward and backward run on tensor cores (flash.cuh): the forward keeps the log-sum-exp
// per (row, head), and the backward rebuilds the probabilities from it. The CPU reference is packedAttention in
// lib/model/cpu/attention.ts.
//
// Layout: q, out, dout, dq are [rows, heads · head_dim], k, v, dk, dv [rows, kv_heads · head_dim]; q, k, v and the
// tiles' dout bf16 (the tiles' type: a training pass writes q, k and v so; the host narrows f32 ones and dout first,
// the rounding the tiles' loads gave them before), the rest f32 (Δ takes dout as it is); lse and delta [rows, heads].
// Kernels come per HD (flash.cuh), at most 128.
#include "flash.cuh"

// ---- query tiles: the forward and the dq pass ---------------------------------------------------------------------
// A block takes one query tile (at most 64 rows of one segment: the host's packedQueryTiles, per tile {first row,
// rows, segment start, prefix start, prefix length}) and one query head. The tile's keys are its segment's prefix,
// then its segment's rows up to the tile's last row: "virtual" key j is prefix row j, or segment row j − prefix
// length, and segment row r sees virtual keys 0 .. prefix length + r. (flash.cuh's Keys.)
struct PackedKeys {
  const bf16* k;
  const bf16* v;
  long long kv_stride;
  int column, head_dim, first_row, rows, segment_start, prefix_start, prefix_length;
  __device__ PackedKeys(const bf16* k_, const bf16* v_, const int* tiles, int kv_head, int kv_heads, int head_dim_)
      : k(k_), v(v_), kv_stride((long long)kv_heads * head_dim_), column(kv_head * head_dim_), head_dim(head_dim_) {
    const int* tile = tiles + 5 * blockIdx.x;
    first_row = tile[0], rows = tile[1], segment_start = tile[2], prefix_start = tile[3], prefix_length = tile[4];
  }
  __device__ int seen(int local) const { return prefix_length + first_row + min(local, rows - 1) - segment_start + 1; }
  __device__ int count() const { return seen(rows - 1); }
  __device__ long long key_row(int j) const { return j < prefix_length ? prefix_start + j : segment_start + (j - prefix_length); }
  template <int HD, int KEY_TILE>
  __device__ void fetch(bf16* k_tile, bf16* v_tile, int key0) const {
    const int keys = count();
    const auto row_of = [&](int r) { return key0 + r < keys ? key_row(key0 + r) : -1LL; };
    fetch_tile<HD, KEY_TILE>(k_tile, k, kv_stride, column, head_dim, row_of);
    fetch_tile<HD, KEY_TILE>(v_tile, v, kv_stride, column, head_dim, row_of);
  }
};

// Forward. out_bf16 (when not null) gets out rounded to bf16, o_proj's GEMM operand. Grid: (query tiles, heads).
// Block: 128. Dynamic shared memory: flash_forward's.
template <int HD>
__device__ void packed_attention_forward(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                         const int* __restrict__ tiles, float* __restrict__ out, bf16* __restrict__ out_bf16,
                                         float* __restrict__ lse, int heads, int kv_heads, int head_dim) {
  const int head = blockIdx.y;
  const PackedKeys keys(k, v, tiles, head / (heads / kv_heads), kv_heads, head_dim);
  flash_forward<HD, FLASH_TILE_ROWS>(q, keys, keys.first_row, keys.rows, head, heads, head_dim, out, out_bf16, lse);
}

// Backward, first pass: dq, per query tile and head as the forward. With p = exp(q·k/√d − lse), dP = dout·vᵀ and
// Δ = Σ_c dout·out per (row, head) (= Σ_j p_j dP_j), dS = p (dP − Δ) and dq += dS·k / √d (dq = … with `overwrite`: a
// tile's rows are written by this block alone). Each warp recomputes S and p for its 16 rows and a key tile, dP = dO·Vᵀ
// likewise, and accumulates dS·K. Δ goes to `delta` for the second pass. With BUFFERS 2, K and V come in two buffers
// as in the forward (the next tile's copies land while the warps work on this one); with 1, each tile's copies are
// waited for. At head size 128 two pairs of buffers take 102 KiB, past the 99 KiB an sm_86/89 block may have, so the
// host picks by the device (packedAttentionKernels): both are instantiated there, two buffers below it.
// Grid: (query tiles, heads). Block: 128. Dynamic shared memory: (2 + 2 · BUFFERS) · 64 rows of HD + 8 bf16.
template <int HD, int BUFFERS>
__device__ void packed_attention_backward_dq(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                             const float* __restrict__ out, const float* __restrict__ dout,
                                             const bf16* __restrict__ dout_bf16, const float* __restrict__ lse, const int* __restrict__ tiles, float* __restrict__ dq,
                                             float* __restrict__ delta, int heads, int kv_heads, int head_dim, int overwrite) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8, KEY_TILE = FLASH_TILE_ROWS;
  static_assert(BUFFERS == 1 || BUFFERS == 2, "the dq pass's K/V tiles come in one buffer or two");
  bf16* qs = reinterpret_cast<bf16*>(shared);
  bf16* dos = qs + FLASH_TILE_ROWS * STRIDE;
  bf16* k_tiles = dos + FLASH_TILE_ROWS * STRIDE;  // BUFFERS of KEY_TILE rows
  bf16* v_tiles = k_tiles + BUFFERS * KEY_TILE * STRIDE;
  const int head = blockIdx.y;
  const PackedKeys tile(k, v, tiles, head / (heads / kv_heads), kv_heads, head_dim);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim;
  const auto query_row = [&](int r) { return r < tile.rows ? (long long)tile.first_row + r : -1LL; };
  fetch_tile<HD, FLASH_TILE_ROWS>(qs, q, q_stride, head * head_dim, head_dim, query_row);
  fetch_tile<HD, FLASH_TILE_ROWS>(dos, dout_bf16, q_stride, head * head_dim, head_dim, query_row);
  if (BUFFERS == 2) tile.fetch<HD, KEY_TILE>(k_tiles, v_tiles, 0);
  cp_async_commit();  // a group of its own: the loop's waits leave only the newest group in flight

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

  const int count = tile.count();
  for (int key0 = 0, buffer = 0; key0 < count; key0 += KEY_TILE, buffer = (buffer + 1) % BUFFERS) {
    const bf16* ks = k_tiles + buffer * KEY_TILE * STRIDE;
    const bf16* vs = v_tiles + buffer * KEY_TILE * STRIDE;
    __syncthreads();  // every warp is done with the buffer about to be filled (with one buffer, this tile's)
    if (BUFFERS == 1) {
      tile.fetch<HD, KEY_TILE>(k_tiles, v_tiles, key0);  // all of a tile's copies in flight at once
    } else if (key0 + KEY_TILE < count) {
      tile.fetch<HD, KEY_TILE>(k_tiles + (buffer ^ 1) * KEY_TILE * STRIDE, v_tiles + (buffer ^ 1) * KEY_TILE * STRIDE, key0 + KEY_TILE);
    }
    cp_async_commit();
    cp_async_wait<BUFFERS - 1>();  // this thread's copies of this tile have landed
    __syncthreads();               // and every thread's
    if (key0 >= warp_seen || warp * 16 >= tile.rows) continue;

    float s[KEY_TILE / 8][4], dp[KEY_TILE / 8][4];
    product_transposed<HD, KEY_TILE>(s, qs, warp * 16, ks, lane);
    product_transposed<HD, KEY_TILE>(dp, dos, warp * 16, vs, lane);
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
    accumulate_product<HD, KEY_TILE>(grad, s, ks, lane);
  }
  for_each_accumulator<HD>(grad, g, t, [&](int row, int c, float value, bool) {
    const int r = warp * 16 + row;
    if (r >= tile.rows || c >= head_dim) return;
    float& at = dq[(tile.first_row + r) * q_stride + head * head_dim + c];
    at = overwrite ? value * scale : at + value * scale;
  });
}

// ---- key tiles: the dk/dv pass ------------------------------------------------------------------------------------
// Backward, second pass: the dk and dv that one query head contributes to one key tile (at most 64 rows of one
// segment, 16 per warp: the host's packedKeyTiles, per tile {first key row, keys, first range, ranges}), from every
// query row of that head that sees those keys. The query rows come as ranges {first row, end, prefix start, prefix
// end, causal}: a causal range (the key's own segment) sees a key at or before the row; a prefix range (a segment
// reading the keys' segment as its prefix) sees the keys in [prefix start, prefix end). The ranges are read
// QUERY_CHUNK rows at a time. Each warp computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ for its 16 keys, then dv += Pᵀ·dO and
// dk += dSᵀ·Q / √d with dSᵀ = Pᵀ (dPᵀ − Δ), in registers.
// A block per (key tile, query head), not per kv head: a kv head's group of query heads (7 for Qwen2.5-0.5B) would
// otherwise run one after another in one block, and a batch of a few packed rows gives too few blocks to fill the
// GPU. Each block stores its head's share in dk_heads and dv_heads ([rows, heads · head_dim]); group_sum adds the
// group's shares into dk and dv, in a fixed order: no atomics, the same bits every run.
// The query chunks come in two buffers: the next chunk's copies land while the warps work on this one.
// Grid: (key tiles, heads). Block: 128. Dynamic shared memory: (2·64 + 4·QUERY_CHUNK) rows of HD + 8 bf16, then
// 2·QUERY_CHUNK floats.
template <int HD, int QUERY_CHUNK>
__device__ void packed_attention_backward_dkdv(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                                               const bf16* __restrict__ dout, const float* __restrict__ lse,
                                               const float* __restrict__ delta, const int* __restrict__ key_tiles,
                                               const int* __restrict__ ranges, float* __restrict__ dk_heads,
                                               float* __restrict__ dv_heads, int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8, KEY_TILE = FLASH_TILE_ROWS;
  bf16* ks = reinterpret_cast<bf16*>(shared);
  bf16* vs = ks + KEY_TILE * STRIDE;
  bf16* q_chunks = vs + KEY_TILE * STRIDE;  // two buffers of QUERY_CHUNK rows
  bf16* do_chunks = q_chunks + 2 * QUERY_CHUNK * STRIDE;
  float* chunk_lse = reinterpret_cast<float*>(do_chunks + 2 * QUERY_CHUNK * STRIDE);  // in base 2
  float* chunk_delta = chunk_lse + QUERY_CHUNK;
  const int* tile = key_tiles + 4 * blockIdx.x;
  const int first_key = tile[0], keys = tile[1], first_range = tile[2], range_count = tile[3];
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim, kv_stride = (long long)kv_heads * head_dim;
  const auto key_row = [&](int r) { return r < keys ? (long long)first_key + r : -1LL; };
  fetch_tile<HD, KEY_TILE>(ks, k, kv_stride, kv_head * head_dim, head_dim, key_row);
  fetch_tile<HD, KEY_TILE>(vs, v, kv_stride, kv_head * head_dim, head_dim, key_row);
  // The chunks, range by range (each range's rows QUERY_CHUNK at a time): step() moves (range, chunk) to the next one.
  const int last_range = first_range + range_count;
  const auto step = [&](int& range, int& chunk) {
    chunk += QUERY_CHUNK;
    if (chunk < ranges[5 * range + 1]) return;
    range++;
    chunk = range < last_range ? ranges[5 * range] : 0;
  };
  const auto fetch_chunk = [&](int buffer, int range, int chunk) {
    const int end = ranges[5 * range + 1];
    const auto query_row = [&](int r) { return chunk + r < end ? (long long)chunk + r : -1LL; };
    fetch_tile<HD, QUERY_CHUNK>(q_chunks + buffer * QUERY_CHUNK * STRIDE, q, q_stride, head * head_dim, head_dim, query_row);
    fetch_tile<HD, QUERY_CHUNK>(do_chunks + buffer * QUERY_CHUNK * STRIDE, dout, q_stride, head * head_dim, head_dim, query_row);
  };
  int range = first_range, chunk = range < last_range ? ranges[5 * range] : 0;
  if (range < last_range) fetch_chunk(0, range, chunk);
  cp_async_commit();  // K, V and the first chunk: a group of their own
  // This lane's two keys (rows g and g + 8 of the warp's 16) and the warp's key rows.
  const int key_lo = first_key + warp * 16, key0 = key_lo + g, key1 = key0 + 8;
  const int key_hi = first_key + min(warp * 16 + 16, keys);  // past the warp's last real key
  const float log2e = 1.4426950408889634f, scale = rsqrtf((float)head_dim), scale2 = scale * log2e;
  float grad_k[HD / 8][4] = {}, grad_v[HD / 8][4] = {};

  for (int buffer = 0, next_range = range, next_chunk = chunk; range < last_range; range = next_range, chunk = next_chunk, buffer ^= 1) {
    const int* bounds = ranges + 5 * range;
    const int end = bounds[1], prefix_start = bounds[2], prefix_end = bounds[3];
    const bool causal = bounds[4] != 0;
    const bf16* qs = q_chunks + buffer * QUERY_CHUNK * STRIDE;
    const bf16* dos = do_chunks + buffer * QUERY_CHUNK * STRIDE;
    step(next_range, next_chunk);
    __syncthreads();  // every warp is done with the other buffer and with the last chunk's lse and Δ
    if (next_range < last_range) fetch_chunk(buffer ^ 1, next_range, next_chunk);
    cp_async_commit();
    for (int r = threadIdx.x; r < QUERY_CHUNK; r += blockDim.x) {
      const bool real = chunk + r < end;
      chunk_lse[r] = real ? lse[(long long)(chunk + r) * heads + head] * log2e : 0.0f;
      chunk_delta[r] = real ? delta[(long long)(chunk + r) * heads + head] : 0.0f;
    }
    cp_async_wait<1>();  // this thread's copies of this chunk have landed (the next chunk's may still run)
    __syncthreads();     // and every thread's
    // Skip when no row of the chunk sees any of the warp's keys (uniform over the warp).
    const int chunk_last = min(chunk + QUERY_CHUNK, end) - 1;
    const bool any = key_lo < key_hi && (causal ? key_lo <= chunk_last : key_lo < prefix_end && key_hi > prefix_start);
    if (!any) continue;

    float p[QUERY_CHUNK / 8][4], ds[QUERY_CHUNK / 8][4];
    product_transposed<HD, QUERY_CHUNK>(p, ks, warp * 16, qs, lane);   // Sᵀ
    product_transposed<HD, QUERY_CHUNK>(ds, vs, warp * 16, dos, lane);  // dPᵀ
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
    accumulate_product<HD, QUERY_CHUNK>(grad_v, p, dos, lane);
    accumulate_product<HD, QUERY_CHUNK>(grad_k, ds, qs, lane);
  }
  for_each_accumulator<HD>(grad_k, g, t, [&](int row, int c, float value, bool) {
    const int key = key_lo + row;
    if (key < key_hi && c < head_dim) dk_heads[key * q_stride + head * head_dim + c] = value * scale;
  });
  for_each_accumulator<HD>(grad_v, g, t, [&](int row, int c, float value, bool) {
    const int key = key_lo + row;
    if (key < key_hi && c < head_dim) dv_heads[key * q_stride + head * head_dim + c] = value;
  });
}

// dk[row, kv head, c] += Σ over the kv head's group of dk_heads[row, head, c], members in order (= with `overwrite`);
// likewise dv. `size` is
// rows · kv_heads · head_dim. A query head's columns follow its kv head's (head = kv head · group + member), so
// element e of dk sits at (e / head_dim · group + member) · head_dim + e % head_dim of dk_heads.
extern "C" __global__ void packed_attention_group_sum(const float* __restrict__ dk_heads, const float* __restrict__ dv_heads,
                                                      float* __restrict__ dk, float* __restrict__ dv, long long size, int group,
                                                      int head_dim, int overwrite) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < size; e += (long long)gridDim.x * blockDim.x) {
    const long long first = e / head_dim * group * head_dim + e % head_dim;
    float sum_k = 0.0f, sum_v = 0.0f;
    for (int member = 0; member < group; member++) {
      sum_k += dk_heads[first + (long long)member * head_dim];
      sum_v += dv_heads[first + (long long)member * head_dim];
    }
    dk[e] = overwrite ? sum_k : dk[e] + sum_k;
    dv[e] = overwrite ? sum_v : dv[e] + sum_v;
  }
}

// Instantiations per head size: the dq pass with two buffers of K/V tiles up to head size 64 and one at 128 (and
// two below, for the devices whose blocks may hold them); the dk/dv pass reads query chunks of 64 rows, or 32 at head
// size 128, where its two 16 × 128 accumulators per warp take 128 registers per thread. Its launch bounds say one
// block per SM suffices: with the block size alone, ptxas held sm_80's head-size-16 instantiation to 128 registers
// and spilled.
#define PACKED_ATTENTION(HD, QUERY_CHUNK, DQ_BUFFERS)                                                                   \
  extern "C" __global__ void __launch_bounds__(128) packed_attention_forward_hd##HD(                                    \
      const bf16* q, const bf16* k, const bf16* v, const int* tiles, float* out, bf16* out_bf16, float* lse, int heads, \
      int kv_heads, int head_dim) {                                                                                      \
    packed_attention_forward<HD>(q, k, v, tiles, out, out_bf16, lse, heads, kv_heads, head_dim);                        \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(128) packed_attention_backward_dq_hd##HD(                                \
      const bf16* q, const bf16* k, const bf16* v, const float* out, const float* dout, const bf16* dout_bf16,          \
      const float* lse, const int* tiles, float* dq, float* delta, int heads, int kv_heads, int head_dim, int overwrite) { \
    packed_attention_backward_dq<HD, DQ_BUFFERS>(q, k, v, out, dout, dout_bf16, lse, tiles, dq, delta, heads, kv_heads,  \
                                                 head_dim, overwrite);                                                   \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(128, 1) packed_attention_backward_dkdv_hd##HD(                              \
      const bf16* q, const bf16* k, const bf16* v, const bf16* dout, const float* lse, const float* delta,              \
      const int* key_tiles, const int* ranges, float* dk_heads, float* dv_heads, int heads, int kv_heads,               \
      int head_dim) {                                                                                                    \
    packed_attention_backward_dkdv<HD, QUERY_CHUNK>(q, k, v, dout, lse, delta, key_tiles, ranges, dk_heads, dv_heads,  \
                                                    heads, kv_heads, head_dim);                                          \
  }
PACKED_ATTENTION(16, 64, 2)
PACKED_ATTENTION(32, 64, 2)
PACKED_ATTENTION(64, 64, 2)
PACKED_ATTENTION(128, 32, 1)
extern "C" __global__ void __launch_bounds__(128) packed_attention_backward_dq_hd128_two_buffers(
    const bf16* q, const bf16* k, const bf16* v, const float* out, const float* dout, const bf16* dout_bf16, const float* lse,
    const int* tiles, float* dq, float* delta, int heads, int kv_heads, int head_dim, int overwrite) {
  packed_attention_backward_dq<128, 2>(q, k, v, out, dout, dout_bf16, lse, tiles, dq, delta, heads, kv_heads, head_dim, overwrite);
}
