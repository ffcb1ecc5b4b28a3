// Tensor-core attention tiles, FlashAttention-2 style, shared by the training attention (packed_attention.cu) and
// the engine's prefill (attention.cu): bf16 tiles in shared memory, products with mma.sync m16n8k16 (common.cuh)
// into f32 accumulators, the online softmax in f32 registers, and no score matrix in global memory.
//
// A block of 128 threads takes a query tile of at most 64 rows (16 per warp) and one query head. Shared tiles hold
// rows of HD + 8 bf16, HD the head size padded with zeros to a multiple of the mma's k of 16: the padding puts the
// eight rows an ldmatrix phase reads in different banks.
#pragma once
#include "common.cuh"

constexpr int FLASH_TILE_ROWS = 64;

// ---- mma fragments (layouts in common.cuh), by ldmatrix ------------------------------------------------------------

// A = tile[row0 .. row0+15][k0 .. k0+15] of a row-major bf16 tile: its four 8×8 quarters, lane l addressing row
// row0 + l % 16 at column k0 + 8 · (l / 16).
__device__ __forceinline__ void load_a(unsigned (&a)[4], const bf16* tile, int stride, int row0, int k0, int lane) {
  ldmatrix_x4<false>(a, tile + (row0 + lane % 16) * stride + k0 + 8 * (lane / 16));
}

// The B fragments of column blocks n0 .. n0+7 (b0) and n0+8 .. n0+15 (b1) for B[kk][n] = tile[n][k0 + kk]: the tile's
// rows are B's columns (as K in Q·Kᵀ), so each 8×8 matrix is read as it is stored; lane l addresses row
// n0 + l % 8 + 8 · (l / 16) at column k0 + 8 · (l / 8 % 2).
__device__ __forceinline__ void load_b_transposed_pair(unsigned (&b0)[2], unsigned (&b1)[2], const bf16* tile, int stride, int n0, int k0, int lane) {
  unsigned r[4];
  ldmatrix_x4<false>(r, tile + (n0 + lane % 8 + 8 * (lane / 16)) * stride + k0 + 8 * (lane / 8 % 2));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// The same for B[kk][n] = tile[k0 + kk][n] (as V in P·V): pairs along k are two rows, so each matrix is read
// transposed; lane l addresses row k0 + l % 8 + 8 · (l / 8 % 2) at column n0 + 8 · (l / 16).
__device__ __forceinline__ void load_b_pair(unsigned (&b0)[2], unsigned (&b1)[2], const bf16* tile, int stride, int k0, int n0, int lane) {
  unsigned r[4];
  ldmatrix_x4<true>(r, tile + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * stride + n0 + 8 * (lane / 16));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
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
// Each A fragment is loaded once and used for all N / 8 column blocks (k outside, n inside), the B fragments two
// blocks at a time, and each c[n] still sums its k-chunks in the same order.
template <int HD, int N>
__device__ __forceinline__ void product_transposed(float (&c)[N / 8][4], const bf16* a_tile, int row0, const bf16* b_tile, int lane) {
  constexpr int STRIDE = HD + 8;
  static_assert(N % 16 == 0, "column blocks in pairs");
#pragma unroll
  for (int n = 0; n < N / 8; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < HD / 16; kc++) {
    unsigned a[4];
    load_a(a, a_tile, STRIDE, row0, kc * 16, lane);
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      unsigned b0[2], b1[2];
      load_b_transposed_pair(b0, b1, b_tile, STRIDE, n * 8, kc * 16, lane);
      mma_bf16_16816(c[n], a, b0, c[n]);
      mma_bf16_16816(c[n + 1], a, b1, c[n + 1]);
    }
  }
}

// acc += P·tile for P (16 × K, accumulator fragments) and tile rows 0 .. K − 1 (rows of HD + 8): 16 × HD.
template <int HD, int K>
__device__ __forceinline__ void accumulate_product(float (&acc)[HD / 8][4], const float (&p)[K / 8][4], const bf16* tile, int lane) {
#pragma unroll
  for (int kc = 0; kc < K / 16; kc++) {
    unsigned a[4];
    accumulators_as_a(a, p[2 * kc], p[2 * kc + 1]);
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
      unsigned b0[2], b1[2];
      load_b_pair(b0, b1, tile, HD + 8, kc * 16, n * 8, lane);
      mma_bf16_16816(acc[n], a, b0, acc[n]);
      mma_bf16_16816(acc[n + 1], a, b1, acc[n + 1]);
    }
  }
}

