// The training parity suite on the CPU emulation of the kernels (emulated-device.ts), with a reference GEMM in
// TypeScript for cuBLAS's general gemm. Needs a C++20 compiler and x86-64, like emulated-parity.test.ts.
import { CudaTrainingOps } from "../../lib/cuda/training-ops.ts";
import type { GemmType } from "../../lib/cuda/blas.ts";
import { hostMemory } from "../../lib/cuda/host-memory.ts";
import { buildEmulator, createEmulatedBackend, findCompiler } from "./emulated-device.ts";
import { defineTrainingParitySuite } from "./training-parity-suite.ts";

/** c[m, n] = alpha · op(a) · op(b) + beta · c over emulated device memory (host addresses), as Blas.gemm. */
function referenceGemm(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean, transB: boolean,
  type: GemmType, alpha = 1, beta = 0): void {
  const memory = hostMemory();
  const read = (address: bigint, count: number): Float32Array => {
    if (type === "f32") {
      const out = new Float32Array(count);
      memory.read(address, out);
      return out;
    }
    const bits = new Uint16Array(count);
    memory.read(address, bits);
    return new Float32Array(Uint32Array.from(bits, (h) => h << 16).buffer);
  };
  const as = read(a, m * k), bs = read(b, k * n), cs = new Float32Array(m * n);
  memory.read(c, cs);
  for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
    let sum = 0;
    for (let p = 0; p < k; p++) sum += as[transA ? p * m + i : i * k + p] * bs[transB ? j * k + p : p * n + j];
    cs[i * n + j] = alpha * sum + (beta === 0 ? 0 : beta * cs[i * n + j]);
  }
  memory.write(c, cs);
}

const compiler = findCompiler();
const skipReason = process.arch !== "x64" ? "skipped: the emulator's fibers are x86-64 only"
  : compiler ? "" : "skipped: no C++ compiler (g++ or clang++; or set CXX)";
defineTrainingParitySuite(`CUDA training ops on the CPU emulator vs the CPU training ops${skipReason ? ` (${skipReason})` : ""}`,
  skipReason !== "", () => new CudaTrainingOps(createEmulatedBackend(buildEmulator(compiler!)), { gemm: referenceGemm }));
