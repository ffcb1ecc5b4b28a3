// GPU acceptance: the parity suite (parity-suite.ts) on the real device. Runs only with ART_TEST_GPU=1 on a machine
// with CUDA; elsewhere it skips and says why. ART_TEST_PARITY_SIZES=small runs it at the emulator's sizes: the GPU
// check's racecheck, which did not finish the full sizes in 160 s (the kernels and their paths are the same).
import { createCudaBackend } from "../../lib/cuda/mod.ts";
import { cudaAvailable, gpuSkipReason } from "./gpu.ts";
import { defineParitySuite } from "./parity-suite.ts";

defineParitySuite(`CUDA backend parity with the CPU backend${gpuSkipReason ? ` (${gpuSkipReason})` : ""}`, !cudaAvailable,
  (options) => createCudaBackend({ log: (m) => console.info(m), ...options }), process.env.ART_TEST_PARITY_SIZES === "small"
    ? { vocab: 3000, maxContext: 300, drawVocab: 64, draws: 256 }
    : { vocab: 151_936, maxContext: 1000, drawVocab: 1000, draws: 4000 });
