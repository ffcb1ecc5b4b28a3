// A device that runs no kernels but checks and records everything the CUDA backend asks of it: every pointer a
// copy, launch or GEMM touches must lie in a live pool block (catches use-after-free and undersized buffers in the
// host orchestration), launch geometry must be legal, and nothing may stay allocated after dispose. Downloads
// read back zeros. It lets the backend's host logic (shapes, index caching, tiling, key splits, sampling I/O,
// freeing, graph recording) run here without a GPU; what the kernels compute is checked by the parity suites.
// Stream capture: launches and GEMMs queued while capturing go into the graph, not into `launches`/`gemms`; each
// replay checks again that every pointer the graph uses is live (a graph must never outlive its buffers), and
// host copies or waits while capturing throw. `failCapture` makes the next capture fail at its start or end,
// `failGraphLaunch` every graph launch.
import type { DeviceQueue, GemmRunner } from "../../lib/cuda/backend.ts";
import { type GemmExArguments, type GemmType, gemmExArguments, gemmExtents, linearGemmArguments } from "../../lib/cuda/blas.ts";
import type { KernelFunction, LaunchConfig } from "../../lib/cuda/driver.ts";
import type { KernelArg } from "../../lib/cuda/kernel-args.ts";
import { type KernelName, kernelModules } from "../../lib/cuda/kernel-build.ts";
import { MemoryPool } from "../../lib/cuda/memory-pool.ts";
import { checkLaunchGeometry } from "./launch-geometry.ts";

export interface RecordedLaunch {
  name: string;
  grid: number[];
  block: number[];
  sharedBytes: number;
  args: readonly KernelArg[];
}

export class RecordingDevice implements DeviceQueue {
  readonly device = { name: "recording device", multiprocessors: 132, sharedBytesPerBlock: 232_448 };
  readonly launches: RecordedLaunch[] = [];
  readonly gemms: Array<{ rows: number; inF: number; outF: number; type: string; alpha: number; beta: number }> = [];
  readonly pool: MemoryPool;
  /** Bytes the "device" has handed out and not taken back. */
  outstandingBytes = 0;
  graphLaunches = 0;
  /** Memsets queued (zeroed allocations among them). */
  memsets = 0;
  failCapture: "begin" | "end" | null = null;
  /** Makes graph launches fail (as a driver error would). */
  failGraphLaunch = false;
  /** Device bytes beyond which allocations fail (the pool then sees out-of-memory). */
  limitBytes = Infinity;
  /** The kernel launches recorded into each graph. */
  readonly graphs = new Map<bigint, RecordedLaunch[]>();
  /** Uploads and graph events in order (to check what a graph reads was written before it ran). */
  readonly events: Array<{ event: "upload"; address: bigint } | { event: "endCapture" | "launchGraph"; graph: bigint }> = [];
  #captured: { checks: Array<() => void>; launches: RecordedLaunch[] } | null = null;
  readonly #graphChecks = new Map<bigint, Array<() => void>>();
  #nextGraph = 1n;
  #next = 0x10_0000_0000n;
  readonly #sizes = new Map<bigint, number>();

  constructor() {
    this.pool = new MemoryPool({
      allocate: (bytes) => {
        if (this.outstandingBytes + bytes > this.limitBytes) return null;
        const address = this.#next;
        this.#next += BigInt(bytes) + 4096n;
        this.#sizes.set(address, bytes);
        this.outstandingBytes += bytes;
        return address;
      },
      release: (address) => {
        this.outstandingBytes -= this.#sizes.get(address)!;
        this.#sizes.delete(address);
      },
    });
  }

  expectLive(address: bigint, bytes: number, what: string): void {
    if (!this.pool.owns(address, bytes)) throw new Error(`${what}: 0x${address.toString(16)} + ${bytes} bytes is not inside a live block`);
  }

  upload(destination: bigint, source: ArrayBufferView, offset = 0): void {
    this.#notCapturing("upload");
    this.expectLive(destination + BigInt(offset), source.byteLength, "upload");
    this.events.push({ event: "upload", address: destination + BigInt(offset) });
  }

  download(source: bigint, target: ArrayBufferView, offset = 0): void {
    this.#notCapturing("download");
    this.expectLive(source + BigInt(offset), target.byteLength, "download");
    new Uint8Array(target.buffer, target.byteOffset, target.byteLength).fill(0);
  }

  zero(destination: bigint, bytes: number): void {
    this.#stream(() => this.expectLive(destination, bytes, "zero"), () => void this.memsets++);
  }

