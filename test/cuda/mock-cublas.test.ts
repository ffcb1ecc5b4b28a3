// Blas (lib/cuda/blas.ts) through the FFI against mocks/libcublas.cpp: the handle is bound to the backend's
// stream and then to its own workspace, cublasGemmEx gets its 19 arguments in order (computed with the emulator's column-major reference on host
// memory), alpha/beta are host scalars, failures carry cuBLAS's status name, dispose destroys the handle.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { Blas } from "../../lib/cuda/blas.ts";
import { openLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
import { seededRandom } from "../../lib/core/random.ts";
import { findCompiler } from "./emulated-device.ts";
import { buildMock, mockDirectory } from "./mocks/build.ts";

const compiler = findCompiler();

describe.skipIf(!compiler)(`Blas against a recording cuBLAS${compiler ? "" : " (skipped: no C++ compiler; set CXX)"}`, () => {
  const dir = mockDirectory("cublas");

  it("runs row-major linear layers (f32 and bf16, alpha and beta) on the bound stream and workspace, and names failures", () => {
    const path = buildMock(compiler!, "libcublas", join(dir, "libcublas.so"));
    const stream = 0xabcn;
    const memory = hostMemory();
    const workspace = { address: memory.malloc(4096), bytes: 4096 };
    const blas = new Blas(stream, { cublasLt: { name: "cublasLt", path, source: "test" }, cublas: { name: "cublas", path, source: "test" } }, workspace);
    const random = seededRandom(3);
    const [rows, inF, outF] = [3, 4, 5];
    // Multiples of 1/8 below 4: exact in bf16, so both operand types must give the same sums.
    const values = (count: number) => Float32Array.from({ length: count }, () => Math.round((random() * 2 - 1) * 32) / 8);
    const onDevice = (data: ArrayBufferView) => {
      const address = memory.malloc(data.byteLength);
      memory.write(address, data);
      return address;
    };
    const bf16 = (data: Float32Array) => Uint16Array.from(new Uint32Array(data.buffer), (bits) => bits >>> 16);
    const x = values(rows * inF), w = values(outF * inF), y0 = values(rows * outF);
    const expected = (alpha: number, beta: number) => Float32Array.from({ length: rows * outF }, (_, at) => {
      const r = Math.floor(at / outF), o = at % outF;
      let sum = 0;
      for (let i = 0; i < inF; i++) sum += x[r * inF + i] * w[o * inF + i];
      return alpha * sum + beta * y0[at];
    });
    for (const type of ["f32", "bf16"] as const) {
      for (const [alpha, beta] of [[1, 0], [2, 1]]) {
        const [dx, dw, dy] = type === "f32" ? [onDevice(x), onDevice(w), onDevice(y0)] : [onDevice(bf16(x)), onDevice(bf16(w)), onDevice(y0)];
        blas.linear(dx, dw, dy, rows, inF, outF, type, alpha, beta);
        const y = new Float32Array(rows * outF);
        memory.read(dy, y);
        for (const address of [dx, dw, dy]) memory.free(address);
        expect(Array.from(y), `${type} alpha ${alpha} beta ${beta}`).toEqual(Array.from(expected(alpha, beta)));
      }
    }
    process.env.MOCK_CUBLAS_FAIL_GEMM = "1";
    try {
      expect(() => blas.linear(1n, 2n, 3n, rows, inF, outF, "f32"))
        .toThrowError(/cublasGemmEx\(3x4 · 5x4ᵀ, f32\) failed: CUBLAS_STATUS_EXECUTION_FAILED \(.*libcublas\.so\)/);
    } finally {
      delete process.env.MOCK_CUBLAS_FAIL_GEMM;
    }
    blas.dispose();
    const report = openLibrary(path, { mock_cublas_report: { result: "pointer", args: [] } }).symbols.mock_cublas_report() as bigint;
    expect(JSON.parse(memory.readCString(report))).toEqual({ gemms: 4, liveHandles: 0, lastStream: Number(stream), lastWorkspaceBytes: 4096, violations: [] });
    memory.free(workspace.address);
  });
});
