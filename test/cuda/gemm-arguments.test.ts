// The row-major GEMM mapping onto cublasGemmEx (gemmExArguments), for every transpose combination, run by the
// emulator's column-major reference of cublasGemmEx and compared with a direct row-major triple loop. The linear
// layer's case is also covered end to end by the emulated parity suite.
import { describe, expect, it } from "vitest";
import { gemmExArguments } from "../../lib/cuda/blas.ts";
import { hostMemory } from "../../lib/cuda/host-memory.ts";
import { seededRandom } from "../../lib/core/random.ts";
import { buildEmulator, emulatedGemmEx, findCompiler } from "./emulated-device.ts";

const compiler = findCompiler();
const skip = process.arch !== "x64" ? "the emulator's fibers are x86-64 only" : compiler ? "" : "no C++ compiler (g++ or clang++; or set CXX)";

describe.skipIf(skip !== "")(`gemmExArguments through a column-major cublasGemmEx reference${skip ? ` (skipped: ${skip})` : ""}`, () => {
  it("computes c[m, n] = alpha · op(a) · op(b) + beta · c for all four transpose combinations", () => {
    const gemmEx = emulatedGemmEx(buildEmulator(compiler!));
    const memory = hostMemory();
    const random = seededRandom(5);
    const [m, n, k, alpha, beta] = [5, 7, 3, 1.5, 0.5];
    const values = (count: number) => Float32Array.from({ length: count }, () => random() * 2 - 1);
    const onDevice = (data: Float32Array) => {
      const address = memory.malloc(data.byteLength);
      memory.write(address, data);
      return address;
    };
    for (const transA of [false, true]) {
      for (const transB of [false, true]) {
        const a = values(m * k), b = values(k * n), c = values(m * n);
        const expected = new Float32Array(m * n);
        for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
          let sum = 0;
          for (let l = 0; l < k; l++) sum += (transA ? a[l * m + i] : a[i * k + l]) * (transB ? b[j * k + l] : b[l * n + j]);
          expected[i * n + j] = alpha * sum + beta * c[i * n + j];
        }
        const [da, db, dc] = [onDevice(a), onDevice(b), onDevice(c)];
        gemmEx(gemmExArguments(da, db, dc, m, n, k, transA, transB, "f32"), alpha, beta);
        const result = new Float32Array(m * n);
        memory.read(dc, result);
        for (const address of [da, db, dc]) memory.free(address);
        for (let i = 0; i < m * n; i++) expect(result[i], `transA ${transA} transB ${transB} element ${i}`).toBeCloseTo(expected[i], 5);
      }
    }
  });
});
