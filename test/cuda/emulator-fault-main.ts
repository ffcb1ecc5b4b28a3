// Run by emulator.test.ts in a child process, since the access it makes stops the process: launches the probe kernel
// named by argv[2] (probe_read_past_end or probe_misaligned_load) on the emulator, then prints "not stopped".
import { join } from "node:path";
import { cString, openLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
import { kernelArgBlockBytes, packKernelArgs } from "../../lib/cuda/kernel-args.ts";
import { buildEmulator, findCompiler } from "./emulated-device.ts";

const lib = openLibrary(buildEmulator(findCompiler()!, [join(import.meta.dirname, "emulator", "probes.cu")]), {
  emu_alloc: { result: "pointer", args: ["u64"] },
  emu_launch: { result: "i32", args: ["buffer", "u32", "u32", "u32", "u32", "u32", "u32", "u32", "pointer"] },
}).symbols;
const memory = hostMemory();
const n = 64;  // 256 bytes: the block ends where its guard page begins
const input = lib.emu_alloc(n * 4) as bigint, output = lib.emu_alloc(16) as bigint;
memory.write(input, new Float32Array(n).fill(1));
const argBlock = memory.malloc(kernelArgBlockBytes(4));
const probe = process.argv[2];
memory.write(argBlock, packKernelArgs([["ptr", input], ["ptr", output], ["i64", n]], argBlock));
lib.emu_launch(cString(probe), 1, 1, 1, 32, 1, 1, 0, argBlock);
console.log("not stopped");
