// The CUDA backend on an emulated device: the real kernel sources, compiled for the CPU by g++ against
// test/cuda/emulator (one thread per CUDA thread), loaded through the project's own FFI, with a column-major
// reference of cublasGemmEx in place of cuBLAS, fed the arguments Blas gives cuBLAS. It runs the parity suite
// without a GPU, so the kernels' arithmetic (tiling, online softmax, key splits, sampling thresholds) and the
// row-major to column-major GEMM mapping are checked here; speed, real cuBLAS and the driver are checked on a GPU.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { freemem, tmpdir, totalmem } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { CudaBackend, type CudaBackendOptions, type DeviceQueue, type GemmRunner } from "../../lib/cuda/backend.ts";
import { type GemmExArguments, gemmExArguments, linearGemmArguments } from "../../lib/cuda/blas.ts";
import type { KernelFunction, LaunchConfig } from "../../lib/cuda/driver.ts";
import { cString, type NativeLibrary, openLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";
import { type KernelArg, kernelArgBlockBytes, packKernelArgs } from "../../lib/cuda/kernel-args.ts";
import { type KernelName, kernelModules, kernelSourceDirectory } from "../../lib/cuda/kernel-build.ts";
import { MemoryPool } from "../../lib/cuda/memory-pool.ts";
import { checkLaunchGeometry } from "./launch-geometry.ts";

const emulatorDir = join(dirname(fileURLToPath(import.meta.url)), "emulator");

export function findCompiler(): string | null {
  for (const compiler of [process.env.CXX, "/usr/bin/g++", "/usr/bin/clang++"]) if (compiler && existsSync(compiler)) return compiler;
  return null;
}

/**
 * Builds (once per content hash) the emulator library with every kernel module, and `extraModules` (paths of more
 * `.cu` files, their extern "C" __global__ kernels launchable by name: the emulator's own tests); returns its path.
 */
export function buildEmulator(compiler: string, extraModules: readonly string[] = []): string {
  const sources = kernelSourceDirectory();
  const files = readdirSync(sources).filter((name) => name.endsWith(".cu") || name.endsWith(".cuh")).sort();
  // -ffp-contract=off: no fused multiply-adds the CUDA source does not ask for. The alignment sanitizer stops at a
  // typed access (a 16-byte vector load, say) from an address its type does not allow, where a GPU faults with
  // "misaligned address" and x86 would just read.
  const flags = ["-std=c++20", "-O2", "-ffp-contract=off", "-fsanitize=alignment", "-fno-sanitize-recover=alignment"];
  const hash = createHash("sha256").update(flags.join(" "));
  for (const file of [...files.map((f) => join(sources, f)), ...["emulator.h", "gemm-reference.h", "runtime.cpp"].map((f) => join(emulatorDir, f)),
    ...extraModules]) {
    hash.update(file).update(readFileSync(file));
  }
  const dir = join(tmpdir(), `art-cuda-emulator-${hash.digest("hex").slice(0, 16)}`);
  const library = join(dir, "libemulator.so");
  if (existsSync(library)) return library;
  // Build in a directory of this process's own, then rename into place: vitest workers build at the same time.
  mkdirSync(dir, { recursive: true });
  const build = mkdtempSync(join(dir, "build-"));
  // The two places CUDA C++ differs from host C++ in these sources: the bf16 header and dynamic shared memory.
  const copy = (from: string, to: string) => writeFileSync(to, readFileSync(from, "utf8")
    .replace("#include <cuda_bf16.h>", '#include "emulator.h"')
    .replaceAll("extern __shared__ float shared[];", "float* shared = emu_dynamic_shared();"));
  for (const file of files) copy(join(sources, file), join(build, file));
  const extras = extraModules.map((path, i) => {
    copy(path, join(build, `extra${i}.cu`));
    return { file: `extra${i}.cu`, kernels: [...readFileSync(path, "utf8").matchAll(/extern "C" __global__ void (\w+)/g)].map((m) => m[1]) };
  });
  writeFileSync(join(build, "kernels.inc"), [...Object.keys(kernelModules).map((m) => `${m}.cu`), ...extras.map((e) => e.file)]
    .map((file) => `#include "${file}"\n`).join(""));
  const names = [...Object.values(kernelModules).flatMap((module) => Object.keys(module)), ...extras.flatMap((e) => e.kernels)];
  writeFileSync(join(build, "registry.inc"), names.map((n) => `{"${n}", [](void** p) { invoke(${n}, p); }},\n`).join(""));
  execFileSync(compiler, [...flags, "-shared", "-fPIC", "-pthread", "-w", "-I", build, "-I", emulatorDir,
    join(emulatorDir, "runtime.cpp"), "-o", join(build, "libemulator.so")], { stdio: ["ignore", "ignore", "pipe"] });
  renameSync(join(build, "libemulator.so"), library);
  rmSync(build, { recursive: true, force: true });
  return library;
}

/** The emulator's column-major cublasGemmEx reference, called with the arguments Blas would give cuBLAS. */
export function emulatedGemmEx(library: string): (g: GemmExArguments, alpha: number, beta: number) => void {
  const { emu_gemm_ex: gemmEx } = openLibrary(library, {
    emu_gemm_ex: {
      result: "i32",
      args: ["i32", "i32", "i32", "i32", "i32", "f32", "pointer", "i32", "i32", "pointer", "i32", "i32", "f32", "pointer", "i32", "i32", "i32"],
    },
  }).symbols;
  return (g, alpha, beta) => {
    const status = gemmEx(g.transa, g.transb, g.m, g.n, g.k, alpha, g.a, g.aType, g.lda, g.b, g.bType, g.ldb, beta, g.c, g.cType, g.ldc, g.computeType);
    if (status !== 0) {
      const shown = JSON.stringify(g, (_key, value) => (typeof value === "bigint" ? `0x${value.toString(16)}` : value));
      throw new Error(`emulator: cublasGemmEx arguments rejected (status ${status}): ${shown}`);
    }
  };
}

/**
 * Stream capture as on a GPU: between beginCapture and endCapture, launches (with their argument values as packed
 * then), GEMMs and memsets are recorded instead of run, and host copies and waits are refused; launchGraph runs a
 * recording. Everything else runs at once (one in-order stream).
 */
class EmulatedDevice implements DeviceQueue {
  /**
   * An H100's opt-in shared memory per block by default, so kernels pick what sm_90 runs; a test sets a smaller one
   * (sm_86/89's 99 KiB) to run what those devices do.
   */
  readonly device = { name: "CPU emulation", multiprocessors: 8, sharedBytesPerBlock: 232_448 };
  readonly pool: MemoryPool;
  readonly #lib: NativeLibrary;
  readonly #memory = hostMemory();
  readonly #argBlock: bigint;
  readonly #gemmEx: ReturnType<typeof emulatedGemmEx>;
  #captured: Array<() => void> | null = null;
  readonly #graphs = new Map<bigint, Array<() => void>>();
  #nextGraph = 1n;
  #disposed = false;
  /** Each event's time when the stream reached it (null until recorded). */
  readonly #events = new Map<bigint, number | null>();
  #nextEvent = 1n;
  /** Device memory the emulator hands out before an allocation fails as a GPU's would (out-of-memory tests). */
  limitBytes = Infinity;
  /** Bytes allocated from the emulator and not yet released. */
  outstandingBytes = 0;
  readonly #sizes = new Map<bigint, number>();

  constructor(library: string) {
    this.#lib = openLibrary(library, {
      emu_alloc: { result: "pointer", args: ["u64"] },
      emu_free: { result: "void", args: ["pointer"] },
      emu_launch: { result: "i32", args: ["buffer", "u32", "u32", "u32", "u32", "u32", "u32", "u32", "pointer"] },
    });
    this.#gemmEx = emulatedGemmEx(library);
    const c = this.#lib.symbols;
    this.pool = new MemoryPool({
      allocate: (bytes) => {
        if (this.outstandingBytes + bytes > this.limitBytes) return null;
        const address = c.emu_alloc(bytes) as bigint;
        if (address === 0n) return null;  // the host refused the mapping: out of memory, as a GPU would say
        this.#sizes.set(address, bytes);
        this.outstandingBytes += bytes;
        return address;
      },
      release: (address) => {
        this.outstandingBytes -= this.#sizes.get(address) ?? 0;
        this.#sizes.delete(address);
        c.emu_free(address);
      },
    });
    // A GPU hands out memory holding whatever was there (a fresh block, or a freed tensor's bits): every block the
    // pool hands out is filled with 0xff bytes (NaN as f32 and bf16, -1 as int32), so a kernel that reads what no op
    // wrote shows up as NaN or a -1 index instead of passing on the zeros of fresh host memory.
    const allocate = this.pool.allocate.bind(this.pool);
    this.pool.allocate = (bytes) => {
      const address = allocate(bytes);
      this.#memory.write(address, new Uint8Array(bytes).fill(0xff));
      return address;
    };
    this.#argBlock = this.#memory.malloc(kernelArgBlockBytes(64));
  }

  upload(destination: bigint, source: ArrayBufferView, offset = 0): void {
    this.#live("upload");
    this.#notCapturing("upload");
    this.#memory.write(destination + BigInt(offset), source);
  }

  download(source: bigint, target: ArrayBufferView, offset = 0): void {
    this.#live("download");
    this.#notCapturing("download");
    this.#memory.read(source + BigInt(offset), target);
  }

  /** As CudaContext's, on the stream (the decode bench measures the copy bandwidth with it). */
  copyDeviceToDevice(destination: bigint, source: bigint, bytes: number): void {
    this.#stream(() => {
      const data = new Uint8Array(bytes);
      this.#memory.read(source, data);
      this.#memory.write(destination, data);
    });
  }

  zero(destination: bigint, bytes: number): void {
    this.#stream(() => this.#memory.write(destination, new Uint8Array(bytes)));
  }

  launch(kernel: KernelFunction, config: LaunchConfig, args: readonly KernelArg[]): void {
    checkLaunchGeometry(kernel.name, config, this.device.sharedBytesPerBlock);
    const packed = packKernelArgs(args, this.#argBlock);
    const [gx, gy = 1, gz = 1] = config.grid, [bx, by = 1, bz = 1] = config.block;
    this.#stream(() => {
      this.#memory.write(this.#argBlock, packed);
      const status = this.#lib.symbols.emu_launch(cString(kernel.name), gx, gy, gz, bx, by, bz, config.sharedBytes ?? 0, this.#argBlock);
      if (status !== 0) throw new Error(`emulator: unknown kernel ${kernel.name}`);
    });
  }

  /** GEMMs with the arguments Blas gives cublasGemmEx, run by the emulator's column-major reference. */
  gemm(): GemmRunner {
    return {
      linear: (x, w, y, rows, inF, outF, type, alpha = 1, beta = 0, ldy = outF, ldx = inF) => {
        const args = linearGemmArguments(x, w, y, rows, inF, outF, type, ldy, ldx);
        this.#stream(() => this.#gemmEx(args, alpha, beta));
      },
      gemm: (a, b, c, m, n, k, transA, transB, type, alpha = 1, beta = 0, strides = {}) => {
        const args = gemmExArguments(a, b, c, m, n, k, transA, transB, type, strides);
        this.#stream(() => this.#gemmEx(args, alpha, beta));
      },
      dispose: () => {},
    };
  }

  synchronize(): void {
    this.#notCapturing("synchronize");
  }

  beginCapture(): void {
    if (this.#captured) throw new Error("emulator: beginCapture while capturing");
    this.#captured = [];
  }

  endCapture(): bigint {
    if (!this.#captured) throw new Error("emulator: endCapture without beginCapture");
    const graph = this.#nextGraph++;
    this.#graphs.set(graph, this.#captured);
    this.#captured = null;
    return graph;
  }

  launchGraph(graph: bigint): void {
    const work = this.#graphs.get(graph);
    if (!work) throw new Error(`emulator: graph ${graph} does not exist`);
    for (const step of work) this.#stream(step);
  }

  destroyGraph(graph: bigint): void {
    if (!this.#graphs.delete(graph)) throw new Error(`emulator: graph ${graph} destroyed twice`);
  }

  /**
   * Stream events (the EventTimeline the benches' per-op profile reads, as CudaContext has them): the emulator runs
   * each op when it is queued, so an event's time is the host's clock when the stream reaches it.
   */
  createEvent(): bigint {
    const event = this.#nextEvent++;
    this.#events.set(event, null);
    return event;
  }

  recordEvent(event: bigint): void {
    if (!this.#events.has(event)) throw new Error(`emulator: event ${event} does not exist`);
    this.#stream(() => this.#events.set(event, performance.now()));
  }

  elapsedMs(start: bigint, end: bigint): number {
    const [from, to] = [this.#events.get(start), this.#events.get(end)];
    if (from == null || to == null) throw new Error(`emulator: elapsedMs of an event never recorded (${start}, ${end})`);
    return to - from;
  }

  destroyEvent(event: bigint): void {
    if (!this.#events.delete(event)) throw new Error(`emulator: event ${event} destroyed twice`);
  }

  /** Graphs made and not destroyed. */
  get liveGraphs(): number {
    return this.#graphs.size;
  }

  /** Runs stream work now, or records it while capturing. */
  #stream(work: () => void): void {
    this.#live("stream work");
    if (this.#captured) this.#captured.push(work);
    else work();
  }

  #notCapturing(what: string): void {
    if (this.#captured) throw new Error(`emulator: ${what} while capturing a graph`);
  }

  /** The emulator's device memory is the host's, or limitBytes where a test set one. */
  memoryInfo() {
    if (Number.isFinite(this.limitBytes)) return { freeBytes: this.limitBytes - this.outstandingBytes, totalBytes: this.limitBytes };
    return { freeBytes: freemem(), totalBytes: totalmem() };
  }

  dispose(): void {
    this.pool.releaseAll();
    this.#memory.free(this.#argBlock);
    this.#disposed = true;
  }

  /** As CudaContext: nothing runs once disposed (the memory is unmapped), with an error instead of a fault. */
  #live(what: string): void {
    if (this.#disposed) throw new Error(`emulator: ${what} after dispose`);
  }
}

export function createEmulatedBackend(library: string, options: CudaBackendOptions = {}): CudaBackend<EmulatedDevice> {
  const device = new EmulatedDevice(library);
  const names = Object.values(kernelModules).flatMap((module) => Object.keys(module)) as KernelName[];
  const kernels = Object.fromEntries(names.map((name, i) => [name, { name, handle: BigInt(i + 1) }])) as Record<KernelName, KernelFunction>;
  return new CudaBackend(device, device.gemm(), kernels, options);
}
