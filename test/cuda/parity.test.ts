// GPU acceptance: the parity suite (parity-suite.ts) on the real device. Runs only with ART_TEST_GPU=1 on a machine
// with CUDA; elsewhere it skips and says why.
import { createCudaBackend } from "../../lib/cuda/mod.ts";
import { cudaAvailable, gpuSkipReason } from "./gpu.ts";
import { defineParitySuite } from "./parity-suite.ts";

defineParitySuite(`CUDA backend parity with the CPU backend${gpuSkipReason ? ` (${gpuSkipReason})` : ""}`, !cudaAvailable,
  (options) => createCudaBackend({ log: (m) => console.info(m), ...options }), { vocab: 151_936, maxContext: 1000, drawVocab: 1000, draws: 4000 });
