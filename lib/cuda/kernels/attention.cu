// Causal grouped-query attention over a paged-by-slot KV cache, one kernel for prefill and decode.
//
// Cache layout (bf16), per layer: K then V, each [slots, kv_heads, max_positions, head_dim]. kv_write stores this
// pass's k and v rows first, so every query then reads its keys from the cache alone: query row i (sequence slot
// slots[i], position positions[i]) attends to cache positions 0..positions[i] of its slot. A decode pass (one row per
// slot) skips kv_write: attention_dplN takes the rows' k and v (k_new, v_new), reads the row's own key from them
// rounded as the cache holds it, and the block whose key split holds that position stores it (one launch fewer per
// layer; no other block of the pass reads it).
//
// attention_dplN: flash-attention style. A block owns one *tile* (up to a few consecutive rows of one slot, chosen
// by the host), one kv head, and one split of the key range. Its query vectors (tile rows × the q heads sharing that
// kv head) sit in shared memory; keys and values stream through shared memory in chunks of 32 positions, and each
// warp keeps, per query vector, the running max m, the running sum l and the unnormalised output o (online softmax),
// so scores are never materialised. Lanes split the 32 keys of a chunk for q·k (K rows padded by one float:
// conflict-free), then split the head dims for o += p·v.
// With one split the block writes the normalised output. With several (long contexts, few rows: decode), each
// split writes (m, l, o), and the last of a (tile, kv head)'s split blocks to finish (counted in split_counters)
// merges them: o = Σ e^(m_s - M) o_s / Σ e^(m_s - M) l_s, splits in order, so the bits do not depend on which block
// is last, and no merge kernel follows (decode passes are launch-bound). Whichever writes the output also writes it
// rounded to bf16 into out_bf16 when that is not null (o_proj's GEMM operand).
// DPL = ceil(head_dim / 32) dims per lane; instantiated for head_dim up to 32, 64, 96, 128, 256.
//
// attention_prefill_hdN: the prefill's long runs of rows (a slot's consecutive positions, at least the host's
// prefillMinRun of them) go to the tensor-core forward of flash.cuh instead, 64 rows and one query head per block,
// the keys loaded from the cache's bf16 rows as they are. Head sizes up to 128; decode rows and short runs stay on
// attention_dplN (and its key splits, which decode needs to fill the GPU).
#include "flash.cuh"

#define ATTN_WARPS 4
#define ATTN_CHUNK 32
// Query vectors per block: tile rows × group size <= ATTN_QMAX; each warp owns ATTN_QMAX / ATTN_WARPS of them.
#define ATTN_QMAX 16
#define ATTN_QPW (ATTN_QMAX / ATTN_WARPS)

// k, v: [rows, kv_heads·hd] f32 -> cache (bf16) at (slot, position).
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v, bf16* __restrict__ cache_k,
                                    bf16* __restrict__ cache_v, const int* __restrict__ slots,
                                    const int* __restrict__ positions, int kv_heads, int head_dim, int max_positions) {
  const int row = blockIdx.x;
  const long long slot = slots[row], position = positions[row];
  for (int t = threadIdx.x; t < kv_heads * head_dim; t += blockDim.x) {
    const int head = t / head_dim, j = t % head_dim;
    const long long at = ((slot * kv_heads + head) * max_positions + position) * head_dim + j;
    cache_k[at] = __float2bfloat16_rn(k[(long long)row * kv_heads * head_dim + t]);
    cache_v[at] = __float2bfloat16_rn(v[(long long)row * kv_heads * head_dim + t]);
  }
}

// Copies positions 0..count-1 of slot `from` into slot `to` in every layer's K and V, in one launch. The cache is
// `planes` (layers × K|V) of [slots, kv_heads, max_positions, head_dim], so each (plane, kv head) pair is one
// contiguous run of count·head_dim elements; the grid strides over all runs at once.
extern "C" __global__ void kv_copy_slot(bf16* cache, int planes, int slots, int kv_heads, int max_positions, int head_dim,
                                        int from, int to, int count) {
  const long long run = (long long)count * head_dim, head_elements = (long long)max_positions * head_dim;
  const long long slot_elements = kv_heads * head_elements, plane_elements = slots * slot_elements;
  const long long n = run * planes * kv_heads;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long pair = i / run, plane = pair / kv_heads, head = pair % kv_heads;
    const long long at = plane * plane_elements + head * head_elements + i % run;
    cache[at + to * slot_elements] = cache[at + from * slot_elements];
  }
}

