/**
 * The three matrix products every CPU op is built from, and who computes them. `portableGemm` is matmul.ts: the
 * readable JavaScript reference, the same numbers on every machine. `systemGemm` hands the same products to the
 * machine's optimised BLAS through the FFI (`cblas_sgemm`: OpenBLAS on Linux, Accelerate on macOS, MKL or BLIS where
 * installed), which runs at several times the speed of anything WebAssembly can express (AVX2/AVX-512 FMA, cache
 * blocking, packed panels) and on all cores. Its rounding depends on the library and the CPU's kernels, so results
 * match the portable products to float rounding, not bit for bit; for a given library, machine and thread count they
 * are deterministic. The thread count can change the rounding: OpenBLAS splits a product with a small output and a
 * long sum (a weight gradient, summed over thousands of tokens) along the sum, so training's numbers depend on it.
 *
 * Choosing: `ART_CPU_BLAS` is `auto` (the default: the system BLAS when one opens, else portable), `portable`,
 * `system` (an error when none opens) or the path of a library exporting `cblas_sgemm`. `ART_CPU_THREADS` sets the
 * BLAS's thread count (default: the machine's cores); backends with different counts may share a process.
 */
import * as os from "node:os";
import { ArtError } from "../../core/errors.ts";
import { type NativeArg, type NativeFunction, type NativeSignature, openLibrary } from "../../core/ffi.ts";
import { hostMemory } from "../../core/host-memory.ts";
import { matmulNNAccumulate, matmulNT, matmulTNAccumulate, type MatmulOptions, type TNStrides, weightedRowSum } from "./matmul.ts";
import { checkThreadCount } from "./matmul-workers.ts";
import type { WasmMatmul } from "./wasm-matmul.ts";

export interface Gemm {
  /** Who computes: "portable (JavaScript)" or e.g. "system BLAS libopenblas.so.0 (OpenBLAS Haswell kernels), 2 threads". */
  readonly description: string;
  /** The system library, or null for the portable products. */
  readonly library: string | null;
  readonly threads: number;
  /** out[n, m] = (accumulate ? out : 0) + alpha · x[n, k] · w[m, k]ᵀ (strides as in MatmulOptions). */
  nt(x: Float32Array, w: Float32Array, n: number, k: number, m: number, out: Float32Array, options?: MatmulOptions): void;
  /** out[n, m] += a[n, k] · b[k, m] */
  nnAccumulate(out: Float32Array, a: Float32Array, b: Float32Array, n: number, k: number, m: number): void;
  /** out[m, k] += a[n, m]ᵀ · b[n, k] (rows `strides` apart; packed by default) */
  tnAccumulate(out: Float32Array, a: Float32Array, b: Float32Array, n: number, m: number, k: number, strides?: TNStrides): void;
  /** out[j] = Σ_t weights[t] · rows[t · stride + j], t < count, j < width (a decoding row's p·v) */
  weightedRowSum(weights: Float32Array, rows: Float32Array, count: number, width: number, stride: number, out: Float32Array): void;
}

/**
 * The portable products. With the WebAssembly kernel (CpuBackend passes its own), every product of 4 rows or more runs
 * there, on `threads` threads, with the JavaScript reference's bits (matmul.wat's float64 sums), and so does decoding's
 * attention over a KV cache kept in the kernel's memory; other products of 1–3 rows stay in JavaScript, where copying
 * an operand into the kernel's memory would cost more than the product.
 */
export function portableGemm(threads = 1, kernel: WasmMatmul | null = null): Gemm {
  if (!kernel) return { description: "portable (JavaScript)", library: null, threads, nt: matmulNT, nnAccumulate: matmulNNAccumulate, tnAccumulate: matmulTNAccumulate, weightedRowSum };
  return {
    description: `portable (WebAssembly SIMD on ${threads} thread${threads === 1 ? "" : "s"})`,
    library: null,
    threads,
    nt: (x, w, n, k, m, out, options) => {
      if (!kernel.ntArrays(x, w, n, k, m, out, options)) matmulNT(x, w, n, k, m, out, options);
    },
    nnAccumulate: (out, a, b, n, k, m) => {
      if (!kernel.nnAccumulateArrays(out, a, b, n, k, m)) matmulNNAccumulate(out, a, b, n, k, m);
    },
    tnAccumulate: (out, a, b, n, m, k, strides) => {
      if (!kernel.tnAccumulateArrays(out, a, b, n, m, k, strides)) matmulTNAccumulate(out, a, b, n, m, k, strides);
    },
    weightedRowSum: (weights, rows, count, width, stride, out) => {
      if (!kernel.weightedRowSumArrays(weights, rows, count, width, stride, out)) weightedRowSum(weights, rows, count, width, stride, out);
    },
  };
}

