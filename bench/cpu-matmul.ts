/**
 * The CPU's matrix products side by side: `x Wᵀ` on the 20M bench config's linear shapes (decode: 1 and 4 rows,
 * prefill: 256 rows) by the JavaScript kernel, the WASM SIMD kernel on 1 thread and on all cores (weight resident,
 * activations copied in and out as CpuBackend.linear does) and the system BLAS at 1 thread and at all cores (what
 * CpuBackend uses by default), beside the machine's measured peak: the system BLAS on a 1024³ product, where packing
 * and call costs vanish. Then the portable products with the JavaScript reference's bits at the prefill shapes: the
 * backward's `dOut · W` and `x Wᵀ` as LoRA, attention and the logit blocks call it, by the JavaScript kernels and by
 * the WASM kernel's float64 sums on 1 thread and on all cores. Variants alternate in short windows so outside load
 * hits them alike. Prints JSON.
 *
 * usage: node bench/cpu-matmul.ts [--out bench/results/cpu-matmul.json]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import { seededRandom } from "../lib/core/random.ts";
import { chooseGemm, type Gemm, systemGemm } from "../lib/model/cpu/gemm.ts";
import { matmulNNAccumulate, matmulNT } from "../lib/model/cpu/matmul.ts";
import { WasmMatmul } from "../lib/model/cpu/wasm-matmul.ts";
import { openblasPins } from "./peers/environment.ts";
import { compare } from "./timing.ts";

// hidden 384, intermediate 1536, 6 query heads and 2 KV heads of 64, vocabulary 8192 (scripts/make-tiny-checkpoint.ts).
const projections = [
  { name: "q_proj", k: 384, m: 384 },
  { name: "k_proj", k: 384, m: 128 },
  { name: "gate_proj", k: 384, m: 1536 },
  { name: "down_proj", k: 1536, m: 384 },
  { name: "lm_head", k: 384, m: 8192 },
];

const gflops = (n: number, k: number, m: number, ms: number) => Number(((2 * n * k * m) / ms / 1e6).toFixed(1));

async function main(argv: string[]): Promise<void> {
  const cores = os.availableParallelism();
  const kernels = [WasmMatmul.create(1), WasmMatmul.create(cores)];
  if (!kernels[0] || !kernels[1]) throw new Error("this runtime has no WebAssembly SIMD");
  const workers = await kernels[1].startWorkers();
  if (workers !== cores - 1) throw new Error(`${workers} of the WASM matmul's ${cores - 1} worker threads started`);
  const library = chooseGemm("auto", 1).gemm.library;
  const blas: { name: string; gemm: Gemm }[] = library
    ? [{ name: "blas1Thread", gemm: systemGemm(library, 1) }, { name: `blas${cores}Threads`, gemm: systemGemm(library, cores) }]
    : [];
  const rng = seededRandom(3);
  const fill = (length: number) => Float32Array.from({ length }, () => rng() - 0.5);

  const peak = blas.map(({ name, gemm }) => {
    const size = 1024, a = fill(size * size), b = fill(size * size), out = new Float32Array(size * size);
    const [ms] = compare([() => gemm.nt(a, b, size, size, size, out)], 3);
    return { side: name, gflops: gflops(size, size, size, ms) };
  });

  const results = [];
  for (const { name, k, m } of projections) {
    // The lm_head only sees the last row of each sequence, never a whole prefill.
    for (const n of name === "lm_head" ? [1, 4] : [1, 4, 256]) {
      const x = fill(n * k), w = fill(m * k), out = new Float32Array(n * m);
      const wAt = 0, xAt = w.byteLength, outAt = xAt + x.byteLength;
      for (const kernel of kernels) {
        if (!kernel!.ensureBytes(outAt + out.byteLength)) throw new Error("WASM memory refused to grow");
        kernel!.heap.set(w, wAt / 4);
      }
      const times = compare([
        () => matmulNT(x, w, n, k, m, out),
        ...kernels.map((kernel) => () => {
          const heap = kernel!.heap;
          heap.set(x, xAt / 4);
          kernel!.matmulNT(xAt, wAt, outAt, n, k, m);
          out.set(heap.subarray(outAt / 4, outAt / 4 + n * m));
        }),
        ...blas.map(({ gemm }) => () => gemm.nt(x, w, n, k, m, out)),
      ], 5);
      const sides = ["javascript", "wasm1Thread", `wasm${cores}Threads`, ...blas.map((b) => b.name)];
      results.push({
        shape: `${n === 256 ? "prefill" : "decode"} ${name}`, n, k, m,
        gflops: Object.fromEntries(sides.map((side, i) => [side, gflops(n, k, m, times[i])])),
      });
    }
  }
  // The float64-summed products at the prefill shapes: dx = dOut · W (W resident, as after the forward's linear)
  // and x Wᵀ through the memory (W transposed in), each beside the JavaScript it replaces.
  const exact = [];
  for (const { name, k, m } of projections.filter((p) => p.name !== "lm_head")) {
    const n = 256, dOut = fill(n * m), x = fill(n * k), w = fill(m * k), dx = new Float32Array(n * k), out = new Float32Array(n * m);
    const resident = kernels.map((kernel) => {
      const at = kernel!.allocate(w.byteLength)! / 4;
      const view = kernel!.heap.subarray(at, at + w.length);
      view.set(w);
      return view;
    });
    const times = compare([
      () => matmulNNAccumulate(dx, dOut, w, n, m, k),
      ...kernels.map((kernel, i) => () => kernel!.nnAccumulateArrays(dx, dOut, resident[i]!, n, m, k)),
      () => matmulNT(x, w, n, k, m, out),
      ...kernels.map((kernel) => () => kernel!.ntArrays(x, w, n, k, m, out)),
    ], 5);
    const sides = ["javascript", "wasmF64_1Thread", `wasmF64_${cores}Threads`];
    exact.push(
      { shape: `prefill dOut·W ${name}`, n, k: m, m: k, gflops: Object.fromEntries(sides.map((side, i) => [side, gflops(n, k, m, times[i])])) },
      { shape: `prefill x·Wᵀ ${name}`, n, k, m, gflops: Object.fromEntries(sides.map((side, i) => [side, gflops(n, k, m, times[3 + i])])) },
    );
    resident.forEach((view, i) => kernels[i]!.release(view.byteOffset));
  }
  const report = {
    benchmark: "cpu-matmul", command: "node bench/cpu-matmul.ts",
    machine: `${os.cpus()[0]?.model ?? "cpu"} × ${cores}`, node: process.version,
    systemBlas: blas[0]?.gemm.description ?? null, openblasEnvironment: openblasPins(),
    loadAverageAtEnd: os.loadavg().map((l) => Number(l.toFixed(2))),
    note: "GFLOP/s = 2·n·k·m / best of 5 alternating 300 ms windows; javascript is single-threaded; the WASM kernel " +
      "splits a product of at least 2M multiply-adds over its threads (smaller ones run on one); " +
      "peak = the system BLAS on a 1024 × 1024 × 1024 product; float64Sums = the portable products with the " +
      "JavaScript reference's bits (matmulF64), operands copied (and W transposed for x·Wᵀ) through the WASM memory",
    peak,
    results,
    float64Sums: exact,
  };
  const json = JSON.stringify(report, null, 2);
  console.log(json);
  const outIndex = argv.indexOf("--out");
  if (outIndex >= 0) fs.writeFileSync(argv[outIndex + 1], `${json}\n`);
  kernels[1].close();
}

await main(process.argv.slice(2));