// Keys chunk .. chunk + ATTN_CHUNK − 1 of one slot's kv head into s_k (rows of HD + 1) and s_v (rows of HD) as f32,
// zeros from key_end and past head_dim; the key at fresh_position (a decode row's own, maybe not in the cache yet)
// from k_fresh / v_fresh, rounded to bf16 as the cache holds it. With head_dim a multiple of 8 each thread reads
// 16-byte vectors of 8 bf16, a batch of K's and V's issued back to back before any is stored, so a chunk waits for
// memory about once per batch (a loop that stored each element before loading the next waited once per element).
template <int HD>
__device__ __forceinline__ void load_key_chunk(float* s_k, float* s_v, const bf16* k_base, const bf16* v_base, int chunk, int key_end,
                                               int head_dim, int fresh_position, const float* k_fresh, const float* v_fresh) {
  const auto cached = [](float x) { return __bfloat162float(__float2bfloat16_rn(x)); };
  const auto put = [&](int key, int j, float k_value, float v_value) {
    if (chunk + key == fresh_position && j < head_dim) k_value = cached(k_fresh[j]), v_value = cached(v_fresh[j]);
    s_k[key * (HD + 1) + j] = k_value;
    s_v[key * HD + j] = v_value;
  };
  constexpr int THREADS = ATTN_WARPS * 32, VECTORS = HD / 8, PER_THREAD = ATTN_CHUNK * VECTORS / THREADS;
  static_assert(ATTN_CHUNK * VECTORS % THREADS == 0, "a chunk's vectors spread evenly over the block");
  // Two vectors of K and two of V in flight per thread at most: registers for more would crowd the accumulators.
  constexpr int BATCH = PER_THREAD % 2 == 0 ? 2 : 1;
  static_assert(PER_THREAD % BATCH == 0, "whole batches");
  const bool aligned = head_dim % 8 == 0 && reinterpret_cast<unsigned long long>(k_base) % 16 == 0
                    && reinterpret_cast<unsigned long long>(v_base) % 16 == 0;
  if (aligned) {
#pragma unroll 1
    for (int batch = 0; batch < PER_THREAD; batch += BATCH) {
      uint4 k[BATCH], v[BATCH];
#pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const int t = threadIdx.x + (batch + b) * THREADS, key = t / VECTORS, j = t % VECTORS * 8, position = chunk + key;
        const bool load = position < key_end && j < head_dim && position != fresh_position;
        k[b] = load ? *reinterpret_cast<const uint4*>(k_base + (long long)position * head_dim + j) : uint4{};
        v[b] = load ? *reinterpret_cast<const uint4*>(v_base + (long long)position * head_dim + j) : uint4{};
      }
#pragma unroll
      for (int b = 0; b < BATCH; b++) {
        const int t = threadIdx.x + (batch + b) * THREADS, key = t / VECTORS, j = t % VECTORS * 8;
        const unsigned kw[4] = {k[b].x, k[b].y, k[b].z, k[b].w}, vw[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
#pragma unroll
        for (int w = 0; w < 4; w++) {
          // A bf16's bits are the high half of the f32 it widens to.
          put(key, j + 2 * w, __uint_as_float(kw[w] << 16), __uint_as_float(vw[w] << 16));
          put(key, j + 2 * w + 1, __uint_as_float(kw[w] & 0xffff0000u), __uint_as_float(vw[w] & 0xffff0000u));
        }
      }
    }
    return;
  }
  for (int t = threadIdx.x; t < ATTN_CHUNK * HD; t += THREADS) {
    const int key = t / HD, j = t % HD, position = chunk + key;
    const bool load = position < key_end && j < head_dim && position != fresh_position;
    put(key, j, load ? __bfloat162float(k_base[(long long)position * head_dim + j]) : 0.0f,
        load ? __bfloat162float(v_base[(long long)position * head_dim + j]) : 0.0f);
  }
}