export type CpuBlasChoice = "auto" | "portable" | "system" | (string & {});

export interface GemmChoice {
  gemm: Gemm;
  /** Why this one: the library opened, or why none did. */
  reason: string;
}

/**
 * Bytes of W per product when `x Wᵀ` has few rows (decoding's products on the BLAS: a linear layer's from 5 rows, and
 * the LoRA and attention products; a linear layer's 1 to 4 rows run on matmul.wat's linearF32, CpuBackend's
 * #decodeLinear), by row count: each slice of W is read from memory once and stays in cache while the library packs
 * and multiplies it, where one product over the whole of W streams it through cache in the library's own blocking.
 * Measured on the 20M model's seven products per layer (8 layers, one thread, OpenBLAS 0.3.21): against one product
 * each, 1.58× faster at 1 row, 1.51× at 4, 1.38× at 8, 1.25× at 12; none from 16 rows. 256 KiB slices beat per-row matrix-vector products too (1.04× at 1 row, 1.26× at 4).
 */
function sliceBytes(rows: number): number {
  return rows <= 4 ? 256 << 10 : rows <= 12 ? 128 << 10 : Infinity;
}

// CBLAS's enum values (cblas.h).
const ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112;

export const cblasSignatures: Record<string, NativeSignature> = {
  // void cblas_sgemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
  cblas_sgemm: { result: "void", args: ["i32", "i32", "i32", "i32", "i32", "i32", "f32", "buffer", "i32", "buffer", "i32", "f32", "buffer", "i32"] },
  // void cblas_sgemv(order, trans, M, N, alpha, A, lda, x, incx, beta, y, incy)
  cblas_sgemv: { result: "void", args: ["i32", "i32", "i32", "i32", "f32", "buffer", "i32", "buffer", "i32", "f32", "buffer", "i32"] },
  // Each library's own thread setting; a library has at most one of them.
  openblas_set_num_threads: { result: "void", args: ["i32"], optional: true },
  MKL_Set_Num_Threads: { result: "void", args: ["i32"], optional: true },
  bli_thread_set_num_threads: { result: "void", args: ["i64"], optional: true },
  // const char* openblas_get_corename(void): the CPU whose kernels OpenBLAS chose, for the description.
  openblas_get_corename: { result: "pointer", args: [], optional: true },
};

/** Where optimised BLAS libraries are, most common first; the loader resolves sonames. */
export function blasCandidates(platform = process.platform): string[] {
  if (platform === "darwin") return ["/System/Library/Frameworks/Accelerate.framework/Accelerate"];
  if (platform === "win32") return ["libopenblas.dll", "mkl_rt.2.dll"];
  // libopenblasp: Fedora's pthread build; libblas.so.3 is left out: it is the unoptimised reference BLAS unless
  // the distribution's alternatives point it at one of these.
  return ["libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so", "libmkl_rt.so.2", "libmkl_rt.so", "libblis.so.4"];
}

/** The products `ART_CPU_BLAS` asks for, else "auto". */
export function defaultBlasChoice(env: Record<string, string | undefined> = process.env): CpuBlasChoice {
  return env.ART_CPU_BLAS || "auto";
}

/** The thread count `ART_CPU_THREADS` asks for, else the machine's cores. */
export function defaultCpuThreads(env: Record<string, string | undefined> = process.env): number {
  const text = env.ART_CPU_THREADS;
  if (text === undefined || text === "") return os.availableParallelism();
  const threads = Number(text);
  if (!Number.isInteger(threads) || threads < 1) {
    throw new ArtError("bad_cpu_threads", `ART_CPU_THREADS=${JSON.stringify(text)} is not a positive whole number of threads`);
  }
  return threads;
}

/**
 * The products a CPU backend uses. `choice` "auto" never throws (a library that does not open is the reason given
 * for the portable products); "system" and a path throw ArtError("cpu_blas_unavailable") naming what was tried.
 */
