// When a second BLAS thread pays: the evidence for gemm.ts's bound (products under 2^23 multiply-adds run on one
// thread). Part 1, each product alone: milliseconds of cblas_sgemm (x Wᵀ, row-major, the shapes of the tiny task
// models' and the 20M bench model's layers) on 1 and on 2 of OpenBLAS's threads, called directly (not through the
// Gemm, which would apply the bound), best of rounds, and the count the Gemm now gives that product. Part 2, a whole
// job: the tic-tac-toe demo on the tiny model (DEMO_JOB: models/tictactoe-tiny, whose 64-wide products are nearly
// all small, 120 steps at lr 5e-3; the demo's default before it moved to models/tictactoe-small) on
// ART_CPU_THREADS=1 and 2, wall seconds and CPU seconds (user + system: a spinning BLAS thread shows there),
// alternating runs.
//
// Usage: node bench/cpu-threads.ts [--demo-runs 2] [--out bench/results/cpu-threads.json]
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { openLibrary } from "../lib/core/ffi.ts";
import { cblasSignatures, chooseGemm } from "../lib/model/cpu/gemm.ts";

const { values } = parseArgs({ options: { "demo-runs": { type: "string", default: "2" }, out: { type: "string" } } });
const library = chooseGemm("auto", 1).gemm.library;
if (!library) throw new Error("cpu-threads: no system BLAS opened (apt-get install libopenblas0-pthread)");
const symbols = openLibrary(library, { ...cblasSignatures, openblas_get_num_threads: { result: "i32", args: [], optional: true } }).symbols;
if (!symbols.openblas_set_num_threads) throw new Error(`cpu-threads: ${library} is not OpenBLAS`);

const ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112;
const round = (x: number, places = 3) => Number(x.toFixed(places));

/** [rows, depth (the sum's length), columns]: x [rows, depth] · W [columns, depth]ᵀ. */
const shapes: [number, number, number][] = [
  [70, 64, 128], [256, 64, 192], [512, 64, 192], [2240, 64, 64], [2240, 64, 128], [2240, 64, 512],
  [32, 384, 384], [64, 384, 256], [96, 384, 200], [256, 384, 384], [32, 384, 1536], [256, 384, 3072], [1024, 1536, 384],
];
const products = shapes.map(([n, k, m]) => {
  const x = Float32Array.from({ length: n * k }, (_, i) => ((i * 7919) % 1000) / 1000 - 0.5);
  const w = Float32Array.from({ length: m * k }, (_, i) => ((i * 104729) % 1000) / 1000 - 0.5);
  const out = new Float32Array(n * m);
  // What the Gemm does now: a 2-thread Gemm's product, then OpenBLAS's setting read back. The direct calls below
  // change that setting behind the Gemm's back, so it is put back afterwards.
  chooseGemm(library, 2).gemm.nt(x, w, n, k, m, out);
  const gemmThreads = symbols.openblas_get_num_threads?.() ?? null;
  const repeats = Math.max(5, Math.min(400, Math.floor(3e8 / (n * k * m))));
  const best = [Infinity, Infinity];
  for (let round = 0; round < 5; round++) {
    for (const threads of [1, 2]) {
      symbols.openblas_set_num_threads(threads);
      const start = performance.now();
      for (let r = 0; r < repeats; r++) symbols.cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, n, m, k, 1, x, k, w, k, 0, out, m);
      best[threads - 1] = Math.min(best[threads - 1], (performance.now() - start) / repeats);
    }
  }
  if (gemmThreads !== null) symbols.openblas_set_num_threads(gemmThreads);
  return {
    rows: n, depth: k, columns: m, multiplyAdds: n * k * m, ms1Thread: round(best[0]), ms2Threads: round(best[1]),
    speedupOf2Threads: round(best[0] / best[1], 2), gemmThreads,
  };
});

const DEMO_JOB = "--model models/tictactoe-tiny --steps 120 --lr 0.005";

/** One `art-ts demo` run of DEMO_JOB: wall and CPU seconds, and its results. */
function demo(threads: number) {
  const dir = mkdtempSync(join(os.tmpdir(), "art-threads-"));
  try {
    const started = performance.now();
    const child = execFileSync("bash", ["-c", `TIMEFORMAT='%U %S'; { time node lib/cli.ts demo ${DEMO_JOB} --device cpu --quiet --art-dir '${dir}/art' --out '${dir}/out' > /dev/null; } 2>&1`],
      { encoding: "utf8", env: { ...process.env, ART_CPU_THREADS: String(threads) } });
    const wall = (performance.now() - started) / 1000;
    const [user, system] = child.trim().split(/\s+/).slice(-2).map(Number);
    const summary = JSON.parse(readFileSync(join(dir, "out", "summary.json"), "utf8"));
    return { threads, wallSeconds: round(wall, 1), cpuSeconds: round(user + system, 1), systemSeconds: round(system, 1),
      winSampled: summary.after.winRate, winGreedy: summary.greedy.after.winRate };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
const demos = [];
for (let r = 0; r < Number(values["demo-runs"]); r++) for (const threads of [2, 1]) demos.push(demo(threads));

const report = {
  benchmark: "cpu-threads", command: `node bench/cpu-threads.ts ${process.argv.slice(2).join(" ")}`.trim(),
  machine: `${os.cpus()[0]?.model ?? "cpu"} × ${os.availableParallelism()}`, node: process.version, library,
  loadAverageAtEnd: os.loadavg().map((l) => round(l, 2)),
  what: "each product alone on 1 and 2 OpenBLAS threads (best of 5 rounds) and the count a 2-thread Gemm gives it now; the demo on 1 and 2 threads, alternating",
  products, demos,
};
const json = JSON.stringify(report, null, 2);
console.log(json);
if (values.out) writeFileSync(values.out, json + "\n");