// One (row, head, dim) of the merged output: the splits' partials in order (a split past the row's position saw no
// keys: m = -inf, skipped). The partials come from other blocks of this launch, so they are read past the L1 cache.
__device__ __forceinline__ float merged_split_value(const float* partial_o, const float* partial_ml, long long partial,
                                                    long long stride, int splits, int head_dim, int j) {
  float max_m = -INFINITY;
  for (int s = 0; s < splits; s++) max_m = fmaxf(max_m, __ldcg(partial_ml + (s * stride + partial) * 2));
  float total_l = 0.0f, acc = 0.0f;
  for (int s = 0; s < splits; s++) {
    const float m = __ldcg(partial_ml + (s * stride + partial) * 2);
    if (m == -INFINITY) continue;
    const float w = __expf(m - max_m);
    total_l += w * __ldcg(partial_ml + (s * stride + partial) * 2 + 1);
    acc += w * __ldcg(partial_o + (s * stride + partial) * head_dim + j);
  }
  return acc / total_l;
}

// Called by every split block of a (tile, kv head) once its partials are written: the last one to arrive merges all
// splits' partials for the tile's rows and the group's heads, then resets its counter for the next launch (a CUDA
// graph replays this one). The fence before counting makes a block's partials visible to whichever block is last.
__device__ __noinline__ void merge_if_last_split(const float* partial_o, const float* partial_ml, const int* tile_offset, int* split_counters,
                                    int first_row, int rows, int group, int heads, int kv_head, int head_dim, int partial_rows,
                                    float* out, bf16* out_bf16, float* shared) {
  int* last = reinterpret_cast<int*>(shared);  // the queries' shared memory, no longer read
  int* counter = split_counters + blockIdx.x * gridDim.y + blockIdx.y;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) *last = atomicAdd(counter, 1) == (int)gridDim.z - 1;
  __syncthreads();
  if (!*last) return;
  __threadfence();
  const long long stride = (long long)partial_rows * heads;
  for (int t = threadIdx.x; t < rows * group * head_dim; t += blockDim.x) {
    const int vec = t / head_dim, j = t % head_dim;
    const int row = first_row + vec / group, head = kv_head * group + vec % group;
    const long long partial = (long long)(tile_offset[blockIdx.x] + vec / group) * heads + head;
    const float value = merged_split_value(partial_o, partial_ml, partial, stride, gridDim.z, head_dim, j);
    out[((long long)row * heads + head) * head_dim + j] = value;
    if (out_bf16) out_bf16[((long long)row * heads + head) * head_dim + j] = __float2bfloat16_rn(value);
  }
  if (threadIdx.x == 0) *counter = 0;
}

