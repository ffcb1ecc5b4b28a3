/**
 * The WebAssembly SIMD matmul (matmul.wat, assembled into matmul-wasm-bytes.ts by scripts/build-wasm.ts): the same
 * `out = alpha · x Wᵀ (+ out)` as kernels.ts `matmulNT`, f32x4 register-tiled. It computes on its own linear memory,
 * so operands live at byte offsets there. This class owns an instance, and blocks of its memory are handed out by an
 * explicit allocator (first fit over a free list, above it a bump pointer `top`): the CPU backend keeps each linear
 * weight in a block and copies activations into the scratch space above `top` per call.
 */
import { ArtError } from "../../core/errors.ts";
import { matmulWasmBase64 } from "./matmul-wasm-bytes.ts";

// The slice of the WebAssembly JS API used here: TypeScript declares it only in its DOM libs, which this project's
// ES2023 + node types leave out; Node, Deno and browsers all have it.
interface WasmMemory {
  readonly buffer: ArrayBuffer;
  grow(pages: number): number;
}
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object) => { readonly exports: object };
};

interface MatmulExports {
  memory: WasmMemory;
  matmulNT(x: number, w: number, out: number, n: number, k: number, m: number, alpha: number, accumulate: number): void;
}

const PAGE_BYTES = 65536;
/** A 32-bit memory addresses 4 GiB: 65536 pages. */
const MAX_PAGES = 65536;

let compiled: object | null | undefined;

/** The compiled module, or null where the runtime has no WebAssembly SIMD (compilation then fails validation). */
function compiledModule(): object | null {
  if (compiled === undefined) {
    const bytes = Uint8Array.from(atob(matmulWasmBase64), (c) => c.charCodeAt(0));
    try {
      compiled = new WebAssembly.Module(bytes);
    } catch {
      compiled = null;
    }
  }
  return compiled;
}

export class WasmMatmul {
  readonly #exports: MatmulExports;
  #heap: Float32Array;
  /** Free blocks below `top`, sorted by offset, never adjacent (released neighbours merge). */
  readonly #free: { offset: number; bytes: number }[] = [];
  readonly #blockBytes = new Map<number, number>();
  #top = 0;

  /** A fresh instance (its own memory), or null without WebAssembly SIMD. */
  static create(): WasmMatmul | null {
    const module = compiledModule();
    return module ? new WasmMatmul(new WebAssembly.Instance(module).exports as unknown as MatmulExports) : null;
  }

  private constructor(exports: MatmulExports) {
    this.#exports = exports;
    this.#heap = new Float32Array(exports.memory.buffer);
  }

  /** The memory as f32s. Growing the memory detaches earlier views, so take this again after `ensureBytes`. */
  get heap(): Float32Array {
    if (this.#heap.buffer !== this.#exports.memory.buffer) this.#heap = new Float32Array(this.#exports.memory.buffer);
    return this.#heap;
  }

  get byteLength(): number {
    return this.#exports.memory.buffer.byteLength;
  }

  /** The end of the highest allocated block: scratch space starts here. */
  get top(): number {
    return this.#top;
  }

  /** A 16-byte-aligned block of `bytes`, or null when the memory cannot grow to hold it (past 4 GiB). */
  allocate(bytes: number): number | null {
    const size = Math.max(16, Math.ceil(bytes / 16) * 16); // never empty: each block has its own offset
    const index = this.#free.findIndex((block) => block.bytes >= size);
    let offset: number;
    if (index >= 0) {
      const block = this.#free[index];
      offset = block.offset;
      if (block.bytes === size) this.#free.splice(index, 1);
      else Object.assign(block, { offset: offset + size, bytes: block.bytes - size });
    } else {
      if (!this.ensureBytes(this.#top + size)) return null;
      offset = this.#top;
      this.#top += size;
    }
    this.#blockBytes.set(offset, size);
    return offset;
  }

  /** Gives a block from `allocate` back. */
  release(offset: number): void {
    const bytes = this.#blockBytes.get(offset);
    if (bytes === undefined) throw new ArtError("bad_wasm_block", `no WASM block was allocated at ${offset} (released twice?)`);
    this.#blockBytes.delete(offset);
    let index = this.#free.findIndex((block) => block.offset > offset);
    if (index < 0) index = this.#free.length;
    this.#free.splice(index, 0, { offset, bytes });
    // Merge with the following block, then the preceding one, so free space never fragments into neighbours.
    const next = this.#free[index + 1];
    if (next && offset + bytes === next.offset) {
      this.#free[index].bytes += next.bytes;
      this.#free.splice(index + 1, 1);
    }
    const previous = this.#free[index - 1];
    if (previous && previous.offset + previous.bytes === offset) {
      previous.bytes += this.#free[index].bytes;
      this.#free.splice(index, 1);
      index--;
    }
    // Free space at the top goes back to the bump pointer (the memory itself never shrinks).
    const last = this.#free[this.#free.length - 1];
    if (last.offset + last.bytes === this.#top) {
      this.#top = last.offset;
      this.#free.pop();
    }
  }

  /** Grows the memory to hold at least `bytes`; false when that is past 4 GiB or the runtime refuses. */
  ensureBytes(bytes: number): boolean {
    const pages = Math.ceil(bytes / PAGE_BYTES);
    const current = this.#exports.memory.buffer.byteLength / PAGE_BYTES;
    if (pages <= current) return true;
    if (pages > MAX_PAGES) return false;
    try {
      this.#exports.memory.grow(pages - current);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * out[n, m] = (accumulate ? out : 0) + alpha · x[n, k] · w[m, k]ᵀ with x, w, out at these byte offsets (multiples
   * of 4, ranges inside the memory: the kernel would trap, not read past it).
   */
  matmulNT(x: number, w: number, out: number, n: number, k: number, m: number, alpha = 1, accumulate = false): void {
    const end = Math.max(x + n * k * 4, w + m * k * 4, out + n * m * 4);
    if ((x | w | out) & 3 || end > this.byteLength) {
      throw new ArtError("bad_matmul_operands", `WASM matmul operands at ${x}, ${w}, ${out} (n=${n}, k=${k}, m=${m}) are misaligned or reach past the ${this.byteLength}-byte memory: place them with ensureBytes first`);
    }
    this.#exports.matmulNT(x, w, out, n, k, m, alpha, accumulate ? 1 : 0);
  }
}
