import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ArtError } from "../../lib/core/errors.ts";
import { openLibrary } from "../../lib/core/ffi.ts";
import { kernelArgBlockBytes, packKernelArgs } from "../../lib/cuda/kernel-args.ts";
import { expectedFfiResults, runFfiChecks } from "./ffi-checks.ts";

describe("FFI (libc as the test library)", () => {
  it("binds C signatures on Node through koffi: 64-bit results are bigints, out-params keep their type", () => {
    process.env.ART_FFI_CHECK = "works";
    expect(runFfiChecks()).toEqual({ runtime: "node", ...expectedFfiResults });
  });

  const deno = "node_modules/.bin/deno";
  it.skipIf(!existsSync(deno))("gives the same results on Deno through Deno.dlopen", () => {
    const text = execFileSync(deno, ["run", "--allow-ffi", "--allow-read", "--allow-env", "test/cuda/ffi-deno-main.ts"],
      { encoding: "utf8", env: { ...process.env, ART_FFI_CHECK: "works" } });
    const parsed = JSON.parse(text, (_key, value) => (typeof value === "string" && /^\d+n$/.test(value) ? BigInt(value.slice(0, -1)) : value));
    expect(parsed).toEqual({ runtime: "deno", ...expectedFfiResults });
  });

  it("names the library when it cannot be opened", () => {
    expect(() => openLibrary("libdoes-not-exist.so.1", {})).toThrowError(ArtError);
    expect(() => openLibrary("libdoes-not-exist.so.1", {})).toThrowError(/cannot open native library libdoes-not-exist\.so\.1/);
  });

  it("names the symbol when one is missing", () => {
    expect(() => openLibrary("libc.so.6", { cuNoSuchFunction: { result: "i32", args: [] } }))
      .toThrowError(/symbol cuNoSuchFunction not found in libc\.so\.6/);
  });
});

describe("kernel argument blocks", () => {
  it("lays out a pointer table then 8-byte value slots, little-endian, addresses relative to the base", () => {
    const base = 0x1000n;
    const bytes = packKernelArgs([["ptr", 0xdead_beef_0000n], ["i32", -1], ["u32", 7], ["f32", 1.5], ["i64", -2n]], base);
    expect(bytes.length).toBe(kernelArgBlockBytes(5));
    const view = new DataView(bytes.buffer);
    expect([0, 1, 2, 3, 4].map((i) => view.getBigUint64(i * 8, true))).toEqual([0x1028n, 0x1030n, 0x1038n, 0x1040n, 0x1048n]);
    expect(view.getBigUint64(40, true)).toBe(0xdead_beef_0000n);
    expect(view.getInt32(48, true)).toBe(-1);
    expect(view.getUint32(56, true)).toBe(7);
    expect(view.getFloat32(64, true)).toBe(1.5);
    expect(view.getBigInt64(72, true)).toBe(-2n);
  });
});
