/**
 * Whether the CUDA backend can run here, and creating it. `cudaAvailability()` never throws: it answers with a
 * reason a person can act on, for `device: "auto"` to report. `createCudaBackend()` throws that reason as ArtError.
 */
import { ArtError } from "../core/errors.ts";
import { CudaBackend } from "./backend.ts";
import { Blas, cublasWorkspaceBytes, findBlasLibraries } from "./blas.ts";
import { systemDiscoveryInputs } from "./discovery.ts";
import { CudaContext, type DeviceInfo, listDevices } from "./driver.ts";
import { loadKernels } from "./kernels.ts";

export interface CudaAvailability {
  ok: boolean;
  /** Why not (when !ok), or what will be used (when ok). */
  reason: string;
  device?: DeviceInfo;
}

let cached: CudaAvailability | null = null;

/** Checks the driver, a GPU of compute capability >= 8.0 (bf16) and cuBLAS; cached for the process. */
export function cudaAvailability(): CudaAvailability {
  cached ??= probe();
  return cached;
}

function probe(): CudaAvailability {
  try {
    const devices = listDevices();
    if (devices.length === 0) return { ok: false, reason: "the NVIDIA driver reports no GPU" };
    const device = devices[0];
    const [major, minor] = device.computeCapability;
    if (major < 8) {
      return { ok: false, reason: `${device.name} has compute capability ${major}.${minor}; art-ts needs 8.0 or newer (bf16)`, device };
    }
    const blas = findBlasLibraries(systemDiscoveryInputs());
    return { ok: true, reason: `${device.name} (sm_${major}${minor}, ${(device.totalMemoryBytes / 2 ** 30).toFixed(0)} GiB), cuBLAS ${blas.cublas.path}`, device };
  } catch (error) {
    return { ok: false, reason: (error as Error).message };
  }
}

export interface CreateCudaBackendOptions {
  /** GPU ordinal (default 0). */
  device?: number;
  /** Told which kernels were loaded (prebuilt or compiled) and where cuBLAS came from, and if graphs are switched off. */
  log?: (message: string) => void;
  /** Replay decode passes as CUDA graphs (default: on, unless ART_CUDA_GRAPHS=0). */
  graphs?: boolean;
}

export function createCudaBackend(options: CreateCudaBackendOptions = {}): CudaBackend {
  const availability = cudaAvailability();
  if (!availability.ok) throw new ArtError("cuda_unavailable", `the CUDA backend cannot start: ${availability.reason}`);
  const context = new CudaContext(options.device ?? 0);
  let blas: Blas | null = null;
  try {
    const inputs = systemDiscoveryInputs();
    // The workspace is pool memory for the context's life: the context frees it when it is disposed.
    blas = new Blas(context.stream, findBlasLibraries(inputs), { address: context.pool.allocate(cublasWorkspaceBytes), bytes: cublasWorkspaceBytes });
    const kernels = loadKernels(context, inputs);
    options.log?.(`art-ts cuda: ${context.device.name}, kernels from ${kernels.source}, cuBLAS ${blas.libraries.cublas.path}`);
    return new CudaBackend(context, blas, kernels.functions, { graphs: options.graphs, log: options.log });
  } catch (error) {
    blas?.dispose();
    context.dispose();
    throw error;
  }
}
