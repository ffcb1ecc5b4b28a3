/**
 * The CPU backend: every Backend op over Float32Array, the bodies in kernels.ts, attention.ts and logprobs.ts, their
 * matrix products through a `Gemm` (gemm.ts): the machine's optimised BLAS on all cores when one is installed, else
 * the portable products (the WASM SIMD kernels of matmul.wat on all cores, matmul.ts's bits). Everything else runs on
 * the calling thread. "bf16" tensors are rounded to bf16 values and kept in f32 storage, so the CPU reproduces the numbers
 * of a GPU that stores bf16 weights. Every training op exists here, full-parameter gradients included: this is the
 * reference the CUDA backend is checked against.
 */
import { ArtError } from "../../core/errors.ts";
import {
  type AdamWScalars, type AdamWTensors, type Backend, type ChunkSizes, type DType, type InputLoras, type KvCache, type KvCacheSpec, kvCacheElements, type LoraTarget, type PackedSegment,
  type ProjectionGradient, type RopeRotation, type RowPlacement, type SampleResult, type SamplingParams, type Tensor, type TokenLogprobs, checkKvSlotCopy, checkSampled, checkTokenIds, columnBlocks,
  loraTargetShape, projectionGradientShape, shapeSize, swigluShape, viewShape,
} from "../backend.ts";
import { f32ToBf16 } from "../safetensors.ts";
import {
  attendBlock, attendKvHead, GroupScratch, KEPT_PROBABILITY_FLOATS, packedAttention, packedAttentionBackward, probabilityOffsets,
} from "./attention.ts";
import {
  adamwUpdate, embeddingRowsBackward, linearRowsBackward, logSoftmaxRow, loraRows, loraRowsBackward, ropeRows, ropeTable, rmsNormRows,
  rmsNormRowsBackward, sumOfSquares, swigluRows, swigluRowsBackward,
} from "./kernels.ts";
import { chunkedLogprobs, chunkedLogprobsBackward } from "./logprobs.ts";
import { AttentionThreads, type CacheRun } from "./attention-threads.ts";
import { chooseGemm, type CpuBlasChoice, defaultBlasChoice, type Gemm, portableGemm, systemGemm } from "./gemm.ts";
import { sampleRows } from "./sample.ts";
import { WasmElementwise } from "./wasm-elementwise.ts";
import { DECODE_MAX_ROWS, WasmMatmul } from "./wasm-matmul.ts";

export class CpuTensor implements Tensor {
  readonly shape: readonly number[];
  readonly dtype: DType;
  readonly size: number;
  #data: Float32Array;
  /** Set once `linear` has moved this weight into the WASM matmul's memory: the values then live only there. */
  resident: { kernel: WasmMatmul; offset: number } | null = null;
  /** A bf16 weight's bf16 copy in a WASM matmul's memory, made by `linear` for decoding's products (system BLAS). */
  bf16Resident: { kernel: WasmMatmul; offset: number } | null = null;
  constructor(shape: readonly number[], dtype: DType, data: Float32Array) {
    this.shape = shape;
    this.dtype = dtype;
    this.#data = data;
    this.size = data.length;
  }
  /** A resident tensor's values are a view of the WASM memory, which is shared, so growing it leaves the view valid. */
  get data(): Float32Array {
    return this.#data;
  }
  /** New storage (free assigns an empty array): a resident tensor gives its blocks of WASM memory back. */
  set data(values: Float32Array) {
    for (const block of [this.resident, this.bf16Resident]) block?.kernel.release(block.offset);
    this.resident = this.bf16Resident = null;
    this.#data = values;
  }
  get rows(): number {
    return this.shape[0];
  }
  get cols(): number {
    return this.size / this.shape[0];
  }
}

/**
 * Rows of another tensor (Backend.view): its values are the owner's, wherever the owner keeps them (moved into the
 * WASM matmul's memory or not); it owns no storage.
 */
class CpuTensorView extends CpuTensor {
  readonly owner: CpuTensor;
  /** Where the view starts in the owner's values. */
  readonly offset: number;
  constructor(owner: CpuTensor, shape: readonly number[], offset: number) {
    super(shape, owner.dtype, owner.data.subarray(offset, offset + shapeSize(shape)));
    this.owner = owner;
    this.offset = offset;
  }
  override get data(): Float32Array {
    return this.owner.data.subarray(this.offset, this.offset + this.size);
  }
  override set data(_values: Float32Array) {
    throw new ArtError("view_storage", "cpu backend: a view shares its owner's storage and cannot be given storage of its own");
  }
}

