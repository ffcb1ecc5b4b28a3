// The matrix products of the CPU backend: the system BLAS (cblas_sgemm through the FFI) against a float64
// reference, with every option the ops use (strides of head slices, alpha, accumulation, a column range, empty
// products), the operand checks that keep a wrong shape from reaching native code, and the choice of provider.
// CI installs OpenBLAS and sets ART_TEST_SYSTEM_BLAS=1, so there these tests cannot skip.
import { describe, expect, it } from "vitest";
import { CpuBackend, CpuTensor } from "../../lib/model/cpu/backend.ts";
import { WasmMatmul } from "../../lib/model/cpu/wasm-matmul.ts";
import { blasCandidates, chooseGemm, defaultCpuThreads, type Gemm, portableGemm, systemGemm } from "../../lib/model/cpu/gemm.ts";
import { random } from "../cuda/compare.ts";
import { openLibrary } from "../../lib/core/ffi.ts";

const detected = chooseGemm("auto", 1);
const required = process.env.ART_TEST_SYSTEM_BLAS === "1";

/** out[i, j] = Σ_p a(i, p) · b(p, j) in float64, operands read through accessors. */
function reference(rows: number, cols: number, depth: number, a: (i: number, p: number) => number, b: (p: number, j: number) => number): Float64Array {
  const out = new Float64Array(rows * cols);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
    let s = 0;
    for (let p = 0; p < depth; p++) s += a(i, p) * b(p, j);
    out[i * cols + j] = s;
  }
  return out;
}

/** Largest |actual − expected| over the largest |expected|: f32 products of these depths stay near 1e-7. */
function relativeError(expected: ArrayLike<number>, actual: ArrayLike<number>): number {
  let worst = 0, scale = 1e-30;
  for (let i = 0; i < expected.length; i++) {
    worst = Math.max(worst, Math.abs(actual[i] - expected[i]));
    scale = Math.max(scale, Math.abs(expected[i]));
  }
  return worst / scale;
}

// Measured at these depths (≤ 300): 5e-7 on OpenBLAS (f32 sums), 4e-8 on the portable products (float64 sums);
// a wrong index or stride is O(1).
const TOLERANCE = 2e-6;

