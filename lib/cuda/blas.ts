/**
 * GEMMs through cuBLAS (cublasGemmEx): bf16 or f32 operands, f32 output, f32 accumulation. Operand type "f32" computes
 * in f32 (CUBLAS_COMPUTE_32F, no TF32, so f32 weights give f32 results for parity); "tf32" is f32 storage multiplied on
 * the tensor cores with TF32 inputs (CUBLAS_COMPUTE_32F_FAST_TF32: each operand rounded to 10 mantissa bits, f32
 * sums), for f32 products beside a bf16 model's products, which round more (a LoRA's, see the backend). libcublasLt is loaded first by absolute path: libcublas
 * depends on it by soname, which the loader can then resolve from the already-loaded copy.
 *
 * Row-major to column-major: cuBLAS reads every row-major buffer as its transpose, so the row-major
 * c[m, n] = op(a) · op(b) is the column-major cᵀ = op(b)ᵀ · op(a)ᵀ: b goes first (see gemmExArguments). A linear
 * layer y[n, out] = x[n, in] · W[out, in]ᵀ is the case a = x, b = W transposed: op(A) = Aᵀ with A = W (lda = in),
 * B = x (ldb = in), ldc = out.
 */
import { ArtError } from "../core/errors.ts";
import { type DiscoveryInputs, type FoundLibrary, findCudaLibrary, systemDiscoveryInputs } from "./discovery.ts";
import { type NativeLibrary, openLibrary } from "../core/ffi.ts";
import { hostMemory } from "../core/host-memory.ts";

import type { NativeSignature } from "../core/ffi.ts";

/** Every cuBLAS / cuBLASLt symbol bound, with its C signature (test/cuda/abi.test.ts checks them against the headers). */
export const cublasSignatures = {
  cublasCreate_v2: { result: "i32", args: ["buffer"] },
  cublasDestroy_v2: { result: "i32", args: ["pointer"] },
  cublasSetStream_v2: { result: "i32", args: ["pointer", "pointer"] },
  cublasSetWorkspace_v2: { result: "i32", args: ["pointer", "pointer", "u64"] },
  cublasGetStatusName: { result: "pointer", args: ["i32"] },
  cublasGemmEx: {
    result: "i32",
    args: ["pointer", "i32", "i32", "i32", "i32", "i32", "buffer", "pointer", "i32", "i32", "pointer", "i32", "i32",
      "buffer", "pointer", "i32", "i32", "i32", "i32"],
  },
} satisfies Record<string, NativeSignature>;
export const cublasLtSignatures = { cublasLtGetVersion: { result: "u64", args: [] } } satisfies Record<string, NativeSignature>;

/** The enumerators used here, by their header names (library_types.h, cublas_api.h; checked by the ABI test). */
export const blasConstants = {
  CUBLAS_OP_N: 0, CUBLAS_OP_T: 1, CUDA_R_32F: 0, CUDA_R_16BF: 14, CUBLAS_COMPUTE_32F: 68, CUBLAS_COMPUTE_32F_FAST_TF32: 77,
  CUBLAS_GEMM_DEFAULT: -1,
} as const;
const { CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_32F, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT } = blasConstants;

/** Operands' storage and how they are multiplied: bf16, f32 exactly, or f32 through TF32 tensor cores. */
export type GemmType = "f32" | "tf32" | "bf16";

export interface BlasLibraries {
  cublasLt: FoundLibrary;
  cublas: FoundLibrary;
}

export function findBlasLibraries(inputs: DiscoveryInputs = systemDiscoveryInputs()): BlasLibraries {
  return { cublasLt: findCudaLibrary("cublasLt", inputs), cublas: findCudaLibrary("cublas", inputs) };
}

/** The column-major GEMM (cuBLAS's terms: C = op(A) · op(B), C m×n) that computes a row-major linear layer. */
export interface GemmExArguments {
  transa: number; transb: number; m: number; n: number; k: number;
  a: bigint; aType: number; lda: number;
  b: bigint; bType: number; ldb: number;
  c: bigint; cType: number; ldc: number;
  computeType: number;
}

/**
 * The distances between consecutive rows of gemm's row-major operands as stored, where they are not packed: a block
 * of columns of a wider matrix (a LoRA's x Aᵀ among its group's, a projection's part of a stacked output).
 */
export interface GemmStrides {
  a?: number;
  b?: number;
  c?: number;
}

/**
 * cublasGemmEx arguments for the row-major c[m, n] = op(a)[m, k] · op(b)[k, n], where op(a) is a, or aᵀ with a stored
 * [k, m] when `transA` (likewise b): column-major, cᵀ = op(b)ᵀ · op(a)ᵀ. Each operand's rows are packed unless
 * `strides` says otherwise. The emulated device runs the same arguments through a column-major reference of
 * cublasGemmEx, so the parity suite checks this mapping against the CPU backend.
 */
export function gemmExArguments(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean,
                                transB: boolean, operandType: GemmType, strides: GemmStrides = {}): GemmExArguments {
  const type = operandType === "bf16" ? CUDA_R_16BF : CUDA_R_32F;
  const computeType = operandType === "tf32" ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const { a: lda = transA ? m : k, b: ldb = transB ? k : n, c: ldc = n } = strides;
  return {
    transa: transB ? CUBLAS_OP_T : CUBLAS_OP_N, transb: transA ? CUBLAS_OP_T : CUBLAS_OP_N, m: n, n: m, k,
    a: b, aType: type, lda: ldb, b: a, bType: type, ldb: lda, c, cType: CUDA_R_32F, ldc, computeType,
  };
}

