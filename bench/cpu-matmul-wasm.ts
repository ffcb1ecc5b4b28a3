/**
 * Is the WebAssembly SIMD matmul worth it? Times `x Wᵀ` on the 20M bench config's linear shapes (decode: 1 and
 * 4 rows, prefill: 256 rows) three ways, alternating in one process: the JavaScript kernel (kernels.ts matmulNT),
 * the WASM kernel alone (operands already in its memory), and the WASM kernel with the activations copied in and
 * the result copied out per call (the weight stays resident: what an integration that keeps weights in the WASM
 * memory and copies activations pays). Prints JSON.
 *
 * usage: node bench/cpu-matmul-wasm.ts [--out bench/results/cpu-matmul-wasm.json]
 */
import * as fs from "node:fs";
import * as os from "node:os";
import { seededRandom } from "../lib/core/random.ts";
import { matmulNT } from "../lib/model/cpu/matmul.ts";
import { WasmMatmul } from "../lib/model/cpu/wasm-matmul.ts";
import { compare } from "./timing.ts";

// hidden 384, intermediate 1536, 6 query heads and 2 KV heads of 64, vocabulary 8192 (scripts/make-tiny-checkpoint.ts).
const projections = [
  { name: "q_proj", k: 384, m: 384 },
  { name: "k_proj", k: 384, m: 128 },
  { name: "gate_proj", k: 384, m: 1536 },
  { name: "down_proj", k: 1536, m: 384 },
  { name: "lm_head", k: 384, m: 8192 },
];

function main(argv: string[]): void {
  const kernel = WasmMatmul.create();
  if (!kernel) throw new Error("this runtime has no WebAssembly SIMD");
  const rng = seededRandom(3);
  const results = [];
  for (const { name, k, m } of projections) {
    // The lm_head only sees the last row of each sequence, never a whole prefill.
    for (const n of name === "lm_head" ? [1, 4] : [1, 4, 256]) {
      const x = Float32Array.from({ length: n * k }, () => rng() - 0.5);
      const w = Float32Array.from({ length: m * k }, () => rng() - 0.5);
      const out = new Float32Array(n * m);
      const wAt = 0, xAt = w.byteLength, outAt = xAt + x.byteLength;
      if (!kernel.ensureBytes(outAt + out.byteLength)) throw new Error("WASM memory refused to grow");
      kernel.heap.set(w, wAt / 4);
      kernel.heap.set(x, xAt / 4);
      const [js, wasm, wasmWithCopies] = compare([
        () => matmulNT(x, w, n, k, m, out),
        () => kernel.matmulNT(xAt, wAt, outAt, n, k, m),
        () => {
          const heap = kernel.heap;
          heap.set(x, xAt / 4);
          kernel.matmulNT(xAt, wAt, outAt, n, k, m);
          out.set(heap.subarray(outAt / 4, outAt / 4 + n * m));
        },
      ], 5);
      const gflops = (ms: number) => Number(((2 * n * k * m) / ms / 1e6).toFixed(2));
      results.push({
        shape: `${n === 256 ? "prefill" : "decode"} ${name}`, n, k, m,
        jsMs: Number(js.toFixed(4)), wasmMs: Number(wasm.toFixed(4)), wasmWithCopiesMs: Number(wasmWithCopies.toFixed(4)),
        jsGflops: gflops(js), wasmGflops: gflops(wasm),
        speedup: Number((js / wasm).toFixed(2)), speedupWithCopies: Number((js / wasmWithCopies).toFixed(2)),
      });
    }
  }
  const report = {
    benchmark: "cpu-matmul-wasm", command: "node bench/cpu-matmul-wasm.ts",
    machine: `${os.cpus()[0]?.model ?? "cpu"} × ${os.availableParallelism()}`, node: process.version,
    loadAverageAtEnd: os.loadavg().map((l) => Number(l.toFixed(2))),
    note: "single thread; best of 5 alternating 300 ms windows per variant; speedup = JS time / WASM time",
    results,
  };
  const json = JSON.stringify(report, null, 2);
  console.log(json);
  const outIndex = argv.indexOf("--out");
  if (outIndex >= 0) fs.writeFileSync(argv[outIndex + 1], `${json}\n`);
}

main(process.argv.slice(2));
