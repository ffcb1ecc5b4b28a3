// `node --import ./test/cuda/emulated-cuda-hooks.ts program`: the program's art-ts, built (dist/) or from source,
// finds the kernel emulator where it looks for a GPU: emulated-availability.ts loads in place of
// lib/cuda/availability, so `device: "cuda"` gets the CUDA backend on the CPU emulation of the .cu kernels.
import { registerHooks } from "node:module";

const replacement = new URL("./emulated-availability.ts", import.meta.url).href;

registerHooks({
  resolve(specifier, context, nextResolve) {
    const resolved = nextResolve(specifier, context);
    return /\/lib\/cuda\/availability\.(js|ts)$/.test(resolved.url) ? { url: replacement } : resolved;
  },
});
