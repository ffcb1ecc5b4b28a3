// The emulator's own semantics, with probe kernels (emulator/probes.cu). It runs the blocks of a launch and the threads
// between two barriers in seeded random orders (emulator/runtime.cpp), so that a kernel whose result depends on
// either order gives different results, as it could on a GPU: both orders change with the seed, and the race of a
// missing barrier shows up. And it runs the tensor cores' mma.m16n8k16 with the fragment layout of the PTX ISA,
// written out again here from the ISA's tables. Accesses a GPU refuses stop it, where they happen: a read past the end
// of a buffer (each block ends at a guard page) and a misaligned vector load (the alignment sanitizer).
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { openLibrary, type NativeLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
import { type KernelArg, kernelArgBlockBytes, packKernelArgs } from "../../lib/cuda/kernel-args.ts";
import { cString } from "../../lib/core/ffi.ts";
import { f32ToBf16 } from "../../lib/model/safetensors.ts";
import { buildEmulator, findCompiler } from "./emulated-device.ts";

const compiler = findCompiler();
const skipReason = process.arch !== "x64" ? "the emulator's fibers are x86-64 only" : compiler ? "" : "no C++ compiler (g++ or clang++; or set CXX)";

describe.skipIf(skipReason !== "")(`the kernel emulator${skipReason ? ` (skipped: ${skipReason})` : ""}`, () => {
  const memory = hostMemory();
  let lib: NativeLibrary;
  let argBlock: bigint;
  beforeAll(() => {
    lib = openLibrary(buildEmulator(compiler!, [join(import.meta.dirname, "emulator", "probes.cu")]), {
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

  it("stops at a read past the end of a buffer and at a misaligned vector load, as a GPU faults", () => {
    // A Node that runs .ts files: this one, or the repository's pinned one.
    const node = (process.features as { typescript?: unknown }).typescript ? process.execPath : join(import.meta.dirname, "../../node_modules/.bin/node");
    const run = (probe: string) => spawnSync(node, [join(import.meta.dirname, "emulator-fault-main.ts"), probe],
      { encoding: "utf8", timeout: 120_000 });
    const pastEnd = run("probe_read_past_end");
    expect(pastEnd.signal).toBe("SIGSEGV");
    const misaligned = run("probe_misaligned_load");
    expect(misaligned.status).not.toBe(0);
    expect(misaligned.stderr).toMatch(/misaligned address .* for type 'const struct float4', which requires 16 byte alignment/);
    expect(pastEnd.stdout + misaligned.stdout).not.toMatch(/not stopped/);
  });

  it("runs mma.sync.m16n8k16 (bf16 in, f32 out) with the PTX ISA's fragment layout", () => {
    const bf16 = (x: number) => new Float32Array(Uint32Array.of(f32ToBf16(x) << 16).buffer)[0];
    let seed = 3;
    const draw = () => bf16(((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5) * 4);
    const A = Array.from({ length: 16 }, () => Array.from({ length: 16 }, draw));   // [m][k]
    const B = Array.from({ length: 16 }, () => Array.from({ length: 8 }, draw));    // [k][n]
    const C = Array.from({ length: 16 }, () => Array.from({ length: 8 }, draw));
    const pair = (low: number, high: number) => (f32ToBf16(low) | (f32ToBf16(high) << 16)) >>> 0;
    // The ISA's tables, with g = lane / 4 and t = lane % 4.
    const a = new Uint32Array(32 * 4), b = new Uint32Array(32 * 2), c = new Float32Array(32 * 4);
    for (let lane = 0; lane < 32; lane++) {
      const g = lane >> 2, t = lane & 3;
      a.set([pair(A[g][2 * t], A[g][2 * t + 1]), pair(A[g + 8][2 * t], A[g + 8][2 * t + 1]),
        pair(A[g][2 * t + 8], A[g][2 * t + 9]), pair(A[g + 8][2 * t + 8], A[g + 8][2 * t + 9])], 4 * lane);
      b.set([pair(B[2 * t][g], B[2 * t + 1][g]), pair(B[2 * t + 8][g], B[2 * t + 9][g])], 2 * lane);
      c.set([C[g][2 * t], C[g][2 * t + 1], C[g + 8][2 * t], C[g + 8][2 * t + 1]], 4 * lane);
    }
    const d = device(new Float32Array(32 * 4));
    launch("probe_mma", 1, 32, [["ptr", device(a)], ["ptr", device(b)], ["ptr", device(c)], ["ptr", d]]);
    const got = read(d, new Float32Array(32 * 4));
    for (let lane = 0; lane < 32; lane++) {
      const g = lane >> 2, t = lane & 3;
      [[g, 2 * t], [g, 2 * t + 1], [g + 8, 2 * t], [g + 8, 2 * t + 1]].forEach(([row, col], i) => {
        let sum = C[row][col];
        for (let k = 0; k < 16; k++) sum += A[row][k] * B[k][col];
        expect(got[4 * lane + i]).toBeCloseTo(sum, 4);
      });
    }
  });

  it("ldmatrix_x4 gives each lane the ISA's rows (or, transposed, columns) of the four 8 × 8 matrices the lanes address", () => {
    // tile[row][column] = 100 · row + column, as bf16 bits (exact: small integers).
    const tile = new Uint16Array(16 * 16);
    for (let row = 0; row < 16; row++) for (let column = 0; column < 16; column++) tile[row * 16 + column] = f32ToBf16(100 * row + column);
    const input = device(new Uint32Array(tile.buffer));
    for (const trans of [false, true]) {
      const out = device(new Uint32Array(32 * 4));
      launch("probe_ldmatrix", 1, 32, [["ptr", input], ["ptr", out], ["i32", trans ? 1 : 0]]);
      const got = read(out, new Uint32Array(32 * 4));
      for (let lane = 0; lane < 32; lane++) {
        for (let i = 0; i < 4; i++) {
          // Matrix i is the one lanes 8i .. 8i + 7 address: rows 8 · (i % 2) .., columns 8 · (i / 2) .. of the tile.
          const [row0, column0] = [8 * (i % 2), 8 * Math.floor(i / 2)];
          // The ISA: lane l holds row l / 4, elements 2(l % 4) and 2(l % 4) + 1; with .trans, column l / 4, rows 2(l % 4), 2(l % 4) + 1.
          const at = (k: number) => (trans ? tile[(row0 + 2 * (lane % 4) + k) * 16 + column0 + (lane >> 2)] : tile[(row0 + (lane >> 2)) * 16 + column0 + 2 * (lane % 4) + k]);
          expect(got[4 * lane + i]).toBe((at(0) | (at(1) << 16)) >>> 0);
        }
      }
    }
  });

  it("lands a thread's cp.async copies when it waits for their group, not before; a copy of no source bytes writes zeros", () => {
    const source = device(Float32Array.from([1.5, 2.5, 3.5, 4.5]));
    for (const [sourceBytes, landed] of [[16, [1.5, 2.5, 3.5, 4.5]], [0, [0, 0, 0, 0]]] as const) {
      const out = device(new Float32Array(8));
      launch("probe_cp_async", 1, 1, [["ptr", source], ["ptr", out], ["i32", sourceBytes]]);
      expect([...read(out, new Float32Array(8))]).toEqual([-1, -1, -1, -1, ...landed]);
    }
  });
});