function checkProducts(gemm: Gemm): void {
  it("nt: x·Wᵀ with strided operands (a head's slice of wider rows), alpha, accumulation and a column range", () => {
    const [n, k, m, xStride, wStride, outStride] = [37, 45, 29, 53, 50, 31];
    const x = random(n * xStride, 1), w = random(m * wStride, 2), start = random(n * outStride, 3);
    const expected = reference(n, m, k, (i, p) => x[i * xStride + p], (p, j) => w[j * wStride + p]);
    const out = start.slice();
    gemm.nt(x, w, n, k, m, out, { xStride, wStride, outStride, alpha: 0.5, accumulate: true });
    const want = Float64Array.from(out, (_, idx) => {
      const [i, j] = [Math.floor(idx / outStride), idx % outStride];
      return j < m ? start[idx] + 0.5 * expected[i * m + j] : start[idx];
    });
    expect(relativeError(want, out)).toBeLessThan(TOLERANCE);

    const packed = new Float32Array(n * m).fill(Number.NaN); // overwritten, never read: NaN would survive a read
    gemm.nt(x.subarray(0, n * k), w.subarray(0, m * k), n, k, m, packed);
    const packedExpected = reference(n, m, k, (i, p) => x[i * k + p], (p, j) => w[j * k + p]);
    expect(relativeError(packedExpected, packed)).toBeLessThan(TOLERANCE);

    const columns = new Float32Array(n * m);
    gemm.nt(x.subarray(0, n * k), w.subarray(0, m * k), n, k, m, columns, { columnStart: 10, columnEnd: 20 });
    for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) {
      const value = columns[i * m + j];
      if (j < 10 || j >= 20) expect(value).toBe(0);
      else expect(Math.abs(value - packedExpected[i * m + j])).toBeLessThan(TOLERANCE * 10);
    }
  });

  it("nt at decode sizes (up to 12 rows: W a slice at a time) with strides, alpha, accumulation and columns", () => {
    // 3,000 rows of W 47 floats apart: 564 KB, so 1 to 4 rows take three 256 KiB slices, 5 to 12 rows five of 128 KiB.
    for (const n of [1, 2, 3, 4, 5, 12, 13]) {
      const [k, m, xStride, wStride, outStride] = [45, 3000, 50, 47, 3003];
      const x = random(n * xStride, n), w = random(m * wStride, 2), start = random(n * outStride, 3);
      const expected = reference(n, m, k, (i, p) => x[i * xStride + p], (p, j) => w[j * wStride + p]);
      const out = start.slice();
      gemm.nt(x, w, n, k, m, out, { xStride, wStride, outStride, alpha: 2, accumulate: true, columnStart: 3, columnEnd: 2990 });
      const want = Float64Array.from(out, (_, idx) => {
        const [i, j] = [Math.floor(idx / outStride), idx % outStride];
        return j >= 3 && j < 2990 ? start[idx] + 2 * expected[i * m + j] : start[idx];
      });
      expect(relativeError(want, out), `${n} rows`).toBeLessThan(TOLERANCE);
      const overwritten = new Float32Array(n * m).fill(Number.NaN);
      gemm.nt(x, w, n, k, m, overwritten, { xStride, wStride });
      expect(relativeError(expected, overwritten), `${n} rows`).toBeLessThan(TOLERANCE);
    }
  });

  it("nnAccumulate and tnAccumulate add dOut·W and dOutᵀ·x to what is there", () => {
    const [n, k, m] = [33, 19, 41];
    const a = random(n * k, 4), b = random(k * m, 5), start = random(n * m, 6);
    const nn = start.slice();
    gemm.nnAccumulate(nn, a, b, n, k, m);
    const nnWant = reference(n, m, k, (i, p) => a[i * k + p], (p, j) => b[p * m + j]).map((v, i) => v + start[i]);
    expect(relativeError(nnWant, nn)).toBeLessThan(TOLERANCE);

    const dOut = random(n * m, 7), x = random(n * k, 8), grad = random(m * k, 9);
    const tn = grad.slice();
    gemm.tnAccumulate(tn, dOut, x, n, m, k);
    const tnWant = reference(m, k, n, (i, p) => dOut[p * m + i], (p, j) => x[p * k + j]).map((v, i) => v + grad[i]);
    expect(relativeError(tnWant, tn)).toBeLessThan(TOLERANCE);
  });

  it("weightedRowSum: one row's p·v over strided cached values", () => {
    const [count, width, stride] = [37, 16, 24];
    const weights = random(count + 3, 12), rows = random(count * stride, 13);
    const out = new Float32Array(width + 2).fill(Number.NaN);
    gemm.weightedRowSum(weights, rows, count, width, stride, out);
    const expected = reference(1, width, count, (_, t) => weights[t], (t, j) => rows[t * stride + j]);
    expect(relativeError(expected, out.subarray(0, width))).toBeLessThan(TOLERANCE);
    expect(Number.isNaN(out[width])).toBe(true); // nothing past the row is written
  });

  it("an empty sum is zero, and products with no rows or columns touch nothing", () => {
    const out = Float32Array.of(5, 5, 5, 5);
    gemm.nt(new Float32Array(0), new Float32Array(0), 2, 0, 2, out);
    expect([...out]).toEqual([0, 0, 0, 0]);
    out.fill(5);
    gemm.nt(new Float32Array(0), new Float32Array(0), 2, 0, 2, out, { accumulate: true });
    expect([...out]).toEqual([5, 5, 5, 5]);
    gemm.nt(new Float32Array(0), random(6, 1), 0, 3, 2, out);
    gemm.nnAccumulate(out, new Float32Array(0), new Float32Array(0), 0, 0, 4);
    expect([...out]).toEqual([5, 5, 5, 5]);
  });
}

describe("portable products", () => checkProducts(portableGemm()));
describe("portable products with the WASM kernel on 2 threads", () => checkProducts(portableGemm(2, WasmMatmul.create(2))));

const noSystemBlas = !required && detected.gemm.library === null;
/** OpenBLAS's current thread setting (the library is loaded once per process), where the system BLAS is OpenBLAS. */
const openblasThreads = noSystemBlas ? undefined
  : openLibrary(detected.gemm.library!, { openblas_get_num_threads: { result: "i32", args: [], optional: true } }).symbols.openblas_get_num_threads as (() => number) | undefined;
