/**
 * GEMMs through cuBLAS (cublasGemmEx): bf16 or f32 operands, f32 output, f32 accumulation (CUBLAS_COMPUTE_32F, no
 * TF32, so f32 weights give f32 results for parity). libcublasLt is loaded first by absolute path: libcublas
 * depends on it by soname, which the loader can then resolve from the already-loaded copy.
 *
 * Row-major to column-major: y[n, out] = x[n, in] · W[out, in]ᵀ is, read column-major, yᵀ = W · xᵀ where the
 * row-major W buffer is the column-major matrix Wᵀ (in × out): so op(A) = Aᵀ with A = W (lda = in), B = x (ldb = in).
 */
import { ArtError } from "../core/errors.ts";
import { type DiscoveryInputs, type FoundLibrary, findCudaLibrary, systemDiscoveryInputs } from "./discovery.ts";
import { type NativeLibrary, openLibrary } from "./ffi.ts";
import { hostMemory } from "./host-memory.ts";

const CUBLAS_OP_N = 0, CUBLAS_OP_T = 1;
const CUDA_R_32F = 0, CUDA_R_16BF = 14;
const CUBLAS_COMPUTE_32F = 68;
const CUBLAS_GEMM_DEFAULT = -1;

export type GemmType = "f32" | "bf16";

export interface BlasLibraries {
  cublasLt: FoundLibrary;
  cublas: FoundLibrary;
}

export function findBlasLibraries(inputs: DiscoveryInputs = systemDiscoveryInputs()): BlasLibraries {
  return { cublasLt: findCudaLibrary("cublasLt", inputs), cublas: findCudaLibrary("cublas", inputs) };
}

export class Blas {
  readonly libraries: BlasLibraries;
  readonly #lt: NativeLibrary;
  readonly #lib: NativeLibrary;
  readonly #handle: bigint;
  readonly #alpha = new Float32Array(1);
  readonly #beta = new Float32Array(1);

  constructor(stream: bigint, libraries: BlasLibraries = findBlasLibraries()) {
    this.libraries = libraries;
    // Opening cublasLt first makes its soname resolvable for cublas (same directory, any search path).
    this.#lt = openLibrary(libraries.cublasLt.path, { cublasLtGetVersion: { result: "u64", args: [] } });
    this.#lib = openLibrary(libraries.cublas.path, {
      cublasCreate_v2: { result: "i32", args: ["buffer"] },
      cublasDestroy_v2: { result: "i32", args: ["pointer"] },
      cublasSetStream_v2: { result: "i32", args: ["pointer", "pointer"] },
      cublasGetStatusName: { result: "pointer", args: ["i32"] },
      cublasGemmEx: {
        result: "i32",
        args: ["pointer", "i32", "i32", "i32", "i32", "i32", "buffer", "pointer", "i32", "i32", "pointer", "i32", "i32",
          "buffer", "pointer", "i32", "i32", "i32", "i32"],
      },
    });
    const out = new BigUint64Array(1);
    this.#check(this.#lib.symbols.cublasCreate_v2(out), "cublasCreate");
    this.#handle = out[0];
    this.#check(this.#lib.symbols.cublasSetStream_v2(this.#handle, stream), "cublasSetStream");
  }

  /**
   * y[rows, outF] = alpha · x[rows, inF] · w[outF, inF]ᵀ + beta · y.  x and w share `operandType`; y is f32.
   */
  linear(x: bigint, w: bigint, y: bigint, rows: number, inF: number, outF: number, operandType: GemmType,
         alpha = 1, beta = 0): void {
    this.#alpha[0] = alpha;
    this.#beta[0] = beta;
    const type = operandType === "bf16" ? CUDA_R_16BF : CUDA_R_32F;
    this.#check(this.#lib.symbols.cublasGemmEx(this.#handle, CUBLAS_OP_T, CUBLAS_OP_N, outF, rows, inF, this.#alpha,
      w, type, inF, x, type, inF, this.#beta, y, CUDA_R_32F, outF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
    `cublasGemmEx(${rows}x${inF} · ${outF}x${inF}ᵀ, ${operandType})`);
  }

  /**
   * c[m, n] = alpha · op(a) · op(b) + beta · c, all row-major: op(a) is [m, k] (a stored [k, m] when `transA`), op(b)
   * is [k, n] (b stored [n, k] when `transB`). Read column-major this is cᵀ = op(b)ᵀ · op(a)ᵀ, so b goes first.
   * The training pass's products (dx = dy · W, dB = dyᵀ · xa, …) have this form; `linear` is the case transB.
   */
  gemm(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean, transB: boolean,
       operandType: GemmType, alpha = 1, beta = 0): void {
    this.#alpha[0] = alpha;
    this.#beta[0] = beta;
    const type = operandType === "bf16" ? CUDA_R_16BF : CUDA_R_32F;
    this.#check(this.#lib.symbols.cublasGemmEx(this.#handle, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
      n, m, k, this.#alpha, b, type, transB ? k : n, a, type, transA ? m : k, this.#beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT), `cublasGemmEx(${transA ? "ᵀ" : ""}${m}x${k} · ${k}x${n}${transB ? "ᵀ" : ""}, ${operandType})`);
  }

  dispose(): void {
    this.#check(this.#lib.symbols.cublasDestroy_v2(this.#handle), "cublasDestroy");
    this.#lib.close();
    this.#lt.close();
  }

  #check(status: number | bigint, what: string): void {
    if (status === 0) return;
    const name = hostMemory().readCString(this.#lib.symbols.cublasGetStatusName(status) as bigint);
    throw new ArtError("cublas_error", `${what} failed: ${name || `cublasStatus ${status}`} (${this.libraries.cublas.path})`);
  }
}
