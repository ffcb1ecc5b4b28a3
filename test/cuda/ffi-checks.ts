// FFI checks against libc, shared by the Node test and the Deno run of the same checks (no test framework here).
import { cString, ffiRuntime, openLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
import { packKernelArgs } from "../../lib/cuda/kernel-args.ts";

export function runFfiChecks(): Record<string, unknown> {
  const libc = openLibrary("libc.so.6", {
    strlen: { result: "u64", args: ["buffer"] },
    strtoull: { result: "u64", args: ["buffer", "pointer", "i32"] },
    abs: { result: "i32", args: ["i32"] },
    getenv: { result: "pointer", args: ["buffer"] },
    // An out-param of 8 bytes: a BigUint64Array(1) through a buffer slot keeps its bigint type.
    memcpy: { result: "pointer", args: ["buffer", "buffer", "u64"] },
    cuNoSuchFunction: { result: "i32", args: [], optional: true },
  });
  const c = libc.symbols;
  const memory = hostMemory();
  const out = new BigUint64Array(1);
  c.memcpy(out, new BigUint64Array([5n]), 8);
  const block = memory.malloc(64);
  const args = packKernelArgs([["ptr", 0x7f00_0000_1234n], ["i32", -3], ["f32", 0.5]], block);
  memory.write(block, args);
  const readBack = new Uint8Array(args.length);
  memory.read(block, readBack);
  const table = new BigUint64Array(readBack.buffer, 0, 3);
  const firstValue = new BigUint64Array(1);
  memory.read(table[0], firstValue);
  const thirdValue = new Float32Array(1);
  memory.read(table[2], thirdValue);
  memory.free(block);
  const result = {
    runtime: ffiRuntime(),
    strlen: c.strlen(cString("hello")),
    small: c.strtoull(cString("42"), 0n, 10),
    large: c.strtoull(cString("18446744073709551615"), 0n, 10),
    abs: c.abs(-7),
    outParam: out[0],
    home: memory.readCString(c.getenv(cString("ART_FFI_CHECK")) as bigint),
    missingEnv: memory.readCString(c.getenv(cString("ART_FFI_CHECK_UNSET")) as bigint),
    optionalLeftOut: !("cuNoSuchFunction" in c),
    argsRoundTrip: readBack.every((b, i) => b === args[i]),
    firstArg: firstValue[0],
    thirdArg: thirdValue[0],
  };
  return result;
}

export const expectedFfiResults = {
  strlen: 5n, small: 42n, large: 18446744073709551615n, abs: 7, outParam: 5n, home: "works", missingEnv: "",
  optionalLeftOut: true, argsRoundTrip: true, firstArg: 0x7f00_0000_1234n, thirdArg: 0.5,
};