// tile_start/tile_rows: the rows of each tile (consecutive batch rows of one slot). Grid: (tiles, kv_heads, splits).
// split_len: keys per split (a multiple of ATTN_CHUNK). partial_* used only when gridDim.z > 1, over the tiles' rows
// only (a pass's prefill rows go to the tensor-core kernel): partial_o [splits, partial_rows, heads, hd], partial_ml
// [splits, partial_rows, heads, 2], a tile's rows from tile_offset[tile] (the rows of the tiles before it).
template <int DPL>
__device__ void attention(const float* __restrict__ q, bf16* __restrict__ cache_k, bf16* __restrict__ cache_v,
                          const int* __restrict__ slots, const int* __restrict__ positions,
                          const int* __restrict__ tile_start, const int* __restrict__ tile_rows, int heads, int kv_heads,
                          int head_dim, int max_positions, int split_len, float* __restrict__ out,
                          bf16* __restrict__ out_bf16, float* __restrict__ partial_o, float* __restrict__ partial_ml,
                          int partial_rows, const float* __restrict__ k_new, const float* __restrict__ v_new,
                          const int* __restrict__ tile_offset, int* __restrict__ split_counters) {
  extern __shared__ float shared[];
  constexpr int HD = DPL * 32;
  float* s_q = shared;                                   // [ATTN_QMAX][HD]
  float* s_k = s_q + ATTN_QMAX * HD;                     // [ATTN_CHUNK][HD + 1]
  float* s_v = s_k + ATTN_CHUNK * (HD + 1);              // [ATTN_CHUNK][HD]

  const int tile = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z;
  const int group = heads / kv_heads;
  const int first_row = tile_start[tile], rows = tile_rows[tile];
  const int vectors = rows * group;
  const long long slot = slots[first_row];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float scale = rsqrtf((float)head_dim);

  int last_position = 0;
  for (int r = 0; r < rows; r++) last_position = max(last_position, positions[first_row + r]);
  const int key_begin = split * split_len;
  const int key_end = min(last_position + 1, key_begin + split_len);

  // Query vector v = r * group + g is row first_row + r, head kv_head * group + g.
  for (int t = threadIdx.x; t < ATTN_QMAX * HD; t += blockDim.x) {
    const int vec = t / HD, j = t % HD;
    float value = 0.0f;
    if (vec < vectors && j < head_dim) {
      const int row = first_row + vec / group, head = kv_head * group + vec % group;
      value = q[((long long)row * heads + head) * head_dim + j] * scale;
    }
    s_q[t] = value;
  }

  float m[ATTN_QPW], l[ATTN_QPW], o[ATTN_QPW][DPL];
  int my_position[ATTN_QPW];
#pragma unroll
  for (int i = 0; i < ATTN_QPW; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    const int vec = warp + i * ATTN_WARPS;
    my_position[i] = vec < vectors ? positions[first_row + vec / group] : -1;
#pragma unroll
    for (int d = 0; d < DPL; d++) o[i][d] = 0.0f;
  }

  bf16* k_base = cache_k + (slot * kv_heads + kv_head) * (long long)max_positions * head_dim;
  bf16* v_base = cache_v + (slot * kv_heads + kv_head) * (long long)max_positions * head_dim;
  // Decode without kv_write (k_new set, one row per tile): the row's own key and value, and whether this block (the
  // split holding its position) stores them.
  const int fresh_position = k_new ? last_position : -1;
  const float* k_fresh = k_new ? k_new + ((long long)first_row * kv_heads + kv_head) * head_dim : nullptr;
  const float* v_fresh = k_new ? v_new + ((long long)first_row * kv_heads + kv_head) * head_dim : nullptr;
  if (k_new && key_begin <= fresh_position && fresh_position < key_begin + split_len) {
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
      k_base[(long long)fresh_position * head_dim + j] = __float2bfloat16_rn(k_fresh[j]);
      v_base[(long long)fresh_position * head_dim + j] = __float2bfloat16_rn(v_fresh[j]);
    }
  }
  for (int chunk = key_begin; chunk < key_end; chunk += ATTN_CHUNK) {
    __syncthreads();  // the previous chunk (and the q load) is complete everywhere
    // The row's own key comes from k_new (another block's thread may be storing it in the cache meanwhile).
    load_key_chunk<HD>(s_k, s_v, k_base, v_base, chunk, key_end, head_dim, fresh_position, k_fresh, v_fresh);
    __syncthreads();
    const int key = chunk + lane;
#pragma unroll
    for (int i = 0; i < ATTN_QPW; i++) {
      if (my_position[i] < chunk) continue;  // warp-uniform: causal mask excludes the whole chunk
      const float* qv = s_q + (warp + i * ATTN_WARPS) * HD;
      float score = -INFINITY;
      if (key < key_end && key <= my_position[i]) {
        float dot = 0.0f;
#pragma unroll 8
        for (int j = 0; j < HD; j++) dot += qv[j] * s_k[lane * (HD + 1) + j];
        score = dot;
      }
      const float m_new = fmaxf(m[i], warp_max(score));
      const float p = __expf(score - m_new);  // 0 for masked keys
      const float correction = __expf(m[i] - m_new);
      l[i] = l[i] * correction + warp_sum(p);
#pragma unroll
      for (int d = 0; d < DPL; d++) o[i][d] *= correction;
      for (int kk = 0; kk < ATTN_CHUNK; kk++) {
        const float pk = __shfl_sync(0xffffffffu, p, kk);
#pragma unroll
        for (int d = 0; d < DPL; d++) o[i][d] += pk * s_v[kk * HD + lane + 32 * d];
      }
      m[i] = m_new;
    }
  }

