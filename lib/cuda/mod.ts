/** Public names of the CUDA area: whether CUDA can run here, and the backend (the engine's ops on an NVIDIA GPU). */
export { CudaBackend, CudaTensor } from "./backend.ts";
export { type CudaAvailability, type CreateCudaBackendOptions, createCudaBackend, cudaAvailability } from "./availability.ts";
export { type CudaLibraryName, type DiscoveryInputs, type FoundLibrary, findCudaLibrary, findNvrtc, systemDiscoveryInputs } from "./discovery.ts";
export { type DeviceInfo, listDevices } from "./driver.ts";
export { type MemoryPoolStats } from "./memory-pool.ts";