describe.skipIf(noSystemBlas)(`system BLAS (${detected.reason})`, () => {
  // A skipped suite is still collected: without a BLAS its (skipped) tests are listed over the portable products.
  const gemm = noSystemBlas ? portableGemm() : systemGemm(detected.gemm.library ?? "", 1);
  checkProducts(gemm);

  it("refuses operands too short for their shape before native code sees them", () => {
    const out = new Float32Array(4);
    expect(() => gemm.nt(new Float32Array(5), new Float32Array(6), 2, 3, 2, out))
      .toThrow("BLAS operand A: 2 rows of 3 values 3 apart do not fit in its 5 values");
    expect(() => gemm.nt(new Float32Array(6), new Float32Array(6), 2, 3, 2, out, { xStride: 2 }))
      .toThrow("BLAS operand A: 2 rows of 3 values 2 apart");
    expect(() => gemm.nt(new Float32Array(3), new Float32Array(6), 1, 3, 2, new Float32Array(1)))
      .toThrow("BLAS operand C: 1 rows of 2 values 2 apart do not fit in its 1 values");
    expect(() => gemm.nnAccumulate(new Float32Array(3), new Float32Array(6), new Float32Array(6), 2, 3, 2))
      .toThrow("BLAS operand C: 2 rows of 2 values 2 apart do not fit in its 3 values");
  });

  // How the library splits a product between threads (and which kernel a thread's share takes) is its own: on one
  // development machine the forward's products gave the same bits on 1 and 2 threads, on another (OpenBLAS 0.3.21,
  // Haswell kernels) 2 threads changed 7% of these outputs by float rounding. What art-ts relies on is each thread
  // count's determinism.
  it("gives the same bits on every call for a thread count, and float rounding across counts", () => {
    const [n, k, m] = [192, 384, 200]; // 14.7M multiply-adds: shared between threads (see the next test)
    const x = random(n * k, 10), w = random(m * k, 11);
    const product = (g: Gemm) => {
      const out = new Float32Array(n * m);
      g.nt(x, w, n, k, m, out);
      return out;
    };
    const two = systemGemm(gemm.library!, 2);
    const once = product(gemm), twice = product(two);
    expect(product(gemm)).toEqual(once);
    expect(product(two)).toEqual(twice);
    expect(product(gemm)).toEqual(once); // back on one thread
    // Measured 3.8e-7 (3.1e-5 on values up to 79), bound about 5× that.
    expect(relativeError(once, twice)).toBeLessThan(2e-6);
  });

  // A product under 2^23 multiply-adds runs on one thread whatever the Gemm's count (gemm.ts says why), a larger one
  // on the Gemm's count: read back from OpenBLAS, whose thread setting the Gemm applies before each product.
  it.runIf(openblasThreads !== undefined)("runs a small product on one thread and a large one on the Gemm's threads", () => {
    const two = systemGemm(gemm.library!, 2);
    const run = (n: number, k: number, m: number) => {
      two.nt(random(n * k, 15), random(m * k, 16), n, k, m, new Float32Array(n * m));
      return openblasThreads!();
    };
    expect(run(64, 64, 512)).toBe(1); // a tiny model's LM head over a batch of 64 rows: 2.1M
    expect(run(256, 384, 640)).toBe(2); // the 20M model's q/k/v over 256 rows: 63M
    expect(run(2000, 64, 64)).toBe(1); // 8.2M, just under (a 64-wide q projection over 2,000 training rows)
    gemm.nt(random(4, 17), random(4, 18), 2, 2, 2, new Float32Array(4)); // the 1-thread Gemm applies its count too
    expect(openblasThreads!()).toBe(1);
  });

  // A weight gradient's shape (a sum over 2,000 tokens into a 192 × 64 output): OpenBLAS splits the sum between
  // threads, so 2 threads round differently from 1, and each thread count repeats its own bits (docs/engine.md).
  it("gives a long-sum product the same bits on every call for one thread count, and float rounding across counts", () => {
    const [rows, m, k] = [2000, 192, 64];
    const a = random(rows * m, 12), b = random(rows * k, 13), start = random(m * k, 14);
    const product = (g: Gemm) => {
      const out = start.slice();
      g.tnAccumulate(out, a, b, rows, m, k);
      return out;
    };
    const two = systemGemm(gemm.library!, 2);
    const once = product(gemm), twice = product(two);
    expect(product(gemm)).toEqual(once);
    expect(product(two)).toEqual(twice);
    const reference = product(portableGemm());
    for (const result of [once, twice]) {
      // Against the portable products (float64 sums): measured 7.6e-5 on values up to 182 (a few float32 ulps), bound 4× that.
      result.forEach((value, i) => expect(Math.abs(value - reference[i]!)).toBeLessThan(3e-4));
    }
  });
});