/** The linear layer y[rows, outF] = x[rows, inF] · w[outF, inF]ᵀ as a row-major GEMM, x's rows `ldx` and y's `ldy` apart. */
export function linearGemmArguments(x: bigint, w: bigint, y: bigint, rows: number, inF: number, outF: number,
                                    operandType: GemmType, ldy = outF, ldx = inF): GemmExArguments {
  return gemmExArguments(x, w, y, rows, outF, inF, false, true, operandType, { a: ldx, c: ldy });
}

/**
 * The elements cublasGemmEx reads of A and B and reads or writes of C for these arguments (column-major: the last
 * column's start plus its length), 0 for an empty product: what a recording device checks lies in live memory.
 */
export function gemmExtents(g: GemmExArguments): { a: number; b: number; c: number } {
  if (g.m === 0 || g.n === 0) return { a: 0, b: 0, c: 0 };
  const extent = (rows: number, columns: number, ld: number) => (rows === 0 || columns === 0 ? 0 : (columns - 1) * ld + rows);
  const [aRows, aColumns] = g.transa === CUBLAS_OP_N ? [g.m, g.k] : [g.k, g.m];
  const [bRows, bColumns] = g.transb === CUBLAS_OP_N ? [g.k, g.n] : [g.n, g.k];
  return { a: extent(aRows, aColumns, g.lda), b: extent(bRows, bColumns, g.ldb), c: extent(g.m, g.n, g.ldc) };
}

/** Device memory cuBLAS works in: NVIDIA's recommended size for Hopper (older GPUs need less and ignore the rest). */
export const cublasWorkspaceBytes = 32 << 20;

export class Blas {
  readonly libraries: BlasLibraries;
  readonly #lib: NativeLibrary;
  readonly #handle: bigint;
  readonly #alpha = new Float32Array(1);
  readonly #beta = new Float32Array(1);

  /**
   * A handle bound to `stream`, working in `workspace` (device memory the caller owns and keeps until dispose). With
   * its own workspace, cuBLAS allocates nothing while a stream is captured into a CUDA graph, and every graph and
   * every eager call share the one buffer (all work is ordered on the one stream).
   */
  constructor(stream: bigint, libraries: BlasLibraries, workspace: { address: bigint; bytes: number }) {
    this.libraries = libraries;
    // Opening cublasLt first makes its soname resolvable for cublas (same directory, any search path).
    openLibrary(libraries.cublasLt.path, cublasLtSignatures);
    this.#lib = openLibrary(libraries.cublas.path, cublasSignatures);
    const out = new BigUint64Array(1);
    this.#check(this.#lib.symbols.cublasCreate_v2(out), "cublasCreate");
    this.#handle = out[0];
    this.#check(this.#lib.symbols.cublasSetStream_v2(this.#handle, stream), "cublasSetStream");
    // After the stream: cublasSetStream resets the handle to cuBLAS's own workspace.
    this.#check(this.#lib.symbols.cublasSetWorkspace_v2(this.#handle, workspace.address, workspace.bytes), "cublasSetWorkspace");
  }

  /**
   * y[rows, outF] = alpha · x[rows, inF] · w[outF, inF]ᵀ + beta · y.  x and w share `operandType`; y is f32, its rows
   * `ldy` apart (a block of columns of a wider output when more than outF), x's `ldx` apart.
   */
  linear(x: bigint, w: bigint, y: bigint, rows: number, inF: number, outF: number, operandType: GemmType,
         alpha = 1, beta = 0, ldy = outF, ldx = inF): void {
    this.#run(linearGemmArguments(x, w, y, rows, inF, outF, operandType, ldy, ldx), alpha, beta,
      () => `cublasGemmEx(${rows}x${inF} · ${outF}x${inF}ᵀ, ${operandType})`);
  }

  /**
   * c[m, n] = alpha · op(a) · op(b) + beta · c, all row-major: op(a) is [m, k] (a stored [k, m] when `transA`), op(b)
   * is [k, n] (b stored [n, k] when `transB`), rows packed unless `strides` says otherwise; gemmExArguments maps it to
   * column-major cuBLAS. The training pass's products (dx = dy · W, dB = dyᵀ · xa, …) have this form; `linear` is
   * the case transB.
   */
  gemm(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean, transB: boolean,
       operandType: GemmType, alpha = 1, beta = 0, strides: GemmStrides = {}): void {
    this.#run(gemmExArguments(a, b, c, m, n, k, transA, transB, operandType, strides), alpha, beta,
      () => `cublasGemmEx(${transA ? `${k}x${m}ᵀ` : `${m}x${k}`} · ${transB ? `${n}x${k}ᵀ` : `${k}x${n}`}, ${operandType})`);
  }

  /** `what` names the call in an error: made only then, since a training pass makes thousands of calls. */
  #run(g: GemmExArguments, alpha: number, beta: number, what: () => string): void {
    this.#alpha[0] = alpha;
    this.#beta[0] = beta;
    const status = this.#lib.symbols.cublasGemmEx(this.#handle, g.transa, g.transb, g.m, g.n, g.k, this.#alpha,
      g.a, g.aType, g.lda, g.b, g.bType, g.ldb, this.#beta, g.c, g.cType, g.ldc, g.computeType, CUBLAS_GEMM_DEFAULT);
    if (status !== 0) this.#check(status, what());
  }

  /** Destroys the handle; the libraries stay loaded (see openLibrary). */
  dispose(): void {
    this.#check(this.#lib.symbols.cublasDestroy_v2(this.#handle), "cublasDestroy");
  }

  #check(status: number | bigint, what: string): void {
    if (status === 0) return;
    const name = hostMemory().readCString(this.#lib.symbols.cublasGetStatusName(status) as bigint);
    throw new ArtError("cublas_error", `${what} failed: ${name || `cublasStatus ${status}`} (${this.libraries.cublas.path})`);
  }
}
