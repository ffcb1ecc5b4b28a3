// The emulator runs the blocks of a launch and the threads between two barriers in seeded random orders
// (emulator/runtime.cpp), so that a kernel whose result depends on either order gives different results, as it
// could on a GPU. These probes show both orders change with the seed, and that the race of a missing barrier shows up.
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { openLibrary, type NativeLibrary } from "../../lib/cuda/ffi.ts";
import { hostMemory } from "../../lib/cuda/host-memory.ts";
import { type KernelArg, kernelArgBlockBytes, packKernelArgs } from "../../lib/cuda/kernel-args.ts";
import { cString } from "../../lib/cuda/ffi.ts";
import { buildEmulator, findCompiler } from "./emulated-device.ts";

const compiler = findCompiler();
const skipReason = process.arch !== "x64" ? "the emulator's fibers are x86-64 only" : compiler ? "" : "no C++ compiler (g++ or clang++; or set CXX)";

describe.skipIf(skipReason !== "")(`the emulator's block and thread orders${skipReason ? ` (skipped: ${skipReason})` : ""}`, () => {
  const memory = hostMemory();
  let lib: NativeLibrary;
  let argBlock: bigint;
  beforeAll(() => {
    lib = openLibrary(buildEmulator(compiler!, [join(import.meta.dirname, "emulator", "order-probes.cu")]), {
      emu_alloc: { result: "pointer", args: ["u64"] },
      emu_launch: { result: "i32", args: ["buffer", "u32", "u32", "u32", "u32", "u32", "u32", "u32", "pointer"] },
      emu_set_seed: { result: "void", args: ["u64"] },
    });
    argBlock = memory.malloc(kernelArgBlockBytes(8));
  });
  const launch = (name: string, blocks: number, threads: number, args: KernelArg[]) => {
    memory.write(argBlock, packKernelArgs(args, argBlock));
    expect(lib.symbols.emu_launch(cString(name), blocks, 1, 1, threads, 1, 1, 0, argBlock)).toBe(0);
  };
  const device = (values: Uint32Array | Float32Array): bigint => {
    const address = lib.symbols.emu_alloc(values.byteLength) as bigint;
    memory.write(address, values);
    return address;
  };
  const read = <T extends Uint32Array | Float32Array>(address: bigint, out: T): T => {
    memory.read(address, out);
    return out;
  };

  it("runs the blocks of a launch in an order that changes with the seed", () => {
    const orderOf = (seed: number) => {
      lib.symbols.emu_set_seed(BigInt(seed));
      const counter = device(new Uint32Array(1)), order = device(new Uint32Array(32));
      launch("probe_block_order", 32, 32, [["ptr", counter], ["ptr", order]]);
      return Array.from(read(order, new Uint32Array(32)));
    };
    const [a, b] = [orderOf(1), orderOf(2)];
    expect([...a].sort((x, y) => x - y)).toEqual(Array.from({ length: 32 }, (_, i) => i)); // each block once
    expect(a).not.toEqual(b);
    expect(orderOf(1)).toEqual(a); // a seed gives its order again
  });

  it("exposes a missing barrier: the racy kernel's output depends on the seed, the synced one's never does", () => {
    const input = Float32Array.from({ length: 4 * 64 }, (_, i) => i);
    const expected = Float32Array.from(input, (_, i) => input[i - (i % 64) + ((i % 64) + 1) % 64]);
    const outputs = (synced: number) => [1, 2, 3, 4].map((seed) => {
      lib.symbols.emu_set_seed(BigInt(seed));
      const out = device(new Float32Array(input.length));
      launch("probe_neighbour", 4, 64, [["ptr", device(input)], ["ptr", out], ["i32", synced]]);
      return read(out, new Float32Array(input.length));
    });
    for (const out of outputs(1)) expect(out).toEqual(expected);
    // Which neighbours had written when a thread read depends on the thread order: it changes with the seed.
    const racy = outputs(0);
    expect(racy.some((out) => out.some((x, i) => x !== expected[i]))).toBe(true);
    expect(new Set(racy.map((out) => out.join(","))).size).toBeGreaterThan(1);
  });
});