describe.skipIf(noSystemBlas)("decoding's products beside the system BLAS", () => {
  // Decoding's products (1 to 4 rows) run on the WASM kernel (matmul.wat's linearF32 / linearBf16), larger ones on the
  // BLAS. Both against float64 sums over the (rounded) weights: measured 8.0e-7 at a depth of 384 (f32 sums), bound
  // 2.5× that. Each row count is checked, since 1-2 and 3-4 rows run different loops.
  it("1-4 rows of an f32 weight run where it moved in the kernel's memory (a stacked weight's view and a bias too), which the BLAS then reads", () => {
    const backend = new CpuBackend({ blas: detected.gemm.library ?? "portable", threads: 1 });
    const k = 384, m = 200, rows = 2 * m;
    const values = random(rows * k, 11), stacked = backend.upload(values.slice(), [rows, k]) as CpuTensor;
    const bias = backend.upload(random(m, 12), [m]), b = backend.download(bias);
    const second = backend.view(stacked, m, m); // the second projection of the stacked weight
    for (const n of [1, 2, 3, 4, 5]) {
      const xs = random(n * k, 40 + n), out = backend.zeros([n, m]);
      backend.linear(backend.upload(xs.slice(), [n, k]), second, bias, out);
      const want = reference(n, m, k, (i, p) => xs[i * k + p], (p, j) => values[(m + j) * k + p]).map((v, i) => v + b[i % m]);
      expect(relativeError(want, backend.download(out))).toBeLessThan(2e-6);
      expect(stacked.resident).not.toBeNull(); // moved on the first product, not copied: its values are a view there
    }
    expect(backend.download(stacked)).toEqual(values);
    // Written in place (as full-parameter training's update is), the next decoding product reads the new values.
    const updated = values.map((v) => -2 * v), xs = random(k, 50), out = backend.zeros([1, m]);
    backend.write(stacked, updated);
    backend.linear(backend.upload(xs.slice(), [1, k]), second, null, out);
    expect(relativeError(reference(1, m, k, (_, p) => xs[p], (p, j) => updated[(m + j) * k + p]), backend.download(out))).toBeLessThan(2e-6);
    backend.free(stacked);
    expect(stacked.resident).toBeNull(); // freeing gives the block back
  });

  it("1-4 rows of a bf16 weight read its bf16 copy (a stacked weight's view and a bias too), 5 rows the BLAS", () => {
    const backend = new CpuBackend({ blas: detected.gemm.library ?? "portable", threads: 1 });
    const k = 384, m = 200, rows = 2 * m;
    const stacked = backend.upload(random(rows * k, 21), [rows, k], "bf16") as CpuTensor;
    const rounded = backend.download(stacked);
    expect(rounded.every((v, i) => v === Math.fround(v) && (new Uint32Array(rounded.buffer)[i] & 0xffff) === 0)).toBe(true);
    const bias = backend.upload(random(m, 22), [m]);
    for (const n of [1, 2, 3, 4, 5]) {
      const xs = random(n * k, 30 + n), x = backend.upload(xs.slice(), [n, k]), out = backend.zeros([n, m]);
      const second = backend.view(stacked, m, m); // the second projection of the stacked weight
      backend.linear(x, second, bias, out);
      const b = backend.download(bias);
      const want = reference(n, m, k, (i, p) => xs[i * k + p], (p, j) => rounded[(m + j) * k + p]).map((v, i) => v + b[i % m]);
      expect(relativeError(want, backend.download(out))).toBeLessThan(2e-6);
      expect(stacked.bf16Resident).not.toBeNull();
      expect(stacked.resident).toBeNull(); // its f32 values stay where they were, for the BLAS
    }
    const alone = backend.upload(random(m * k, 23), [m, k], "bf16") as CpuTensor, x5 = backend.upload(random(5 * k, 24), [5, k]);
    backend.linear(x5, alone, null, backend.zeros([5, m]));
    expect(alone.bf16Resident).toBeNull();  // 5 rows: the BLAS
    backend.free(stacked);
    expect(stacked.bf16Resident).toBeNull(); // freeing gives the bf16 copy's block back
  });
});

describe("choosing the products", () => {
  it("is required where CI says a system BLAS is installed", () => {
    if (required) expect(detected.gemm.library, detected.reason).not.toBeNull();
  });

  it("falls back to the portable products under auto, and names what failed otherwise", () => {
    expect(chooseGemm("portable", 3).gemm).toMatchObject({ library: null, threads: 3 });
    expect(() => chooseGemm("/no/such/libblas.so", 1)).toThrow(/no system BLAS opened \(\/no\/such\/libblas.so: cannot open native library.*apt-get install libopenblas0-pthread/);
    expect(blasCandidates("linux")[0]).toBe("libopenblas.so.0");
    expect(blasCandidates("darwin")[0]).toContain("Accelerate.framework");
  });

  it.skipIf(!detected.gemm.library?.includes("openblas"))("names the kernels OpenBLAS chose (the ones OPENBLAS_CORETYPE pins, where set)", () => {
    const core = /\(OpenBLAS (\w+) kernels\), 1 thread$/.exec(detected.gemm.description)?.[1];
    expect(core, detected.gemm.description).toBeDefined();
    const pinned = process.env.OPENBLAS_CORETYPE;
    if (pinned) expect(core!.toLowerCase()).toBe(pinned.toLowerCase());
  });

  it("reads ART_CPU_THREADS and refuses a count that is not one", () => {
    expect(defaultCpuThreads({ ART_CPU_THREADS: "3" })).toBe(3);
    expect(defaultCpuThreads({})).toBeGreaterThan(0);
    expect(() => defaultCpuThreads({ ART_CPU_THREADS: "two" })).toThrow('ART_CPU_THREADS="two" is not a positive whole number of threads');
    expect(() => systemGemm("libopenblas.so.0", 0)).toThrow("0 is not a positive whole number of threads");
  });
});
