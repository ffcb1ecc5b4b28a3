/**
 * The CUDA driver API from TypeScript: the device's primary context, one stream, events, device memory through
 * the caching pool, async host<->device copies through a pinned staging ring, modules, kernel launches, and
 * stream capture into CUDA graphs (recorded once, replayed with one launch).
 * libcuda.so.1 is opened by soname only (it belongs to the installed kernel driver). CUDA 13 exports the _v2
 * names used here. Every call is checked; a failure throws ArtError with the driver's error name.
 */
import { ArtError } from "../core/errors.ts";
import { cString, type NativeLibrary, type NativeSignature, openLibrary } from "../core/ffi.ts";
import { type HostMemory, hostMemory } from "../core/host-memory.ts";
import { type KernelArg, kernelArgBlockBytes, packKernelArgs } from "./kernel-args.ts";
import { MemoryPool } from "./memory-pool.ts";

const p = "pointer", b = "buffer", u8 = "u8", i32 = "i32", u32 = "u32", u64 = "u64";
const fn = (result: NativeSignature["result"], ...args: NativeSignature["args"][number][]): NativeSignature => ({ result, args });

/** Every driver symbol bound, with its C signature (test/cuda/abi.test.ts checks each against cuda.h and libcuda). */
export const driverSignatures = {
  cuInit: fn(i32, u32),
  cuDriverGetVersion: fn(i32, b),
  cuDeviceGetCount: fn(i32, b),
  cuDeviceGet: fn(i32, b, i32),
  cuDeviceGetName: fn(i32, b, i32, i32),
  cuDeviceGetAttribute: fn(i32, b, i32, i32),
  cuDeviceTotalMem_v2: fn(i32, b, i32),
  cuDevicePrimaryCtxRetain: fn(i32, b, i32),
  cuDevicePrimaryCtxRelease_v2: fn(i32, i32),
  cuCtxSetCurrent: fn(i32, p),
  cuMemGetInfo_v2: fn(i32, b, b),
  cuStreamCreate: fn(i32, b, u32),
  cuStreamDestroy_v2: fn(i32, p),
  cuStreamSynchronize: fn(i32, p),
  cuEventCreate: fn(i32, b, u32),
  cuEventRecord: fn(i32, p, p),
  cuEventSynchronize: fn(i32, p),
  cuEventDestroy_v2: fn(i32, p),
  cuMemAlloc_v2: fn(i32, b, u64),
  cuMemFree_v2: fn(i32, p),
  cuMemHostAlloc: fn(i32, b, u64, u32),
  cuMemFreeHost: fn(i32, p),
  cuMemcpyHtoDAsync_v2: fn(i32, p, p, u64, p),
  cuMemcpyDtoHAsync_v2: fn(i32, p, p, u64, p),
  cuMemcpyDtoDAsync_v2: fn(i32, p, p, u64, p),
  cuMemsetD8Async: fn(i32, p, u8, u64, p),
  cuModuleLoadData: fn(i32, b, b),
  cuModuleUnload: fn(i32, p),
  cuModuleGetFunction: fn(i32, b, p, b),
  cuFuncSetAttribute: fn(i32, p, i32, i32),
  cuLaunchKernel: fn(i32, p, u32, u32, u32, u32, u32, u32, u32, p, p, p),
  cuStreamBeginCapture_v2: fn(i32, p, i32),
  cuStreamEndCapture: fn(i32, p, b),
  cuGraphInstantiateWithFlags: fn(i32, b, p, u64),
  cuGraphDestroy: fn(i32, p),
  cuGraphLaunch: fn(i32, p, p),
  cuGraphExecDestroy: fn(i32, p),
  cuGetErrorName: fn(i32, i32, b),
  cuGetErrorString: fn(i32, i32, b),
  // CUDA 12.8 added cuEventElapsedTime_v2 (cuda.h maps cuEventElapsedTime to it); older drivers have only the first.
  cuEventElapsedTime_v2: { ...fn(i32, b, p, p), optional: true },
  cuEventElapsedTime: { ...fn(i32, b, p, p), optional: true, legacyNameOf: "cuEventElapsedTime_v2" },
} satisfies Record<string, NativeSignature>;

