// lib/cuda/availability.ts's two functions answered by the kernel emulator: `device: "cuda"` then runs the CUDA
// backend on the CPU emulation of the .cu kernels (emulated-device.ts). `node --import emulated-cuda-hooks.ts` puts
// this module in place of lib/cuda/availability (scripts/notebook-run.ts --cuda-emulator does), so a whole program,
// a notebook or a bench, runs its GPU path, host logic and kernels alike, on a machine without a GPU.
import type { CreateCudaBackendOptions, CudaAvailability } from "../../lib/cuda/availability.ts";
import type { CudaBackend } from "../../lib/cuda/backend.ts";
import { buildEmulator, createEmulatedBackend, findCompiler } from "./emulated-device.ts";

const reason = "the kernel emulator (test/cuda/emulated-device.ts): the .cu kernels compiled for the CPU";
const noCompiler = "the kernel emulator needs a C++ compiler (g++ or clang++)";

export function cudaAvailability(): CudaAvailability {
  return findCompiler() ? { ok: true, reason } : { ok: false, reason: noCompiler };
}

export function createCudaBackend(options: CreateCudaBackendOptions = {}): CudaBackend {
  const compiler = findCompiler();
  if (!compiler) throw new Error(noCompiler);
  options.log?.(`art-ts cuda: ${reason}`);
  return createEmulatedBackend(buildEmulator(compiler), { graphs: options.graphs, log: options.log }) as unknown as CudaBackend;
}
