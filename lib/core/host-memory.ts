/**
 * Native host memory through libc, the same way on Node and Deno: allocate memory the garbage collector never moves
 * (kernel argument blocks, pointer arrays), and copy between JS typed arrays and raw addresses (pinned staging,
 * C strings a library returns). Copies go through memcpy, so no runtime-specific "view an address" API is needed.
 */
import { ArtError } from "./errors.ts";
import { type NativeLibrary, type NativeSignature, openLibrary } from "./ffi.ts";

export interface HostMemory {
  malloc(bytes: number): bigint;
  free(address: bigint): void;
  /** Copies `source`'s bytes to `address` (+ `offset` bytes). */
  write(address: bigint, source: ArrayBufferView, offset?: number): void;
  /** Fills `target` with bytes read from `address` (+ `offset` bytes). */
  read(address: bigint, target: ArrayBufferView, offset?: number): void;
  /** The NUL-terminated string at `address` (a `const char*` a library handed back). */
  readCString(address: bigint): string;
}

/** The libc symbols bound (test/cuda/abi.test.ts checks them against the C headers and libc). */
export const libcSignatures = {
  malloc: { result: "pointer", args: ["u64"] },
  free: { result: "void", args: ["pointer"] },
  memcpy: { result: "pointer", args: ["pointer", "pointer", "u64"] },
  strlen: { result: "u64", args: ["pointer"] },
} satisfies Record<string, NativeSignature>;

/** memcpy bound again per direction: a typed-array source or destination needs the "buffer" slot. */
export const memcpySignatures = {
  toNative: { memcpy: { result: "pointer", args: ["pointer", "buffer", "u64"] } },
  fromNative: { memcpy: { result: "pointer", args: ["buffer", "pointer", "u64"] } },
} satisfies Record<string, Record<"memcpy", NativeSignature>>;

let libc: NativeLibrary | null = null;

export function hostMemory(): HostMemory {
  libc ??= openLibrary("libc.so.6", libcSignatures);
  const c = libc.symbols;
  const toNative = bindMemcpy(libc.path, "toNative");
  const fromNative = bindMemcpy(libc.path, "fromNative");
  return {
    malloc(bytes) {
      const address = c.malloc(bytes) as bigint;
      if (address === 0n) throw new ArtError("host_oom", `malloc(${bytes}) failed: out of host memory`);
      return address;
    },
    free: (address) => void c.free(address),
    write: (address, source, offset = 0) => void toNative(address + BigInt(offset), source, source.byteLength),
    read: (address, target, offset = 0) => void fromNative(target, address + BigInt(offset), target.byteLength),
    readCString(address) {
      if (address === 0n) return "";
      const bytes = new Uint8Array(Number(c.strlen(address)));
      fromNative(bytes, address, bytes.length);
      return new TextDecoder().decode(bytes);
    },
  };
}

const memcpyBindings = new Map<string, NativeLibrary["symbols"][string]>();

function bindMemcpy(path: string, direction: keyof typeof memcpySignatures) {
  let fn = memcpyBindings.get(direction);
  if (!fn) {
    fn = openLibrary(path, memcpySignatures[direction]).symbols.memcpy;
    memcpyBindings.set(direction, fn);
  }
  return fn;
}
