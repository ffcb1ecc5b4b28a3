/**
 * A caching allocator for device memory. cuMemAlloc/cuMemFree synchronise the device and cost tens of
 * microseconds, so freed blocks go to a free list per size class and are handed out again. Size classes are
 * multiples of 256 bytes from 512, and from 4 KiB sixteen per power of two (2^k·(1 + j/16)): a block is at most a
 * sixteenth larger than its request (2^k and 1.5·2^k classes held 22 GB of blocks for a 7B model's 15.2 GB of bf16
 * weights); a request also takes a cached block of the next two classes. When the device is out of memory the cached
 * blocks are released and the allocation is tried once more. All stream work is ordered on one stream, so a block
 * freed by the host can be reused by later work on that stream without waiting.
 */
import { ArtError } from "../core/errors.ts";

export interface DeviceAllocator {
  /** Returns the device address, or null when the device is out of memory. */
  allocate(bytes: number): bigint | null;
  release(address: bigint): void;
}

export interface MemoryPoolStats {
  /** Bytes in blocks handed out and not yet freed (size-class bytes). */
  inUseBytes: number;
  /** Bytes in cached free blocks. */
  cachedBytes: number;
  /** Most bytes ever held from the device (in use + cached). */
  peakReservedBytes: number;
  /** Most bytes ever in use at once (torch's max_memory_allocated, counted in blocks). */
  peakInUseBytes: number;
  requests: number;
  /** Requests served from the cache. */
  reused: number;
  deviceAllocations: number;
}

const minimumClass = 512;

/** The size class (bytes actually reserved) for a request of `bytes`. */
export function sizeClass(bytes: number): number {
  if (!Number.isFinite(bytes) || bytes < 0) throw new ArtError("cuda_alloc", `invalid allocation size ${bytes}`);
  if (bytes <= minimumClass) return minimumClass;
  const step = Math.max(256, 2 ** (Math.floor(Math.log2(bytes)) - 4));
  return Math.ceil(bytes / step) * step;
}

export class MemoryPool {
  readonly #device: DeviceAllocator;
  readonly #free = new Map<number, bigint[]>();
  readonly #live = new Map<bigint, number>();
  #stats: MemoryPoolStats = { inUseBytes: 0, cachedBytes: 0, peakReservedBytes: 0, peakInUseBytes: 0, requests: 0, reused: 0, deviceAllocations: 0 };

  constructor(device: DeviceAllocator) {
    this.#device = device;
  }

  allocate(bytes: number): bigint {
    this.#stats.requests++;
    const cached = this.#takeCached(bytes);
    if (cached) return this.#handOut(cached.address, cached.size);
    const size = sizeClass(bytes);
    const address = this.#device.allocate(size) ?? this.#retryAfterTrim(size, bytes);
    this.#stats.deviceAllocations++;
    return this.#handOut(address, size);
  }

  /**
   * Takes a cached block for a request of `bytes` out of its free list (the one at `address` when given): of the
   * request's class or, failing that, of one of the next two (at most ~1/8 larger), so tensors whose row counts vary
   * from step to step still find blocks, as the coarser classes used to give them. Null when none is cached.
   */
  #takeCached(bytes: number, address?: bigint): { address: bigint; size: number } | null {
    let size = sizeClass(bytes);
    for (let larger = 0; larger <= 2; larger++, size = sizeClass(size + 1)) {
      const list = this.#free.get(size);
      const index = !list ? -1 : address === undefined ? list.length - 1 : list.indexOf(address);
      if (index < 0) continue;
      const taken = index === list!.length - 1 ? list!.pop()! : list!.splice(index, 1)[0];
      this.#stats.reused++;
      this.#stats.cachedBytes -= size;
      return { address: taken, size };
    }
    return null;
  }

  #handOut(address: bigint, size: number): bigint {
    this.#live.set(address, size);
    this.#stats.inUseBytes += size;
    this.#stats.peakReservedBytes = Math.max(this.#stats.peakReservedBytes, this.#stats.inUseBytes + this.#stats.cachedBytes);
    this.#stats.peakInUseBytes = Math.max(this.#stats.peakInUseBytes, this.#stats.inUseBytes);
    return address;
  }

  free(address: bigint): void {
    const size = this.#live.get(address);
    if (size === undefined) {
      throw new ArtError("cuda_double_free", `device address 0x${address.toString(16)} is not a live pool block (freed twice?)`);
    }
    this.#live.delete(address);
    this.#stats.inUseBytes -= size;
    this.#stats.cachedBytes += size;
    let list = this.#free.get(size);
    if (!list) this.#free.set(size, (list = []));
    list.push(address);
  }

  /** True when `address` starts a block handed out and not yet freed. */
  has(address: bigint): boolean {
    return this.#live.has(address);
  }

  /**
   * Takes the cached block at `address` (of a request of `bytes`) out of the free list and hands it out again;
   * false when that block is not cached here (handed out, or never this pool's). A recorded CUDA graph writes its
   * output to one fixed block: claiming it is how a replay gets that block back.
   */
  claim(address: bigint, bytes: number): boolean {
    const cached = this.#takeCached(bytes, address);
    if (!cached) return false;
    this.#stats.requests++;
    this.#handOut(address, cached.size);
    return true;
  }

  /** True when [address, address + bytes) lies inside one live block (a check for tests and diagnostics: O(blocks)). */
  owns(address: bigint, bytes: number): boolean {
    for (const [start, size] of this.#live) {
      if (address >= start && address + BigInt(bytes) <= start + BigInt(size)) return true;
    }
    return false;
  }

  /** Returns every cached block to the device. */
  trim(): void {
    for (const list of this.#free.values()) for (const address of list) this.#device.release(address);
    this.#free.clear();
    this.#stats.cachedBytes = 0;
  }

  /** Frees live blocks too (when the backend is disposed). */
  releaseAll(): void {
    this.trim();
    for (const address of this.#live.keys()) this.#device.release(address);
    this.#live.clear();
    this.#stats.inUseBytes = 0;
  }

  /** Returns the cached blocks to the device and starts the peaks again from what is in use now (benchmarks). */
  resetPeak(): void {
    this.trim();
    this.#stats.peakReservedBytes = this.#stats.peakInUseBytes = this.#stats.inUseBytes;
  }

  stats(): MemoryPoolStats {
    return { ...this.#stats };
  }

  #retryAfterTrim(size: number, requested: number): bigint {
    this.trim();
    const address = this.#device.allocate(size);
    if (address === null) {
      throw new ArtError("cuda_out_of_memory",
        `out of GPU memory allocating ${requested} bytes (${this.#stats.inUseBytes} bytes in use by art-ts): to train, ` +
        "lower microBatchSize or set recomputeActivations: true; to serve, fewer KV-cache slots or positions " +
        "(batcher numSlots, maxPositions or kvCacheMemory; art-ts serve --slots, --context or --kv-memory); or free other " +
        "GPU processes");
    }
    return address;
  }
}