// Hands each element of a warp's 16 × HD accumulators to store(row, column, value, low): this lane's elements are
// rows g (low) and g + 8 of the 16, columns n·8 + 2t and n·8 + 2t + 1.
template <int HD, typename Store>
__device__ __forceinline__ void for_each_accumulator(const float (&acc)[HD / 8][4], int g, int t, Store store) {
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int i = 0; i < 4; i++) store(i < 2 ? g : g + 8, n * 8 + 2 * t + (i & 1), acc[n][i], i < 2);
  }
}

// Every flash kernel's block: 4 warps of 16 query rows each.
constexpr int FLASH_THREADS = 128;

__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ bf16 to_bf16(bf16 x) { return x; }

// 16 bytes of a source row, read with one load: 4 f32 (rounded to bf16 on the way into the tile) or 8 bf16.
template <typename T> struct SourceVector;
template <> struct SourceVector<float> { static constexpr int WIDTH = 4; using Raw = float4; };
template <> struct SourceVector<bf16> { static constexpr int WIDTH = 8; using Raw = uint4; };

// A vector into a row of the tile as bf16: 4 f32 as two packed pairs (one 8-byte store), 8 bf16 as they are (16 bytes).
__device__ __forceinline__ void store_row_vector(bf16* at, const float4& x) {
  *reinterpret_cast<uint2*>(at) = uint2{pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w)};
}
__device__ __forceinline__ void store_row_vector(bf16* at, const uint4& x) { *reinterpret_cast<uint4*>(at) = x; }

// Whether every row's head columns are whole 16-byte vectors: head_dim, the row stride and the column a multiple of
// the vector's width, the source 16-byte aligned.
template <typename T>
__device__ __forceinline__ bool vectors_aligned(const T* source, long long row_stride, int column, int head_dim) {
  constexpr int WIDTH = SourceVector<T>::WIDTH;
  return head_dim % WIDTH == 0 && row_stride % WIDTH == 0 && column % WIDTH == 0 && reinterpret_cast<unsigned long long>(source) % 16 == 0;
}

// Rows 0 .. TILE − 1 of a shared tile (rows of HD + 8) from one head's columns of an f32 or bf16 tensor (f32 rounded
// to bf16): row r is source row row_of(r), or zeros where that is negative; columns past head_dim are zeros. With
// vectors_aligned, each thread reads 16-byte vectors, a batch of them issued back to back before any is stored: the
// loads are independent, so a batch waits for memory once, not once per vector. Else one element at a time.
template <int HD, int TILE, typename T, typename RowOf>
__device__ __forceinline__ void load_tile(bf16* tile, const T* source, long long row_stride, int column, int head_dim, RowOf row_of) {
  using Raw = typename SourceVector<T>::Raw;
  constexpr int WIDTH = SourceVector<T>::WIDTH, VECTORS = HD / WIDTH, PER_THREAD = TILE * VECTORS / FLASH_THREADS;
  static_assert(TILE * VECTORS % FLASH_THREADS == 0, "a tile's vectors spread evenly over the block");
  // At most 4 vectors (16 registers) in flight per thread: more would crowd the accumulators.
  constexpr int BATCH = PER_THREAD < 4 ? PER_THREAD : 4;
  static_assert(PER_THREAD % BATCH == 0, "whole batches");
  if (vectors_aligned(source, row_stride, column, head_dim)) {
    // One batch at a time (not unrolled): the registers of one batch, beside the accumulators.
#pragma unroll 1
    for (int batch = 0; batch < PER_THREAD; batch += BATCH) {
      Raw x[BATCH];
#pragma unroll
      for (int j = 0; j < BATCH; j++) {
        const int i = threadIdx.x + (batch + j) * FLASH_THREADS, r = i / VECTORS, c = i % VECTORS * WIDTH;
        const long long row = row_of(r);
        x[j] = row >= 0 && c < head_dim ? *reinterpret_cast<const Raw*>(source + row * row_stride + column + c) : Raw{};
      }
#pragma unroll
      for (int j = 0; j < BATCH; j++) {
        const int i = threadIdx.x + (batch + j) * FLASH_THREADS, r = i / VECTORS, c = i % VECTORS * WIDTH;
        store_row_vector(tile + r * (HD + 8) + c, x[j]);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < TILE * HD; i += FLASH_THREADS) {
    const int r = i / HD, c = i % HD;
    const long long row = row_of(r);
    tile[r * (HD + 8) + c] = row >= 0 && c < head_dim ? to_bf16(source[row * row_stride + column + c]) : to_bf16(0.0f);
  }
}

// ---- asynchronous copies (sm_80's cp.async): global to shared memory without registers, waited for by group -------
// 16 bytes into shared memory, the first src_bytes (16, or 0: all zeros) read from global memory.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, unsigned src_bytes) {
#ifdef ART_EMULATOR
  emu_cp_async(shared, global, src_bytes);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(shared)), "l"(global), "r"(src_bytes)
               : "memory");