/** The cuda.h enumerators used here, by their header names (the ABI test checks every value). */
export const driverConstants = {
  CUDA_ERROR_OUT_OF_MEMORY: 2,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 76,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 16,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 97,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: 8,
  CU_MEMHOSTALLOC_PORTABLE: 1,
  CU_EVENT_DEFAULT: 0,
  CU_STREAM_NON_BLOCKING: 1,
  CU_STREAM_CAPTURE_MODE_RELAXED: 2,
} as const;
const {
  CUDA_ERROR_OUT_OF_MEMORY, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_MEMHOSTALLOC_PORTABLE,
  CU_EVENT_DEFAULT, CU_STREAM_NON_BLOCKING, CU_STREAM_CAPTURE_MODE_RELAXED,
} = driverConstants;

export interface DeviceInfo {
  ordinal: number;
  /** The driver's CUdevice for this ordinal (cuDeviceGet), which every per-device call takes. */
  handle: number;
  name: string;
  computeCapability: [number, number];
  multiprocessors: number;
  /** The most shared memory a block may ask for (cuFuncSetAttribute's opt-in bound): 99 KiB on sm_86/89, 163 on sm_80, 227 on sm_90. */
  sharedBytesPerBlock: number;
  totalMemoryBytes: number;
  driverVersion: number;
}

let driverLibrary: NativeLibrary | null = null;

/** libcuda.so.1 with cuInit done; throws ArtError saying what is missing. */
export function openDriver(): NativeLibrary {
  if (driverLibrary) return driverLibrary;
  let lib: NativeLibrary;
  try {
    lib = openLibrary("libcuda.so.1", driverSignatures);
  } catch (error) {
    throw new ArtError("cuda_driver_missing",
      `the NVIDIA driver library libcuda.so.1 cannot be loaded (${(error as Error).message}); ` +
      "install the NVIDIA driver (it provides libcuda.so.1) and check nvidia-smi works", { cause: error });
  }
  checkWith(lib, lib.symbols.cuInit(0) as number, "cuInit");
  driverLibrary = lib;
  return lib;
}

function errorName(lib: NativeLibrary, code: number): string {
  const name = new BigUint64Array(1), text = new BigUint64Array(1);
  const memory = hostMemory();
  const known = lib.symbols.cuGetErrorName(code, name) === 0;
  lib.symbols.cuGetErrorString(code, text);
  return known ? `${memory.readCString(name[0])}: ${memory.readCString(text[0])}` : `CUresult ${code}`;
}

function checkWith(lib: NativeLibrary, code: number, what: string): void {
  if (code !== 0) throw new ArtError("cuda_error", `${what} failed: ${errorName(lib, code)} (code ${code})`);
}

/** Lists the devices the driver sees. */
export function listDevices(): DeviceInfo[] {
  const lib = openDriver();
  const c = lib.symbols;
  const check = (code: number | bigint, what: string) => checkWith(lib, code as number, what);
  const value = new Int32Array(1);
  check(c.cuDriverGetVersion(value), "cuDriverGetVersion");
  const driverVersion = value[0];
  check(c.cuDeviceGetCount(value), "cuDeviceGetCount");
  const count = value[0];
  const devices: DeviceInfo[] = [];
  for (let ordinal = 0; ordinal < count; ordinal++) {
    check(c.cuDeviceGet(value, ordinal), "cuDeviceGet");
    const handle = value[0];
    const attribute = (which: number) => {
      check(c.cuDeviceGetAttribute(value, which, handle), "cuDeviceGetAttribute");
      return value[0];
    };
    const nameBytes = new Uint8Array(256);
    check(c.cuDeviceGetName(nameBytes, nameBytes.length, handle), "cuDeviceGetName");
    const total = new BigUint64Array(1);
    check(c.cuDeviceTotalMem_v2(total, handle), "cuDeviceTotalMem");
    devices.push({
      ordinal,
      handle,
      name: new TextDecoder().decode(nameBytes.subarray(0, nameBytes.indexOf(0))),
      computeCapability: [attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)],
      multiprocessors: attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
      sharedBytesPerBlock: attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
      totalMemoryBytes: Number(total[0]),
      driverVersion,
    });
  }
  return devices;
}

