/**
 * Run-time compilation of the kernels with NVRTC, for when the prebuilt fatbins are missing or stale: each module
 * becomes a cubin for the exact device (sm_XY). libnvrtc-builtins is opened first by absolute path, so libnvrtc
 * finds it wherever it came from (a Python wheel is not on the loader's path).
 */
import { ArtError } from "../core/errors.ts";
import type { FoundLibrary } from "./discovery.ts";
import { cString, type NativeLibrary, type NativeSignature, openLibrary } from "../core/ffi.ts";
import { hostMemory } from "../core/host-memory.ts";

/** Every NVRTC symbol bound, with its C signature (test/cuda/abi.test.ts checks them against nvrtc.h and libnvrtc). */
export const nvrtcSignatures = {
  nvrtcCreateProgram: { result: "i32", args: ["buffer", "pointer", "pointer", "i32", "pointer", "pointer"] },
  nvrtcCompileProgram: { result: "i32", args: ["pointer", "i32", "pointer"] },
  nvrtcGetProgramLogSize: { result: "i32", args: ["pointer", "buffer"] },
  nvrtcGetProgramLog: { result: "i32", args: ["pointer", "buffer"] },
  nvrtcGetCUBINSize: { result: "i32", args: ["pointer", "buffer"] },
  nvrtcGetCUBIN: { result: "i32", args: ["pointer", "buffer"] },
  nvrtcDestroyProgram: { result: "i32", args: ["buffer"] },
  nvrtcGetErrorString: { result: "pointer", args: ["i32"] },
} satisfies Record<string, NativeSignature>;

export class Nvrtc {
  readonly #lib: NativeLibrary;

  constructor(nvrtc: FoundLibrary, builtins: FoundLibrary | null) {
    if (builtins) openLibrary(builtins.path, {});
    this.#lib = openLibrary(nvrtc.path, nvrtcSignatures);
  }

  /** Compiles `source` (which may #include the given headers by name) to a cubin for sm_`sm`. */
  compile(name: string, source: string, headers: Record<string, string>, sm: number, includeDirs: string[]): Uint8Array {
    const c = this.#lib.symbols;
    const memory = hostMemory();
    // Every string and string array NVRTC is handed lives in native memory until the program is destroyed: the
    // documentation does not say whether nvrtcCreateProgram copies them, and a JS buffer may be collected.
    const owned: bigint[] = [];
    const native = (bytes: ArrayBufferView) => {
      const address = memory.malloc(Math.max(1, bytes.byteLength));
      memory.write(address, bytes);
      owned.push(address);
      return address;
    };
    const cStringArray = (texts: string[]) => native(BigUint64Array.from(texts, (text) => native(cString(text))));
    const program = new BigUint64Array(1);
    try {
      const headerNames = Object.keys(headers);
      this.#check(c.nvrtcCreateProgram(program, native(cString(source)), native(cString(`${name}.cu`)), headerNames.length,
        cStringArray(headerNames.map((h) => headers[h])), cStringArray(headerNames)), `nvrtcCreateProgram(${name})`);
      const options = [`--gpu-architecture=sm_${sm}`, "-std=c++17", "-default-device",
        ...includeDirs.map((dir) => `-I${dir}`)];
      const status = c.nvrtcCompileProgram(program[0], options.length, cStringArray(options)) as number;
      if (status !== 0) {
        const size = new BigUint64Array(1);
        c.nvrtcGetProgramLogSize(program[0], size);
        const log = new Uint8Array(Number(size[0]));
        c.nvrtcGetProgramLog(program[0], log);
        // The log size counts the terminating NUL.
        const text = new TextDecoder().decode(log).replace(/\0+$/, "");
        throw new ArtError("cuda_compile", `NVRTC failed to compile ${name}.cu for sm_${sm}:\n${text}`);
      }
      const size = new BigUint64Array(1);
      this.#check(c.nvrtcGetCUBINSize(program[0], size), "nvrtcGetCUBINSize");
      const cubin = new Uint8Array(Number(size[0]));
      this.#check(c.nvrtcGetCUBIN(program[0], cubin), "nvrtcGetCUBIN");
      return cubin;
    } finally {
      if (program[0] !== 0n) c.nvrtcDestroyProgram(program);
      for (const address of owned) memory.free(address);
    }
  }

  #check(status: number | bigint, what: string): void {
    if (status !== 0) {
      const text = hostMemory().readCString(this.#lib.symbols.nvrtcGetErrorString(status) as bigint);
      throw new ArtError("nvrtc_error", `${what} failed: ${text || `nvrtcResult ${status}`}`);
    }
  }
}