class CpuKvCache implements KvCache {
  /** Per layer, keys and values laid out [slot][position][kvHead][headDim]: one row's write is contiguous. */
  keys: Float32Array[];
  values: Float32Array[];
  readonly spec: KvCacheSpec;
  /** The WASM matmul whose memory holds keys and values, and their blocks; null when they are plain arrays. */
  #blocks: { kernel: WasmMatmul; offsets: number[] } | null = null;
  /**
   * With `kernel` (the portable products), keys and values live in its memory, where decoding's attention reads them
   * in place; arrays without one, or when it cannot hold them (past 4 GiB), over shared memory when `shared` (the
   * attention threads then read a prompt's keys where they are).
   */
  constructor(spec: KvCacheSpec, kernel: WasmMatmul | null, shared: boolean) {
    this.spec = spec;
    const perLayer = spec.numSlots * spec.maxPositions * spec.numKvHeads * spec.headDim;
    const offsets = kernel ? allocateBlocks(kernel, 2 * spec.numLayers, perLayer * 4) : null;
    if (kernel && offsets) {
      const heap = kernel.heap;
      const layers = offsets.map((offset) => heap.subarray(offset / 4, offset / 4 + perLayer).fill(0));
      this.keys = layers.slice(0, spec.numLayers);
      this.values = layers.slice(spec.numLayers);
      this.#blocks = { kernel, offsets };
      return;
    }
    const layer = () => (shared ? new Float32Array(new SharedArrayBuffer(perLayer * 4)) : new Float32Array(perLayer));
    this.keys = Array.from({ length: spec.numLayers }, layer);
    this.values = Array.from({ length: spec.numLayers }, layer);
  }
  free(): void {
    this.keys = [];
    this.values = [];
    for (const offset of this.#blocks?.offsets ?? []) this.#blocks!.kernel.release(offset);
    this.#blocks = null;
  }
}

/** `count` blocks of `bytes` each from the kernel's allocator, or null (none kept) when its memory cannot hold them all. */
function allocateBlocks(kernel: WasmMatmul, count: number, bytes: number): number[] | null {
  const offsets: number[] = [];
  for (let i = 0; i < count; i++) {
    const offset = kernel.allocate(bytes);
    if (offset === null) {
      for (const allocated of offsets) kernel.release(allocated);
      return null;
    }
    offsets.push(offset);
  }
  return offsets;
}

function cpu(tensor: Tensor): CpuTensor {
  if (!(tensor instanceof CpuTensor)) throw new ArtError("wrong_backend", "a tensor from another backend was passed to the CPU backend");
  if (tensor.data.length === 0 && tensor.size !== 0) throw new ArtError("freed_tensor", "a freed tensor was used");
  return tensor;
}

/** Moves a tensor's values into a block of the kernel's memory; null when the memory cannot hold them. */
function moveIntoWasm(kernel: WasmMatmul, tensor: CpuTensor): CpuTensor["resident"] {
  const offset = kernel.allocate(tensor.size * 4);
  if (offset === null) return null;
  const start = offset / 4;
  kernel.heap.set(tensor.data, start);
  tensor.data = kernel.heap.subarray(start, start + tensor.size);
  tensor.resident = { kernel, offset };
  return tensor.resident;
}

/**
 * Storage the backend allocated and freed, kept for the next tensor of about the same size. A fresh Float32Array's
 * pages are mapped on first write, so each new activation cost its page faults inside the product that first wrote it
 * (measured: a [256 × 1536] product 2.9 ms into reused storage, 3.8 ms into new; a LoRA step of the 20M model 2%
 * faster for it). Arrays are made in size classes (a sixteenth of an octave apart, as the CUDA pool's blocks) and
 * handed out as views of the length asked for: a training step's activations have as many rows as its batch has
 * tokens, a number that changes from one micro-batch to the next, and exact lengths never came back (the tic-tac-toe
 * demo's training spent a sixth of its time making new arrays). Only arrays the backend made itself come back here (an
 * uploaded tensor's array is its caller's); at most the capacity's bytes wait, the rest go to the GC.
 */
class StoragePool {
  /** Free arrays by class length; those over SharedArrayBuffers (for worker threads) apart. */
  readonly #free = new Map<number, Float32Array[]>();
  readonly #freeShared = new Map<number, Float32Array[]>();
  /** The array behind each view handed out. */
  readonly #made = new WeakMap<Float32Array, Float32Array>();
  readonly #capacityBytes: number;
  #bytes = 0;
  constructor(capacityBytes: number) {
    this.#capacityBytes = capacityBytes;
  }

