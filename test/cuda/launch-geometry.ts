// The launch limits cuLaunchKernel enforces (CUDA_ERROR_INVALID_VALUE beyond them), for the devices that stand in for
// a GPU: a grid with no blocks is illegal on a GPU, so a backend that launches one must fail here too, not only there.
import type { LaunchConfig } from "../../lib/cuda/driver.ts";

/**
 * Throws, naming the kernel, when a GPU would refuse this launch's grid, block or shared memory (more than the device's
 * opt-in bound per block, `sharedBytesPerBlock`).
 */
export function checkLaunchGeometry(name: string, config: LaunchConfig, sharedBytesPerBlock: number): void {
  const [gx, gy = 1, gz = 1] = config.grid, [bx, by = 1, bz = 1] = config.block;
  if (!(gx >= 1 && gx < 2 ** 31 && gy >= 1 && gy <= 65535 && gz >= 1 && gz <= 65535)) throw new Error(`${name}: bad grid ${config.grid}`);
  if (!(bx >= 1 && by >= 1 && bz >= 1 && bx * by * bz <= 1024)) throw new Error(`${name}: bad block ${config.block}`);
  if ((config.sharedBytes ?? 0) > sharedBytesPerBlock) {
    throw new Error(`${name}: ${config.sharedBytes} bytes of shared memory, past the device's ${sharedBytesPerBlock} a block`);
  }
}