export interface KernelFunction {
  readonly name: string;
  readonly handle: bigint;
}

export interface LaunchConfig {
  grid: [number, number?, number?];
  block: [number, number?, number?];
  sharedBytes?: number;
}

/** Pinned host memory used round-robin for async copies; a wrap waits for the stream so no region is reused early. */
const stagingBytes = 64 << 20;

export class CudaContext {
  readonly device: DeviceInfo;
  readonly pool: MemoryPool;
  readonly stream: bigint;
  readonly #lib: NativeLibrary;
  readonly #memory: HostMemory;
  readonly #staging: bigint;
  #stagingOffset = 0;
  readonly #argBlock: bigint;
  readonly #argBlockBytes = kernelArgBlockBytes(64);
  /**
   * Loaded modules with their images. The driver reads an image during cuModuleLoadData and, by default, keeps its
   * own copy (cuda.h says so for cuLibraryLoadData; cuModuleLoadData's documentation is silent): holding the image
   * until the module is unloaded costs a few MB and leaves nothing to that assumption under lazy loading.
   */
  readonly #modules: Array<{ handle: bigint; image: Uint8Array }> = [];
  readonly #sharedLimits = new Map<bigint, number>();
  #capturing = false;
  #disposed = false;

  constructor(ordinal = 0) {
    this.#lib = openDriver();
    this.#memory = hostMemory();
    const devices = listDevices();
    if (devices.length === 0) {
      throw new ArtError("cuda_no_device", "the NVIDIA driver is loaded but reports no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
    }
    const device = devices[ordinal];
    if (!device) throw new ArtError("cuda_no_device", `GPU ${ordinal} requested but the driver reports ${devices.length}`);
    this.device = device;
    const out = new BigUint64Array(1);
    this.check(this.#c.cuDevicePrimaryCtxRetain(out, device.handle), "cuDevicePrimaryCtxRetain");
    this.check(this.#c.cuCtxSetCurrent(out[0]), "cuCtxSetCurrent");
    this.check(this.#c.cuStreamCreate(out, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    this.stream = out[0];
    this.check(this.#c.cuMemHostAlloc(out, stagingBytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc (pinned staging)");
    this.#staging = out[0];
    this.#argBlock = this.#memory.malloc(this.#argBlockBytes);
    this.pool = new MemoryPool({
      allocate: (bytes) => {
        const code = this.#c.cuMemAlloc_v2(out, bytes) as number;
        if (code === CUDA_ERROR_OUT_OF_MEMORY) {
          // The pool now frees its cached blocks, which queued kernels may still use; cuMemFree is not documented
          // to wait for a non-blocking stream, so wait here (a rare path).
          this.synchronize();
          return null;
        }
        this.check(code, `cuMemAlloc(${bytes})`);
        return out[0];
      },
      release: (address) => this.check(this.#c.cuMemFree_v2(address), "cuMemFree"),
    });
  }

  /** The driver's functions; after dispose() every use throws, since the stream, staging and argument memory are gone. */
  get #c() {
    if (this.#disposed) {
      throw new ArtError("cuda_disposed", "the CUDA context was disposed (backend.dispose()); nothing can run on it: create a new backend");
    }
    return this.#lib.symbols;
  }

  check(code: number | bigint, what: string): void {
    checkWith(this.#lib, code as number, what);
  }

  /** Queues a copy of `source` into device memory at `destination` (+ `offset` bytes). */
  upload(destination: bigint, source: ArrayBufferView, offset = 0): void {
    this.#notCapturing("upload");
    const bytes = new Uint8Array(source.buffer, source.byteOffset, source.byteLength);
    for (let done = 0; done < bytes.length;) {
      const chunk = Math.min(bytes.length - done, stagingBytes);
      const staged = this.#stage(chunk);
      this.#memory.write(staged, bytes.subarray(done, done + chunk));
      this.check(this.#c.cuMemcpyHtoDAsync_v2(destination + BigInt(offset + done), staged, chunk, this.stream), "cuMemcpyHtoDAsync");
      done += chunk;
    }
  }

  /** Copies device memory into `target`, waiting for every queued operation first. */
  download(source: bigint, target: ArrayBufferView, offset = 0): void {
    this.#notCapturing("download");
    const bytes = new Uint8Array(target.buffer, target.byteOffset, target.byteLength);
    for (let done = 0; done < bytes.length;) {
      const chunk = Math.min(bytes.length - done, stagingBytes);
      const staged = this.#stage(chunk);
      this.check(this.#c.cuMemcpyDtoHAsync_v2(staged, source + BigInt(offset + done), chunk, this.stream), "cuMemcpyDtoHAsync");
      this.synchronize();
      this.#memory.read(staged, bytes.subarray(done, done + chunk));
      done += chunk;
    }
  }

  copyDeviceToDevice(destination: bigint, source: bigint, bytes: number): void {
    this.check(this.#c.cuMemcpyDtoDAsync_v2(destination, source, bytes, this.stream), "cuMemcpyDtoDAsync");
  }

  zero(destination: bigint, bytes: number): void {
    this.check(this.#c.cuMemsetD8Async(destination, 0, bytes, this.stream), "cuMemsetD8Async");
  }

  synchronize(): void {
    this.#notCapturing("synchronize");
    this.check(this.#c.cuStreamSynchronize(this.stream), "cuStreamSynchronize");
    this.#stagingOffset = 0;  // nothing queued reads the staging ring any more
  }

  /** Loads a module image (fatbin or cubin) and returns the named functions. */
  loadModule(image: Uint8Array, names: readonly string[], label: string): Record<string, KernelFunction> {
    const out = new BigUint64Array(1);
    this.check(this.#c.cuModuleLoadData(out, image), `cuModuleLoadData(${label})`);
    const module = out[0];
    this.#modules.push({ handle: module, image });
    const functions: Record<string, KernelFunction> = {};
    for (const name of names) {
      this.check(this.#c.cuModuleGetFunction(out, module, cString(name)), `cuModuleGetFunction(${label}.${name})`);
      functions[name] = { name, handle: out[0] };
    }
    return functions;
  }

  launch(kernel: KernelFunction, config: LaunchConfig, args: readonly KernelArg[]): void {
    const c = this.#c;  // throws once disposed, before the freed argument block is written
    const shared = config.sharedBytes ?? 0;
    if (shared > 48 * 1024 && (this.#sharedLimits.get(kernel.handle) ?? 0) < shared) {
      // Beyond 48 KiB of dynamic shared memory a kernel must opt in.
      this.check(c.cuFuncSetAttribute(kernel.handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
        `cuFuncSetAttribute(${kernel.name}, ${shared} bytes shared)`);
      this.#sharedLimits.set(kernel.handle, shared);
    }
    if (kernelArgBlockBytes(args.length) > this.#argBlockBytes) {
      throw new ArtError("cuda_launch", `${kernel.name}: ${args.length} kernel arguments exceed the argument block`);
    }
    // cuLaunchKernel copies the argument values before returning, so one block serves every launch.
    this.#memory.write(this.#argBlock, packKernelArgs(args, this.#argBlock));
    const [gx, gy = 1, gz = 1] = config.grid;
    const [bx, by = 1, bz = 1] = config.block;
    const status = c.cuLaunchKernel(kernel.handle, gx, gy, gz, bx, by, bz, shared, this.stream, this.#argBlock, 0n);
    // The message only on failure: a training pass launches thousands of kernels.
    if (status !== 0) this.check(status, `cuLaunchKernel(${kernel.name}, grid ${gx}x${gy}x${gz}, block ${bx}x${by}x${bz})`);
  }

  /**
   * Starts recording this stream's work into a graph instead of running it: kernels, GEMMs on the stream, memsets
   * and device copies. Relaxed mode, so the pool may still take memory from the driver meanwhile (that memory then
   * belongs to whoever keeps the graph). Host copies and waits are refused until endCapture: a captured copy would
   * bake the staging ring's address into the graph, and a wait would invalidate the capture.
   */
  beginCapture(): void {
    if (this.#capturing) throw new ArtError("cuda_capture", "beginCapture: the stream is already capturing");
    this.check(this.#c.cuStreamBeginCapture_v2(this.stream, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
    this.#capturing = true;
  }

  /** Ends the capture and returns the instantiated graph (cuGraphExec); the stream runs work normally again. */
  endCapture(): bigint {
    this.#capturing = false;
    const out = new BigUint64Array(1);
    this.check(this.#c.cuStreamEndCapture(this.stream, out), "cuStreamEndCapture");
    const graph = out[0];
    try {
      this.check(this.#c.cuGraphInstantiateWithFlags(out, graph, 0n), "cuGraphInstantiate");
    } finally {
      this.check(this.#c.cuGraphDestroy(graph), "cuGraphDestroy");  // the executable graph is independent of it
    }
    return out[0];
  }

  /** Queues one replay of a graph from endCapture on the stream. */
  launchGraph(graph: bigint): void {
    this.check(this.#c.cuGraphLaunch(graph, this.stream), "cuGraphLaunch");
  }

  /** Frees a graph from endCapture (a replay still queued completes first). */
  destroyGraph(graph: bigint): void {
    this.check(this.#c.cuGraphExecDestroy(graph), "cuGraphExecDestroy");
  }

  createEvent(): bigint {
    const out = new BigUint64Array(1);
    this.check(this.#c.cuEventCreate(out, CU_EVENT_DEFAULT), "cuEventCreate");
    return out[0];
  }

  recordEvent(event: bigint): void {
    this.check(this.#c.cuEventRecord(event, this.stream), "cuEventRecord");
  }

  /** Milliseconds between two recorded events (waits for the second). */
  elapsedMs(start: bigint, end: bigint): number {
    this.check(this.#c.cuEventSynchronize(end), "cuEventSynchronize");
    const ms = new Float32Array(1);
    const elapsed = this.#c.cuEventElapsedTime_v2 ?? this.#c.cuEventElapsedTime;
    this.check(elapsed(ms, start, end), "cuEventElapsedTime");
    return ms[0];
  }

  destroyEvent(event: bigint): void {
    this.check(this.#c.cuEventDestroy_v2(event), "cuEventDestroy");
  }

  memoryInfo(): { freeBytes: number; totalBytes: number } {
    const free = new BigUint64Array(1), total = new BigUint64Array(1);
    this.check(this.#c.cuMemGetInfo_v2(free, total), "cuMemGetInfo");
    return { freeBytes: Number(free[0]), totalBytes: Number(total[0]) };
  }

  /**
   * Frees everything in dependency order: device memory and modules, pinned and argument memory, the stream, then
   * the context reference. Every step is tried even when one fails (after a sticky kernel fault every call fails),
   * so the primary context is released regardless; the first failure is thrown at the end.
   */
  dispose(): void {
    if (this.#disposed) return;
    const failures: unknown[] = [];
    const attempt = (release: () => void) => {
      try {
        release();
      } catch (error) {
        failures.push(error);
      }
    };
    attempt(() => this.synchronize());
    attempt(() => this.pool.releaseAll());
    for (const module of this.#modules) attempt(() => this.check(this.#c.cuModuleUnload(module.handle), "cuModuleUnload"));
    this.#modules.length = 0;
    attempt(() => this.check(this.#c.cuMemFreeHost(this.#staging), "cuMemFreeHost"));
    this.#memory.free(this.#argBlock);
    attempt(() => this.check(this.#c.cuStreamDestroy_v2(this.stream), "cuStreamDestroy"));
    attempt(() => this.check(this.#c.cuDevicePrimaryCtxRelease_v2(this.device.handle), "cuDevicePrimaryCtxRelease"));
    this.#disposed = true;
    if (failures.length > 0) throw failures[0];
  }

  #notCapturing(what: string): void {
    if (this.#capturing) {
      throw new ArtError("cuda_capture", `${what} while the stream is capturing a CUDA graph: host copies and waits cannot be recorded in one`);
    }
  }

  /** The next `bytes` of the staging ring; wrapping waits for queued copies that may still read the ring. */
  #stage(bytes: number): bigint {
    void this.#c;  // throws once disposed: the staging memory is freed
    if (this.#stagingOffset + bytes > stagingBytes) {
      this.synchronize();
      this.#stagingOffset = 0;
    }
    const at = this.#staging + BigInt(this.#stagingOffset);
    this.#stagingOffset += Math.ceil(bytes / 256) * 256;
    return at;
  }
}
