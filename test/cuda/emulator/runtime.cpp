// The emulated device behind test/cuda/emulated-device.ts: host memory as device memory, kernel launches from a
// cuLaunchKernel-style parameter array, and a column-major reference of cublasGemmEx standing in for cuBLAS. Built as a shared library
// by the test, with the kernels (kernels.inc) and their launch table (registry.inc) it generates.
//
// Fibers: a minimal x86-64 context switch (callee-saved registers and the stack pointer; the kernels change no
// floating-point control state). A fiber waiting at a barrier is resumed only once every participant has arrived
// (the barrier's generation moved on), so warps that take different paths between __syncthreads stay correct.
//
// Order: a GPU promises no order between the blocks of a launch, nor between threads from one barrier to the next.
// So the blocks of each launch run in a random order, and in every round the runnable fibers are resumed in a random
// order, both drawn from one seeded generator (ART_EMULATOR_SEED, or emu_set_seed): a kernel whose result depends on
// either order (a race) gives different results from run to run and seed to seed, where a correct one gives the same
// bits. A fiber still runs from one barrier or warp exchange to the next without being interrupted: races within
// such a stretch are what compute-sanitizer's racecheck looks for on a GPU (scripts/cuda-gpu-check.sh).
#include "emulator.h"
#include "gemm-reference.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unordered_map>
#include <utility>
#include <vector>

emu_dim3 threadIdx, blockIdx;
emu_dim3 blockDim, gridDim;

extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

struct Barrier {
  unsigned expected = 0, arrived = 0, generation = 0;
};

struct AsyncCopy {
  void* shared;
  const void* global;
  unsigned src_bytes;
};

struct Fiber {
  void* sp = nullptr;
  emu_dim3 thread;
  bool done = false;
  Barrier* waiting = nullptr;
  unsigned waiting_generation = 0;
  // cp.async: the copies issued since the last commit, then the committed groups, oldest first.
  std::vector<AsyncCopy> uncommitted;
  std::vector<std::vector<AsyncCopy>> groups;
};

static constexpr size_t stack_bytes = 256 * 1024;
static std::vector<Fiber> fibers;
static std::vector<std::vector<char>> stacks;
static std::vector<Barrier> warp_barriers;
static Barrier block_barrier;
static std::vector<uint64_t> warp_slots;
static std::vector<float> dynamic_shared;
static void* scheduler_sp = nullptr;
static std::vector<unsigned> resume_order;

