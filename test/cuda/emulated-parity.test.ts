// The parity suite on the CPU emulation of the kernels (test/cuda/emulated-device.ts): the kernels' arithmetic
// checked without a GPU, at smaller sizes (every CUDA thread is a fiber on one CPU thread). Needs a C++20 compiler
// and x86-64 (the fiber switch is x86-64 assembly). ~20 s on two cores.
import { buildEmulator, createEmulatedBackend, findCompiler } from "./emulated-device.ts";
import { defineParitySuite } from "./parity-suite.ts";

const compiler = findCompiler();
const skipReason = process.arch !== "x64" ? "skipped: the emulator's fibers are x86-64 only"
  : compiler ? "" : "skipped: no C++ compiler (g++ or clang++; or set CXX)";
defineParitySuite(`CUDA kernels on the CPU emulator vs the CPU backend${skipReason ? ` (${skipReason})` : ""}`,
  skipReason !== "", (options) => createEmulatedBackend(buildEmulator(compiler!), options), { vocab: 3000, maxContext: 300, drawVocab: 64, draws: 256 });
