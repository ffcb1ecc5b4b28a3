// GPU acceptance of the training ops: the training parity suite on the real device (cuBLAS, the compiled kernels).
// Runs only with ART_TEST_GPU=1 on a machine with CUDA; elsewhere it skips and says why.
import { createCudaBackend } from "../../lib/cuda/mod.ts";
import { cudaAvailable, gpuSkipReason } from "./gpu.ts";
import { defineTrainingParitySuite } from "./training-parity-suite.ts";

defineTrainingParitySuite(`CUDA training ops vs the CPU backend's${gpuSkipReason ? ` (${gpuSkipReason})` : ""}`, !cudaAvailable,
  () => createCudaBackend({ log: (m) => console.info(m) }));