#endif
}
// Closes the group of this thread's copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#ifdef ART_EMULATOR
  emu_cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most PENDING of this thread's groups are still in flight (the newest ones). Other threads' copies
// are theirs to wait for: a __syncthreads after every thread's wait makes a whole tile visible.
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
#ifdef ART_EMULATOR
  emu_cp_async_wait(PENDING);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// A key tile's rows into shared memory as load_tile lays them out, from a bf16 tensor: with vectors_aligned by cp.async,
// whose copies run on while the block computes (the caller commits them, waits and syncs before reading the tile), else
// by load_tile's element loads, done on return. The copies hold no registers, so a tile's are all in flight at once.
template <int HD, int TILE, typename RowOf>
__device__ __forceinline__ void fetch_tile(bf16* tile, const bf16* source, long long row_stride, int column, int head_dim, RowOf row_of) {
  if (!vectors_aligned(source, row_stride, column, head_dim)) {
    load_tile<HD, TILE>(tile, source, row_stride, column, head_dim, row_of);
    return;
  }
  constexpr int VECTORS = HD / 8, PER_THREAD = TILE * VECTORS / FLASH_THREADS;
  static_assert(TILE * VECTORS % FLASH_THREADS == 0, "a tile's vectors spread evenly over the block");
#pragma unroll 1  // issuing a copy does not wait, so a loop costs a few integer instructions; unrolled, ptxas spilled
  for (int j = 0; j < PER_THREAD; j++) {
    const int i = threadIdx.x + j * FLASH_THREADS, r = i / VECTORS, c = i % VECTORS * 8;
    const long long row = row_of(r);
    const bool real = row >= 0 && c < head_dim;
    cp_async_16(tile + r * (HD + 8) + c, real ? source + row * row_stride + column + c : source, real ? 16 : 0);
  }
}

// ---- the forward -----------------------------------------------------------------------------------------------------
// Keys: where a query tile's keys come from (packed training rows, or a slot of the KV cache). It provides
//   int count() const           the tile's keys (those of its last row)
//   int seen(int local) const   the keys row `local` of the tile sees (a row past the tile: those of its last row)
//   template <int HD, int KEY_TILE> void fetch(bf16* k_tile, bf16* v_tile, int key0) const
//                               keys key0 .. key0 + KEY_TILE − 1 into the shared tiles (fetch_tile: commit, wait and
//                               sync before reading), K and V in rows of HD + 8; zeros past count() and past
//                               head_dim, by every thread
// Rows see a prefix of the keys, so a key tile past a warp's last row is skipped whole.