  /**
   * Storage of `length` floats, zeroed unless `zeroed` is false (then it may hold what its last tensor left), over a
   * SharedArrayBuffer where `shared`.
   */
  take(length: number, zeroed = true, shared = false): Float32Array {
    const size = storageClass(length);
    const reused = (shared ? this.#freeShared : this.#free).get(size)?.pop();
    if (reused) this.#bytes -= reused.byteLength;
    const array = reused ?? (shared ? new Float32Array(new SharedArrayBuffer(size * 4)) : new Float32Array(size));
    const view = size === length ? array : array.subarray(0, length);
    this.#made.set(view, array);
    return reused && zeroed ? view.fill(0) : view;
  }

  /** `storage` now belongs to someone else too (a tensor uploaded over it): it never comes back here. */
  disown(storage: Float32Array): void {
    this.#made.delete(storage);
  }

  give(storage: Float32Array): void {
    const array = this.#made.get(storage);
    if (!array) return;
    this.#made.delete(storage);
    if (array.length === 0 || this.#bytes + array.byteLength > this.#capacityBytes) return;
    const lists = array.buffer instanceof SharedArrayBuffer ? this.#freeShared : this.#free;
    const list = lists.get(array.length);
    if (list) list.push(array);
    else lists.set(array.length, [array]);
    this.#bytes += array.byteLength;
  }
}

/**
 * The free storage a backend keeps (StoragePool), 1 GiB: a step's activations are live during the step anyway, so
 * keeping them between steps raises no peak, only what the process holds while idle. Measured on the 20M LoRA step,
 * one thread, against 256 MiB (whose 4 × 512 batch, with its kept attention probabilities, outgrew it): 4 × 512
 * 3,193–3,208 → 3,053–3,082 ms (512 MiB: 3,109–3,114), 2 × 512 1,533 → 1,496 ms.
 */
const STORAGE_POOL_BYTES = 1 << 30;

/** The floats an array for `length` floats is made with: exact up to 256, then rounded up to a sixteenth of an octave. */
function storageClass(length: number): number {
  if (length <= 256) return length;
  const step = 2 ** (Math.floor(Math.log2(length)) - 4);
  return Math.ceil(length / step) * step;
}

// The attention workers of a collected backend stop with it (a test suite makes hundreds of backends).
const closeAttentionThreads = new FinalizationRegistry<AttentionThreads>((threads) => threads.close());

function cpuKvCache(cache: KvCache): CpuKvCache {
  if (!(cache instanceof CpuKvCache)) throw new ArtError("wrong_backend", "a KV cache from another backend was passed to the CPU backend");
  return cache;
}

function expectSize(name: string, tensor: Tensor, size: number): void {
  if (tensor.size !== size) {
    throw new ArtError("wrong_shape", `cpu backend: ${name} has ${tensor.size} elements ([${tensor.shape}]), expected ${size}`);
  }
}

function expectMultiple(name: string, tensor: Tensor, rowWidth: number): void {
  if (tensor.size % rowWidth !== 0) {
    throw new ArtError("wrong_shape", `cpu backend: ${name} has ${tensor.size} elements ([${tensor.shape}]), not a multiple of ${rowWidth}`);
  }
}

export interface CpuBackendOptions {
  /** Who computes the matrix products (gemm.ts): "auto", "portable", "system" or a library's path. Default `ART_CPU_BLAS`, else "auto". */
  blas?: CpuBlasChoice;
  /**
   * Threads of the matrix products: the system BLAS's, or the portable WebAssembly kernel's (linear layers, the same
   * bits on any count). Default `ART_CPU_THREADS`, else the machine's cores.
   */
  threads?: number;
  /**
   * What runs what is not a product (SwiGLU, softmaxes, RMSNorm, RoPE, exponentials): "wasm", the WebAssembly SIMD
   * kernels of elementwise.wat (a few f32 ulps from the references, with fused multiply-adds where the runtime has
   * relaxed SIMD), or "reference", the JavaScript references, the same bits on every machine. Default "reference"
   * where the portable products were asked for (`blas` or `ART_CPU_BLAS` "portable": reproducible bits), else
   * "wasm", including where no system BLAS opened and the products fell back to the portable ones (there only speed
   * counts: attention's softmaxes dominate a long sequence's training step on the references).
   */
  elementwise?: "wasm" | "reference";
  /**
   * Whether attention (training's, and prompts' over the KV cache) shares its units with `threads − 1` worker threads
   * (attention-threads.ts; default true). false keeps it on the calling thread, with the same bits: for comparison, or
   * where worker threads are unwanted.
   */
  attentionWorkers?: boolean;
  /**
   * What `empty` fills its storage with; default nothing (the storage as the pool has it). Tests fill it with NaN to
   * show that every such buffer is written whole before anything reads it.
   */
  emptyFill?: number;
}

export class CpuBackend implements Backend {
  readonly name = "cpu" as const;
  /**
   * Rows of 128 keep the BLAS's LM-head products large; the portable products keep 16, the committed models' bits
   * (a chunk's rows are one product, whose sums over rows depend on how many it holds).
   */
  readonly logitChunks: ChunkSizes;
  readonly attentionInputs: DType = "f32";
  /** The matrix products' provider, and why it was chosen (for logs and bench reports). */
  readonly gemm: Gemm;
  readonly gemmReason: string;
  /** The WASM SIMD matmul the portable `linear` runs on; null with a system BLAS or without WebAssembly SIMD. */
  readonly #kernel: WasmMatmul | null;
  /**
   * With a system BLAS: the WASM matmul that decoding's products run on, holding the f32 weights they read and bf16
   * weights' bf16 copies (made on first use; null where the runtime has no WebAssembly SIMD).
   */
  #decodeKernel: WasmMatmul | null | undefined;
  /** What is not a product (SwiGLU, softmaxes, RMSNorm, RoPE, exponentials) on WebAssembly SIMD; null: the
   * JavaScript references (CpuBackendOptions.elementwise), or a runtime without WebAssembly SIMD. */
  readonly #elementwise: WasmElementwise | null;
  /**
   * The products of training's and prompts' attention: on one BLAS thread with a system BLAS (they are small, and the
   * units run on every thread at once: #attentionThreads), else the portable ones.
   */
  readonly #attentionGemm: Gemm;
  /** The attention's worker threads (`threads` − 1 of them), null on one thread or with `attentionWorkers` false. */
  readonly #attentionThreads: AttentionThreads | null;
  // Attention scratch (a decoding row's scores, one head's values transposed, a stacked block), grown as needed.
  #scores = new Float32Array(0);
  #valuesT = new Float32Array(0);
  #group = new GroupScratch();
  #lastRope: { positions: Int32Array; frequencies: Float32Array; sign: 1 | -1; table: Float32Array } | null = null;
  readonly #storage = new StoragePool(STORAGE_POOL_BYTES);
  readonly #emptyFill: number | undefined;

  constructor(options: CpuBackendOptions = {}) {
    const blas = options.blas ?? defaultBlasChoice();
    // Checked before a BLAS is opened or a kernel compiled.
    const elementwise = options.elementwise ?? (blas === "portable" ? "reference" : "wasm");
    if (elementwise !== "wasm" && elementwise !== "reference") {
      throw new ArtError("bad_option", `CpuBackend: elementwise must be "wasm" or "reference", got ${JSON.stringify(elementwise)}`);
    }
    if (options.attentionWorkers !== undefined && typeof options.attentionWorkers !== "boolean") {
      throw new ArtError("bad_option", `CpuBackend: attentionWorkers must be true or false, got ${JSON.stringify(options.attentionWorkers)}`);
    }
    const { gemm, reason } = chooseGemm(blas, options.threads);
    this.gemmReason = reason;
    this.#kernel = gemm.library === null ? WasmMatmul.create(gemm.threads) : null;
    this.gemm = this.#kernel ? portableGemm(gemm.threads, this.#kernel) : gemm;
    this.#emptyFill = options.emptyFill;
    this.logitChunks = { rowChunk: this.gemm.library === null ? 16 : 128, vocabChunk: 4096 };
    this.#elementwise = elementwise === "wasm" ? WasmElementwise.create() : null;
    this.#attentionGemm = this.gemm.library === null ? this.gemm : systemGemm(this.gemm.library, 1);
    this.#attentionThreads = this.gemm.threads > 1 && options.attentionWorkers !== false
      ? new AttentionThreads(this.gemm.threads - 1, {
        library: this.gemm.library,
        wasm: this.#kernel !== null,
        elementwise: this.#elementwise && { fusedMultiplyAdd: this.#elementwise.fusedMultiplyAdd },
      })
      : null;
    if (this.#attentionThreads) closeAttentionThreads.register(this, this.#attentionThreads);
  }

  /**
   * Starts the attention's worker threads now (they otherwise start with the first call large enough to share) and
   * resolves with how many are ready (AttentionThreads.start); 0 without them.
   */
  startAttentionWorkers(timeoutMs?: number): Promise<number> {
    return this.#attentionThreads?.start(timeoutMs) ?? Promise.resolve(0);
  }

  /** Units of attention computed on worker threads so far (a diagnostic for benches and tests). */
  get attentionUnitsOnWorkers(): number {
    return this.#attentionThreads?.unitsOnWorkers ?? 0;
  }

  // ---- memory -----------------------------------------------------------------------------------------------------

  upload(data: Float32Array, shape: readonly number[], dtype: DType = "f32"): Tensor {
    if (data.length !== shapeSize(shape)) {
      throw new ArtError("wrong_shape", `cpu backend: ${data.length} values cannot fill shape [${shape}]`);
    }
    if (dtype === "bf16") {
      const bits = new Uint32Array(data.buffer, data.byteOffset, data.length);
      for (let i = 0; i < data.length; i++) bits[i] = f32ToBf16(data[i]) << 16;
    }
    this.#storage.disown(data);
    return new CpuTensor([...shape], dtype, data);
  }

  zeros(shape: readonly number[]): Tensor {
    return new CpuTensor([...shape], "f32", this.#storage.take(shapeSize(shape)));
  }

  empty(shape: readonly number[], dtype: DType = "f32"): Tensor {
    if (dtype !== "f32") throw new ArtError("wrong_dtype", `cpu backend: activations are f32 here (attentionInputs), not ${dtype}`);
    const storage = this.#storage.take(shapeSize(shape), false);
    if (this.#emptyFill !== undefined) storage.fill(this.#emptyFill);
    return new CpuTensor([...shape], "f32", storage);
  }

  copy(x: Tensor): Tensor {
    const values = cpu(x).data;
    const storage = this.#storage.take(values.length);
    storage.set(values);
    return new CpuTensor(x.shape, "f32", storage);
  }

  download(tensor: Tensor): Float32Array {
    return cpu(tensor).data.slice();
  }

  write(tensor: Tensor, values: Float32Array): void {
    const t = cpu(tensor);
    expectSize("written tensor", t, values.length);
    t.data.set(values);
  }

  zero(tensors: readonly Tensor[]): void {
    for (const tensor of tensors) cpu(tensor).data.fill(0);
  }

  free(tensor: Tensor): void {
    const t = cpu(tensor);
    if (t instanceof CpuTensorView) return;
    this.#storage.give(t.data);
    t.data = new Float32Array(0);
  }

  owns(tensor: Tensor): boolean {
    return tensor instanceof CpuTensor;
  }

  view(tensor: Tensor, start: number, rows: number): Tensor {
    const t = cpu(tensor);
    const shape = viewShape("cpu backend", t, start, rows);
    const width = t.size / t.shape[0];
    return t instanceof CpuTensorView ? new CpuTensorView(t.owner, shape, t.offset + start * width) : new CpuTensorView(t, shape, start * width);
  }

  // ---- forward ops ------------------------------------------------------------------------------------------------

  embedding(table: Tensor, ids: Int32Array, out: Tensor): void {
    const t = cpu(table), o = cpu(out);
    const [vocab, d] = t.shape;
    expectSize("embedding out", o, ids.length * d);
    checkTokenIds(ids, vocab);
    ids.forEach((id, i) => o.data.set(t.data.subarray(id * d, (id + 1) * d), i * d));
  }

  rmsNorm(x: Tensor, weight: Tensor, eps: number, out: Tensor, rstd: Tensor | null = null): void {
    const xs = cpu(x), w = cpu(weight), o = cpu(out);
    expectSize("rmsNorm out", o, xs.size);
    expectMultiple("rmsNorm input", xs, w.size);
    if (rstd) expectSize("rmsNorm rstd", rstd, xs.size / w.size);
    const inverses = rstd ? cpu(rstd).data : null;
    if (!this.#elementwise?.rmsNorm(xs.data, w.data, eps, o.data, inverses)) rmsNormRows(xs.data, w.data, eps, o.data, inverses);
  }

  addRmsNorm(a: Tensor, b: Tensor, sum: Tensor, weight: Tensor, eps: number, out: Tensor, rstd: Tensor | null = null,
    loras: InputLoras | null = null): void {
    const w = cpu(weight);
    for (const [name, tensor] of [["b", b], ["sum", sum], ["out", out]] as const) expectSize(`addRmsNorm ${name}`, tensor, a.size);
    expectMultiple("addRmsNorm input", a, w.size);
    if (rstd) expectSize("addRmsNorm rstd", rstd, a.size / w.size);
    if (loras) this.addLoras(loras.x, loras.targets);
    const addend = { values: cpu(b).data, sum: cpu(sum).data };
    if (this.#elementwise?.rmsNorm(cpu(a).data, w.data, eps, cpu(out).data, rstd ? cpu(rstd).data : null, addend)) return;
    this.add(a, b, sum);
    this.rmsNorm(sum, weight, eps, out, rstd);
  }

  linear(x: Tensor, weight: Tensor, bias: Tensor | null, out: Tensor): void {
    const xs = cpu(x), w = cpu(weight), o = cpu(out);
    const [outFeatures, inFeatures] = w.shape;
    expectMultiple("linear input", xs, inFeatures);
    const n = xs.size / inFeatures;
    expectSize("linear out", o, n * outFeatures);
    if (bias) expectSize("linear bias", bias, outFeatures);
    const y = o.data, b = bias ? cpu(bias).data : null, system = this.gemm.library !== null;
    const decoded = system && n >= 1 && n <= DECODE_MAX_ROWS && this.#decodeLinear(xs, w, n, inFeatures, outFeatures, o);
    if (system && !decoded) {
      // The bias first, and the BLAS adds the product to it (one pass fewer over the output).
      if (b) for (let i = 0; i < n; i++) y.set(b, i * outFeatures);
      this.gemm.nt(xs.data, w.data, n, inFeatures, outFeatures, y, { accumulate: b !== null });
      return;
    }
    if (!decoded && !this.#wasmMatmul(xs, w, n, inFeatures, outFeatures, o)) this.gemm.nt(xs.data, w.data, n, inFeatures, outFeatures, y);
    if (b) for (let i = 0; i < n; i++) for (let j = 0; j < outFeatures; j++) y[i * outFeatures + j] += b[j];
  }

  addLoras(x: Tensor, targets: readonly LoraTarget[]): void {
    const xs = cpu(x);
    for (const target of targets) {
      const { lora, out, column, down: kept } = target;
      const a = cpu(lora.a), b = cpu(lora.b), o = cpu(out);
      const { rank, inFeatures, outFeatures, n, width, downWidth } = loraTargetShape("cpu backend", xs, target);
      const down = kept ? cpu(kept.tensor).data.subarray(kept.column) : new Float32Array(n * rank);
      loraRows(this.gemm, xs.data, a.data, b.data, lora.scale, n, inFeatures, outFeatures, rank, o.data.subarray(column), width, down, downWidth);
    }
  }

  splitColumns(x: Tensor, bias: Tensor | null, outs: readonly Tensor[], rotate: RopeRotation | null = null, loras: InputLoras | null = null): void {
    const widths = columnBlocks("cpu backend", x, outs, bias);
    if (loras) this.addLoras(loras.x, loras.targets);
    const xs = cpu(x).data, b = bias ? cpu(bias).data : null;
    const rows = x.shape[0], width = x.size / rows;
    let column = 0;
    outs.forEach((out, j) => {
      const o = cpu(out).data, w = widths[j];
      for (let i = 0; i < rows; i++) {
        const from = i * width + column, to = i * w;
        if (!b) o.set(xs.subarray(from, from + w), to);
        else for (let c = 0; c < w; c++) o[to + c] = xs[from + c] + b[column + c];  // one pass: the copy and the bias
      }
      column += w;
    });
    if (rotate) this.rope(outs[0], outs[1], rotate.positions, rotate.invFreq, rotate.headDim);
  }

  /**
   * out = x Wᵀ on the WASM SIMD kernel: W moves into its memory on first use (and stays, so each weight is copied
   * once), x and out are copied through the scratch space per call. False where that cannot be (no WebAssembly SIMD,
   * or the memory would pass 4 GiB): the caller then runs the JavaScript kernel, so models of any size still work.
   */
  #wasmMatmul(x: CpuTensor, w: CpuTensor, n: number, k: number, m: number, out: CpuTensor): boolean {
    // A weight made resident by another CpuBackend is multiplied where it lives; a view, where its owner does.
    const owner = w instanceof CpuTensorView ? w.owner : w, start = w instanceof CpuTensorView ? w.offset * 4 : 0;
    const resident = owner.resident ?? (this.#kernel && moveIntoWasm(this.#kernel, owner));
    if (!resident) return false;
    return resident.kernel.linearArrays(x.data, resident.offset + start, out.data, n, k, m);
  }

  /**
   * out = x Wᵀ for a decoding product (1 to DECODE_MAX_ROWS rows) on the WASM kernel beside the system BLAS, which reads a
   * weight it does not hold at ~10 GB/s (docs/engine.md): an f32 weight moves into the kernel's memory on first use
   * (its values become a view there, which the BLAS reads as well: no second copy); a bf16 one gets a bf16 copy there
   * (half the bytes; its f32 values, the same bf16-rounded numbers, stay for the BLAS's larger products). False where
   * that cannot be (no WebAssembly SIMD, a width not a multiple of 8, the memory past 4 GiB): the BLAS then computes it.
   * A large weight's columns are shared with the kernel's worker threads (`threads` in all), the same bits on any count.
   */
  #decodeLinear(x: CpuTensor, w: CpuTensor, n: number, k: number, m: number, out: CpuTensor): boolean {
    if (k % 8 !== 0) return false;
    if (this.#decodeKernel === undefined) this.#decodeKernel = WasmMatmul.create(this.gemm.threads);
    const kernel = this.#decodeKernel;
    if (!kernel) return false;
    // A view (one projection of a stacked weight) is read where its owner's values lie.
    const owner = w instanceof CpuTensorView ? w.owner : w, start = w instanceof CpuTensorView ? w.offset : 0;
    if (w.dtype === "bf16") {
      if (!owner.bf16Resident) {
        const offset = kernel.residentBf16(owner.data);
        if (offset === null) return false;
        owner.bf16Resident = { kernel, offset };
      }
      return owner.bf16Resident.kernel.decodeLinearArrays(x.data, owner.bf16Resident.offset + start * 2, "bf16", out.data, n, k, m);
    }
    const resident = owner.resident ?? moveIntoWasm(kernel, owner);
    if (!resident) return false;
    return resident.kernel.decodeLinearArrays(x.data, resident.offset + start * 4, "f32", out.data, n, k, m);
  }

  rope(q: Tensor, k: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void {
    for (const x of [q, k]) this.#rotate(x, positions, invFreq, headDim, 1);
  }

  swiglu(gateUp: Tensor, out: Tensor, loras: InputLoras | null = null): void {
    const { inter } = swigluShape("cpu backend", gateUp, out);
    if (loras) this.addLoras(loras.x, loras.targets);
    if (this.#elementwise) this.#elementwise.swiglu(cpu(gateUp).data, cpu(out).data, inter);
    else swigluRows(cpu(gateUp).data, cpu(out).data, inter);
  }

  add(a: Tensor, b: Tensor, out: Tensor): void {
    const x = cpu(a).data, y = cpu(b).data, o = cpu(out).data;
    expectSize("add input", b, x.length);
    expectSize("add out", out, x.length);
    for (let i = 0; i < o.length; i++) o[i] = x[i] + y[i];
  }

  gatherRows(x: Tensor, rowIndex: Int32Array, out: Tensor): void {
    const xs = cpu(x), o = cpu(out);
    const width = xs.cols;
    expectSize("gatherRows out", o, rowIndex.length * width);
    checkRowIndex(rowIndex, xs.rows);
    for (let i = 0; i < rowIndex.length; i++) {
      o.data.set(xs.data.subarray(rowIndex[i] * width, (rowIndex[i] + 1) * width), i * width);
    }
  }

  // ---- inference: KV cache, attention over it, sampling -------------------------------------------------------

  createKvCache(spec: KvCacheSpec): KvCache {
    return new CpuKvCache({ ...spec }, this.#kernel, this.#attentionThreads !== null);
  }

  kvCacheBytes(spec: KvCacheSpec): number {
    return kvCacheElements(spec) * 4;
  }

  /**
   * Writes each row's keys and values to its slot at its position, then causal attention of every row over its
   * slot's positions 0..position: out = softmax(q·kᵀ/√headDim)·v per query head, heads of a GQA group sharing one KV
   * head. Computed per run of consecutive rows of one slot, in blocks of query rows (attendBlock), so the products
   * are tiled matmuls rather than one dot product per row and key: a decoding row per head, a prompt's block per
   * GQA group with its heads' rows stacked. Prompts' runs are shared with the attention's worker threads when large
   * enough (a run's KV heads are units, as a training segment's), reading the cache where it is (shared memory).
   */
  attention(q: Tensor, k: Tensor, v: Tensor, cache: KvCache, layer: number, rows: RowPlacement, out: Tensor): void {
    const kv = cpuKvCache(cache);
    const { numKvHeads, headDim, maxPositions, numSlots } = kv.spec;
    const n = rows.slots.length;
    const kvWidth = numKvHeads * headDim;
    const qs = cpu(q).data, ks = cpu(k).data, vs = cpu(v).data, o = cpu(out).data;
    expectSize("attention k", k, n * kvWidth);
    expectSize("attention v", v, n * kvWidth);
    const numHeads = q.size / (n * headDim);
    const groupSize = numHeads / numKvHeads;
    const keys = kv.keys[layer], values = kv.values[layer];
    for (let i = 0; i < n; i++) {
      const slot = rows.slots[i], position = rows.positions[i];
      if (!(slot >= 0 && slot < numSlots && position >= 0 && position < maxPositions)) {
        throw new ArtError("kv_cache_range", `row ${i} names slot ${slot} position ${position}; the KV cache has ${numSlots} slots of ${maxPositions} positions`);
      }
      const at = (slot * maxPositions + position) * kvWidth, from = i * kvWidth;
      for (let j = 0; j < kvWidth; j++) {
        keys[at + j] = ks[from + j];
        values[at + j] = vs[from + j];
      }
    }
    const qStride = numHeads * headDim;
    const prompts: CacheRun[] = [];
    for (let start = 0; start < n;) {
      // A run: rows of one slot that follow each other (a prompt's prefill; a decoding sequence is a run of one).
      const slot = rows.slots[start];
      let end = start + 1;
      while (end < n && rows.slots[end] === slot) end++;
      let runKeys = 0;
      for (let r = start; r < end; r++) runKeys = Math.max(runKeys, rows.positions[r] + 1);
      const slotKeys = keys.subarray(slot * maxPositions * kvWidth), slotValues = values.subarray(slot * maxPositions * kvWidth);
      if (end - start === 1) {
        // A decoding row: per KV head, its group's query heads (adjacent in the row) as the rows of one block: their
        // scores in one product and one softmax, then p·v per head straight from the cache (no transpose for a row).
        const scores = this.#decodeScores(groupSize * runKeys);
        const positions = new Int32Array(groupSize).fill(rows.positions[start]);
        for (let kvHead = 0; kvHead < numKvHeads; kvHead++) {
          const at = start * qStride + kvHead * groupSize * headDim;
          attendBlock(this.gemm, this.#elementwise, qs.subarray(at), slotKeys.subarray(kvHead * headDim), slotValues.subarray(kvHead * headDim),
            null, o.subarray(at), positions, headDim, headDim, kvWidth, runKeys, scores);
        }
      } else {
        prompts.push({ row: start, positions: rows.positions.subarray(start, end), runKeys,
          keys: slotKeys.subarray(0, runKeys * kvWidth), values: slotValues.subarray(0, runKeys * kvWidth) });
      }
      start = end;
    }
    // A prompt: per KV head, every query head of its group stacked in blocks of rows (attendKvHead), on every thread
    // when it is large enough (#attentionThreads), its products on one BLAS thread either way.
    const shape = { heads: numHeads, kvHeads: numKvHeads, headDim };
    if (prompts.length === 0 || this.#attentionThreads?.runCache(shape, prompts, qs, o, this.#attentionGemm, this.#elementwise)) return;
    for (const run of prompts) {
      if (this.#valuesT.length < headDim * run.runKeys) this.#valuesT = new Float32Array(headDim * run.runKeys);
      for (let kvHead = 0; kvHead < numKvHeads; kvHead++) {
        attendKvHead(this.#attentionGemm, this.#elementwise, { valuesT: this.#valuesT, group: this.#group }, kvHead, o.subarray(run.row * qStride),
          qs.subarray(run.row * qStride), run.keys, run.values, run.positions, run.runKeys, numHeads, numKvHeads, headDim);
      }
    }
  }

  /** Room for a decoding row's scores: in the fast path's memory, where its softmax works in place. */
  #decodeScores(count: number): Float32Array {
    if (this.#elementwise) return this.#elementwise.scratchView(count);
    if (this.#scores.length < count) this.#scores = new Float32Array(count);
    return this.#scores;
  }

  copyKvSlot(cache: KvCache, from: number, to: number, numPositions: number): void {
    const kv = cpuKvCache(cache);
    checkKvSlotCopy(kv.spec, from, to, numPositions);
    // Positions are the outer index within a slot, so the first numPositions of it are one contiguous run.
    const slotLength = kv.spec.maxPositions * kv.spec.numKvHeads * kv.spec.headDim;
    const runLength = numPositions * kv.spec.numKvHeads * kv.spec.headDim;
    for (const layer of [...kv.keys, ...kv.values]) layer.copyWithin(to * slotLength, from * slotLength, from * slotLength + runLength);
  }

  logSoftmax(logits: Tensor, out: Tensor): void {
    const l = cpu(logits), o = cpu(out);
    const width = l.cols;
    expectSize("logSoftmax out", o, l.size);
    for (let start = 0; start < l.size; start += width) logSoftmaxRow(l.data, start, width, o.data, start);
  }

  sample(logits: Tensor, params: SamplingParams): SampleResult {
    const l = cpu(logits);
    return checkSampled("cpu backend", sampleRows(l.data, l.cols, params, this.#elementwise ?? undefined));
  }

  // ---- training: packed attention, backward ops, target logprobs, optimiser -------------------------------------

  /**
   * Saves the softmax probabilities (attention.ts probabilityOffsets' layout) while they take at most
   * KEPT_PROBABILITY_FLOATS, else nothing (an empty tensor): the backward then recomputes them from q and k, the same
   * bits either way.
   */
  packedAttention(q: Tensor, k: Tensor, v: Tensor, segments: readonly PackedSegment[], headDim: number, out: Tensor): Tensor {
    const { heads, kvHeads } = attentionHeads(q, k, headDim);
    expectSize("attention v", v, k.size);
    expectSize("attention out", out, q.size);
    const shape = { segments, heads, kvHeads, headDim };
    const floats = probabilityOffsets(shape).at(-1)!;
    // Written whole by the units; in shared memory where worker threads write it.
    const kept = floats <= KEPT_PROBABILITY_FLOATS ? this.#storage.take(floats, false, this.#attentionThreads !== null) : null;
    const operands = { q: cpu(q).data, k: cpu(k).data, v: cpu(v).data, out: cpu(out).data, ...(kept && { probs: kept }) };
    if (!this.#attentionThreads?.run("forward", shape, operands, this.#attentionGemm, this.#elementwise)) {
      packedAttention(this.#attentionGemm, this.#elementwise, shape, operands.q, operands.k, operands.v, operands.out, kept);
    }
    return new CpuTensor([kept ? floats : 0], "f32", kept ?? new Float32Array(0));
  }

  /** The probabilities, kept or recomputed, carry all the output would tell: `out` is not read. */
  packedAttentionBackward(q: Tensor, k: Tensor, v: Tensor, _out: Tensor, saved: Tensor, segments: readonly PackedSegment[], headDim: number,
    dOut: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, overwrite = false): void {
    const { heads, kvHeads } = attentionHeads(q, k, headDim);
    // Written, here as added to zeros (the same values): the reference's sums accumulate row by row.
    if (overwrite) for (const gradient of [dq, dk, dv]) cpu(gradient).data.fill(0);
    const shape = { segments, heads, kvHeads, headDim };
    const kept = saved.size > 0 ? cpu(saved).data : null;
    if (kept) expectSize("kept attention probabilities", saved, probabilityOffsets(shape).at(-1)!);
    const operands = {
      q: cpu(q).data, k: cpu(k).data, v: cpu(v).data, dOut: cpu(dOut).data, dq: cpu(dq).data, dk: cpu(dk).data, dv: cpu(dv).data,
      ...(kept && { probs: kept }),
    };
    if (!this.#attentionThreads?.run("backward", shape, operands, this.#attentionGemm, this.#elementwise)) {
      packedAttentionBackward(this.#attentionGemm, this.#elementwise, shape, { ...operands, probs: kept });
    }
  }

  embeddingBackward(ids: Int32Array, dOut: Tensor, dTable: Tensor): void {
    const t = cpu(dTable);
    checkTokenIds(ids, t.rows);
    embeddingRowsBackward(ids, cpu(dOut).data, t.cols, t.data);
  }

  rmsNormBackward(x: Tensor, weight: Tensor, rstd: Tensor, dOut: Tensor, dx: Tensor, dWeight: Tensor | null): void {
    const operands = [cpu(x).data, cpu(weight).data, cpu(rstd).data, cpu(dOut).data, cpu(dx).data, optional(dWeight)] as const;
    if (!this.#elementwise?.rmsNormBackward(...operands)) rmsNormRowsBackward(...operands);
  }

  /** Each projection in turn: its base weight's gradients, then its LoRA's (the order the CPU's numbers were made in). */
  projectionsBackward(x: Tensor, projections: readonly ProjectionGradient[], dx: Tensor | null, overwriteDx = false): void {
    const xs = cpu(x).data;
    const shapes = projections.map((projection) => projectionGradientShape("cpu backend", x, dx, projection));
    if (overwriteDx && dx) cpu(dx).data.fill(0); // then accumulated into: the same bits as into a zeroed buffer
    projections.forEach(({ weight, dOut, dWeight, dBias, lora }, i) => {
      const { n, inFeatures, outFeatures, rank, downWidth } = shapes[i];
      const g = cpu(dOut).data;
      linearRowsBackward(this.gemm, xs, cpu(weight).data, g, n, inFeatures, outFeatures, optional(dx), optional(dWeight), optional(dBias));
      if (!lora) return;
      const { weights: { a, b, scale }, down } = lora;
      loraRowsBackward(this.gemm, xs, cpu(a).data, cpu(b).data, scale, cpu(down.tensor).data.subarray(down.column), downWidth, g,
        n, inFeatures, outFeatures, rank, optional(dx), cpu(lora.dA).data, cpu(lora.dB).data);
    });
  }

  ropeBackward(dq: Tensor, dk: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void {
    for (const x of [dq, dk]) this.#rotate(x, positions, invFreq, headDim, -1);
  }

  /** `loras` (the forward's) need nothing here: swiglu added them into gateUp. */
  swigluBackward(gateUp: Tensor, dOut: Tensor, dGate: Tensor, dUp: Tensor, overwrite = false, _loras: InputLoras | null = null): void {
    const { inter } = swigluShape("cpu backend", gateUp, dOut);
    expectSize("swigluBackward dGate", dGate, dOut.size);
    expectSize("swigluBackward dUp", dUp, dOut.size);
    if (overwrite) this.zero([dGate, dUp]);
    const operands = [cpu(gateUp).data, cpu(dOut).data, cpu(dGate).data, cpu(dUp).data, inter] as const;
    if (this.#elementwise) this.#elementwise.swigluBackward(...operands);
    else swigluRowsBackward(...operands);
  }

  gatherRowsBackward(rowIndex: Int32Array, dOut: Tensor, dx: Tensor): void {
    const d = cpu(dx), g = cpu(dOut).data, out = d.data;
    const width = d.cols;
    checkRowIndex(rowIndex, d.rows);
    rowIndex.forEach((row, i) => {
      for (let j = 0; j < width; j++) out[row * width + j] += g[i * width + j];
    });
  }

  targetLogprobs(hidden: Tensor, head: Tensor, targets: Int32Array, chunks: ChunkSizes): TokenLogprobs {
    const h = cpu(head);
    return chunkedLogprobs(this.gemm, this.#elementwise, cpu(hidden).data, h.data, targets, h.cols, h.rows, chunks);
  }

  targetLogprobsBackward(hidden: Tensor, head: Tensor, targets: Int32Array, logsumexp: Float32Array, dLogprobs: Float32Array,
    dHidden: Tensor, dHead: Tensor | null, chunks: ChunkSizes): void {
    const h = cpu(head);
    chunkedLogprobsBackward(this.gemm, this.#elementwise, cpu(dHidden).data, optional(dHead), dLogprobs, cpu(hidden).data, h.data, targets, logsumexp, h.cols, h.rows, chunks);
  }

  sumOfSquares(tensors: readonly Tensor[]): number {
    return sumOfSquares(tensors.map((t) => cpu(t).data));
  }

  adamw(params: readonly AdamWTensors[], scalars: AdamWScalars): void {
    for (const { value, grad, m, v } of params) adamwUpdate(cpu(value).data, cpu(grad).data, cpu(m).data, cpu(v).data, scalars);
  }

  // ---- helpers ----------------------------------------------------------------------------------------------------

  #rotate(x: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number, sign: 1 | -1): void {
    const xs = cpu(x);
    expectSize("rope inverse frequencies", invFreq, headDim / 2);
    expectMultiple("rope input", xs, positions.length * headDim);
    const table = this.#ropeTable(positions, cpu(invFreq).data, sign), rowWidth = xs.size / positions.length;
    if (!this.#elementwise?.rope(xs.data, rowWidth, table, headDim / 2)) ropeRows(xs.data, rowWidth, table, headDim);
  }

  /**
   * RoPE's angles for these positions, kept from the last call: every layer rotates q and k at the same positions,
   * and the cos and sin of each are most of RoPE's cost.
   */
  #ropeTable(positions: Int32Array, invFreq: Float32Array, sign: 1 | -1): Float32Array {
    const last = this.#lastRope;
    const same = last !== null && last.sign === sign && last.positions.length === positions.length && last.frequencies.length === invFreq.length &&
      last.positions.every((p, i) => p === positions[i]) && last.frequencies.every((f, i) => f === invFreq[i]);
    if (same) return last.table;
    const table = ropeTable(positions, invFreq, sign);
    this.#lastRope = { positions: positions.slice(), frequencies: invFreq.slice(), sign, table };
    return table;
  }
}

function optional(tensor: Tensor | null): Float32Array | null {
  return tensor === null ? null : cpu(tensor).data;
}

/** Query and KV heads of q:[n, heads·hd], k:[n, kvHeads·hd] (rows from the shape). */
function attentionHeads(q: Tensor, k: Tensor, headDim: number): { heads: number; kvHeads: number } {
  const rows = q.shape[0];
  const heads = q.size / (rows * headDim), kvHeads = k.size / (rows * headDim);
  if (!(Number.isInteger(heads) && Number.isInteger(kvHeads) && heads % kvHeads === 0)) {
    throw new ArtError("wrong_shape", `cpu backend: attention q [${q.shape}] and k [${k.shape}] are not whole heads of ${headDim} in groups`);
  }
  return { heads, kvHeads };
}

function checkRowIndex(rowIndex: Int32Array, rows: number): void {
  for (const row of rowIndex) {
    if (!(row >= 0 && row < rows)) throw new ArtError("bad_row_index", `row index ${row} outside 0..${rows - 1}`);
  }
}
