// The row-major GEMM mapping onto cublasGemmEx (gemmExArguments), for every transpose combination, run by the
// emulator's column-major reference of cublasGemmEx and compared with a direct row-major triple loop. The linear
// layer's case is also covered end to end by the emulated parity suite.
import { describe, expect, it } from "vitest";
import { gemmExArguments } from "../../lib/cuda/blas.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
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

  // CUBLAS_COMPUTE_32F_FAST_TF32 as the tensor cores take f32 operands: each rounded to 10 explicit mantissa bits, to
  // nearest with ties away from zero (cvt.rna.tf32.f32), then multiplied and summed in f32.
  it('"tf32" rounds each f32 operand to TF32 (ties away from zero), then sums in f32', () => {
    const gemmEx = emulatedGemmEx(buildEmulator(compiler!));
    const memory = hostMemory();
    const bits = (x: number) => new Uint32Array(Float32Array.of(x).buffer)[0];
    // 1 + 2^-11 is a tie (the first dropped bit alone): away from zero, to 1 + 2^-10; 1 + 2^-12 rounds down to 1;
    // -(1 + 3·2^-12) rounds to -(1 + 2^-10); 3 · 2^-11 + 1 ties up to 1 + 2^-9.
    const a = Float32Array.of(1 + 2 ** -11, 1 + 2 ** -12, -(1 + 3 * 2 ** -12), 1 + 3 * 2 ** -11);
    const expected = [1 + 2 ** -10, 1, -(1 + 2 ** -10), 1 + 2 ** -9];
    const one = Float32Array.of(1);
    const [da, db, dc] = [memory.malloc(16), memory.malloc(4), memory.malloc(16)];
    memory.write(da, a);
    memory.write(db, one);
    for (const [type, want] of [["tf32", expected], ["f32", [...a]]] as const) {
      // c[4, 1] = a[4, 1] · b[1, 1]: each element one operand times 1.
      gemmEx(gemmExArguments(da, db, dc, 4, 1, 1, false, false, type), 1, 0);
      const result = new Float32Array(4);
      memory.read(dc, result);
      expect([...result].map(bits), type).toEqual(want.map(bits));
    }
    for (const address of [da, db, dc]) memory.free(address);
  });
});