// splitmix64: small, and the same sequence on every platform for a seed.
static uint64_t random_state = 0;
static bool seeded = false;
static uint64_t next_random() {
  uint64_t z = (random_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static void ensure_seeded() {
  if (seeded) return;
  const char* env = std::getenv("ART_EMULATOR_SEED");
  random_state = env ? std::strtoull(env, nullptr, 10) : 1;
  seeded = true;
}
/** Fisher-Yates with the seeded generator. */
template <typename T>
static void shuffle(std::vector<T>& items) {
  for (size_t i = items.size(); i > 1; i--) std::swap(items[i - 1], items[next_random() % i]);
}
static unsigned current = 0;
static void (*current_call)(void**) = nullptr;
static void** current_params = nullptr;

static void arrive(Barrier& barrier) {
  Fiber& fiber = fibers[current];
  fiber.waiting = &barrier;
  fiber.waiting_generation = barrier.generation;
  if (++barrier.arrived == barrier.expected) {
    barrier.arrived = 0;
    barrier.generation++;
  }
  emu_switch(&fiber.sp, scheduler_sp);
}

void __syncthreads() { arrive(block_barrier); }
float* emu_dynamic_shared() { return dynamic_shared.data(); }

uint64_t emu_warp_exchange(uint64_t value, int source_lane) {
  const unsigned warp = current / 32;
  // Two slot banks, alternating per exchange: a lane can only publish its next value after every lane of the warp
  // has passed this exchange's barrier, so one barrier per shuffle suffices.
  const unsigned bank = warp_barriers[warp].generation & 1;
  warp_slots[(bank * fibers.size()) + current] = value;
  arrive(warp_barriers[warp]);
  return warp_slots[(bank * fibers.size()) + warp * 32 + unsigned(source_lane)];
}

// The fragments of mma.m16n8k16 with bf16 A and B and f32 C/D, as the PTX ISA lays them out over a warp: with
// g = lane / 4 and t = lane % 4, lane holds A[g][2t..2t+1], A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9]
// (four 32-bit registers, two bf16 each, the lower half first), B[2t..2t+1][g] and B[2t+8..2t+9][g] (two registers),
// and C/D[g][2t..2t+1], C/D[g+8][2t..2t+1] (four floats). Products of bf16 are exact in f32; the sum over k runs in f32
// in k order (a GPU's tensor cores add in an order of their own, within f32 rounding of this).
static std::vector<uint32_t> mma_a, mma_b;

void emu_mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  const unsigned warp = current / 32, lane = current % 32;
  const size_t base = size_t(warp) * 32;
  const unsigned bank = warp_barriers[warp].generation & 1;  // two banks, as in emu_warp_exchange
  const size_t stride = fibers.size();
  for (int i = 0; i < 4; i++) mma_a[(bank * stride + base + lane) * 4 + i] = a[i];
  for (int i = 0; i < 2; i++) mma_b[(bank * stride + base + lane) * 2 + i] = b[i];
  arrive(warp_barriers[warp]);
  auto bf16 = [](uint32_t bits) { return __bfloat162float(__nv_bfloat16{uint16_t(bits)}); };
  // A[row][k]: the lane and register holding it, then the half.
  auto a_at = [&](unsigned row, unsigned k) {
    const unsigned g = row % 8, t = (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    const uint32_t word = mma_a[(bank * stride + base + g * 4 + t) * 4 + reg];
    return bf16(k % 2 ? word >> 16 : word & 0xffff);
  };
  auto b_at = [&](unsigned k, unsigned col) {
    const unsigned t = (k % 8) / 2, reg = k >= 8 ? 1 : 0;
    const uint32_t word = mma_b[(bank * stride + base + col * 4 + t) * 2 + reg];
    return bf16(k % 2 ? word >> 16 : word & 0xffff);
  };
  const unsigned g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    const unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float sum = c[i];
    for (unsigned k = 0; k < 16; k++) sum += a_at(row, k) * b_at(k, col);
    d[i] = sum;
  }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane l publishes the address of row l % 8 of matrix l / 8 (eight
// b16, 16-byte aligned), waits for its warp, then takes register i from matrix i: row l / 4, elements 2(l % 4) and
// 2(l % 4) + 1 (the lower half first), or with .trans the transposed matrix's: column l / 4, rows 2(l % 4) and
// 2(l % 4) + 1.
void emu_ldmatrix_x4(uint32_t* r, const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) {
    std::fprintf(stderr, "emulator: ldmatrix needs each row's address 16-byte aligned\n");
    std::abort();
  }
  const unsigned warp = current / 32, lane = current % 32;
  const unsigned bank = warp_barriers[warp].generation & 1;  // two banks, as in emu_warp_exchange
  warp_slots[(bank * fibers.size()) + current] = reinterpret_cast<uintptr_t>(row);
  arrive(warp_barriers[warp]);
  auto element = [&](unsigned matrix, unsigned row_index, unsigned column) {
    const auto* address = reinterpret_cast<const uint16_t*>(warp_slots[(bank * fibers.size()) + warp * 32 + matrix * 8 + row_index]);
    return uint32_t(address[column]);
  };
  const unsigned q = lane / 4, pair = 2 * (lane % 4);
  for (unsigned i = 0; i < 4; i++) {
    r[i] = trans ? element(i, pair, q) | (element(i, pair + 1, q) << 16) : element(i, q, pair) | (element(i, q, pair + 1) << 16);
  }
}

static void land(const std::vector<AsyncCopy>& copies) {
  for (const AsyncCopy& copy : copies) {
    std::memcpy(copy.shared, copy.global, copy.src_bytes);
    std::memset(static_cast<char*>(copy.shared) + copy.src_bytes, 0, 16 - copy.src_bytes);
  }
}

void emu_cp_async(void* shared, const void* global, unsigned src_bytes) {
  if (src_bytes > 16 || reinterpret_cast<uintptr_t>(shared) % 16 != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(global) % 16 != 0)) {
    std::fprintf(stderr, "emulator: cp.async of 16 bytes needs both addresses 16-byte aligned and at most 16 source bytes\n");
    std::abort();
  }
  fibers[current].uncommitted.push_back({shared, global, src_bytes});
}

void emu_cp_async_commit() {
  Fiber& fiber = fibers[current];
  fiber.groups.push_back(std::move(fiber.uncommitted));
  fiber.uncommitted.clear();
}

void emu_cp_async_wait(int pending) {
  Fiber& fiber = fibers[current];
  while (fiber.groups.size() > size_t(pending)) {
    land(fiber.groups.front());
    fiber.groups.erase(fiber.groups.begin());
  }
}

static void fiber_main() {
  current_call(current_params);
  for (const auto& group : fibers[current].groups) land(group);
  land(fibers[current].uncommitted);
  fibers[current].done = true;
  emu_switch(&fibers[current].sp, scheduler_sp);
  std::abort();  // a finished fiber is never resumed
}

/** Runs one block: every fiber until it finishes, resuming waiters only once their barrier has opened. */
static void run_block(unsigned threads) {
  fibers.assign(threads, Fiber{});
  if (stacks.size() < threads) stacks.resize(threads, std::vector<char>(stack_bytes));
  warp_barriers.assign((threads + 31) / 32, Barrier{});
  for (unsigned w = 0; w < warp_barriers.size(); w++) warp_barriers[w].expected = std::min(32u, threads - w * 32);
  block_barrier = Barrier{threads, 0, 0};
  for (unsigned t = 0; t < threads; t++) {
    // Initial frame for emu_switch: six zeroed registers, then fiber_main as the return address, with the stack
    // aligned as after a call.
    auto top = reinterpret_cast<uintptr_t>(stacks[t].data() + stack_bytes) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<void**>(top - 64);
    for (int i = 0; i < 6; i++) frame[i] = nullptr;
    frame[6] = reinterpret_cast<void*>(&fiber_main);
    frame[7] = nullptr;
    fibers[t].sp = frame;
    fibers[t].thread = {t % blockDim.x, (t / blockDim.x) % blockDim.y, t / (blockDim.x * blockDim.y)};
  }
  unsigned finished = 0;
  resume_order.resize(threads);
  while (finished < threads) {
    bool progressed = false;
    for (unsigned t = 0; t < threads; t++) resume_order[t] = t;
    shuffle(resume_order);
    for (const unsigned t : resume_order) {
      Fiber& fiber = fibers[t];
      if (fiber.done) continue;
      if (fiber.waiting && fiber.waiting->generation == fiber.waiting_generation) continue;
      fiber.waiting = nullptr;
      current = t;
      threadIdx = fiber.thread;
      emu_switch(&scheduler_sp, fiber.sp);
      if (fiber.done) finished++;
      progressed = true;
    }
    if (!progressed) {
      std::fprintf(stderr, "emulator: deadlock in block (%u,%u,%u): threads wait at barriers others never reach\n",
                   blockIdx.x, blockIdx.y, blockIdx.z);
      std::abort();
    }
  }
}

#include "kernels.inc"

template <typename... A, std::size_t... I>
static void invoke(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
  kernel(*static_cast<A*>(params[I])...);
}
template <typename... A>
static void invoke(void (*kernel)(A...), void** params) {
  invoke(kernel, params, std::index_sequence_for<A...>{});
}

struct Entry { const char* name; void (*call)(void**); };
static const Entry registry[] = {
#include "registry.inc"
};

extern "C" {

/**
 * Device memory: each block in pages of its own, ending (256-byte aligned, as cuMemAlloc's) just before an
 * inaccessible guard page, so a kernel or GEMM that reads or writes past the end of its buffer faults at that access
 * (the stack in a debugger names the kernel) instead of corrupting the host's heap to fail somewhere unrelated later.
 */
static std::unordered_map<uint64_t, std::pair<void*, size_t>> mappings;
uint64_t emu_alloc(uint64_t bytes) {
  const size_t page = 4096, used = (bytes + 255) / 256 * 256, length = (used + page - 1) / page * page + page;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return 0;
  char* guard = static_cast<char*>(base) + length - page;
  if (mprotect(guard, page, PROT_NONE) != 0) { munmap(base, length); return 0; }
  const uint64_t address = reinterpret_cast<uint64_t>(guard - used);
  mappings[address] = {base, length};
  return address;
}
void emu_free(uint64_t address) {
  const auto found = mappings.find(address);
  if (found == mappings.end()) { std::fprintf(stderr, "emulator: free of 0x%llx, which is not a live block\n", (unsigned long long)address); std::abort(); }
  munmap(found->second.first, found->second.second);
  mappings.erase(found);
}

/** Returns 0, or -1 for an unknown kernel. */
int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned shared_bytes, void** params) {
  const Entry* entry = nullptr;
  for (const Entry& e : registry) if (std::string(e.name) == name) entry = &e;
  if (!entry) return -1;
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  const unsigned threads = bx * by * bz;
  dynamic_shared.assign(shared_bytes / 4 + 1, 0.0f);
  warp_slots.assign(2 * threads, 0);
  mma_a.assign(2 * threads * 4, 0);
  mma_b.assign(2 * threads * 2, 0);
  current_call = entry->call;
  current_params = params;
  ensure_seeded();
  std::vector<emu_dim3> blocks;
  for (unsigned z = 0; z < gz; z++) for (unsigned y = 0; y < gy; y++) for (unsigned x = 0; x < gx; x++) blocks.push_back({x, y, z});
  shuffle(blocks);
  for (const emu_dim3& block : blocks) {
    blockIdx = block;
    run_block(threads);
  }
  return 0;
}

/** Restarts the order generator from `seed` (what ART_EMULATOR_SEED sets at the first launch). */
void emu_set_seed(uint64_t seed) {
  random_state = seed;
  seeded = true;
}

// The reference cublasGemmEx (gemm-reference.h), fed the arguments Blas gives cuBLAS.
int emu_gemm_ex(int transa, int transb, int m, int n, int k, float alpha, uint64_t a, int a_type, int lda,
                uint64_t b, int b_type, int ldb, float beta, uint64_t c, int c_type, int ldc, int compute) {
  return reference_gemm_ex(transa, transb, m, n, k, alpha, reinterpret_cast<const void*>(a), a_type, lda,
                           reinterpret_cast<const void*>(b), b_type, ldb, beta, reinterpret_cast<void*>(c), c_type, ldc, compute);
}

}  // extern "C"