export function chooseGemm(choice: CpuBlasChoice = defaultBlasChoice(), threads = defaultCpuThreads()): GemmChoice {
  if (choice === "portable") return { gemm: portableGemm(threads), reason: "portable products asked for" };
  const explicit = choice !== "auto" && choice !== "system";
  const failures: string[] = [];
  for (const path of explicit ? [choice] : blasCandidates()) {
    try {
      return { gemm: systemGemm(path, threads), reason: `opened ${path}` };
    } catch (error) {
      failures.push(`${path}: ${(error as Error).message}`);
    }
  }
  const reason = `no system BLAS opened (${failures.join("; ")})`;
  if (choice === "auto") return { gemm: portableGemm(threads), reason };
  throw new ArtError("cpu_blas_unavailable", `${reason}. Install one (Debian/Ubuntu: apt-get install libopenblas0-pthread), ` +
    `name its file in ART_CPU_BLAS, or use ART_CPU_BLAS=portable`);
}

/**
 * Products of fewer multiply-adds run on one thread whatever the Gemm's count. OpenBLAS shares out even a small
 * product, and a thread that has had work spins (sched_yield) for a while waiting for more, competing with the
 * caller's own work between products. Measured on this project's 2-core machine (OpenBLAS 0.3.21), each product
 * alone: a second thread made 0.6M and 3M multiply-adds 1.5× and 1.2× slower, lost 6% at 6–9M with a 64-long sum
 * but gained 1.2–1.3× from 4.7M with a 384-long one, and 1.6–1.9× from 19M. In a whole run the spinning costs more
 * than these: the tic-tac-toe demo (a 64-wide model, whose products are nearly all under 20M) took 41–44 s on 2
 * threads, 32.5 s on one and 31 s with this bound (runs interleaved); with 2^22, no gain (40–43 s). The 20M
 * model's prefill and decode on 2 threads did not change beyond noise (their products are larger, or its decode's
 * slices all smaller). bench/cpu-threads.ts measures both sides of it.
 */
const SHARED_PRODUCT_MULTIPLY_ADDS = 1 << 23;

/** The kernels an OpenBLAS reports using ("Haswell", "SkylakeX", …), or null for another library. */
function openblasCore(symbols: Record<string, NativeFunction>): string | null {
  if (!symbols.openblas_get_corename) return null;
  try {
    return hostMemory().readCString(symbols.openblas_get_corename() as bigint) || null;
  } catch {
    return null;  // no libc.so.6 to read the name with (musl): the description goes without it
  }
}

/** Bindings by path: a backend per model or test binds each library once. */
const opened = new Map<string, Record<string, NativeFunction>>();
const threadsApplied = new Map<string, number>();

function bindings(path: string): Record<string, NativeFunction> {
  let symbols = opened.get(path);
  if (!symbols) {
    symbols = withEnvironment({ OPENBLAS_THREAD_TIMEOUT: OPENBLAS_IDLE_SPIN }, () => openLibrary(path, cblasSignatures).symbols);
    opened.set(path, symbols);
  }
  return symbols;
}

/**
 * How long an OpenBLAS thread spins for more work after a product before it sleeps: 2^20 cycles (about 0.4 ms), where
 * OpenBLAS's default is 2^28 (about 0.1 s). A spinning thread takes a core from whatever runs next: the training
 * attention's worker threads, which share no product with the library. Measured on the 2-vCPU development machine
 * (20M LoRA step, 2 × 512 tokens, 2 threads): the attention forward took 97 ms with the default and 57 ms with 2^4
 * cycles, the backward 243 and 149; 2^20 gave the same step times as 2^4 (973 and 985 ms, against 1,142). OpenBLAS
 * reads the variable when it loads, so it is set only while the library opens (a user's own setting stands).
 */
const OPENBLAS_IDLE_SPIN = "20";

/** Runs `fn` with the variables of `values` set where they are unset, then unsets them again. */
function withEnvironment<T>(values: Record<string, string>, fn: () => T): T {
  const added = Object.keys(values).filter((name) => process.env[name] === undefined);
  for (const name of added) process.env[name] = values[name];
  try {
    return fn();
  } finally {
    for (const name of added) delete process.env[name];
  }
}

/**
 * Sets `path`'s process-wide thread count to `threads` unless this thread set it so last. Before each product a Gemm
 * applies the count that product takes (its own, or one for a small product) this way; the attention threads apply
 * one before their workers' products start (a worker's Gemm sets none).
 */
export function applyBlasThreads(path: string, threads: number): void {
  if (threadsApplied.get(path) === threads) return;
  const symbols = bindings(path);
  symbols.openblas_set_num_threads?.(threads);
  symbols.MKL_Set_Num_Threads?.(threads);
  symbols.bli_thread_set_num_threads?.(threads);
  threadsApplied.set(path, threads);
}

/**
 * The products through `path`'s cblas_sgemm, on `threads` threads. Throws when it does not open. With `setsThreads`
 * false the Gemm never sets the library's thread count: a worker thread's, whose caller has set it to one.
 */
