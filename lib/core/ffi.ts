/**
 * One small FFI for Node (koffi) and Deno (Deno.dlopen): open a shared library, bind symbols from C signatures.
 *
 * The type vocabulary is deliberately tiny. Every raw address (device pointers, handles, pinned host memory, C
 * strings returned by a library) crosses as a `bigint` through an integer-typed slot ("pointer"), which on x86-64
 * and aarch64 is passed in the same register as a C pointer. Host memory the callee reads or writes during the call
 * is a typed array ("buffer"). Out-params are buffers: an `unsigned long long*` or `void**` out-param is a
 * `BigUint64Array(1)`, never an integer slot (koffi would hand back a Number below 2^53 and lose the type).
 * Memory that must outlive one call (kernel argument blocks, staging) lives in native memory the caller owns.
 */
import { createRequire } from "node:module";
import { ArtError } from "./errors.ts";

/** C types a binding may use. "pointer" is an address as bigint (0n is NULL); "buffer" is host memory for the call. */
export type NativeType = "void" | "u8" | "i32" | "u32" | "i64" | "u64" | "f32" | "f64" | "pointer" | "buffer";
export type NativeArg = number | bigint | ArrayBufferView | null;
export interface NativeSignature {
  result: NativeType;
  args: readonly NativeType[];
  /** Bind when present, leave out of `symbols` when the library lacks it (symbols that differ between versions). */
  optional?: boolean;
  /**
   * This entry binds the older, unversioned export of the symbol named here (same C signature), for libraries that
   * predate it; the ABI check (test/cuda/abi.test.ts) expects the headers to map this name to that one.
   */
  legacyNameOf?: string;
}
export type NativeFunction = (...args: NativeArg[]) => number | bigint;

export interface NativeLibrary {
  readonly path: string;
  /** The bound functions, by symbol name; integer results are numbers, 64-bit and pointer results bigints. */
  readonly symbols: Record<string, NativeFunction>;
}

/** Which FFI this process uses: Deno's built-in one under Deno, koffi under Node. */
export function ffiRuntime(): "deno" | "node" {
  return denoGlobal() ? "deno" : "node";
}

/**
 * Opens `path` (an absolute path or a soname the loader resolves) and binds `signatures`. Throws ArtError naming the
 * library when it cannot be opened or a symbol is missing. A library stays loaded for the life of the process: cuBLAS
 * and NVRTC carry the CUDA runtime statically, which registers exit-time teardown, and unloading libraries that do
 * so is a known cause of crashes at exit. Opening one again is cheap (the loader hands back the same copy).
 */
export function openLibrary(path: string, signatures: Record<string, NativeSignature>): NativeLibrary {
  const deno = denoGlobal();
  return deno ? openWithDeno(deno, path, signatures) : openWithKoffi(path, signatures);
}

/** A NUL-terminated UTF-8 copy of `text`, for `const char*` arguments. */
export function cString(text: string): Uint8Array {
  const bytes = new TextEncoder().encode(text);
  const out = new Uint8Array(bytes.length + 1);
  out.set(bytes);
  return out;
}

function is64(type: NativeType): boolean {
  return type === "u64" || type === "i64" || type === "pointer";
}

// ---- Node: koffi ------------------------------------------------------------------------------------------------

interface KoffiModule {
  load(path: string): { func(name: string, result: string, args: string[]): (...args: unknown[]) => unknown };
}

let koffiModule: KoffiModule | null = null;

function koffi(): KoffiModule {
  // Loaded lazily and synchronously: importing art-ts must not load a native addon nor use top-level await.
  koffiModule ??= createRequire(import.meta.url)("koffi") as KoffiModule;
  return koffiModule;
}

const koffiTypes: Record<NativeType, string> = {
  void: "void", u8: "uint8", i32: "int32", u32: "uint32", i64: "int64", u64: "uint64", f32: "float", f64: "double",
  pointer: "uint64", buffer: "void *",
};

function openWithKoffi(path: string, signatures: Record<string, NativeSignature>): NativeLibrary {
  let handle: ReturnType<KoffiModule["load"]>;
  try {
    handle = koffi().load(path);
  } catch (error) {
    throw new ArtError("ffi_open", `cannot open native library ${path}: ${(error as Error).message}`, { cause: error });
  }
  const symbols: Record<string, NativeFunction> = {};
  for (const [name, signature] of Object.entries(signatures)) {
    let fn: (...args: unknown[]) => unknown;
    try {
      fn = handle.func(name, koffiTypes[signature.result], signature.args.map((type) => koffiTypes[type]));
    } catch (error) {
      if (signature.optional) continue;
      throw new ArtError("ffi_symbol", `symbol ${name} not found in ${path} (library too old?): ${(error as Error).message}`,
        { cause: error });
    }
    const wide = is64(signature.result);
    symbols[name] = wide
      ? (...args) => BigInt(fn(...args) as number | bigint)
      : (...args) => (fn(...args) as number | undefined) ?? 0;
  }
  return { path, symbols };
}

// ---- Deno: Deno.dlopen ------------------------------------------------------------------------------------------

interface DenoFfi {
  dlopen(path: string, symbols: Record<string, { parameters: string[]; result: string; optional?: boolean }>): {
    symbols: Record<string, (...args: unknown[]) => unknown>;
  };
}

function denoGlobal(): DenoFfi | null {
  const deno = (globalThis as { Deno?: DenoFfi }).Deno;
  return deno && typeof deno.dlopen === "function" ? deno : null;
}

const denoTypes: Record<NativeType, string> = {
  void: "void", u8: "u8", i32: "i32", u32: "u32", i64: "i64", u64: "u64", f32: "f32", f64: "f64", pointer: "u64", buffer: "buffer",
};

function openWithDeno(deno: DenoFfi, path: string, signatures: Record<string, NativeSignature>): NativeLibrary {
  const definitions: Record<string, { parameters: string[]; result: string; optional?: boolean }> = {};
  for (const [name, signature] of Object.entries(signatures)) {
    definitions[name] = { parameters: signature.args.map((type) => denoTypes[type]), result: denoTypes[signature.result],
      ...(signature.optional ? { optional: true } : {}) };
  }
  let handle: ReturnType<DenoFfi["dlopen"]>;
  try {
    handle = deno.dlopen(path, definitions);
  } catch (error) {
    throw new ArtError("ffi_open", `cannot open native library ${path} (or one of its symbols): ${(error as Error).message}`,
      { cause: error });
  }
  const symbols: Record<string, NativeFunction> = {};
  for (const [name, signature] of Object.entries(signatures)) {
    const fn = handle.symbols[name];
    if (!fn) continue;  // an optional symbol the library lacks (Deno binds it as null)
    const args = signature.args;
    // Deno wants bigint for 64-bit slots and rejects a Number there; normalise both ways.
    const convert = (values: NativeArg[]) => values.map((v, i) => (is64(args[i]) && typeof v === "number" ? BigInt(v) : v));
    const wide = is64(signature.result);
    symbols[name] = wide
      ? (...values) => BigInt(fn(...convert(values)) as number | bigint)
      : (...values) => (fn(...convert(values)) as number | undefined) ?? 0;
  }
  return { path, symbols };
}
