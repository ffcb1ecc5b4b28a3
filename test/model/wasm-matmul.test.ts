// The WebAssembly SIMD matmul against a float64 triple loop written here, on shapes that reach every tile and
// remainder (n = 1..3 rows for the 1 × 4 tile, k not a multiple of 4, m not a multiple of the tiles, more than one
// 32-row block), with alpha ≠ 1 and accumulation; the same bits on worker threads; and the committed bytes against
// what the build script assembles.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import process from "node:process";
import { describe, expect, it } from "vitest";
import { ArtError } from "../../lib/core/errors.ts";
import { seededRandom } from "../../lib/core/random.ts";
import { CpuBackend, type CpuTensor } from "../../lib/model/cpu/backend.ts";
import { type MatmulOptions, matmulNNAccumulate, matmulNT, matmulTNAccumulate, weightedRowSum } from "../../lib/model/cpu/matmul.ts";
import { MatmulWorkers } from "../../lib/model/cpu/matmul-workers.ts";
import { WasmMatmul } from "../../lib/model/cpu/wasm-matmul.ts";
import { generatedModuleSource, generatedPath, WASM_MODULES } from "../../scripts/build-wasm.ts";
import { maxAbsDiff } from "./helpers.ts";

const F32_EPSILON = 2 ** -24;

/** A copy of `values` in a block of the kernel's memory (as a resident weight or a KV cache lives); release its byteOffset. */
function inMemory(kernel: WasmMatmul, values: Float32Array): Float32Array {
  const at = kernel.allocate(values.byteLength)! / 4;
  const view = kernel.heap.subarray(at, at + values.length);
  view.set(values);
  return view;
}

