import { describe, expect, it } from "vitest";
import { type DeviceAllocator, MemoryPool, sizeClass } from "../../lib/cuda/memory-pool.ts";

/** A fake device with a byte budget that records every call. */
function fakeDevice(budget: number) {
  let next = 0x1000n;
  let used = 0;
  const sizes = new Map<bigint, number>();
  const calls: string[] = [];
  const device: DeviceAllocator = {
    allocate(bytes) {
      calls.push(`alloc ${bytes}`);
      if (used + bytes > budget) return null;
      const address = next;
      next += BigInt(bytes);
      used += bytes;
      sizes.set(address, bytes);
      return address;
    },
    release(address) {
      calls.push(`release ${sizes.get(address)}`);
      used -= sizes.get(address)!;
      sizes.delete(address);
    },
  };
  return { device, calls, used: () => used };
}

describe("device memory pool", () => {
  it("rounds requests up to multiples of 256 bytes from 512, and from 4 KiB to sixteen classes per power of two", () => {
    expect([1, 512, 513, 769, 4095, 4096, 4097, 8191, 3_000_000].map(sizeClass))
      .toEqual([512, 512, 768, 1024, 4096, 4096, 4352, 8192, 23 * 2 ** 17]);
    // A 7B model's gate_proj in bf16 (18,944 × 3,584 × 2 bytes): 5% over, where 2^k / 1.5·2^k classes took 48%.
    expect(sizeClass(18944 * 3584 * 2)).toBe(17 * 2 ** 23);
    for (let bytes = 4096; bytes < 2 ** 34; bytes = Math.ceil(bytes * 1.37) + 1) {
      const size = sizeClass(bytes);
      expect(size % 256).toBe(0);
      expect(size >= bytes && size <= bytes * (1 + 1 / 16)).toBe(true);
    }
    expect(() => sizeClass(-1)).toThrowError(/invalid allocation size -1/);
  });

  it("reuses a freed block of the same class without touching the device", () => {
    const fake = fakeDevice(1 << 20);
    const pool = new MemoryPool(fake.device);
    const a = pool.allocate(1000);
    pool.free(a);
    const b = pool.allocate(900);
    expect(b).toBe(a);
    expect(fake.calls).toEqual(["alloc 1024"]);
    expect(pool.stats()).toEqual({ inUseBytes: 1024, cachedBytes: 0, peakReservedBytes: 1024, peakInUseBytes: 1024, requests: 2, reused: 1,
      deviceAllocations: 1 });
    const c = pool.allocate(2000);
    expect(c).not.toBe(a);
    expect(pool.stats().peakReservedBytes).toBe(1024 + 2048);
  });

  it("serves a request from a cached block of its class or of the next two, and claims such a block back", () => {
    const fake = fakeDevice(1 << 30);
    const pool = new MemoryPool(fake.device);
    const block = pool.allocate(18 * 2 ** 20);  // class 18 MiB; the next two classes are 19 and 20 MiB
    pool.free(block);
    expect(pool.allocate(16.5 * 2 ** 20)).toBe(block);  // class 17 MiB: two classes below, reused
    pool.free(block);
    const fresh = pool.allocate(15.5 * 2 ** 20);  // class 15.5 MiB (half-MiB steps below 16): three below, a new block
    expect(fresh).not.toBe(block);
    expect(pool.stats()).toMatchObject({ deviceAllocations: 2, reused: 1, inUseBytes: 15.5 * 2 ** 20, cachedBytes: 18 * 2 ** 20 });
    expect(pool.claim(block, 17 * 2 ** 20)).toBe(true);
    expect(pool.stats()).toMatchObject({ inUseBytes: 33.5 * 2 ** 20, cachedBytes: 0 });
    pool.releaseAll();
  });

  it("releases cached blocks and retries once when the device is full, then names the failure", () => {
    const fake = fakeDevice(4096);
    const pool = new MemoryPool(fake.device);
    pool.free(pool.allocate(2048));
    pool.free(pool.allocate(1024));
    const big = pool.allocate(3000);  // needs the cached 2048 + 1024 released first
    expect(fake.calls).toEqual(["alloc 2048", "alloc 1024", "alloc 3072", "release 2048", "release 1024", "alloc 3072"]);
    expect(pool.stats().cachedBytes).toBe(0);
    expect(() => pool.allocate(2000)).toThrowError(/out of GPU memory allocating 2000 bytes \(3072 bytes in use by art-ts\)/);
    pool.free(big);
    pool.releaseAll();
    expect(fake.used()).toBe(0);
  });

  it("keeps the peaks of bytes held and bytes in use, and restarts them from the blocks in use, after returning the cached ones", () => {
    const fake = fakeDevice(1 << 20);
    const pool = new MemoryPool(fake.device);
    const kept = pool.allocate(1024);
    pool.free(pool.allocate(8192));
    pool.free(pool.allocate(4096));  // a block of another class: the 8192 stays cached beside it
    expect(pool.stats()).toMatchObject({ peakReservedBytes: 1024 + 8192 + 4096, peakInUseBytes: 1024 + 8192 });
    pool.resetPeak();
    expect(fake.used()).toBe(1024);
    expect(pool.stats()).toMatchObject({ peakReservedBytes: 1024, peakInUseBytes: 1024, cachedBytes: 0, inUseBytes: 1024 });
    pool.free(kept);
  });

  it("refuses to free an address twice", () => {
    const pool = new MemoryPool(fakeDevice(1 << 20).device);
    const a = pool.allocate(10);
    pool.free(a);
    expect(() => pool.free(a)).toThrowError(/device address 0x1000 is not a live pool block \(freed twice\?\)/);
  });
});

describe("memory pool ownership check", () => {
  it("knows which address ranges lie inside live blocks", () => {
    const pool = new MemoryPool({ allocate: () => 0x1000n, release: () => {} });
    const a = pool.allocate(600); // 768-byte class
    expect(pool.owns(a, 768)).toBe(true);
    expect(pool.owns(a + 700n, 68)).toBe(true);
    expect(pool.owns(a + 700n, 69)).toBe(false);
    pool.free(a);
    expect(pool.owns(a, 1)).toBe(false);
  });

  it("claims a cached block back by address, and refuses one that is handed out or unknown", () => {
    const fake = fakeDevice(1 << 20);
    const pool = new MemoryPool(fake.device);
    const a = pool.allocate(3000), b = pool.allocate(3000);
    expect(pool.claim(a, 3000)).toBe(false); // handed out
    pool.free(a);
    pool.free(b);
    expect(pool.has(a)).toBe(false);
    expect(pool.claim(a, 3000)).toBe(true);
    expect(pool.has(a)).toBe(true);
    expect(pool.claim(a, 3000)).toBe(false); // already taken
    expect(pool.claim(0x9999n, 3000)).toBe(false);
    expect(pool.allocate(3000)).toBe(b); // the other cached block is still there
    expect(pool.stats()).toMatchObject({ inUseBytes: 2 * 3072, cachedBytes: 0 });
  });

  it("stacks on another pool: blocks come from it and go back to it only when trimmed", () => {
    const fake = fakeDevice(1 << 20);
    const main = new MemoryPool(fake.device);
    const arena = new MemoryPool({ allocate: (bytes) => main.allocate(bytes), release: (address) => main.free(address) });
    const a = arena.allocate(5000);
    expect(main.has(a)).toBe(true);
    arena.free(a);
    expect(main.has(a)).toBe(true); // cached by the arena, still the arena's
    arena.trim();
    expect(main.has(a)).toBe(false);
    expect(main.stats().cachedBytes).toBe(sizeClass(5000));
  });
});