export function systemGemm(path: string, threads: number, { setsThreads = true } = {}): Gemm {
  checkThreadCount(threads);
  const symbols = bindings(path);
  const core = openblasCore(symbols);
  const onThreads = (fn: NativeFunction, multiplyAdds: (args: NativeArg[]) => number): NativeFunction => (...args) => {
    if (setsThreads) applyBlasThreads(path, multiplyAdds(args) < SHARED_PRODUCT_MULTIPLY_ADDS ? 1 : threads);
    return fn(...args);
  };
  // cblas_sgemm(order, transA, transB, M, N, K, …): M·N·K; cblas_sgemv(order, trans, M, N, …): M·N.
  const sgemm = onThreads(symbols.cblas_sgemm, (args) => Number(args[3]) * Number(args[4]) * Number(args[5]));
  const sgemv = onThreads(symbols.cblas_sgemv, (args) => Number(args[2]) * Number(args[3]));
  return {
    description: `system BLAS ${path}${core ? ` (OpenBLAS ${core} kernels)` : ""}, ${threads} thread${threads === 1 ? "" : "s"}`,
    library: path,
    threads,
    nt(x, w, n, k, m, out, options = {}) {
      const { alpha = 1, accumulate = false, columnStart = 0, columnEnd = m, xStride = k, wStride = k, outStride = m } = options;
      const chunk = Math.max(1, Math.floor(sliceBytes(n) / (4 * wStride)));
      for (let c0 = columnStart; c0 < columnEnd; c0 += chunk) {
        const c1 = Math.min(columnEnd, c0 + chunk);
        product(sgemm, NO_TRANS, TRANS, n, c1 - c0, k, alpha, x, xStride, w.subarray(c0 * wStride), wStride, accumulate, out.subarray(c0), outStride);
      }
    },
    nnAccumulate(out, a, b, n, k, m) {
      product(sgemm, NO_TRANS, NO_TRANS, n, m, k, 1, a, k, b, m, true, out, m);
    },
    tnAccumulate(out, a, b, n, m, k, strides = {}) {
      const { aStride = m, bStride = k, outStride = k } = strides;
      product(sgemm, TRANS, NO_TRANS, m, k, n, 1, a, aStride, b, bStride, true, out, outStride);
    },
    weightedRowSum(weights, rows, count, width, stride, out) {
      checkOperand("x", weights, 1, count, count);
      checkOperand("A", rows, count, width, stride);
      checkOperand("y", out, 1, width, width);
      out.fill(0, 0, width);
      if (count > 0 && width > 0) sgemv(ROW_MAJOR, TRANS, count, width, 1, rows, stride, weights, 1, 1, out, 1);
    },
  };
}

/**
 * C[rows, cols] = alpha · op(A) · op(B) (+ C when accumulating), row-major. Empty products are handled here: BLAS
 * rejects a leading dimension of 0 (it would print an error and compute nothing), and a sum over no terms is 0.
 */
function product(sgemm: NativeFunction, transA: number, transB: number, rows: number, cols: number, depth: number, alpha: number,
  a: Float32Array, lda: number, b: Float32Array, ldb: number, accumulate: boolean, c: Float32Array, ldc: number): void {
  if (rows === 0 || cols === 0) return;
  // The library reads and writes wherever the arguments point: an operand too short for its shape would be memory
  // corruption, not a wrong answer, so each is checked here.
  checkOperand("A", a, transA === TRANS ? depth : rows, transA === TRANS ? rows : depth, lda);
  checkOperand("B", b, transB === TRANS ? cols : depth, transB === TRANS ? depth : cols, ldb);
  checkOperand("C", c, rows, cols, ldc);
  if (depth === 0) {
    if (!accumulate) for (let i = 0; i < rows; i++) c.fill(0, i * ldc, i * ldc + cols);
    return;
  }
  sgemm(ROW_MAJOR, transA, transB, rows, cols, depth, alpha, a, lda, b, ldb, accumulate ? 1 : 0, c, ldc);
}

/** An operand stored as `rows` rows of `width` values, `stride` apart, must lie inside its array. */
function checkOperand(name: string, values: Float32Array, rows: number, width: number, stride: number): void {
  if (rows === 0 || width === 0) return;
  if (stride < width || (rows - 1) * stride + width > values.length) {
    throw new ArtError("bad_matmul_operands", `BLAS operand ${name}: ${rows} rows of ${width} values ${stride} apart do not fit in its ${values.length} values`);
  }
}
