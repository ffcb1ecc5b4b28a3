/**
 * Getting the kernels onto the device: the prebuilt fatbins when they match the sources, else NVRTC for this
 * device's architecture, else nvcc into a per-hash cache. Says which it used, and when none works, why.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { ArtError } from "../core/errors.ts";
import { cudaIncludeDirectories, type DiscoveryInputs, findNvrtc, systemDiscoveryInputs } from "./discovery.ts";
import type { CudaContext, KernelFunction } from "./driver.ts";
import {
  cachedNvccCubins, findNvcc, type KernelModuleName, type KernelName, kernelModules, kernelSources, readPrebuiltKernels,
} from "./kernel-build.ts";
import { Nvrtc } from "./nvrtc.ts";

export interface LoadedKernels {
  functions: Record<KernelName, KernelFunction>;
  /** "prebuilt fatbin", "NVRTC (sm_90)" or "nvcc (sm_90, cached)". */
  source: string;
}

/**
 * ART_CUDA_KERNELS=prebuilt|nvrtc|nvcc forces one path (to test the fallbacks on a GPU machine); unset = the
 * first that works.
 */
export function loadKernels(context: CudaContext, inputs: DiscoveryInputs = systemDiscoveryInputs()): LoadedKernels {
  const [major, minor] = context.device.computeCapability;
  const sm = major * 10 + minor;
  const forced = inputs.env.ART_CUDA_KERNELS;
  if (forced !== undefined && !["prebuilt", "nvrtc", "nvcc"].includes(forced)) {
    throw new ArtError("bad_env", `ART_CUDA_KERNELS must be prebuilt, nvrtc or nvcc, got ${JSON.stringify(forced)}`);
  }
  const prebuilt = forced === undefined || forced === "prebuilt" ? readPrebuiltKernels() : { stale: `ART_CUDA_KERNELS=${forced}` };
  if (forced === "prebuilt" && "stale" in prebuilt) throw new ArtError("cuda_kernels_unavailable", `ART_CUDA_KERNELS=prebuilt but ${prebuilt.stale}`);
  let images: Record<KernelModuleName, Uint8Array>;
  let source: string;
  if ("images" in prebuilt) {
    images = prebuilt.images;
    source = "prebuilt fatbin";
  } else {
    const nvrtc: ReturnType<typeof findNvrtc> = forced === "nvcc" ? { searched: ["skipped: ART_CUDA_KERNELS=nvcc"] } : findNvrtc(inputs);
    const nvcc = forced === "nvrtc" ? null : findNvcc(inputs.env);
    if ("nvrtc" in nvrtc) {
      const compiler = new Nvrtc(nvrtc.nvrtc, nvrtc.builtins);
      const { headers, modules } = kernelSources();
      images = {} as Record<KernelModuleName, Uint8Array>;
      for (const module of Object.keys(kernelModules) as KernelModuleName[]) {
        images[module] = compiler.compile(module, modules[module], headers, sm, cudaIncludeDirs(inputs));
      }
      source = `NVRTC (sm_${sm}, ${prebuilt.stale})`;
    } else if (nvcc) {
      images = cachedNvccCubins(nvcc, sm);
      source = `nvcc (sm_${sm}, ${prebuilt.stale})`;
    } else {
      throw new ArtError("cuda_kernels_unavailable",
        `${prebuilt.stale}, and neither NVRTC nor nvcc is available to compile them. Run \`npm run build:cuda\` where nvcc ` +
        "exists, or install NVRTC (pip install nvidia-cuda-nvrtc, or -cu12) or the CUDA toolkit. NVRTC was looked for in:\n" +
        nvrtc.searched.map((place) => `  - ${place}`).join("\n"));
    }
  }
  const functions = {} as Record<KernelName, KernelFunction>;
  for (const module of Object.keys(kernelModules) as KernelModuleName[]) {
    Object.assign(functions, context.loadModule(images[module], Object.keys(kernelModules[module]), module));
  }
  return { functions, source };
}

/** Directories that hold cuda_bf16.h (NVRTC needs it when its built-in headers lack it). */
function cudaIncludeDirs(inputs: DiscoveryInputs): string[] {
  return cudaIncludeDirectories(inputs).filter((dir) => existsSync(join(dir, "cuda_bf16.h")));
}
