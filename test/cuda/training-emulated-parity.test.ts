// The training parity suite on the CPU emulation of the kernels (emulated-device.ts), with the emulator's reference
// of cublasGemmEx fed the arguments Blas gives cuBLAS. Needs a C++20 compiler and x86-64, like emulated-parity.test.ts.
import { buildEmulator, createEmulatedBackend, findCompiler } from "./emulated-device.ts";
import { defineTrainingParitySuite } from "./training-parity-suite.ts";

const compiler = findCompiler();
const skipReason = process.arch !== "x64" ? "skipped: the emulator's fibers are x86-64 only"
  : compiler ? "" : "skipped: no C++ compiler (g++ or clang++; or set CXX)";
defineTrainingParitySuite(`CUDA training ops on the CPU emulator vs the CPU backend${skipReason ? ` (${skipReason})` : ""}`,
  skipReason !== "", () => createEmulatedBackend(buildEmulator(compiler!)));
