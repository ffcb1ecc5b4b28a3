// What sampling a row of logits costs the CPU backend: nanoseconds per vocabulary entry of `sampleRows` (the draw's
// weights, its thresholds and walk, and the logprobs' normaliser), with the JavaScript references
// (`referenceSamplerKernels`: samplingExp emulating f32 arithmetic with Math.fround, the float64 log-sum-exp), with
// the references' weights beside the WebAssembly log-sum-exp (what the system-BLAS backend ran before the weights had
// a kernel), and with the WebAssembly kernels (`WasmElementwise`: what it runs now). The ids drawn are checked equal on
// every side (the weights are the same bits). Seeded logits spread over ±10, one uniform per row; best of rounds.
//
// Usage: node bench/cpu-sampler.ts [--rounds 7] [--out bench/results/cpu-sampler.json]
import { writeFileSync } from "node:fs";
import os from "node:os";
import { parseArgs } from "node:util";
import { seededRandom } from "../lib/core/random.ts";
import type { SamplingParams } from "../lib/model/backend.ts";
import { referenceSamplerKernels, type SamplerKernels, sampleRows } from "../lib/model/cpu/sample.ts";
import { WasmElementwise } from "../lib/model/cpu/wasm-elementwise.ts";

const { values } = parseArgs({ options: { rounds: { type: "string", default: "7" }, out: { type: "string" } } });
const rounds = Number(values.rounds);
const wasm = WasmElementwise.create();
if (!wasm) throw new Error("cpu-sampler: this runtime has no WebAssembly SIMD");

const sides: Record<string, SamplerKernels> = {
  reference: referenceSamplerKernels,
  referenceWeightsWasmLogSumExp: { logSumExp: (row) => wasm.logSumExp(row), samplingWeights: referenceSamplerKernels.samplingWeights },
  wasm,
};

const round = (x: number, places = 2) => Number(x.toFixed(places));
const results = [];
for (const { vocab, rows } of [{ vocab: 512, rows: 64 }, { vocab: 151_936, rows: 8 }]) {
  for (const topP of [1, 0.9]) {
    const rng = seededRandom(vocab + rows);
    const logits = Float32Array.from({ length: rows * vocab }, () => (rng() - 0.5) * 20);
    const params: SamplingParams = {
      temperature: new Float32Array(rows).fill(1), topK: new Int32Array(rows), topP: new Float32Array(rows).fill(topP),
      uniforms: Float32Array.from({ length: rows }, () => rng()), numTopLogprobs: 0,
    };
    const calls = Math.max(1, Math.round(2e6 / (rows * vocab)));
    const nsPerEntry: Record<string, number> = {};
    let ids: Int32Array | null = null;
    for (const [name, kernels] of Object.entries(sides)) {
      let best = Infinity;
      for (let r = 0; r < rounds; r++) {
        const start = performance.now();
        for (let c = 0; c < calls; c++) {
          const drawn = sampleRows(logits, vocab, params, kernels).ids;
          if (ids === null) ids = drawn;
          else if (drawn.some((id, i) => id !== ids![i])) throw new Error(`cpu-sampler: ${name} drew other ids than the reference`);
        }
        best = Math.min(best, (performance.now() - start) / calls);
      }
      nsPerEntry[name] = round((best * 1e6) / (rows * vocab));
    }
    results.push({
      vocab, rows, topP, nsPerEntry, msPerRow: Object.fromEntries(Object.entries(nsPerEntry).map(([k, ns]) => [k, round((ns * vocab) / 1e6, 3)])),
      speedupOverBefore: round(nsPerEntry.referenceWeightsWasmLogSumExp / nsPerEntry.wasm),
    });
  }
}
const report = {
  benchmark: "cpu-sampler", command: `node bench/cpu-sampler.ts ${process.argv.slice(2).join(" ")}`.trim(),
  machine: `${os.cpus()[0]?.model ?? "cpu"} × ${os.availableParallelism()}`, node: process.version,
  loadAverageAtEnd: os.loadavg().map((l) => round(l)),
  what: "ns per vocabulary entry of sampleRows (temperature 1, top-p as given), best of rounds; the same ids on every side",
  results,
};
const json = JSON.stringify(report, null, 2);
console.log(json);
if (values.out) writeFileSync(values.out, json + "\n");