describe("WASM SIMD matmul", () => {
  it.each(WASM_MODULES)("the committed $name module is what scripts/build-wasm.ts assembles from $name.wat", async ({ name, constant, unfused }) => {
    expect(readFileSync(generatedPath(name), "utf8")).toBe(await generatedModuleSource(name, constant, unfused));
  });

  it("matches a float64 x·Wᵀ within f32 rounding on every tile and remainder", () => {
    const kernel = WasmMatmul.create();
    if (!kernel) throw new Error("this runtime has no WebAssembly SIMD");
    const rng = seededRandom(11);
    const shapes = [[1, 1, 1], [1, 7, 5], [2, 13, 9], [3, 384, 10], [4, 16, 2], [5, 3, 3], [37, 9, 11], [70, 33, 7], [8, 1, 4]];
    for (let trial = 0; trial < 12; trial++) {
      shapes.push([1 + Math.floor(rng() * 80), 1 + Math.floor(rng() * 70), 1 + Math.floor(rng() * 40)]);
    }
    for (const [n, k, m] of shapes) {
      for (const [alpha, accumulate] of [[1, false], [-0.375, true], [2.5, false]] as const) {
        const x = Float32Array.from({ length: n * k }, () => rng() * 2 - 1);
        const w = Float32Array.from({ length: m * k }, () => rng() * 2 - 1);
        const before = Float32Array.from({ length: n * m }, () => rng() * 4 - 2);
        // Operands at unaligned-to-16 offsets, as a tensor allocator may place them.
        const xAt = 4, wAt = xAt + x.byteLength + 4, outAt = wAt + w.byteLength + 12;
        expect(kernel.ensureBytes(outAt + before.byteLength)).toBe(true);
        const heap = kernel.heap;
        heap.set(x, xAt / 4);
        heap.set(w, wAt / 4);
        heap.set(before, outAt / 4);
        kernel.matmulNT(xAt, wAt, outAt, n, k, m, alpha, accumulate);
        const out = heap.subarray(outAt / 4, outAt / 4 + n * m);
        for (let i = 0; i < n; i++) {
          for (let o = 0; o < m; o++) {
            let exact = 0, magnitude = 0;
            for (let j = 0; j < k; j++) {
              exact += x[i * k + j] * w[o * k + j];
              magnitude += Math.abs(x[i * k + j] * w[o * k + j]);
            }
            const previous = accumulate ? before[i * m + o] : 0;
            // Any summation order of k f32 products is within k·ε of Σ|x·w| (plus the scale and the add).
            const bound = (k + 3) * F32_EPSILON * (Math.abs(alpha) * magnitude + Math.abs(previous)) + 1e-30;
            const error = Math.abs(out[i * m + o] - (previous + alpha * exact));
            if (error > bound) throw new Error(`n=${n} k=${k} m=${m} alpha=${alpha} accumulate=${accumulate}: out[${i}, ${o}] is off by ${error} > ${bound}`);
          }
        }
      }
    }
  });

  it.each([true, false])("decoding's products (1-4 rows over f32 or bf16 weights) are within f32 rounding of float64 on edge shapes (fused %s)", (fusedMultiplyAdd) => {
    const kernel = WasmMatmul.create(1, { fusedMultiplyAdd });
    if (!kernel) throw new Error("this runtime has no WebAssembly SIMD");
    const rng = seededRandom(12);
    for (const [k, m] of [[8, 1], [16, 3], [24, 7], [392, 5]]) {
      const w = Float32Array.from({ length: m * k }, () => rng() * 2 - 1);
      const rounded = w.map((v) => new Float32Array(new Uint32Array([new Uint32Array(Float32Array.of(v).buffer)[0] & 0xffff0000]).buffer)[0]);
      const f32At = kernel.allocate(w.byteLength)!;
      kernel.heap.set(w, f32At / 4);
      const bf16At = kernel.residentBf16(rounded)!;
      for (const [weights, at, values] of [["f32", f32At, w], ["bf16", bf16At, rounded]] as const) {
        for (const n of [1, 2, 3, 4]) {
          const x = Float32Array.from({ length: n * k }, () => rng() * 2 - 1), out = new Float32Array(n * m).fill(NaN);
          expect(kernel.decodeLinearArrays(x, at, weights, out, n, k, m)).toBe(true);
          for (let i = 0; i < n; i++) for (let o = 0; o < m; o++) {
            let exact = 0, magnitude = 0;
            for (let j = 0; j < k; j++) {
              exact += x[i * k + j] * values[o * k + j];
              magnitude += Math.abs(x[i * k + j] * values[o * k + j]);
            }
            // Any summation order of k f32 products is within k·ε of Σ|x·w|; a row read from the wrong place is O(1) off.
            const error = Math.abs(out[i * m + o] - exact), bound = (k + 3) * F32_EPSILON * magnitude + 1e-30;
            if (!(error <= bound)) throw new Error(`${weights} n=${n} k=${k} m=${m}: out[${i}, ${o}] is off by ${error} > ${bound}`);
          }
        }
      }
      kernel.release(f32At);
      kernel.release(bf16At);
    }
    expect(() => kernel.decodeLinearArrays(new Float32Array(5 * 8), 0, "f32", new Float32Array(5), 5, 8, 1)).toThrow(/1 to 4 rows/);
    expect(() => kernel.decodeLinearArrays(new Float32Array(12), 0, "f32", new Float32Array(1), 1, 12, 1)).toThrow(/multiple of 8/);
  });

  it("allocates first fit, merges released neighbours and gives free space at the top back", () => {
    const kernel = WasmMatmul.create()!;
    const a = kernel.allocate(100)!, b = kernel.allocate(64)!, c = kernel.allocate(16)!;
    expect([a, b, c]).toEqual([0, 112, 176]);
    expect(kernel.top).toBe(192);
    kernel.release(a);
    kernel.release(b);
    expect(kernel.allocate(150)).toBe(0); // a and b merged into one 176-byte block
    expect(kernel.allocate(16)).toBe(160); // its remainder
    kernel.release(c);
    expect(kernel.top).toBe(176);
    expect(kernel.allocate(200_000)).toBe(176); // past the first 64 KiB page: the memory grows
    expect(kernel.byteLength).toBeGreaterThanOrEqual(176 + 200_000);
    expect(kernel.allocate(2 ** 32)).toBeNull();
    expect(() => kernel.release(8)).toThrow(/no WASM block/);
  });

  it("CpuBackend.linear keeps weights in the WASM memory, their data readable across growth, and frees them", () => {
    const backend = new CpuBackend({ blas: "portable" });
    const rng = seededRandom(5);
    const values = (length: number) => Float32Array.from({ length }, () => rng() - 0.5);
    const [n, k, m] = [3, 21, 10];
    const wValues = values(m * k), xValues = values(n * k);
    const w = backend.upload(wValues.slice(), [m, k]) as CpuTensor, x = backend.upload(xValues, [n, k]);
    const out = backend.zeros([n, m]) as CpuTensor;
    const expected = new Float32Array(n * m);
    matmulNT(xValues, wValues, n, k, m, expected);
    backend.linear(x, w, null, out);
    expect(w.resident).not.toBeNull();
    expect(maxAbsDiff(backend.download(out), expected)).toBeLessThan(1e-6);
    // A weight of 1 MB grows the memory past its first page, detaching the view w.data held.
    const big = backend.upload(values(512 * 512), [512, 512]);
    backend.linear(backend.zeros([1, 512]), big, null, backend.zeros([1, 512]));
    expect(w.data).toEqual(wValues);
    out.data.fill(0);
    backend.linear(x, w, null, out);
    expect(maxAbsDiff(backend.download(out), expected)).toBeLessThan(1e-6);
    const residentAt = w.resident!.offset;
    backend.free(w);
    expect(w.resident).toBeNull();
    const again = backend.upload(wValues.slice(), [m, k]) as CpuTensor;
    backend.linear(x, again, null, out);
    expect(again.resident!.offset).toBe(residentAt); // the freed block is reused
  });

  it("a view of a weight multiplies where its owner lives, moved into the WASM memory or not", () => {
    const backend = new CpuBackend({ blas: "portable" });
    const rng = seededRandom(6);
    const [n, k, m, start, rows] = [3, 21, 10, 4, 5];
    const wValues = Float32Array.from({ length: m * k }, () => rng() - 0.5), xValues = Float32Array.from({ length: n * k }, () => rng() - 0.5);
    const expected = new Float32Array(n * rows);
    matmulNT(xValues, wValues.subarray(start * k), n, k, rows, expected);
    const owner = backend.upload(wValues.slice(), [m, k]) as CpuTensor, x = backend.upload(xValues, [n, k]);
    const view = backend.view(owner, start, rows), out = backend.zeros([n, rows]);
    backend.linear(x, view, null, out); // moves the owner in
    expect(owner.resident).not.toBeNull();
    const first = backend.download(out);
    expect(maxAbsDiff(first, expected)).toBeLessThan(1e-6);
    const whole = backend.zeros([n, m]);
    backend.linear(x, owner, null, whole);
    expect(backend.download(whole).filter((_, i) => i % m >= start && i % m < start + rows)).toEqual(first);
    backend.linear(x, view, null, out);
    expect(backend.download(out)).toEqual(first);
    expect(backend.download(view)).toEqual(wValues.subarray(start * k, (start + rows) * k));
  });

  it("splits a large product over worker threads, by rows or by columns, with the same bits as one thread", async () => {
    const one = WasmMatmul.create(1)!, three = WasmMatmul.create(3)!;
    try {
      expect(await three.startWorkers()).toBe(2);
      const rng = seededRandom(17);
      // Bands of rows (96 and 37 rows, the last band ragged), of columns (2-3 rows; m = 1030 is not a multiple of 4),
      // and a product below the threshold that stays on one thread.
      const shapes: [number, number, number, number][] = [[96, 256, 100, 2], [37, 300, 200, 2], [3, 512, 2000, 2], [2, 1024, 1030, 2], [8, 64, 64, 0]];
      for (const [n, k, m, blocksOnWorkers] of shapes) {
        const counted = three.blocksOnWorkers;
        for (const [alpha, accumulate] of [[1, false], [-0.375, true]] as const) {
          const x = Float32Array.from({ length: n * k }, () => rng() * 2 - 1);
          const w = Float32Array.from({ length: m * k }, () => rng() * 2 - 1);
          const before = Float32Array.from({ length: n * m }, () => rng() * 4 - 2);
          const xAt = 4, wAt = xAt + x.byteLength, outAt = wAt + w.byteLength + 8;
          const results = [one, three].map((kernel) => {
            expect(kernel.ensureBytes(outAt + before.byteLength)).toBe(true);
            kernel.heap.set(x, xAt / 4);
            kernel.heap.set(w, wAt / 4);
            kernel.heap.set(before, outAt / 4);
            kernel.matmulNT(xAt, wAt, outAt, n, k, m, alpha, accumulate);
            return new Uint32Array(kernel.heap.slice(outAt / 4, outAt / 4 + n * m).buffer);
          });
          expect(results[1], `n=${n} k=${k} m=${m}`).toEqual(results[0]);
        }
        expect(three.blocksOnWorkers - counted, `blocks of n=${n} k=${k} m=${m} the workers computed`).toBe(2 * blocksOnWorkers);
      }
      three.close();
      expect(await three.startWorkers(), "workers after close").toBe(0);
    } finally {
      three.close();
    }
  });

  it("decoding's products of a large weight split its columns over worker threads, with the same bits as one thread", async () => {
    const one = WasmMatmul.create(1)!, three = WasmMatmul.create(3)!;
    try {
      expect(await three.startWorkers()).toBe(2);
      const rng = seededRandom(29);
      // 2.1 MB of weights each (at least 2 MiB: 3 and 4 rows split; m = 1030 is not a multiple of 4, so the last band
      // is ragged), and 1 MB, which stays on this thread; 1 and 2 rows always do.
      for (const [weights, k, m, split] of [["f32", 512, 1030, true], ["bf16", 1024, 1030, true], ["f32", 256, 1030, false]] as const) {
        const w = Float32Array.from({ length: m * k }, () => rng() * 2 - 1);
        for (const n of [1, 2, 3, 4]) {
          const x = Float32Array.from({ length: n * k }, () => rng() * 2 - 1);
          const counted = three.blocksOnWorkers;
          const [expected, actual] = [one, three].map((kernel) => {
            const at = weights === "f32" ? kernel.allocate(w.byteLength)! : kernel.residentBf16(w)!;
            if (weights === "f32") kernel.heap.set(w, at / 4);
            const out = new Float32Array(n * m).fill(NaN);
            expect(kernel.decodeLinearArrays(x, at, weights, out, n, k, m)).toBe(true);
            kernel.release(at);
            return new Uint32Array(out.buffer);
          });
          expect(actual, `${weights} n=${n} k=${k} m=${m}`).toEqual(expected);
          expect(three.blocksOnWorkers - counted, `${weights} n=${n} k=${k} m=${m}: blocks on workers`).toBe(split && n >= 3 ? 2 : 0);
        }
      }
    } finally {
      three.close();
    }
  });

  it("CpuBackend's portable products run on its thread count", () => {
    const backend = new CpuBackend({ blas: "portable", threads: 3 });
    expect(backend.gemm.description).toBe("portable (WebAssembly SIMD on 3 threads)");
    const w = backend.upload(new Float32Array(8), [2, 4]) as CpuTensor;
    backend.linear(backend.zeros([1, 4]), w, null, backend.zeros([1, 2]));
    expect(w.resident!.kernel.threads).toBe(3);
  });

  it("the float64 products give the JavaScript reference's bits (x·Wᵀ, dOut·W, aᵀ·b) on every tile and leftover, on one thread and on three, fused or not", async () => {
    // The default module fuses its multiply-adds where the runtime has relaxed SIMD; `plain` never does.
    const one = WasmMatmul.create(1)!, three = WasmMatmul.create(3)!, plain = WasmMatmul.create(1, { fusedMultiplyAdd: false })!;
    try {
      expect(await three.startWorkers()).toBe(2);
      const rng = seededRandom(23);
      // Zeros (and negative zeros) take the reference's skip on leftover rows; the last shapes are large enough to
      // split: bands of rows (with leftover rows in the last), then of columns.
      const value = () => (rng() < 0.2 ? (rng() < 0.5 ? 0 : -0) : rng() * 2 - 1);
      const values = (count: number) => Float32Array.from({ length: count }, value);
      const bits = (x: Float32Array) => new Uint32Array(x.slice().buffer);
      const shapes: [number, number, number][] = [];
      for (const n of [1, 2, 3, 4, 5, 7, 8, 13]) for (const k of [1, 3, 16, 33]) for (const m of [1, 2, 3, 4, 5, 9, 30]) shapes.push([n, k, m]);
      shapes.push([64, 256, 200], [37, 300, 200], [3, 1024, 1000], [200, 300, 40]);
      let ntInWasm = 0;
      for (const [n, k, m] of shapes) {
        const what = (name: string, kernel: WasmMatmul) =>
          `${name} n=${n} k=${k} m=${m} on ${kernel.threads} thread(s)${kernel === plain ? ", unfused" : ""}`;
        // dOut·W, W copied in and W already in the memory (a resident weight, used where it lies).
        const a = values(n * k), b = values(k * m), before = values(n * m).map((v) => v * 3);
        const expected = before.slice();
        matmulNNAccumulate(expected, a, b, n, k, m);
        for (const kernel of [one, three, plain]) {
          const resident = inMemory(kernel, b);
          for (const operand of [b, resident]) {
            const out = before.slice();
            expect(kernel.nnAccumulateArrays(out, a, operand, n, k, m)).toBe(true);
            expect(bits(out), what(operand === b ? "nn" : "nn, resident b", kernel)).toEqual(bits(expected));
          }
          kernel.release(resident.byteOffset);
        }
        // aᵀ·b (a [n, m], b [n, k]) with each operand a slice of wider rows.
        const strides = { aStride: m + 3, bStride: k + 1, outStride: k + 2 };
        const ta = values(n * strides.aStride), tb = values(n * strides.bStride), tBefore = values(m * strides.outStride);
        const tExpected = tBefore.slice();
        matmulTNAccumulate(tExpected, ta, tb, n, m, k, strides);
        for (const kernel of [one, three, plain]) {
          const out = tBefore.slice();
          expect(kernel.tnAccumulateArrays(out, ta, tb, n, m, k, strides)).toBe(true);
          expect(bits(out), what("tn", kernel)).toEqual(bits(tExpected));
        }
        // x·Wᵀ with strides, a scale and accumulation; each orientation (n ≥ m transposes W, n < m transposes x).
        const someColumns = { columnStart: Math.floor(m / 3), columnEnd: m - Math.floor(m / 4), accumulate: true };
        const cases: MatmulOptions[] = [{}, { alpha: 1 / Math.sqrt(7), accumulate: true, xStride: k + 2, wStride: k + 1, outStride: m + 5 }, someColumns];
        for (const options of cases) {
          const x = values(n * (options.xStride ?? k)), w = values(m * (options.wStride ?? k)), ntBefore = values(n * (options.outStride ?? m));
          const ntExpected = ntBefore.slice();
          matmulNT(x, w, n, k, m, ntExpected, options);
          for (const kernel of [one, three, plain]) {
            // W outside the memory (copied or transposed in), and W in it (a KV cache there: read in place).
            const resident = inMemory(kernel, w);
            for (const operand of [w, resident]) {
              const out = ntBefore.slice();
              if (!kernel.ntArrays(x, operand, n, k, m, out, options)) {
                expect((n < 4 && (operand === w || n * k * m < 16_384)) || (options === someColumns && someColumns.columnEnd <= someColumns.columnStart),
                  "only decoding's rows with W outside the memory or a small product (or no columns) stay in JavaScript").toBe(true);
                continue;
              }
              ntInWasm++;
              expect(bits(out), what(`nt ${JSON.stringify(options)}${operand === w ? "" : ", W in the memory"}`, kernel)).toEqual(bits(ntExpected));
            }
            kernel.release(resident.byteOffset);
          }
        }
      }
      expect(ntInWasm).toBeGreaterThan(1400);
      expect(three.blocksOnWorkers, "blocks the workers computed").toBeGreaterThan(12);
    } finally {
      three.close();
    }
  });

  it("CpuBackend keeps a portable KV cache in the WASM memory, where decoding reads it in place, and frees it", () => {
    const spec = { numLayers: 2, numKvHeads: 2, headDim: 16, numSlots: 3, maxPositions: 40 };
    const layers = (cache: object) => (cache as { keys: Float32Array[]; values: Float32Array[] });
    const portable = new CpuBackend({ blas: "portable" });
    const cache = portable.createKvCache(spec);
    const [keys, values] = [layers(cache).keys[0]!, layers(cache).values[1]!];
    expect(keys.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(keys.every((x) => x === 0) && values.every((x) => x === 0)).toBe(true);
    const offset = keys.byteOffset;
    cache.free();
    // The blocks went back: the next cache of the same size gets the same place.
    expect(layers(portable.createKvCache(spec)).keys[0]!.byteOffset).toBe(offset);
  });

  it("a decoding row's p·v over rows in the memory gives matmul.ts weightedRowSum's bits, fused or not", () => {
    const kernels = [WasmMatmul.create(1)!, WasmMatmul.create(1, { fusedMultiplyAdd: false })!];
    const rng = seededRandom(29);
    // Below 16K multiply-adds the row stays in JavaScript (the first three); the rest run in the kernel.
    for (const [count, width, stride] of [[1, 1, 1], [5, 3, 4], [17, 64, 128], [300, 64, 64], [1040, 128, 256], [1300, 13, 13], [257, 67, 70]]) {
      const weights = Float32Array.from({ length: count }, () => rng());
      const rows = Float32Array.from({ length: (count - 1) * stride + width }, () => rng() * 2 - 1);
      const expected = new Float32Array(width);
      weightedRowSum(weights, rows, count, width, stride, expected);
      for (const kernel of kernels) {
        const out = new Float32Array(width);
        expect(kernel.weightedRowSumArrays(weights, rows, count, width, stride, out), "rows outside the memory stay in JavaScript").toBe(false);
        const resident = inMemory(kernel, rows);
        expect(kernel.weightedRowSumArrays(weights, resident, count, width, stride, out)).toBe(count * width >= 16_384);
        if (count * width < 16_384) weightedRowSum(weights, resident, count, width, stride, out);
        expect(new Uint32Array(out.buffer), `count=${count} width=${width} stride=${stride}`).toEqual(new Uint32Array(expected.buffer));
        kernel.release(resident.byteOffset);
      }
    }
  });

  it("says once when a worker thread fails to start, and counts only the workers that did", async () => {
    const warnings: string[] = [];
    // Bytes that are no WebAssembly module: each worker throws compiling them, before it looks at the memory.
    const workers = new MatmulWorkers(Uint8Array.of(0, 1, 2, 3), {}, 2, (message) => warnings.push(message));
    for (let waited = 0; warnings.length === 0 && waited < 5000; waited += 10) await new Promise((resolve) => setTimeout(resolve, 10));
    await new Promise((resolve) => setTimeout(resolve, 100));
    workers.close();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^art-ts: a matrix-product worker thread failed \(.+\); the portable products run on the threads that started, fewer than the 3 asked for \(ART_CPU_THREADS\)$/);
    expect(workers.ready).toBe(0);
  });

  it("lets the process exit while its workers wait for work", () => {
    const kernelModule = new URL("../../lib/model/cpu/wasm-matmul.ts", import.meta.url).href;
    const script = `import { WasmMatmul } from ${JSON.stringify(kernelModule)}; console.log(await WasmMatmul.create(2).startWorkers());`;
    const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 30_000 });
    expect(run.stdout.trim(), run.stderr).toBe("1");
    expect(run.status).toBe(0);
  });

  it("names misplaced operands and refuses memory past 4 GiB", () => {
    const kernel = WasmMatmul.create()!;
    expect(() => kernel.matmulNT(2, 0, 64, 1, 4, 1)).toThrow(ArtError);
    expect(() => kernel.matmulNT(0, 0, kernel.byteLength, 1, 4, 1)).toThrow(/reach past/);
    expect(kernel.ensureBytes(2 ** 32 + 4)).toBe(false);
  });
});