#pragma unroll
  for (int i = 0; i < ATTN_QPW; i++) {
    const int vec = warp + i * ATTN_WARPS;
    if (vec >= vectors) continue;
    const int row = first_row + vec / group, head = kv_head * group + vec % group;
    const long long at = ((long long)row * heads + head) * head_dim;
    if (gridDim.z == 1) {
      const float inv_l = 1.0f / l[i];
#pragma unroll
      for (int d = 0; d < DPL; d++) {
        if (lane + 32 * d >= head_dim) continue;
        const float value = o[i][d] * inv_l;
        out[at + lane + 32 * d] = value;
        if (out_bf16) out_bf16[at + lane + 32 * d] = __float2bfloat16_rn(value);
      }
    } else {
      const long long partial = ((long long)split * partial_rows + tile_offset[tile] + vec / group) * heads + head;
#pragma unroll
      for (int d = 0; d < DPL; d++)
        if (lane + 32 * d < head_dim) partial_o[partial * head_dim + lane + 32 * d] = o[i][d];
      if (lane == 0) {
        partial_ml[partial * 2] = m[i];
        partial_ml[partial * 2 + 1] = l[i];
      }
    }
  }
  if (gridDim.z > 1) merge_if_last_split(partial_o, partial_ml, tile_offset, split_counters, first_row, rows, group, heads,
                                         kv_head, head_dim, partial_rows, out, out_bf16, shared);
}

#define ATTENTION_ENTRY(DPL)                                                                                         \
  extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) attention_dpl##DPL(                                  \
      const float* q, bf16* ck, bf16* cv, const int* slots, const int* positions, const int* tile_start,             \
      const int* tile_rows, int heads, int kv_heads, int head_dim, int max_positions, int split_len, float* out,     \
      bf16* out_bf16, float* partial_o, float* partial_ml, int partial_rows, const float* k_new,                    \
      const float* v_new, const int* tile_offset, int* split_counters) {                                             \
    attention<DPL>(q, ck, cv, slots, positions, tile_start, tile_rows, heads, kv_heads, head_dim, max_positions,    \
                   split_len, out, out_bf16, partial_o, partial_ml, partial_rows, k_new, v_new, tile_offset,        \
                   split_counters);                                                                                  \
  }
ATTENTION_ENTRY(1)
ATTENTION_ENTRY(2)
ATTENTION_ENTRY(3)
ATTENTION_ENTRY(4)
ATTENTION_ENTRY(8)

// A prefill tile's keys (flash.cuh's Keys): positions 0 .. of one slot and kv head of the cache, as bf16 rows.
struct CacheKeys {
  const bf16* k;  // the slot's and kv head's [max_positions, head_dim]
  const bf16* v;
  int head_dim, first_position, rows;
  __device__ int seen(int local) const { return first_position + min(local, rows - 1) + 1; }
  __device__ int count() const { return first_position + rows; }
  template <int HD, int KEY_TILE>
  __device__ void fetch(bf16* k_tile, bf16* v_tile, int key0) const {
    const int keys = count();
    const auto row_of = [&](int r) { return key0 + r < keys ? (long long)(key0 + r) : -1LL; };
    fetch_tile<HD, KEY_TILE>(k_tile, k, head_dim, 0, head_dim, row_of);
    fetch_tile<HD, KEY_TILE>(v_tile, v, head_dim, 0, head_dim, row_of);
  }
};

// tiles: per tile {first row, rows (at most 64), slot, first position}; row first_row + r is at position
// first_position + r. Grid: (tiles, heads). Block: 128. Dynamic shared memory: flash_forward's.
template <int HD>
__device__ void attention_prefill(const float* __restrict__ q, const bf16* __restrict__ cache_k, const bf16* __restrict__ cache_v,
                                  const int* __restrict__ tiles, float* __restrict__ out, bf16* __restrict__ out_bf16,
                                  int heads, int kv_heads, int head_dim, int max_positions) {
  const int* tile = tiles + 4 * blockIdx.x;
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads);
  const long long base = ((long long)tile[2] * kv_heads + kv_head) * max_positions * head_dim;
  const CacheKeys keys{cache_k + base, cache_v + base, head_dim, tile[3], tile[1]};
  flash_forward<HD, FLASH_TILE_ROWS>(q, keys, tile[0], tile[1], head, heads, head_dim, out, out_bf16, nullptr);
}

#define ATTENTION_PREFILL(HD)                                                                                           \
  extern "C" __global__ void __launch_bounds__(128) attention_prefill_hd##HD(                                           \
      const float* q, const bf16* cache_k, const bf16* cache_v, const int* tiles, float* out, bf16* out_bf16, int heads, \
      int kv_heads, int head_dim, int max_positions) {                                                                   \
    attention_prefill<HD>(q, cache_k, cache_v, tiles, out, out_bf16, heads, kv_heads, head_dim, max_positions);          \
  }
ATTENTION_PREFILL(16)
ATTENTION_PREFILL(32)
ATTENTION_PREFILL(64)
ATTENTION_PREFILL(128)
