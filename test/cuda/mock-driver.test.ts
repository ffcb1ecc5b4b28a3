// CudaContext (lib/cuda/driver.ts) end to end through the FFI, against mocks/libcuda.cpp: a libcuda.so.1
// built from cuda.h that defers stream work until the host waits and records misuse (see its header comment).
// What it checks that nothing else here can: the staging ring is never rewritten while a queued copy may still
// read it, downloads wait before reading, async copies use pinned memory, kernels get their arguments through
// cuLaunchKernel's pointer array, more than 48 KiB of shared memory is opted into, device handles come from
// cuDeviceGet, the context is current on every call, OOM recovery waits before freeing, error names come back,
// graphs replay what was captured (and nothing runs at capture), and dispose frees everything before releasing
// the context. On Node (koffi) and Deno (Deno.dlopen).
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { systemDiscoveryInputs } from "../../lib/cuda/discovery.ts";
import { findCompiler } from "./emulated-device.ts";
import { buildMock, mockDirectory } from "./mocks/build.ts";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "..", "..");
const compiler = findCompiler();
const cudaInclude = systemDiscoveryInputs().toolkitRoots.map((r) => join(r, "include")).find((d) => existsSync(join(d, "cuda.h")));
const skip = !compiler ? "no C++ compiler (g++ or clang++; set CXX)" : !cudaInclude ? "no CUDA toolkit include/cuda.h" : "";

const expected = {
  device: { ordinal: 0, handle: 7, name: "Mock GPU", computeCapability: [9, 0], multiprocessors: 132, sharedBytesPerBlock: 232_448, totalMemoryBytes: 80 * 2 ** 30, driverVersion: 13000 },
  uploadsIntact: [true, true, true, true, true],
  filled: [2.5, -1.25],
  zeroThenCopy: true,
  elapsedMs: 0.5,
  allocatedAfterOom: true,
  errors: ["mock call failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory (code 2)", "mock call failed: CUresult 12345 (code 12345)"],
  graph: [
    [1], ["upload while the stream is capturing a CUDA graph: host copies and waits cannot be recorded in one",
      "synchronize while the stream is capturing a CUDA graph: host copies and waits cannot be recorded in one"],
    [7, 0], [7, 0], 900,
    "cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: operation failed due to a previous error during capture (code 901)",
    [5],
  ],
  afterDispose: ["cuda_disposed", "cuda_disposed", "cuda_disposed", "cuda_disposed"],
  driver: { launches: 3, graphLaunches: 2, retains: 0, violations: ["cuStreamSynchronize during stream capture"] },
};

describe.skipIf(skip !== "")(`CudaContext against a recording libcuda${skip ? ` (skipped: ${skip})` : ""}`, () => {
  const dir = mockDirectory("cuda");
  const build = () => {
    if (!existsSync(join(dir, "libcuda.so.1"))) buildMock(compiler!, "libcuda", join(dir, "libcuda.so.1"), ["-I", cudaInclude!]);
  };
  // 256 MiB of mock device memory: the script's 150 MiB request fails until the pool releases its cache.
  const run = (command: string, args: string[]) => JSON.parse(execFileSync(command, [...args, join(here, "mock-driver-main.ts")], {
    encoding: "utf8", env: { ...process.env, LD_LIBRARY_PATH: dir, MOCK_CUDA_MEMORY_LIMIT: String(256 << 20) }, timeout: 60_000,
  }));

  // A Node that runs .ts files: this one, or the repo's pinned one (node_modules/.bin/node).
  const pinned = join(root, "node_modules", ".bin", "node");
  const node = (process.features as { typescript?: unknown }).typescript ? process.execPath : existsSync(pinned) ? pinned : null;
  it.skipIf(!node)(`on Node: copies, launches, graphs, events, OOM recovery, errors and dispose behave as on a driver${node ? "" : " (skipped: no Node that runs .ts)"}`, () => {
    build();
    expect(run(node!, [])).toEqual(expected);
  });

  const deno = join(root, "node_modules", ".bin", "deno");
  it.skipIf(!existsSync(deno))(`on Deno: the same${existsSync(deno) ? "" : " (skipped: no node_modules/.bin/deno)"}`, () => {
    build();
    expect(run(deno, ["run", "--allow-ffi", "--allow-read", "--allow-env"])).toEqual(expected);
  });
});
