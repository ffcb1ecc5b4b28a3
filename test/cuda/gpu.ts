// Whether the GPU suites run: only with ART_TEST_GPU=1, which says "this machine has a working GPU". Then a CUDA
// backend that cannot start fails the suites that import this (it never turns them into skips), so a GPU check
// cannot pass by skipping everything.
import { ArtError } from "../../lib/core/errors.ts";
import { cudaAvailability } from "../../lib/cuda/mod.ts";

const requested = process.env.ART_TEST_GPU === "1";
if (requested) {
  const availability = cudaAvailability();
  if (!availability.ok) throw new ArtError("cuda_unavailable", `ART_TEST_GPU=1 but CUDA is unavailable: ${availability.reason}`);
}

export const cudaAvailable = requested;
export const gpuSkipReason = requested ? "" : "skipped: GPU suites run only with ART_TEST_GPU=1";
