/**
 * An attention worker thread (attention-threads.ts): products and elementwise kernels made as its backend's are, then
 * every posted job's units taken until none is left. Its Gemm never sets the BLAS's thread count: the posting thread
 * has set it to one.
 */
import { parentPort, workerData } from "node:worker_threads";
import { type AttentionJob, type AttentionWorkerData, runAttentionUnits } from "./attention-threads.ts";
import { portableGemm, systemGemm } from "./gemm.ts";
import { WasmElementwise } from "./wasm-elementwise.ts";
import { WasmMatmul } from "./wasm-matmul.ts";

const data = workerData as AttentionWorkerData;
const gemm = data.library ? systemGemm(data.library, 1, { setsThreads: false }) : portableGemm(1, data.wasm ? WasmMatmul.create(1) : null);
const fast = data.elementwise ? WasmElementwise.create(data.elementwise) : null;
if (data.elementwise && !fast) throw new Error("the WebAssembly elementwise kernels did not compile in the worker");
parentPort!.on("message", (job: AttentionJob) => runAttentionUnits(job, gemm, fast));
Atomics.store(new Int32Array(data.ready), data.index, 1);