  launch(kernel: KernelFunction, config: LaunchConfig, args: readonly KernelArg[]): void {
    const [gx, gy = 1, gz = 1] = config.grid, [bx, by = 1, bz = 1] = config.block;
    const shared = config.sharedBytes ?? 0;
    checkLaunchGeometry(kernel.name, config, this.device.sharedBytesPerBlock);
    // Every kernel here reduces over warps: whole warps only.
    if ((bx * by * bz) % 32 !== 0) throw new Error(`${kernel.name}: bad block ${config.block}`);
    const check = () => args.forEach(([type, value], i) => {
      if (type === "ptr" && value !== 0n) this.expectLive(BigInt(value), 1, `${kernel.name} argument ${i}`);
    });
    const launch = { name: kernel.name, grid: [gx, gy, gz], block: [bx, by, bz], sharedBytes: shared, args };
    this.#stream(check, () => this.launches.push(launch));
    this.#captured?.launches.push(launch);
  }

  synchronize(): void {
    this.#notCapturing("synchronize");
  }

  beginCapture(): void {
    if (this.#captured) throw new Error("beginCapture while capturing");
    if (this.failCapture === "begin") throw new Error("recording device: capture refused");
    this.#captured = { checks: [], launches: [] };
  }

  endCapture(): bigint {
    const captured = this.#captured;
    if (!captured) throw new Error("endCapture without beginCapture");
    this.#captured = null;
    if (this.failCapture === "end") throw new Error("recording device: capture invalidated");
    const graph = this.#nextGraph++;
    this.#graphChecks.set(graph, captured.checks);
    this.graphs.set(graph, captured.launches);
    this.events.push({ event: "endCapture", graph });
    return graph;
  }

  launchGraph(graph: bigint): void {
    const checks = this.#graphChecks.get(graph);
    if (!checks) throw new Error(`graph ${graph} does not exist`);
    if (this.failGraphLaunch) throw new Error("recording device: graph launch failed");
    for (const check of checks) check();
    this.graphLaunches++;
    this.events.push({ event: "launchGraph", graph });
  }

  destroyGraph(graph: bigint): void {
    if (!this.#graphChecks.delete(graph)) throw new Error(`graph ${graph} destroyed twice`);
    this.graphs.delete(graph);
  }

  /** Checks stream work's pointers now; records it in `launches`/`gemms`, or in the graph being captured. */
  #stream(check: () => void, record: () => void): void {
    check();
    if (this.#captured) this.#captured.checks.push(check);
    else record();
  }

  #notCapturing(what: string): void {
    if (this.#captured) throw new Error(`${what} while capturing a graph`);
  }

  /** What the limit leaves (with no limit, more than any test asks for). */
  memoryInfo() {
    const totalBytes = Number.isFinite(this.limitBytes) ? this.limitBytes : 2 ** 50;
    return { freeBytes: totalBytes - this.outstandingBytes, totalBytes };
  }

  dispose(): void {
    this.pool.releaseAll();
  }

  /** The GEMMs the backend asks for, with the same bounds checks. */
  gemm(): GemmRunner {
    const gemm = (g: GemmExArguments, type: GemmType, alpha: number, beta: number) => {
      const size = type === "bf16" ? 2 : 4;
      // What cublasGemmEx would touch of each operand, with its leading dimensions (in cuBLAS's terms, c is m × n).
      const extents = gemmExtents(g);
      this.#stream(() => {
        this.expectLive(g.a, extents.a * size, "GEMM a");
        this.expectLive(g.b, extents.b * size, "GEMM b");
        this.expectLive(g.c, extents.c * 4, "GEMM c");
      }, () => this.gemms.push({ rows: g.n, inF: g.k, outF: g.m, type, alpha, beta }));
    };
    return {
      linear: (x, w, y, rows, inF, outF, type, alpha = 1, beta = 0, ldy = outF, ldx = inF) =>
        gemm(linearGemmArguments(x, w, y, rows, inF, outF, type, ldy, ldx), type, alpha, beta),
      gemm: (a, b, c, m, n, k, transA, transB, type, alpha = 1, beta = 0, strides = {}) =>
        gemm(gemmExArguments(a, b, c, m, n, k, transA, transB, type, strides), type, alpha, beta),
      dispose: () => {},
    };
  }

  /** Kernel handles by name (the recording device needs no module). */
  static kernels(): Record<KernelName, KernelFunction> {
    const names = Object.values(kernelModules).flatMap((module) => Object.keys(module)) as KernelName[];
    return Object.fromEntries(names.map((name, i) => [name, { name, handle: BigInt(i + 1) }])) as Record<KernelName, KernelFunction>;
  }
}
