// Run by mock-driver.test.ts in a child process (Node or Deno) whose LD_LIBRARY_PATH puts the mock libcuda.so.1
// first: drives the real CudaContext through the paths a GPU would take and prints what came back as JSON.
import { ArtError } from "../../lib/core/errors.ts";
import { CudaContext } from "../../lib/cuda/driver.ts";
import { openLibrary } from "../../lib/core/ffi.ts";
import { hostMemory } from "../../lib/core/host-memory.ts";

const mebibyte = 1 << 20;
function pattern(bytes: number, seed: number): Uint8Array {
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) out[i] = (i * 31 + seed * 7 + (i >> 12)) & 255;
  return out;
}
function same(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

const context = new CudaContext(0);
const results: Record<string, unknown> = { device: context.device };

// Uploads queued back to back without waiting, the third wrapping the 64 MiB staging ring, then read back.
const sizes = [30 * mebibyte, 30 * mebibyte, 30 * mebibyte, 1000, 3];
const buffers = sizes.map((bytes) => context.pool.allocate(bytes));
const sources = sizes.map((bytes, i) => pattern(bytes, i));
sizes.forEach((_, i) => context.upload(buffers[i], sources[i]));
results.uploadsIntact = sizes.map((bytes, i) => {
  const back = new Uint8Array(bytes);
  context.download(buffers[i], back);
  return same(back, sources[i]);
});

// A kernel through cuLaunchKernel's parameter array, with and without more than 48 KiB of dynamic shared memory.
const { fill_f32: fill } = context.loadModule(new Uint8Array([1, 2, 3]), ["fill_f32"], "mock");
const values = context.pool.allocate(4096 * 4);
const filled: number[] = [];
for (const [value, sharedBytes] of [[2.5, 0], [-1.25, 64 * 1024]] as const) {
  context.launch(fill, { grid: [1], block: [32], sharedBytes }, [["ptr", values], ["f32", value], ["i64", 4096]]);
  const back = new Float32Array(4096);
  context.download(values, back);
  filled.push(...new Set(back));
}
results.filled = filled;

// Zero, a device-to-device copy, and the time between two events.
context.zero(buffers[3], 1000);
context.copyDeviceToDevice(buffers[3], buffers[4], 3);
const zeroed = new Uint8Array(1000);
context.download(buffers[3], zeroed);
results.zeroThenCopy = same(zeroed.subarray(0, 3), sources[4]) && zeroed.subarray(3).every((v) => v === 0);
const [start, end] = [context.createEvent(), context.createEvent()];
context.recordEvent(start);
context.recordEvent(end);
results.elapsedMs = context.elapsedMs(start, end);
context.destroyEvent(start);
context.destroyEvent(end);

// A CUDA graph: captured work does not run; each replay runs it with the arguments of the capture; host copies
// and waits are refused while capturing; a capture the driver invalidated fails at its end, and the stream then
// works as before.
{
  const region = context.pool.allocate(64 * 4);
  const readRegion = () => {
    const back = new Float32Array(64);
    context.download(region, back);
    return [...new Set(back)];
  };
  context.upload(region, new Float32Array(64).fill(1));
  context.beginCapture();
  context.launch(fill, { grid: [1], block: [32] }, [["ptr", region], ["f32", 7], ["i64", 32]]);
  context.zero(region + 32n * 4n, 32 * 4);
  const refused = [() => context.upload(region, new Float32Array(1)), () => context.synchronize()].map((call) => {
    try {
      call();
      return "not refused";
    } catch (error) {
      return (error as Error).message;
    }
  });
  const graph = context.endCapture();
  const graphResults: unknown[] = [readRegion(), refused];
  context.launchGraph(graph);
  graphResults.push(readRegion());
  context.upload(region, new Float32Array(64).fill(3));
  context.launchGraph(graph);
  graphResults.push(readRegion());
  context.destroyGraph(graph);
  // The driver itself refuses a wait on a capturing stream and invalidates the capture (CudaContext never asks).
  const { cuStreamSynchronize: rawSynchronize } = openLibrary("libcuda.so.1", { cuStreamSynchronize: { result: "i32", args: ["pointer"] } }).symbols;
  context.beginCapture();
  graphResults.push(rawSynchronize(context.stream));
  try {
    context.endCapture();
    graphResults.push("invalidated capture ended without error");
  } catch (error) {
    graphResults.push((error as Error).message);
  }
  context.upload(region, new Float32Array(64).fill(5));
  graphResults.push(readRegion());
  context.pool.free(region);
  results.graph = graphResults;
}

// Out of device memory while stream work is queued: the pool releases its cached blocks and retries.
for (const buffer of buffers) context.pool.free(buffer);
context.upload(values, new Float32Array(16));
const big = context.pool.allocate(150 * mebibyte);
results.allocatedAfterOom = big !== 0n;

// Error text: a code the driver names, and one it does not.
results.errors = [2, 12345].map((code) => {
  try {
    context.check(code, "mock call");
    return "no error";
  } catch (error) {
    return error instanceof ArtError ? error.message : `not an ArtError: ${error}`;
  }
});

context.dispose();
// After dispose, work is refused with the reason, before anything touches the freed staging or argument memory.
results.afterDispose = [
  () => context.launch(fill, { grid: [1], block: [32] }, [["ptr", values], ["f32", 1], ["i64", 32]]),
  () => context.upload(values, new Float32Array(4)), () => context.download(values, new Float32Array(4)), () => context.synchronize(),
].map((call) => {
  try {
    call();
    return "not refused";
  } catch (error) {
    return error instanceof ArtError ? error.code : `not an ArtError: ${error}`;
  }
});
const report = openLibrary("libcuda.so.1", { mock_report: { result: "pointer", args: [] } }).symbols.mock_report() as bigint;
results.driver = JSON.parse(hostMemory().readCString(report));
console.log(JSON.stringify(results));
