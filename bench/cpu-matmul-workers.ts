/**
 * Do worker threads pay off for the CPU backend's matmul? Times `x Wᵀ` on the 20M config's largest shapes
 * (decode: 4 rows, prefill: 256 rows) single-threaded and split by output columns between the main thread and
 * one worker (shared memory, Atomics for the hand-off: the cheapest synchronisation there is). Prints JSON.
 *
 * usage: node bench/cpu-matmul-workers.ts
 */
import * as os from "node:os";
import { Worker } from "node:worker_threads";
import { matmulNT } from "../lib/model/cpu/matmul.ts";
import { compare } from "./timing.ts";

const shapes = [
  { name: "decode gate_proj", n: 4, k: 384, m: 1536 },
  { name: "decode down_proj", n: 4, k: 1536, m: 384 },
  { name: "prefill gate_proj", n: 256, k: 384, m: 1536 },
  { name: "prefill down_proj", n: 256, k: 1536, m: 384 },
];

// The worker waits on control[0] (a job counter), computes columns [m/2, m), and bumps control[1] when done.
const workerSource = `
  const { workerData } = require("node:worker_threads");
  const { control, x, w, out, n, k, m, kernelUrl } = workerData;
  import(kernelUrl).then(({ matmulNT }) => {
    const xs = new Float32Array(x), ws = new Float32Array(w), os = new Float32Array(out);
    let seen = 0;
    for (;;) {
      Atomics.wait(control, 0, seen);
      seen = Atomics.load(control, 0);
      if (seen < 0) return;
      matmulNT(xs, ws, n, k, m, os, { columnStart: m / 2 });
      Atomics.add(control, 1, 1);
      Atomics.notify(control, 1);
    }
  });
`;

async function main(): Promise<void> {
  const results = [];
  for (const { name, n, k, m } of shapes) {
    const x = new Float32Array(new SharedArrayBuffer(n * k * 4)).map(() => Math.random() - 0.5);
    const w = new Float32Array(new SharedArrayBuffer(m * k * 4)).map(() => Math.random() - 0.5);
    const out = new Float32Array(new SharedArrayBuffer(n * m * 4));
    const control = new Int32Array(new SharedArrayBuffer(8));
    const kernelUrl = new URL("../lib/model/cpu/kernels.ts", import.meta.url).href;
    const worker = new Worker(workerSource, { eval: true, workerData: { control, x: x.buffer, w: w.buffer, out: out.buffer, n, k, m, kernelUrl } });
    await new Promise((resolve) => setTimeout(resolve, 300)); // let the worker load the kernel
    let jobs = 0;
    const [single, split] = compare([() => matmulNT(x, w, n, k, m, out), () => {
      jobs++;
      Atomics.store(control, 0, jobs);
      Atomics.notify(control, 0);
      matmulNT(x, w, n, k, m, out, { columnEnd: m / 2 });
      while (Atomics.load(control, 1) < jobs) Atomics.wait(control, 1, Atomics.load(control, 1), 50);
    }]);
    Atomics.store(control, 0, -1);
    Atomics.notify(control, 0);
    await worker.terminate();
    results.push({
      shape: name, n, k, m,
      singleThreadMs: Number(single.toFixed(3)), twoThreadsMs: Number(split.toFixed(3)),
      speedup: Number((single / split).toFixed(2)),
      singleGflops: Number(((2 * n * k * m) / single / 1e6).toFixed(2)),
    });
  }
  console.log(JSON.stringify({
    benchmark: "cpu-matmul-workers", command: "node bench/cpu-matmul-workers.ts",
    machine: `${os.cpus()[0]?.model ?? "cpu"} × ${os.availableParallelism()}`, loadAverage: os.loadavg().map((l) => Number(l.toFixed(2))),
    results,
  }, null, 2));
}

main();