// Each warp computes S = Q·Kᵀ for its 16 rows and a key tile, keeps each row's running max and sum (online softmax,
// base 2), and accumulates O += P·V with P rounded to bf16. out (and out_bf16, when not null) get O / sum, rows
// [first_row, first_row + rows) and the head's columns of [rows, heads · head_dim]; lse (when not null) gets
// log Σ exp(q·k/√d) at [row, head]. K and V come in two buffers: the copies of the next key tile run while the warps
// work on this one, so the tensor cores do not wait for memory between tiles. Dynamic shared memory: 64 + 4 · KEY_TILE
// rows of HD + 8 bf16 (Q, then two of K and of V).
template <int HD, int KEY_TILE, typename Q, typename Keys>
__device__ void flash_forward(const Q* __restrict__ q, const Keys& keys, int first_row, int rows, int head, int heads,
                              int head_dim, float* __restrict__ out, bf16* __restrict__ out_bf16, float* __restrict__ lse) {
  extern __shared__ float shared[];
  constexpr int STRIDE = HD + 8;
  bf16* qs = reinterpret_cast<bf16*>(shared);
  bf16* k_tiles = qs + FLASH_TILE_ROWS * STRIDE;  // two buffers of KEY_TILE rows
  bf16* v_tiles = k_tiles + 2 * KEY_TILE * STRIDE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const long long q_stride = (long long)heads * head_dim;

  const int count = keys.count();
  keys.template fetch<HD, KEY_TILE>(k_tiles, v_tiles, 0);
  cp_async_commit();
  load_tile<HD, FLASH_TILE_ROWS>(qs, q, q_stride, head * head_dim, head_dim,
                                 [&](int r) { return r < rows ? (long long)first_row + r : -1LL; });
  const int row0 = warp * 16 + g, row1 = row0 + 8;
  const int seen0 = keys.seen(row0), seen1 = keys.seen(row1), warp_seen = keys.seen(warp * 16 + 15);
  const float scale = rsqrtf((float)head_dim) * 1.4426950408889634f;  // scores in base 2: exp2f
  float max0 = -INFINITY, max1 = -INFINITY, sum0 = 0.0f, sum1 = 0.0f;
  float o[HD / 8][4] = {};

  for (int key0 = 0, buffer = 0; key0 < count; key0 += KEY_TILE, buffer ^= 1) {
    const bf16* ks = k_tiles + buffer * KEY_TILE * STRIDE;
    const bf16* vs = v_tiles + buffer * KEY_TILE * STRIDE;
    __syncthreads();  // every warp is done with the other buffer (the previous tile): it takes the next tile
    if (key0 + KEY_TILE < count) {
      keys.template fetch<HD, KEY_TILE>(k_tiles + (buffer ^ 1) * KEY_TILE * STRIDE, v_tiles + (buffer ^ 1) * KEY_TILE * STRIDE, key0 + KEY_TILE);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of this tile have landed (the next tile's may still run)
    __syncthreads();     // and every thread's
    // Every key of this tile lies past this warp's rows, or the warp has no rows (uniform over the warp).
    if (key0 >= warp_seen || warp * 16 >= rows) continue;

    float s[KEY_TILE / 8][4];
    product_transposed<HD, KEY_TILE>(s, qs, warp * 16, ks, lane);
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
    accumulate_product<HD, KEY_TILE>(o, s, vs, lane);
  }
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
  sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
  sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
  for_each_accumulator<HD>(o, g, t, [&](int row, int c, float value, bool low) {
    const int r = warp * 16 + row;
    if (r >= rows || c >= head_dim) return;
    const long long at = (first_row + r) * q_stride + head * head_dim + c;
    out[at] = value / (low ? sum0 : sum1);
    if (out_bf16) out_bf16[at] = __float2bfloat16_rn(out[at]);
  });
  if (lse && t == 0) {
    const float ln2 = 0.6931471805599453f;
    if (row0 < rows) lse[(long long)(first_row + row0) * heads + head] = (max0 + log2f(sum0)) * ln2;
    if (row1 < rows) lse[(long long)(first_row + row1) * heads + head] = (max1 + log2f(sum1)) * ln2;
  }
}
