// Every FFI binding of lib/cuda against the C headers that declare it and the library that exports it (see
// abi-check.ts). cuda.h ships with nvcc; cuBLAS and NVRTC headers come with their toolkits or Python wheels (on a
// machine without them, point ART_ABI_INCLUDE_DIRS at a directory holding cublas_v2.h, cublasLt.h and nvrtc.h).
// Each library's export check runs where the library is on disk (libcuda: the toolkit's stub or the driver's).
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { blasConstants, cublasLtSignatures, cublasSignatures } from "../../lib/cuda/blas.ts";
import {
  cudaIncludeDirectories, type CudaLibraryName, systemDiscoveryInputs, tryFindCudaLibrary,
} from "../../lib/cuda/discovery.ts";
import { driverConstants, driverSignatures } from "../../lib/cuda/driver.ts";
import type { NativeSignature } from "../../lib/core/ffi.ts";
import { libcSignatures, memcpySignatures } from "../../lib/core/host-memory.ts";
import { nvrtcSignatures } from "../../lib/cuda/nvrtc.ts";
import { type BindingGroup, exportedSymbols, generateAbiCheck, missingExports, runAbiCheck } from "./abi-check.ts";
import { findCompiler } from "./emulated-device.ts";

const inputs = systemDiscoveryInputs();
const includeDirs = [...cudaIncludeDirectories(inputs), ...(process.env.ART_ABI_INCLUDE_DIRS ?? "").split(":").filter((d) => d)];
const compiler = findCompiler();
const toolkitInclude = inputs.toolkitRoots.map((root) => join(root, "include")).find((dir) => existsSync(join(dir, "cuda.h")));
const nm = (() => {
  try {
    execFileSync("nm", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

const skipAll = !compiler ? "no C++ compiler (g++ or clang++; set CXX)" : !toolkitInclude ? "no CUDA toolkit include/cuda.h" : "";

/** The library file whose exports a group must have, or why it cannot be checked here. */
type LibraryFile = { path: string } | { missing: string };

function loaderCacheFile(soname: string): string | undefined {
  return inputs.loaderCache.find((entry) => entry.name === soname)?.path;
}

function cudaLibrary(name: CudaLibraryName): () => LibraryFile {
  return () => {
    const found = tryFindCudaLibrary(name, inputs);
    return "path" in found ? { path: found.path } : { missing: `${name} not found (searched ${found.searched.length} places)` };
  };
}

const groups: Array<BindingGroup & { library: () => LibraryFile }> = [
  {
    name: "CUDA driver", headers: ["cuda.h"], tables: [driverSignatures], constants: driverConstants,
    library: () => {
      const stubs = inputs.toolkitRoots.flatMap((root) => [join(root, "lib64", "stubs", "libcuda.so"),
        join(root, "targets", process.arch === "arm64" ? "sbsa-linux" : "x86_64-linux", "lib", "stubs", "libcuda.so")]);
      const path = loaderCacheFile("libcuda.so.1") ?? stubs.find(existsSync);
      return path ? { path } : { missing: "neither libcuda.so.1 (driver) nor a toolkit's stubs/libcuda.so is on disk" };
    },
  },
  { name: "cuBLAS", headers: ["cublas_v2.h"], tables: [cublasSignatures], constants: blasConstants, library: cudaLibrary("cublas") },
  { name: "cuBLASLt", headers: ["cublasLt.h"], tables: [cublasLtSignatures], constants: {}, library: cudaLibrary("cublasLt") },
  { name: "NVRTC", headers: ["nvrtc.h"], tables: [nvrtcSignatures], constants: {}, library: cudaLibrary("nvrtc") },
  {
    name: "libc", headers: ["stdlib.h", "string.h"], tables: [libcSignatures, memcpySignatures.toNative, memcpySignatures.fromNative],
    constants: {},
    library: () => {
      const path = loaderCacheFile("libc.so.6");
      return path ? { path } : { missing: "libc.so.6 is not in the loader cache" };
    },
  },
];

function missingHeaders(group: BindingGroup): string[] {
  return group.headers.filter((header) => ![...includeDirs, "/usr/include"].some((dir) => existsSync(join(dir, header))));
}

describe.skipIf(skipAll !== "")(`FFI bindings vs C headers${skipAll ? ` (skipped: ${skipAll})` : ""}`, () => {
  for (const group of groups) {
    const absent = missingHeaders(group);
    const headerSkip = absent.length > 0
      ? ` (skipped: ${absent.join(", ")} not in ${includeDirs.join(", ") || "any include directory"}; set ART_ABI_INCLUDE_DIRS)` : "";
    it.skipIf(absent.length > 0)(`${group.name}: argument counts, sizes, classes, results, bound names and constants agree${headerSkip}`, () => {
      expect(runAbiCheck(group, compiler!, includeDirs)).toEqual([]);
    });

    const library = group.library();
    const librarySkip = !nm ? " (skipped: nm not installed)" : "missing" in library ? ` (skipped: ${library.missing})` : "";
    it.skipIf(librarySkip !== "")(`${group.name}: every bound symbol is exported by ${"path" in library ? library.path : "the library"}${librarySkip}`, () => {
      expect(missingExports(group, exportedSymbols((library as { path: string }).path))).toEqual([]);
    });
  }
});

describe.skipIf(skipAll !== "")("the ABI check fails on a wrong declaration", () => {
  const driver = groups[0];
  const fn = (result: NativeSignature["result"], ...args: NativeSignature["args"][number][]): NativeSignature => ({ result, args });

  it("names every wrong argument size or class, argument count, result, legacy name, unknown symbol and constant", () => {
    const wrong: BindingGroup = {
      ...driver,
      tables: [{
        ...driverSignatures,
        cuMemAlloc_v2: fn("i32", "buffer", "u32"),                        // size_t bytesize as 32 bits
        cuFuncSetAttribute: fn("i32", "pointer", "i32", "f32"),             // int value as a float
        cuLaunchKernel: fn("i32", "pointer", "u32", "u32", "u32", "u32", "u32", "u32", "u32", "pointer", "pointer"),
        cuGetErrorString: fn("u64", "i32", "buffer"),                       // CUresult as 64 bits
        cuStreamDestroy: fn("i32", "pointer"),                              // the pre-_v2 export
        cuNoSuchFunction: fn("i32"),
      }],
      constants: { ...driverConstants, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 17 },
    };
    const problems = runAbiCheck(wrong, compiler!, includeDirs).join("\n");
    expect(problems).toMatch(/ABI cuMemAlloc_v2 argument 2: the FFI declares u32 \(4-byte integer\/pointer\)/);
    expect(problems).toMatch(/ABI cuFuncSetAttribute argument 3: the FFI declares f32 \(4-byte floating point\)/);
    expect(problems).toMatch(/ABI cuLaunchKernel: the headers declare a different number of arguments than the FFI's 10/);
    expect(problems).toMatch(/ABI cuGetErrorString result: the FFI declares u64/);
    expect(problems).toMatch(/ABI cuStreamDestroy name: the headers resolve cuStreamDestroy to cuStreamDestroy_v2/);
    expect(problems).toMatch(/ABI cuNoSuchFunction: not declared by cuda\.h/);
    expect(problems).toMatch(/ABI constant CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: the code uses 17/);
    // Nothing else: the untouched bindings still pass.
    expect(problems.split("\n")).toHaveLength(7);
  });

  it("checks a legacy fallback name against the symbol the headers map it to", () => {
    const source = generateAbiCheck({ ...driver, tables: [{ cuEventElapsedTime: driverSignatures.cuEventElapsedTime }], constants: {} });
    expect(source).toContain("decltype(&cuEventElapsedTime)");
    expect(source).toContain('art_abi::same(ART_ABI_EXPANDED(cuEventElapsedTime), "cuEventElapsedTime_v2")');
    const mislabelled = { ...driverSignatures.cuEventElapsedTime, legacyNameOf: "cuEventElapsedTime_v3" };
    expect(runAbiCheck({ ...driver, tables: [{ cuEventElapsedTime: mislabelled }], constants: {} }, compiler!, includeDirs))
      .toEqual([expect.stringMatching(/ABI cuEventElapsedTime name: the headers resolve cuEventElapsedTime to cuEventElapsedTime_v2, the FFI binds cuEventElapsedTime as the legacy name of cuEventElapsedTime_v3/)]);
  });

  const libc = groups[groups.length - 1];
  const libcFile = libc.library();
  it.skipIf(!nm || "missing" in libcFile)("reports a bound name the library does not export, unless the binding is optional", () => {
    const exported = exportedSymbols((libcFile as { path: string }).path);
    expect(exported.has("memcpy")).toBe(true);
    const tables = [{ ...libcSignatures, art_not_exported: fn("i32"), art_optional: { ...fn("i32"), optional: true } }];
    expect(missingExports({ ...libc, tables }, exported)).toEqual(["art_not_exported"]);
  });
});
