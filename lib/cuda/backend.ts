/**
 * The CUDA backend: every Backend op on device memory, queued on one stream; the kernels are kernels/*.cu, each
 * op's CPU reference the same op of lib/model/cpu. Activations are f32; weights may be bf16 (half the bytes decode
 * must read). Products run on cuBLAS: a bf16 weight takes the activations narrowed to bf16 (written beside them by
 * the kernel that produced them, or by one conversion kernel), f32 accumulation either way; the unmerged LoRA is two
 * more small GEMMs, the second accumulating `scale · (x Aᵀ) Bᵀ` into the output. The KV cache is bf16. Small
 * per-call index arrays (token ids, positions, slots, attention tiles) go up through the pinned staging ring; the last
 * few are cached by content, because every layer of a forward pass passes the same positions and slots. Decode
 * passes are recorded into CUDA graphs and replayed (decode-graphs.ts); while one is recorded, the backend takes its
 * transient memory from the graph arena and reads the pass's ids, slots and positions from the graph's input buffer.
 *
 * Training runs here for LoRA adapters and for every weight: the frozen base weights are the engine's own tensors (f32
 * or bf16); LoRA A/B, their gradients, the AdamW moments and every activation but q, k and v (bf16: attentionInputs)
 * are f32. Full-parameter training's weight and LM-head gradients are f32 cuBLAS products, a bias's and a norm
 * weight's column sums (#columnSums), the embedding's one block per distinct token (embeddingPlan).
 */
import { ArtError } from "../core/errors.ts";
import {
  type AdamWScalars, type AdamWTensors, type Backend, type ChunkSizes, type DecodePass, type DType, type InputLoras, type KvCache, type KvCacheSpec, kvCacheElements, type LoraTarget,
  type PackedSegment, type ProjectionGradient, type RopeRotation, type RowPlacement, type SampleResult, type SamplingParams, type Tensor, type TokenLogprobs, checkKvSlotCopy,
  checkSampled, checkSamplingParams, checkTokenIds, columnBlocks, loraTargetShape, projectionGradientShape, segmentsCoverRows, shapeSize, swigluShape, viewShape,
} from "../model/backend.ts";
import {
  attentionDimsPerLane, attentionKeyWindow, attentionQueryVectors, attentionSharedBytes, attentionWarps, checkPackedHeadDim,
  type AttentionPlan, checkRowsInCache, flashForwardBytes, flashHeadSize, packedAttentionKernels, packedKeyTiles, packedQueryTiles, planAttention, planSplits, splitPairsBound,
  tensorCoreTileRows,
} from "./attention-plan.ts";
import { type DecodeGraphStats, DecodeGraphs, type DeferredUpload } from "./decode-graphs.ts";
import type { GemmStrides, GemmType } from "./blas.ts";
import type { CudaContext, KernelFunction, LaunchConfig } from "./driver.ts";
import type { KernelArg } from "./kernel-args.ts";
import type { MemoryPool } from "./memory-pool.ts";
import { checkKernelArgs, type KernelName } from "./kernel-build.ts";

export class CudaTensor implements Tensor {
  readonly shape: readonly number[];
  readonly dtype: DType;
  readonly size: number;
  /** Bumped by every op that writes the tensor: a cached derived copy (the bf16 GEMM operand) is valid while equal. */
  version = 0;
  #address: bigint;
  constructor(shape: readonly number[], dtype: DType, address: bigint) {
    this.shape = shape;
    this.dtype = dtype;
    this.size = shapeSize(shape);
    this.#address = address;
  }
  get address(): bigint {
    if (this.#address === 0n) throw new ArtError("freed_tensor", "a freed tensor was used");
    return this.#address;
  }
  get bytes(): number {
    return this.size * (this.dtype === "bf16" ? 2 : 4);
  }
  /** Marks the tensor freed and returns its address (once). */
  release(): bigint {
    const address = this.address;
    this.#address = 0n;
    return address;
  }
}

/** Rows of another tensor (Backend.view): its address is within the owner's memory, which it does not own. */
class CudaTensorView extends CudaTensor {
  readonly owner: CudaTensor;
  readonly byteOffset: number;
  constructor(owner: CudaTensor, shape: readonly number[], byteOffset: number) {
    super(shape, owner.dtype, 1n);
    this.owner = owner;
    this.byteOffset = byteOffset;
  }
  override get address(): bigint {
    return this.owner.address + BigInt(this.byteOffset);
  }
  override release(): bigint {
    throw new ArtError("view_storage", "cuda backend: a view shares its owner's memory; free the owner");
  }
}

/** What the backend needs of a device. CudaContext is the real one; host-logic tests use a recording one. */
export interface DeviceQueue {
  readonly device: { name: string; multiprocessors: number; sharedBytesPerBlock: number };
  readonly pool: MemoryPool;
  upload(destination: bigint, source: ArrayBufferView, offset?: number): void;
  download(source: bigint, target: ArrayBufferView, offset?: number): void;
  zero(destination: bigint, bytes: number): void;
  launch(kernel: KernelFunction, config: LaunchConfig, args: readonly KernelArg[]): void;
  synchronize(): void;
  /** Stream capture (CudaContext.beginCapture): work queued until endCapture is recorded, not run. */
  beginCapture(): void;
  /** Ends the capture; the instantiated graph. */
  endCapture(): bigint;
  launchGraph(graph: bigint): void;
  destroyGraph(graph: bigint): void;
  memoryInfo(): { freeBytes: number; totalBytes: number };
  dispose(): void;
}

/** What the backend needs of cuBLAS (see Blas.linear and Blas.gemm). */
export interface GemmRunner {
  linear(x: bigint, w: bigint, y: bigint, rows: number, inF: number, outF: number, operandType: GemmType, alpha?: number, beta?: number,
    ldy?: number, ldx?: number): void;
  gemm(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean, transB: boolean, operandType: GemmType,
    alpha?: number, beta?: number, strides?: GemmStrides): void;
  dispose(): void;
}

class CudaKvCache implements KvCache {
  readonly spec: KvCacheSpec;
  readonly address: bigint;
  /** Names the cache in recorded graphs' keys. */
  readonly id: number;
  readonly #free: (cache: CudaKvCache) => void;
  #freed = false;
  constructor(spec: KvCacheSpec, address: bigint, id: number, free: (cache: CudaKvCache) => void) {
    this.spec = spec;
    this.address = address;
    this.id = id;
    this.#free = free;
  }
  /** Elements of K (or V) of one layer: [slots, kvHeads, maxPositions, headDim]. */
  get layerElements(): number {
    const s = this.spec;
    return s.numSlots * s.numKvHeads * s.maxPositions * s.headDim;
  }
  keys(layer: number): bigint {
    return this.address + BigInt(layer * 2 * this.layerElements * 2);
  }
  values(layer: number): bigint {
    return this.keys(layer) + BigInt(this.layerElements * 2);
  }
  /** The attention's split counters, after every layer's K and V. */
  get splitCounters(): bigint {
    return this.keys(this.spec.numLayers);
  }
  free(): void {
    if (this.#freed) return;
    this.#freed = true;
    this.#free(this);
  }
}

function cuda(tensor: Tensor): CudaTensor {
  if (!(tensor instanceof CudaTensor)) throw new ArtError("wrong_backend", "a tensor from another backend was passed to the CUDA backend");
  return tensor;
}

function cudaKvCache(cache: KvCache): CudaKvCache {
  if (!(cache instanceof CudaKvCache)) throw new ArtError("wrong_backend", "a KV cache from another backend was passed to the CUDA backend");
  return cache;
}

function expectSize(name: string, tensor: Tensor, size: number): void {
  if (tensor.size !== size) {
    throw new ArtError("wrong_shape", `cuda backend: ${name} has ${tensor.size} elements ([${tensor.shape}]), expected ${size}`);
  }
}

function expectMultiple(name: string, tensor: Tensor, rowWidth: number): void {
  if (tensor.size % rowWidth !== 0) {
    throw new ArtError("wrong_shape", `cuda backend: ${name} has ${tensor.size} elements ([${tensor.shape}]), not a multiple of ${rowWidth}`);
  }
}

function expectF32(name: string, tensor: Tensor): void {
  if (tensor.dtype !== "f32") throw new ArtError("wrong_dtype", `cuda backend: ${name} must be f32 (activations), got ${tensor.dtype}`);
}

/** An f32 tensor of this backend (activations, gradients, LoRA and optimiser tensors). */
function f32(name: string, tensor: Tensor): CudaTensor {
  const t = cuda(tensor);
  expectF32(name, t);
  return t;
}

/** An addLoras target, checked: its tensors, its shapes, its output's row width and first column. */
interface LoraPart {
  a: CudaTensor; b: CudaTensor; o: CudaTensor; kept: KeptDown | null;
  rank: number; inFeatures: number; outFeatures: number; n: number; width: number; column: number; scale: number;
}

/** A LoRA's x Aᵀ kept for training: columns column .. column + rank of `tensor`, whose rows are `width` apart. */
interface KeptDown { tensor: CudaTensor; column: number; width: number }

/** Where a kept x Aᵀ starts. */
function keptAddress({ tensor, column }: KeptDown): bigint {
  return tensor.address + BigInt(column * 4);
}

/**
 * How a LoRA's f32 products multiply: beside base products of bf16 weights (`bf16Base`), whose operands round to 8
 * significant bits, on the TF32 tensor cores (operands rounded to 11) rather than the CUDA cores, which ran these skinny
 * products (rank 8 against the whole batch) slowly; beside f32 weights, exactly, as f32 models' results must be.
 * (The backward's two products with the output gradient read its bf16 copy instead: projectionsBackward.)
 */
function loraProducts(bf16Base: boolean): GemmType {
  return bf16Base ? "tf32" : "f32";
}

/** Whether each tensor starts where the one before it ends: rows of one stacked tensor, as one GEMM operand. */
function adjacent(tensors: readonly CudaTensor[]): boolean {
  return tensors.every((t, i) => i === 0 || t.address === tensors[i - 1].address + BigInt(tensors[i - 1].bytes));
}

/**
 * Whether the LoRAs of a group (each with its A, its A's gradient when training, its kept x Aᵀ) can run as one
 * stacked product: f32, A matrices (and gradients) adjacent rows, and the x Aᵀ side by side in one tensor in their
 * order. DifferentiableTransformer lays them out so; anything else runs a LoRA at a time.
 */
function stackable(loras: readonly { a: CudaTensor; dA?: CudaTensor; kept: KeptDown | null; rank: number }[]): boolean {
  if (loras.length < 2) return false;
  const tensor = loras[0].kept?.tensor;
  const sideBySide = loras.every(({ a, kept }, i) => a.dtype === "f32" && kept !== null && kept.tensor === tensor
    && (i === 0 || kept.column === loras[i - 1].kept!.column + loras[i - 1].rank));
  const gradients = loras.map((l) => l.dA);
  const gradientsAdjacent = gradients.every((g) => g === undefined) || (gradients.every((g) => g !== undefined) && adjacent(gradients as CudaTensor[]));
  return sideBySide && adjacent(loras.map((l) => l.a)) && gradientsAdjacent;
}

/** lora.cu's rows per lora_up tile (LORA_TILE_ROWS), limits (LORA_MAX_RANK, LORA_MAX_FUSED_PAIRS) and block shapes (LORA_WARPS, LORA_COLUMNS). */
const loraKernelTileRows = 64, loraKernelMaxRank = 64, loraFusedMaxPairs = 64, loraDownWarps = 8, loraUpColumns = 256;
/** elementwise.cu's swiglu_kept_lora and its backward: KEPT_COLUMNS threads, a column each, over KEPT_TILE_ROWS rows. */
const keptColumns = 256, keptTileRows = 64;

/**
 * Bytes of LoRA B matrices an op may read on its way in (rows × each row's B bytes) when it adds its input's LoRAs
 * itself. Each row's block reads all of its B (at 0.5B and rank 16: 37 KB for q/k/v, 29 KB for o and for down, 311 KB
 * for gate/up), where lora_up reads B once per 64 rows; 8 MiB of L2 reads take about 1.5 µs on an H100, less than
 * the launch a fold saves, so a few sequences' decode folds every LoRA and batch 64 all but gate/up's. Not yet tuned
 * on a GPU; every path gives the same bits, so this changes only speed.
 */
const LORA_FOLD_BYTES = 8 << 20;

/** Blocks of the sum-of-squares reduction per tensor. */
const sumSquaresBlocks = 64;
/** Rows per block of column_sums_partial: 8,192 rows of a 896-wide gradient make 128 × 4 blocks of 256 threads. */
const COLUMN_SUM_ROWS = 64;
/** A launch's most blocks along the grid's y (and z). */
const MAX_GRID_Y = 65535;

/** Threads for a block-per-row kernel over `width` elements: a multiple of 32, at most 1024. */
function rowThreads(width: number, cap = 256): number {
  return Math.min(cap, Math.max(32, Math.ceil(width / 32) * 32));
}

/** convert.cu's f32_to_bf16: the parts one launch narrows. */
const narrowParts = 4;

/** Grid for a grid-stride elementwise kernel over n elements. */
function gridFor(n: number): number {
  return Math.max(1, Math.min(Math.ceil(n / 256), 8192));
}

interface CachedIndex {
  host: Int32Array;
  snapshot: Int32Array;
  address: bigint;
}

/** Recently uploaded index arrays, reused while their content is unchanged. */
const indexCacheEntries = 8;

export interface CudaBackendOptions {
  /**
   * Replay decode passes as CUDA graphs (decode-graphs.ts). Default: on, unless the environment sets
   * ART_CUDA_GRAPHS=0.
   */
  graphs?: boolean;
  /** Told when graphs are switched off after a failure. Default: console.warn. */
  log?: (message: string) => void;
}

/** While a decode pass is recorded: its memory, its inputs' fixed addresses, the index arrays to upload after. */
interface Recording {
  arena: MemoryPool;
  inputs: Map<Int32Array, bigint>;
  deferred: Map<Int32Array, DeferredUpload>;
}

export class CudaBackend<Device extends DeviceQueue = CudaContext> implements Backend {
  readonly name = "cuda" as const;
  /** 1024 rows × 16384 vocabulary entries: a 64 MB f32 block, 80 blocks for 8 × 1024 tokens of a 152k vocabulary. */
  readonly logitChunks: ChunkSizes = { rowChunk: 1024, vocabChunk: 16384 };
  /** The tensor-core attention multiplies bf16 tiles: q, k and v stored as bf16 lose nothing and halve its reads. */
  readonly attentionInputs: DType = "bf16";
  readonly context: Device;
  readonly blas: GemmRunner;
  readonly #kernels: Record<KernelName, KernelFunction>;
  #indexCache: CachedIndex[] = [];
  /** The last activation narrowed to bf16 for a GEMM: a projection's product and its LoRA's A product read the same input. */
  #bf16Copy: { tensor: CudaTensor; version: number; address: bigint } | null = null;
  /**
   * Gate's and up's input gradients rounded to bf16 side by side, as swigluBackward wrote them beside the f32 ones:
   * the operand projectionsBackward would otherwise merge from those (merge_columns_bf16), valid for these versions.
   */
  #mergedGradients: { parts: readonly CudaTensor[]; versions: readonly number[]; address: bigint } | null = null;
  /** Whether a bf16 matrix was uploaded: then producers of GEMM inputs write bf16 copies (#bf16Output). */
  #bf16Matrices = false;
  /** The last attention plan, reused by every layer of a pass (same arrays, so their device copies are reused too). */
  #lastPlan: { slots: Int32Array; positions: Int32Array; group: number; headDim: number; plan: AttentionPlan } | null = null;
  readonly #graphs: DecodeGraphs | null;
  #recording: Recording | null = null;
  #nextCacheId = 1;

  constructor(context: Device, blas: GemmRunner, kernels: Record<KernelName, KernelFunction>, options: CudaBackendOptions = {}) {
    this.context = context;
    this.blas = blas;
    this.#kernels = kernels;
    const graphs = options.graphs ?? process.env.ART_CUDA_GRAPHS !== "0";
    this.#graphs = !graphs ? null : new DecodeGraphs({
      pool: context.pool,
      upload: (destination, data) => context.upload(destination, data),
      launchGraph: (graph) => context.launchGraph(graph),
      destroyGraph: (graph) => context.destroyGraph(graph),
      record: (run, inputs, arena) => this.#record(run, inputs, arena),
      outputTensor: (shape, address) => new CudaTensor(shape, "f32", address),
      kvCache: cudaKvCache,
    }, options.log ?? ((message) => console.warn(message)));
  }

  // ---- memory ---------------------------------------------------------------------------------------------------

  #allocate(shape: readonly number[], dtype: DType): CudaTensor {
    const size = shapeSize(shape);
    return new CudaTensor([...shape], dtype, this.#transient().allocate(Math.max(1, size) * (dtype === "bf16" ? 2 : 4)));
  }

  /** Where tensors and scratch come from: the graph arena while a pass is recorded, the main pool otherwise. */
  #transient(): MemoryPool {
    return this.#recording?.arena ?? this.context.pool;
  }

  /** Gives a block back to the pool that handed it out. */
  #release(address: bigint): void {
    const arena = this.#graphs?.arena;
    (arena?.has(address) ? arena : this.context.pool).free(address);
  }

  upload(data: Float32Array, shape: readonly number[], dtype: DType = "f32"): Tensor {
    if (data.length !== shapeSize(shape)) throw new ArtError("wrong_shape", `cuda backend: ${data.length} values cannot fill shape [${shape}]`);
    const f32 = this.#allocate(shape, "f32");
    this.context.upload(f32.address, data);
    if (dtype === "f32") return f32;
    if (shape.length === 2) this.#bf16Matrices = true;
    const narrow = this.#allocate(shape, "bf16");
    this.#narrowInto([{ source: f32.address, count: data.length }], [narrow.address]);
    this.free(f32);
    return narrow;
  }

  zeros(shape: readonly number[]): Tensor {
    const tensor = this.#allocate(shape, "f32");
    this.context.zero(tensor.address, tensor.bytes);
    return tensor;
  }

  empty(shape: readonly number[], dtype: DType = "f32"): Tensor {
    return this.#allocate(shape, dtype);
  }

  copy(x: Tensor): Tensor {
    const out = this.zeros(x.shape);
    this.add(out, f32("copied tensor", x), out);
    return out;
  }

  write(tensor: Tensor, data: Float32Array): void {
    const t = f32("written tensor", tensor);
    if (data.length !== t.size) throw new ArtError("wrong_shape", `cuda backend: ${data.length} values cannot fill [${t.shape}]`);
    t.version++;
    this.context.upload(t.address, data);
  }

  zero(tensors: readonly Tensor[]): void {
    const ts = tensors.map((tensor) => f32("zeroed tensor", tensor));
    for (const t of ts) t.version++;
    this.#launchOverTensors("zero_tensors", ts.map((t) => [t.address]), ts.map((t) => t.size), [], 64);
  }

  owns(tensor: Tensor): boolean {
    return tensor instanceof CudaTensor;
  }

  download(tensor: Tensor): Float32Array {
    const t = cuda(tensor);
    const out = new Float32Array(t.size);
    if (t.dtype === "f32") {
      this.context.download(t.address, out);
      return out;
    }
    const wide = this.#allocate(t.shape, "f32");
    this.#launch("bf16_to_f32", [gridFor(t.size)], [256], [["ptr", t.address], ["ptr", wide.address], ["i64", t.size]]);
    this.context.download(wide.address, out);
    this.free(wide);
    return out;
  }

  free(tensor: Tensor): void {
    const t = cuda(tensor);
    if (t instanceof CudaTensorView) return;
    if (this.#bf16Copy?.tensor === t) this.#dropBf16Copy();
    if (this.#mergedGradients?.parts.includes(t)) this.#dropMergedGradients();
    this.#release(t.release());
  }

  view(tensor: Tensor, start: number, rows: number): Tensor {
    const t = cuda(tensor);
    const shape = viewShape("cuda backend", t, start, rows);
    const bytes = start * (t.bytes / t.shape[0]);
    return t instanceof CudaTensorView ? new CudaTensorView(t.owner, shape, t.byteOffset + bytes) : new CudaTensorView(t, shape, bytes);
  }

  availableMemory(): number {
    return this.context.memoryInfo().freeBytes + this.context.pool.stats().cachedBytes;
  }

  /** Device memory statistics (pool, graph arena, driver) for benchmarks and diagnostics. */
  memoryStats() {
    return { pool: this.context.pool.stats(), graphArena: this.#graphs?.arena.stats() ?? null, device: this.context.memoryInfo() };
  }

  // ---- recorded decode passes (decode-graphs.ts) -----------------------------------------------------------------

  runDecodePass(pass: DecodePass, run: () => Tensor): Tensor {
    return this.#graphs ? this.#graphs.run(pass, run) : run();
  }

  releaseDecodePasses(owner: object): void {
    this.#graphs?.forgetOwner(owner);
  }

  /** How decode passes ran (recorded, replayed, eager), or null when graphs were not asked for. */
  decodeGraphStats(): DecodeGraphStats | null {
    return this.#graphs?.stats() ?? null;
  }

  // ---- ops ------------------------------------------------------------------------------------------------------

  embedding(table: Tensor, ids: Int32Array, out: Tensor): void {
    const t = cuda(table), o = cuda(out);
    o.version++;
    const [vocab, d] = t.shape;
    expectSize("embedding out", o, ids.length * d);
    checkTokenIds(ids, vocab);
    this.#launch(t.dtype === "bf16" ? "embedding_bf16" : "embedding_f32", [ids.length], [rowThreads(d)],
      [["ptr", t.address], ["ptr", this.#indices(ids)], ["ptr", o.address], ["i32", d]]);
  }

  rmsNorm(x: Tensor, weight: Tensor, eps: number, out: Tensor, rstd: Tensor | null = null): void {
    const xs = cuda(x), w = cuda(weight), o = cuda(out);
    o.version++;
    expectSize("rmsNorm out", o, xs.size);
    expectMultiple("rmsNorm input", xs, w.size);
    // A norm of whole rows feeds GEMMs (q/k/v, the head); a per-head norm (Qwen3's q/k norm) does not.
    const gemmInput = w.size === o.shape[o.shape.length - 1];
    this.#launch(w.dtype === "bf16" ? "rmsnorm_bf16" : "rmsnorm_f32", [xs.size / w.size], [rowThreads(w.size)],
      [["ptr", xs.address], ["ptr", w.address], ["f32", eps], ["ptr", o.address], ["ptr", gemmInput ? this.#bf16Output(o) : 0n],
        ["ptr", this.#rstd(rstd, xs.size / w.size)], ["i32", w.size]]);
  }

  /**
   * With `loras` (one LoRA into b, an inference pass's: nothing kept for a backward), add_rmsnorm_lora adds it on
   * the way in (rmsnorm.cu), lora.cu's sums in its order: the same bits as addLoras then add_rmsnorm, and b is left
   * without it. Other LoRAs go through addLoras first.
   */
  addRmsNorm(a: Tensor, b: Tensor, sum: Tensor, weight: Tensor, eps: number, out: Tensor, rstd: Tensor | null = null,
    loras: InputLoras | null = null): void {
    const as = cuda(a), bs = cuda(b), s = cuda(sum), w = cuda(weight), o = cuda(out);
    expectSize("residual add input", bs, as.size);
    expectSize("addRmsNorm sum", s, as.size);
    expectSize("addRmsNorm out", o, as.size);
    expectMultiple("addRmsNorm input", as, w.size);
    const folded = loras ? this.#foldableLoras(loras, bs, [w.size]) : null;
    if (loras && !folded) this.addLoras(loras.x, loras.targets);
    s.version++;
    o.version++;
    const norm = w.dtype === "bf16" ? "bf16" : "f32";
    const args: KernelArg[] = [["ptr", as.address], ["ptr", bs.address], ["ptr", s.address], ["ptr", w.address], ["f32", eps],
      ["ptr", o.address], ["ptr", this.#bf16Output(o)], ["ptr", this.#rstd(rstd, as.size / w.size)], ["i32", w.size]];
    if (!folded) {
      this.#launch(`add_rmsnorm_${norm}`, [as.size / w.size], [rowThreads(w.size)], args);
      return;
    }
    const { x, parts: [lora], inFeatures, rank, dtype } = folded;
    this.#launch(`add_rmsnorm_lora_${norm}_${dtype}`, [as.size / w.size], [rowThreads(w.size)],
      [...args, ["ptr", x.address], ["ptr", lora!.a.address], ["ptr", lora!.b.address], ["f32", lora!.scale], ["i32", inFeatures], ["i32", rank]]);
  }

  /**
   * The LoRAs a fused op can add on its way in (split_rope_lora, swiglu_lora, add_rmsnorm_lora), by part of `fused`'s
   * columns (q, k, v; gate, up; o or down alone): each into all of one part, nothing kept, one rank that lora.cuh
   * stages, one input width and dtype, their B read by each row within LORA_FOLD_BYTES.
   */
  #foldableLoras({ x, targets }: InputLoras, fused: CudaTensor, widths: readonly number[]) {
    const xs = f32("LoRA input", x);
    const starts = widths.map((_, j) => widths.slice(0, j).reduce((sum, w) => sum + w, 0));
    const parts: ({ a: CudaTensor; b: CudaTensor; scale: number } | undefined)[] = [];
    let shape: { rank: number; inFeatures: number; dtype: DType } | null = null;
    let readBytes = 0;
    for (const target of targets) {
      const { rank, inFeatures, outFeatures, n, width } = loraTargetShape("cuda backend", xs, target);
      const a = cuda(target.lora.a), b = cuda(target.lora.b), p = starts.indexOf(target.column);
      shape ??= { rank, inFeatures, dtype: a.dtype };
      const fits = cuda(target.out).address === fused.address && p >= 0 && !parts[p] && outFeatures === widths[p] && n * width === fused.size && n > 0;
      if (!fits || target.down || b.dtype !== a.dtype || rank > loraKernelMaxRank || rank !== shape.rank || inFeatures !== shape.inFeatures || a.dtype !== shape.dtype) return null;
      parts[p] = { a, b, scale: target.lora.scale };
      readBytes += n * b.bytes;
    }
    if (readBytes > LORA_FOLD_BYTES) return null;
    return shape && { x: xs, parts, rank: shape.rank, inFeatures: shape.inFeatures, dtype: shape.dtype === "bf16" ? "bf16" : "f32" };
  }

  /**
   * A training pass's gate/up LoRAs (x Aᵀ kept for the backward, f32, one rank, each into all of its half of gateUp) as
   * swiglu_kept_lora and its backward add them on their way in (elementwise.cu), or null: the launch geometry and the
   * kernels' LoRA arguments. swiglu and swigluBackward take the same rule, so the backward adds exactly what the
   * forward left out of gateUp.
   */
  #keptGateUpLoras({ x, targets }: InputLoras, gateUp: CudaTensor, inter: number) {
    const xs = f32("LoRA input", x);
    const parts = this.#loraParts(xs, targets);
    const halves = [0, inter].map((column) => parts.find((p) => p.column === column));
    const rank = parts[0]?.rank;
    const fits = parts.length > 0 && parts.length === halves.filter(Boolean).length && parts.every((p) =>
      p.kept !== null && p.o.address === gateUp.address && p.outFeatures === inter && p.width === 2 * inter && p.rank === rank
      && p.kept.width === parts[0].kept!.width && p.kept.tensor === parts[0].kept!.tensor);
    if (!fits || rank > loraKernelMaxRank) return null;
    const rows = parts[0].n;
    const args: KernelArg[] = [...halves.map((p): KernelArg => ["ptr", p ? keptAddress(p.kept!) : 0n]), ["i32", parts[0].kept!.width],
      ...halves.map((p): KernelArg => ["ptr", p ? p.b.address : 0n]), ...halves.map((p): KernelArg => ["f32", p?.scale ?? 0]), ["i32", rank]];
    return { x: xs, parts, rows, args, grid: [Math.ceil(inter / keptColumns), Math.ceil(rows / keptTileRows)] as [number, number] };
  }

  linear(x: Tensor, weight: Tensor, bias: Tensor | null, out: Tensor): void {
    const xs = cuda(x), w = cuda(weight), o = cuda(out);
    o.version++;
    expectF32("linear input", xs);
    const [outFeatures, inFeatures] = w.shape;
    expectMultiple("linear input", xs, inFeatures);
    const n = xs.size / inFeatures;
    expectSize("linear out", o, n * outFeatures);
    this.blas.linear(this.#operand(xs, w.dtype), w.address, o.address, n, inFeatures, outFeatures, w.dtype);
    if (bias) {
      const b = cuda(bias);
      expectSize("linear bias", b, outFeatures);
      this.#launch(b.dtype === "bf16" ? "add_bias_bf16" : "add_bias_f32", [gridFor(o.size)], [256],
        [["ptr", o.address], ["ptr", b.address], ["i64", n], ["i32", outFeatures]]);
    }
  }

  /**
   * An inference pass's LoRAs (nothing kept for a backward, up to three targets of one rank and dtype) run as lora.cu's
   * two launches for the whole group, one for a decode pass of a few sequences. A training pass's group whose A
   * matrices are rows of one tensor (`stackable`) takes its down products as one GEMM into the x Aᵀ it keeps, then a
   * GEMM per target; otherwise each target is two cuBLAS GEMMs.
   */
  addLoras(x: Tensor, targets: readonly LoraTarget[]): void {
    const xs = f32("LoRA input", x);
    const parts = this.#loraParts(xs, targets);
    if (parts.length === 0) return;
    for (const { o } of parts) o.version++;
    if (stackable(parts)) {
      this.#keepDowns(xs, parts);
      const type = loraProducts(this.#roundedForProduct(xs));
      for (const p of parts) {
        this.blas.linear(keptAddress(p.kept!), p.b.address, p.o.address + BigInt(p.column * 4), p.n, p.rank, p.outFeatures, type, p.scale, 1, p.width, p.kept!.width);
      }
      return;
    }
    const { n, rank, inFeatures, a: firstA } = parts[0];
    const grouped = n >= 1 && rank <= loraKernelMaxRank && parts.length <= 3
      && parts.every((p) => !p.kept && p.rank === rank && p.inFeatures === inFeatures && p.a.dtype === firstA.dtype);
    if (!grouped) {
      for (const part of parts) this.#loraGemms(xs, part);
      return;
    }
    const suffix = firstA.dtype === "bf16" ? "bf16" : "f32";
    const each = <T>(pick: (part: LoraPart) => T, none: T): T[] => [0, 1, 2].map((p) => (parts[p] ? pick(parts[p]) : none));
    const ups: KernelArg[] = [...each((p): KernelArg => ["ptr", p.b.address], ["ptr", 0n]),
      ...each((p): KernelArg => ["ptr", p.o.address + BigInt(p.column * 4)], ["ptr", 0n]),
      ...each((p): KernelArg => ["i32", p.outFeatures], ["i32", 0]), ...each((p): KernelArg => ["i32", p.width], ["i32", 0]),
      ...each((p): KernelArg => ["f32", p.scale], ["f32", 0])];
    const grid: [number, number] = [Math.ceil(Math.max(...parts.map((p) => p.outFeatures)) / loraUpColumns), parts.length];
    const as = each((p): KernelArg => ["ptr", p.a.address], ["ptr", 0n]);
    if (n * rank <= loraFusedMaxPairs) {
      // A decode pass of a few sequences: both products in one launch, each block computing its part's x Aᵀ.
      this.#launch(`lora_fused_${suffix}`, grid, [loraUpColumns], [["ptr", xs.address], ...as, ...ups, ["i32", n], ["i32", inFeatures], ["i32", rank]]);
      return;
    }
    const down = this.#transient().allocate(parts.length * n * rank * 4);
    this.#launch(`lora_down_${suffix}`, [Math.ceil((n * rank) / loraDownWarps), parts.length], [loraDownWarps * 32],
      [["ptr", xs.address], ...as, ["ptr", down], ["i32", n], ["i32", inFeatures], ["i32", rank]]);
    this.#launch(`lora_up_${suffix}`, [...grid, Math.ceil(n / loraKernelTileRows)], [loraUpColumns], [["ptr", down], ...ups, ["i32", n], ["i32", rank]]);
    this.#release(down);
  }

  /** addLoras' targets, checked: A and B alike, f32 where x Aᵀ is kept for training. */
  #loraParts(xs: CudaTensor, targets: readonly LoraTarget[]): LoraPart[] {
    return targets.map((target): LoraPart => {
      const { lora, out, column, down } = target;
      const a = cuda(lora.a), b = cuda(lora.b), o = f32("LoRA output", out);
      if (a.dtype !== b.dtype) throw new ArtError("wrong_dtype", `cuda backend: LoRA A is ${a.dtype} but B is ${b.dtype}; store both alike`);
      const { rank, inFeatures, outFeatures, n, width, downWidth } = loraTargetShape("cuda backend", xs, target);
      if (down && a.dtype !== "f32") throw new ArtError("wrong_dtype", `cuda backend: a LoRA trained here (its x·Aᵀ kept) is f32, not ${a.dtype}`);
      const kept = down ? { tensor: f32("LoRA x·Aᵀ", down.tensor), column: down.column, width: downWidth } : null;
      return { a, b, o, kept, rank, inFeatures, outFeatures, n, width, column, scale: lora.scale };
    });
  }

  /** x Aᵀ of kept LoRAs into their kept columns: one GEMM over a stackable group's A, else one per LoRA. */
  #keepDowns(xs: CudaTensor, parts: readonly LoraPart[]): void {
    const type = loraProducts(this.#roundedForProduct(xs));
    for (const { kept } of parts) kept!.tensor.version++;
    if (stackable(parts)) {
      const { n, inFeatures, kept } = parts[0];
      const stackedRank = parts.reduce((sum, p) => sum + p.rank, 0);
      this.blas.linear(xs.address, parts[0].a.address, keptAddress(kept!), n, inFeatures, stackedRank, type, 1, 0, kept!.width);
      return;
    }
    for (const { a, kept, n, inFeatures, rank } of parts) this.blas.linear(xs.address, a.address, keptAddress(kept!), n, inFeatures, rank, type, 1, 0, kept!.width);
  }

  /** One target of addLoras as two cuBLAS GEMMs: x Aᵀ (kept when asked, in its columns), then scale · (x Aᵀ) Bᵀ into its columns. */
  #loraGemms(xs: CudaTensor, { a, b, o, kept, rank, inFeatures, outFeatures, n, width, column, scale }: LoraPart): void {
    if (kept) kept.tensor.version++;
    const down = kept ? keptAddress(kept) : this.#transient().allocate(n * rank * 4);
    const downWidth = kept?.width ?? rank;
    const type = a.dtype === "bf16" ? "bf16" : loraProducts(this.#roundedForProduct(xs));
    this.blas.linear(this.#operand(xs, a.dtype), a.address, down, n, inFeatures, rank, type, 1, 0, downWidth);
    // A kept x Aᵀ is f32 with f32 B (addLoras checks), so only a packed one is narrowed.
    const downOperand = b.dtype === "bf16" ? this.#narrow(down, n * rank) : down;
    // Into the output's columns column .. column + outF: rows `width` apart.
    this.blas.linear(downOperand, b.address, o.address + BigInt(column * 4), n, rank, outFeatures, type, scale, 1, width, downWidth);
    if (downOperand !== down) this.#release(downOperand);
    if (!kept) this.#release(down);
  }

  /**
   * With `rotate` and an inference pass's q/k/v LoRAs (nothing kept, one rank, each into all of its part's columns),
   * split_rope_lora adds them on the way in (rope.cu), lora.cu's sums in its order: the same bits as addLoras then
   * split_rope, and x is left without them. Other LoRAs go through addLoras first.
   */
  splitColumns(x: Tensor, bias: Tensor | null, outs: readonly Tensor[], rotate: RopeRotation | null = null, loras: InputLoras | null = null): void {
    const xs = f32("splitColumns input", x);
    const widths = columnBlocks("cuda backend", xs, outs, bias);
    if (outs.length > 3) throw new ArtError("wrong_shape", `cuda backend: splitColumns writes at most 3 parts (q, k, v), not ${outs.length}`);
    // Parts as a training pass keeps them for the tensor-core attention (bf16, split_rope_to_bf16), or f32.
    const narrowed = outs.some((out) => out.dtype === "bf16");
    if (narrowed && !(rotate && outs.every((out) => out.dtype === "bf16"))) {
      throw new ArtError("wrong_dtype", `cuda backend: splitColumns writes bf16 parts only as q, k and v all bf16 with a rotation; got [${outs.map((out) => out.dtype)}]${rotate ? "" : " without one"}`);
    }
    const folded = loras && rotate && !narrowed ? this.#foldableLoras(loras, xs, widths) : null;
    if (loras && !folded) this.addLoras(loras.x, loras.targets);
    const os = outs.map((out) => (narrowed ? cuda(out) : f32("splitColumns output", out)));
    for (const o of os) o.version++;
    const biasAddress = bias ? f32("splitColumns bias", bias).address : 0n;
    if (rotate) {
      // q, k, v: split_rope (rope.cu), one block per row.
      const { positions, invFreq, headDim } = rotate;
      const f = cuda(invFreq);
      expectSize("rope inverse frequencies", f, headDim / 2);
      const heads = widths.map((width) => width / headDim);
      if (os.length !== 3 || positions.length !== xs.shape[0] || !heads.every(Number.isInteger) || heads[1] !== heads[2]) {
        throw new ArtError("wrong_shape", `cuda backend: splitColumns with a rotation takes q, k and v of whole heads of ${headDim} (k as wide as v) and a position per row; got widths [${widths}] for ${xs.shape[0]} rows and ${positions.length} positions`);
      }
      if (positions.length === 0) return; // a GPU refuses a launch over no rows
      const frequencies = f.dtype === "bf16" ? "bf16" : "f32";
      const args: KernelArg[] = [["ptr", xs.address], ["ptr", biasAddress], ...os.map((o): KernelArg => ["ptr", o.address]),
        ["ptr", this.#indices(positions)], ["ptr", f.address], ["i32", heads[0]], ["i32", heads[1]], ["i32", headDim]];
      const threads: [number] = [rowThreads(((heads[0] + heads[1]) * headDim) / 2, 128)];
      if (!folded) {
        this.#launch(narrowed ? `split_rope_to_bf16_${frequencies}` : `split_rope_${frequencies}`, [positions.length], threads, args);
        return;
      }
      const part = (p: number) => folded.parts[p];
      this.#launch(`split_rope_lora_${frequencies}_${folded.dtype}`, [positions.length], threads, [...args, ["ptr", folded.x.address],
        ...[0, 1, 2].map((p): KernelArg => ["ptr", part(p)?.a.address ?? 0n]), ...[0, 1, 2].map((p): KernelArg => ["ptr", part(p)?.b.address ?? 0n]),
        ...[0, 1, 2].map((p): KernelArg => ["f32", part(p)?.scale ?? 0]), ["i32", folded.inFeatures], ["i32", folded.rank]]);
      return;
    }
    const pointers: KernelArg[] = [0, 1, 2].map((j) => ["ptr", os[j]?.address ?? 0n]);
    const partWidths: KernelArg[] = [0, 1, 2].map((j) => ["i32", widths[j] ?? 0]);
    this.#launch("split_columns", [gridFor(xs.size)], [256], [["ptr", xs.address], ["ptr", biasAddress], ...pointers, ...partWidths, ["i64", xs.shape[0]]]);
  }

  rope(q: Tensor, k: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void {
    this.#rotate(q, k, positions, invFreq, headDim, 1);
  }

  /**
   * With an inference pass's gate/up LoRAs (nothing kept, one rank, each into all of its half), swiglu_lora adds them
   * on the way in (elementwise.cu), lora.cu's sums in its order: the same bits as addLoras then swiglu, and gateUp is
   * left without them. Other LoRAs go through addLoras first.
   */
  swiglu(gateUp: Tensor, out: Tensor, loras: InputLoras | null = null): void {
    const g = f32("swiglu gate/up", gateUp), o = f32("swiglu out", out);
    const { inter } = swigluShape("cuda backend", g, o);
    const folded = loras ? this.#foldableLoras(loras, g, [inter, inter]) : null;
    const kept = loras && !folded ? this.#keptGateUpLoras(loras, g, inter) : null;
    if (loras && !folded && !kept) this.addLoras(loras.x, loras.targets);
    o.version++;
    if (kept) {
      // A training pass: x Aᵀ into the kept columns, then the SwiGLU adds the products on its way in.
      this.#keepDowns(kept.x, kept.parts);
      this.#launch("swiglu_kept_lora", kept.grid, [keptColumns], [["ptr", g.address], ["ptr", o.address], ["ptr", this.#bf16Output(o)],
        ["i32", inter], ["i32", kept.rows], ...kept.args]);
      return;
    }
    if (!folded) {
      this.#launch("swiglu", [gridFor(o.size)], [256], [["ptr", g.address], ["ptr", o.address], ["ptr", this.#bf16Output(o)],
        ["i32", inter], ["i64", o.size]]);
      return;
    }
    const part = (p: number) => folded.parts[p];
    this.#launch(`swiglu_lora_${folded.dtype}`, [o.size / inter], [rowThreads(inter)], [["ptr", g.address], ["ptr", o.address],
      ["ptr", this.#bf16Output(o)], ["i32", inter], ["ptr", folded.x.address], ...[0, 1].map((p): KernelArg => ["ptr", part(p)?.a.address ?? 0n]),
      ...[0, 1].map((p): KernelArg => ["ptr", part(p)?.b.address ?? 0n]), ...[0, 1].map((p): KernelArg => ["f32", part(p)?.scale ?? 0]),
      ["i32", folded.inFeatures], ["i32", folded.rank]]);
  }

  add(a: Tensor, b: Tensor, out: Tensor): void {
    const as = cuda(a), bs = cuda(b), o = cuda(out);
    o.version++;
    expectSize("add input", bs, as.size);
    expectSize("add out", o, as.size);
    this.#launch("add", [gridFor(o.size)], [256], [["ptr", as.address], ["ptr", bs.address], ["ptr", o.address], ["i64", o.size]]);
  }

  gatherRows(x: Tensor, rowIndex: Int32Array, out: Tensor): void {
    const xs = cuda(x), o = cuda(out);
    o.version++;
    const width = xs.size / xs.shape[0];
    expectSize("gatherRows out", o, rowIndex.length * width);
    checkRowIndex(rowIndex, xs.shape[0]);
    if (rowIndex.length === 0) return;
    // Rows of an operand whose bf16 copy is current (the attention's output, gathered for a prefill's scored rows
    // before o_proj) take their copy along; it becomes out's. Allocated before x's is dropped, which the launch reads.
    const source = this.#roundedForProduct(xs) ? this.#bf16Copy!.address : 0n;
    const copy = source ? this.#transient().allocate(o.size * 2) : 0n;
    this.#launch("gather_rows", [rowIndex.length], [rowThreads(width)],
      [["ptr", xs.address], ["ptr", source], ["ptr", this.#indices(rowIndex)], ["ptr", o.address], ["ptr", copy], ["i32", width]]);
    if (copy) {
      this.#dropBf16Copy();
      this.#bf16Copy = { tensor: o, version: o.version, address: copy };
    }
  }

  // ---- inference: KV cache, attention over it, sampling ----------------------------------------------------------

  createKvCache(spec: KvCacheSpec): KvCache {
    // After K and V, the attention's split counters (attention.cu: one per (tile, kv head) of a pass whose keys are
    // split, fewer than splitPairsBound), zero between launches as the kernel leaves them.
    const bytes = this.kvCacheBytes(spec), counterBytes = splitPairsBound(this.context.device.multiprocessors) * 4;
    const address = this.context.pool.allocate(bytes + counterBytes);
    this.context.zero(address, bytes + counterBytes);
    return new CudaKvCache({ ...spec }, address, this.#nextCacheId++, (cache) => {
      this.#graphs?.forgetCache(cache.id);
      this.context.pool.free(cache.address);
    });
  }

  kvCacheBytes(spec: KvCacheSpec): number {
    return kvCacheElements(spec) * 2;
  }

  attention(q: Tensor, k: Tensor, v: Tensor, kvCache: KvCache, layer: number, rows: RowPlacement, out: Tensor): void {
    const cache = cudaKvCache(kvCache);
    const { numKvHeads, headDim, maxPositions, numSlots } = cache.spec;
    const n = rows.slots.length;
    const kvWidth = numKvHeads * headDim;
    const qs = cuda(q), ks = cuda(k), vs = cuda(v), o = cuda(out);
    o.version++;
    expectSize("attention k", ks, n * kvWidth);
    expectSize("attention v", vs, n * kvWidth);
    expectSize("attention out", o, qs.size);
    const maxPosition = checkRowsInCache(cache.spec, rows);
    const numHeads = qs.size / (n * headDim);
    const group = numHeads / numKvHeads;
    if (!Number.isInteger(group) || group > attentionQueryVectors) {
      throw new ArtError("cuda_unsupported", `cuda attention: ${numHeads} query heads over ${numKvHeads} kv heads (at most ${attentionQueryVectors} per kv head)`);
    }
    const slots = this.#indices(rows.slots), positions = this.#indices(rows.positions);
    const plan = this.#attentionPlan(rows, group, headDim);
    // A decode pass leaves storing its keys to the attention kernel; any other pass stores them first, since its rows
    // read keys other rows of the pass write.
    const decode = plan.decode;
    if (!decode) {
      this.#launch("kv_write", [n], [rowThreads(kvWidth)], [["ptr", ks.address], ["ptr", vs.address], ["ptr", cache.keys(layer)],
        ["ptr", cache.values(layer)], ["ptr", slots], ["ptr", positions], ["i32", numKvHeads], ["i32", headDim], ["i32", maxPositions]]);
    }
    const outBf16 = this.#bf16Output(o); // o_proj's operand, written by whichever kernel writes the output
    if (plan.prefill.length > 0) {
      const hd = flashHeadSize(headDim)!;
      this.#launch(`attention_prefill_hd${hd}`, [plan.prefill.length / 4, numHeads], [2 * tensorCoreTileRows], [["ptr", qs.address],
        ["ptr", cache.keys(layer)], ["ptr", cache.values(layer)], ["ptr", this.#indices(plan.prefill)], ["ptr", o.address], ["ptr", outBf16],
        ["i32", numHeads], ["i32", numKvHeads], ["i32", headDim], ["i32", maxPositions]], flashForwardBytes(hd));
    }
    const tileCount = plan.tileStart.length;
    if (tileCount === 0) return;
    const keyWindow = attentionKeyWindow(maxPosition + 1, maxPositions);
    const { splits, splitLength } = planSplits(tileCount, numKvHeads, keyWindow, this.context.device.multiprocessors);
    const dpl = attentionDimsPerLane(headDim);
    // Split partials for the tiles' rows only: a mixed pass's prefill rows (thousands) have none.
    const partialRows = plan.tileRows.reduce((sum, rows) => sum + rows, 0);
    const partialO = splits > 1 ? this.#transient().allocate(splits * partialRows * numHeads * headDim * 4) : 0n;
    const partialMl = splits > 1 ? this.#transient().allocate(splits * partialRows * numHeads * 2 * 4) : 0n;
    // The tiles' device copies, shared by both launches; the offsets only matter (and go up) when keys are split.
    const tileStart = this.#indices(plan.tileStart), tileRows = this.#indices(plan.tileRows);
    const tileOffset = splits > 1 ? this.#indices(plan.tileOffset) : 0n;
    this.#launch(`attention_dpl${dpl}`, [tileCount, numKvHeads, splits], [attentionWarps * 32], [
      ["ptr", qs.address], ["ptr", cache.keys(layer)], ["ptr", cache.values(layer)], ["ptr", slots], ["ptr", positions],
      ["ptr", tileStart], ["ptr", tileRows], ["i32", numHeads], ["i32", numKvHeads],
      ["i32", headDim], ["i32", maxPositions], ["i32", splitLength], ["ptr", o.address], ["ptr", outBf16],
      ["ptr", partialO], ["ptr", partialMl], ["i32", partialRows], ["ptr", decode ? ks.address : 0n], ["ptr", decode ? vs.address : 0n],
      ["ptr", tileOffset], ["ptr", splits > 1 ? cache.splitCounters : 0n]],
    attentionSharedBytes(dpl));
    if (splits > 1) {
      this.#release(partialO);
      this.#release(partialMl);
    }
  }

  copyKvSlot(kvCache: KvCache, from: number, to: number, numPositions: number): void {
    const cache = cudaKvCache(kvCache);
    const { numLayers, numSlots, numKvHeads, maxPositions, headDim } = cache.spec;
    checkKvSlotCopy(cache.spec, from, to, numPositions);
    if (numPositions === 0) return;
    // One launch for every layer's K and V (a cuMemcpy3D could do the same strided copy, but would need its own
    // driver binding and would not run on the kernel emulator the tests use).
    this.#launch("kv_copy_slot", [gridFor(2 * numLayers * numKvHeads * numPositions * headDim)], [256], [["ptr", cache.address],
      ["i32", 2 * numLayers], ["i32", numSlots], ["i32", numKvHeads], ["i32", maxPositions], ["i32", headDim], ["i32", from],
      ["i32", to], ["i32", numPositions]]);
  }

  logSoftmax(logits: Tensor, out: Tensor): void {
    const l = cuda(logits), o = cuda(out);
    o.version++;
    expectSize("logSoftmax out", o, l.size);
    const width = l.size / l.shape[0];
    this.#launch("log_softmax", [l.shape[0]], [rowThreads(width, 1024)], [["ptr", l.address], ["ptr", o.address], ["i32", width]]);
  }

  sample(logits: Tensor, params: SamplingParams): SampleResult {
    return this.startSample(logits, params)();
  }

  /** Queues the sampling kernel; the function returned waits for it and reads the results (Backend.startSample). */
  startSample(logits: Tensor, params: SamplingParams): () => SampleResult {
    const l = cuda(logits);
    expectF32("sample logits", l);
    const rows = l.shape[0], vocab = l.size / rows, top = params.numTopLogprobs;
    checkSamplingParams("cuda backend", params, rows, vocab);
    // Inputs in one upload, outputs in one download:
    // [temperature | topP | topK | uniforms | allowedTokens?], [ids | logprobs | topIds | topLogprobs].
    const mask = params.allowedTokens;
    const inputs = new ArrayBuffer(rows * 16 + (mask ? mask.byteLength : 0));
    new Float32Array(inputs, 0, rows).set(params.temperature);
    new Float32Array(inputs, rows * 4, rows).set(params.topP);
    new Int32Array(inputs, rows * 8, rows).set(params.topK);
    new Float32Array(inputs, rows * 12, rows).set(params.uniforms);
    if (mask) new Uint32Array(inputs, rows * 16, mask.length).set(mask);
    const input = this.context.pool.allocate(inputs.byteLength);
    const outputBytes = rows * 8 + rows * top * 8;
    const output = this.context.pool.allocate(outputBytes);
    const release = () => {
      this.context.pool.free(input);
      this.context.pool.free(output);
    };
    try {
      this.context.upload(input, new Uint8Array(inputs));
      const at = (base: bigint, offset: number): KernelArg => ["ptr", base + BigInt(offset)];
      // Without alternatives their outputs are empty: null, not pointers past the end of the block.
      const none: KernelArg = ["ptr", 0n];
      this.#launch("sample", [rows], [rowThreads(vocab, 1024)], [["ptr", l.address], ["i32", vocab], at(input, 0), at(input, rows * 4),
        at(input, rows * 8), at(input, rows * 12), mask ? at(input, rows * 16) : none, ["i32", top], at(output, 0),
        at(output, rows * 4), top > 0 ? at(output, rows * 8) : none, top > 0 ? at(output, rows * 8 + rows * top * 4) : none]);
    } catch (error) {
      release();
      throw error;
    }
    return () => {
      try {
        const host = new ArrayBuffer(outputBytes);
        this.context.download(output, new Uint8Array(host));
        return checkSampled("cuda backend", {
          ids: new Int32Array(host, 0, rows),
          logprobs: new Float32Array(host, rows * 4, rows),
          topIds: new Int32Array(host, rows * 8, rows * top),
          topLogprobs: new Float32Array(host, rows * 8 + rows * top * 4, rows * top),
        });
      } finally {
        release();
      }
    };
  }

  // ---- training: packed attention, backward ops, target logprobs, optimiser -----------------------------------

  /** Saves the log-sum-exp of every (row, head): [rows, heads]. */
  packedAttention(q: Tensor, k: Tensor, v: Tensor, segments: readonly PackedSegment[], headDim: number, out: Tensor): Tensor {
    const o = f32("attention out", out), qs = cuda(q), ks = cuda(k), vs = cuda(v);
    const { rows, heads, kvHeads } = packedShape(qs, ks, headDim);
    expectSize("attention v", vs, ks.size);
    expectSize("attention out", o, qs.size);
    const { forwardKernel, forwardBytes } = packedAttentionKernels(headDim, this.context.device.sharedBytesPerBlock);
    o.version++;
    // Segments that cover every row (a training batch's do) get every row of lse written, and o_proj's bf16 operand
    // too, beside out; otherwise rows outside them keep zeros (lse here, out the caller's) and there is no copy.
    const covered = segmentsCoverRows(segments, rows);
    const lse = cuda(covered ? this.empty([rows, heads]) : this.zeros([rows, heads]));
    const tiles = packedQueryTiles(segments);
    if (tiles.length === 0) return lse;
    this.#withAttentionInputs([qs, ks, vs], ([qb, kb, vb]) => this.#withIndices(tiles, (index) =>
      this.#launch(forwardKernel, [tiles.length / 5, heads], [2 * tensorCoreTileRows],
        [["ptr", qb], ["ptr", kb], ["ptr", vb], ["ptr", index], ["ptr", o.address],
          ["ptr", covered ? this.#bf16Output(o) : 0n], ["ptr", lse.address], ["i32", heads], ["i32", kvHeads], ["i32", headDim]], forwardBytes)));
    return lse;
  }

  /**
   * Tensors as the packed attention kernels' tiles read them, bf16: as they are, or f32 ones narrowed into scratch (the
   * rounding the tiles' loads applied to f32 values before, so the same bits either way) for the duration of `use`.
   */
  #withAttentionInputs(tensors: readonly CudaTensor[], use: (addresses: bigint[]) => void): void {
    const scratch: bigint[] = [];
    try {
      use(tensors.map((t) => {
        if (t.dtype === "bf16") return t.address;
        scratch.push(this.#narrow(t.address, t.size));
        return scratch.at(-1)!;
      }));
    } finally {
      for (const address of scratch) this.#release(address);
    }
  }

  packedAttentionBackward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, saved: Tensor, segments: readonly PackedSegment[], headDim: number,
    dOut: Tensor, dq: Tensor, dk: Tensor, dv: Tensor, overwrite = false): void {
    const qs = cuda(q), ks = cuda(k), vs = cuda(v), o = f32("attention out", out);
    const lse = f32("attention log-sum-exp", saved);
    const g = f32("attention output gradient", dOut), dqs = f32("attention dq", dq), dks = f32("attention dk", dk), dvs = f32("attention dv", dv);
    const { rows, heads, kvHeads } = packedShape(qs, ks, headDim);
    for (const [name, tensor, size] of [["out", o, qs.size], ["output gradient", g, qs.size], ["dq", dqs, qs.size], ["dk", dks, ks.size],
      ["dv", dvs, ks.size], ["log-sum-exp", lse, rows * heads]] as const) expectSize(`attention ${name}`, tensor, size);
    const { dqKernel, dqBytes, dkdvKernel, dkdvBytes } = packedAttentionKernels(headDim, this.context.device.sharedBytesPerBlock);
    const queryTiles = packedQueryTiles(segments);
    const covered = segmentsCoverRows(segments, rows);
    // Overwritten gradients: the dq pass writes only the segments' rows, so the others are zeroed first; the group sum
    // writes every row of dk and dv.
    if (queryTiles.length === 0) {
      if (overwrite) this.zero([dqs, dks, dvs]);
      return;
    }
    if (overwrite && !covered) this.zero([dqs]);
    dqs.version++;
    dks.version++;
    dvs.version++;
    // Δ = Σ dOut·out per (row, head), written by the dq pass for the dk/dv pass; each query head's share of dk and dv,
    // summed over each kv head's group at the end. The passes write every row of them when the segments cover every
    // row; otherwise the rows outside them are zeros.
    const scratch: CudaTensor[] = [];
    const allocate = (shape: number[]) => {
      scratch.push(cuda(covered ? this.empty(shape) : this.zeros(shape)));
      return scratch.at(-1)!;
    };
    try {
      const delta = allocate([rows, heads]);
      const dkHeads = allocate([rows, heads * headDim]), dvHeads = allocate([rows, heads * headDim]);
      // dOut's tiles too come narrowed once (Δ reads it as it is).
      this.#withAttentionInputs([qs, ks, vs, g], ([qb, kb, vb, gb]) => {
        this.#withIndices(queryTiles, (index) => this.#launch(dqKernel, [queryTiles.length / 5, heads],
          [2 * tensorCoreTileRows], [["ptr", qb], ["ptr", kb], ["ptr", vb], ["ptr", o.address], ["ptr", g.address], ["ptr", gb],
            ["ptr", lse.address], ["ptr", index], ["ptr", dqs.address], ["ptr", delta.address], ["i32", heads], ["i32", kvHeads], ["i32", headDim],
            ["i32", overwrite && covered ? 1 : 0]], dqBytes));
        const keyTiles = packedKeyTiles(segments);
        this.#withIndices(keyTiles.tiles, (tileIndex) => this.#withIndices(keyTiles.ranges, (rangeIndex) =>
          this.#launch(dkdvKernel, [keyTiles.tiles.length / 4, heads], [2 * tensorCoreTileRows],
            [["ptr", qb], ["ptr", kb], ["ptr", vb], ["ptr", gb], ["ptr", lse.address], ["ptr", delta.address],
              ["ptr", tileIndex], ["ptr", rangeIndex], ["ptr", dkHeads.address], ["ptr", dvHeads.address], ["i32", heads], ["i32", kvHeads],
              ["i32", headDim]], dkdvBytes)));
      });
      this.#launch("packed_attention_group_sum", [gridFor(dks.size)], [256], [["ptr", dkHeads.address], ["ptr", dvHeads.address],
        ["ptr", dks.address], ["ptr", dvs.address], ["i64", dks.size], ["i32", heads / kvHeads], ["i32", headDim], ["i32", overwrite ? 1 : 0]]);
    } finally {
      for (const tensor of scratch) this.free(tensor);
    }
  }

  /** table[ids[i]] += dOut[i], each token's rows summed by one block (embeddingPlan), so no atomics. */
  embeddingBackward(ids: Int32Array, dOut: Tensor, dTable: Tensor): void {
    const t = f32("embedding gradient", dTable), g = f32("embedding output gradient", dOut);
    const [vocab, d] = t.shape;
    expectSize("embedding output gradient", g, ids.length * d);
    checkTokenIds(ids, vocab);
    t.version++;
    if (ids.length === 0) return;
    const { plan, tokens } = embeddingPlan(ids);
    this.#withIndices(plan, (address) => this.#launch("embedding_backward", [tokens], [rowThreads(d)],
      [["ptr", address], ["ptr", g.address], ["ptr", t.address], ["i32", tokens], ["i32", d]]));
  }

  rmsNormBackward(x: Tensor, weight: Tensor, rstd: Tensor, dOut: Tensor, dx: Tensor, dWeight: Tensor | null): void {
    const xs = f32("rmsnorm input", x), w = cuda(weight), s = f32("rmsnorm rstd", rstd), g = f32("rmsnorm output gradient", dOut);
    const d = f32("rmsnorm input gradient", dx);
    expectSize("rmsnorm rstd", s, xs.size / w.size);
    if (dWeight !== null) {
      // dW += Σ over rows of dOut · x̂ (x̂ = x · rstd)
      const dw = f32("rmsnorm weight gradient", dWeight);
      expectSize("rmsnorm weight gradient", dw, w.size);
      dw.version++;
      this.#columnSums(g, { x: xs, rowScale: s }, dw);
    }
    d.version++;
    // Its bf16 copy too (once a bf16 matrix is loaded): the residual stream's gradient is the output gradient of the
    // next projection backward, o's or the layer below's down (projectionsBackward reads the cached copy).
    this.#launch(w.dtype === "bf16" ? "rmsnorm_backward_bf16" : "rmsnorm_backward_f32", [xs.size / w.size], [rowThreads(w.size)],
      [["ptr", xs.address], ["ptr", w.address], ["ptr", s.address], ["ptr", g.address], ["ptr", d.address], ["ptr", this.#bf16Output(d)], ["i32", w.size]]);
  }

  /**
   * dx (=|+=) Σ dOut · W over the projections (a bf16 weight takes dOut narrowed to bf16; bf16 weights that are rows
   * of one stacked weight, q/k/v's or gate/up's, take their dOut side by side in one bf16 buffer, merge_columns_bf16,
   * and one GEMM with the stacked weight), then their LoRAs: dB +=
   * scale · dOutᵀ (x Aᵀ) and the [n, rank] scale · dOut B per LoRA; a stacked group (`stackable`: q/k/v, gate/up
   * as DifferentiableTransformer lays them out) then takes dA += (dOut B)ᵀ x and dx += (dOut B) A as one GEMM each
   * over its stacked A, a lone LoRA as a GEMM of its own. Beside bf16 weights, the two products that read dOut read
   * the bf16 copy the input gradient's product read (with x Aᵀ and B rounded to bf16 for them), as PEFT's bf16
   * autocast does: dOut is the largest operand of a LoRA's backward, the widest projections' [n, out] in f32 read
   * twice, and its bf16 copy is half the bytes. Full-parameter training's dW += dOutᵀ x is a GEMM (f32) and
   * dBias += Σ dOut a column sum, per projection.
   */
  projectionsBackward(x: Tensor, projections: readonly ProjectionGradient[], dx: Tensor | null, overwriteDx = false): void {
    const xs = f32("projections' input", x);
    if (projections.length === 0) throw new ArtError("wrong_shape", "cuda backend: projectionsBackward needs at least one projection");
    const shapes = projections.map((projection) => projectionGradientShape("cuda backend", xs, dx, projection));
    const d = dx === null ? null : f32("projections' input gradient", dx);
    const gradients = projections.map(({ dOut }) => f32("projection output gradient", dOut));
    projections.forEach(({ dWeight, dBias }, i) => {
      const { n, inFeatures, outFeatures } = shapes[i];
      if (dWeight !== null) {
        const dw = f32("projection weight gradient", dWeight);
        expectSize("projection weight gradient", dw, outFeatures * inFeatures);
        dw.version++;
        this.blas.gemm(gradients[i].address, xs.address, dw.address, outFeatures, inFeatures, n, true, false, "f32", 1, 1);
      }
      if (dBias !== null) {
        const db = f32("projection bias gradient", dBias);
        expectSize("projection bias gradient", db, outFeatures);
        db.version++;
        this.#columnSums(gradients[i], null, db);
      }
    });
    const loras = projections.flatMap(({ lora }, i) => {
      if (!lora) return [];
      const { weights, down, dA, dB } = lora;
      const { n, inFeatures, outFeatures, rank, downWidth } = shapes[i];
      const kept = { tensor: f32("LoRA x·Aᵀ", down.tensor), column: down.column, width: downWidth };
      return [{ a: f32("LoRA A", weights.a), b: f32("LoRA B", weights.b), dA: f32("LoRA A gradient", dA), dB: f32("LoRA B gradient", dB), kept,
        rank, n, inFeatures, outFeatures, scale: weights.scale, g: gradients[i], projection: i }];
    });
    if (d) d.version++;
    for (const l of loras) {
      l.dA.version++;
      l.dB.version++;
    }
    const weights = projections.map(({ weight }) => cuda(weight));
    // dOut's bf16 copies, by projection (address and row stride), kept for the LoRAs' products; released at the end.
    const narrowed: ({ address: bigint; ld: number } | null)[] = projections.map(() => null);
    const owned: bigint[] = [];
    if (d && weights.length > 1 && weights.length <= 3 && weights.every((w) => w.dtype === "bf16") && adjacent(weights)) {
      const rows = shapes[0].n, widths = shapes.map((s) => s.outFeatures), stackedWidth = widths.reduce((sum, w) => sum + w, 0);
      // gate/up's as swigluBackward wrote them, else merged here.
      let merged = this.#takeMergedGradients(gradients);
      if (merged === null) {
        merged = this.#transient().allocate(Math.max(1, rows * stackedWidth) * 2);
        this.#launch("merge_columns_bf16", [gridFor(rows * stackedWidth)], [256], [
          ...[0, 1, 2].map((j): KernelArg => ["ptr", gradients[j]?.address ?? 0n]), ["ptr", merged],
          ...[0, 1, 2].map((j): KernelArg => ["i32", widths[j] ?? 0]), ["i64", rows]]);
      }
      this.blas.gemm(merged, weights[0].address, d.address, rows, shapes[0].inFeatures, stackedWidth, false, false, "bf16", 1, overwriteDx ? 0 : 1);
      owned.push(merged);
      let column = 0;
      widths.forEach((width, i) => {
        narrowed[i] = { address: merged + BigInt(column * 2), ld: stackedWidth };
        column += width;
      });
    } else if (d) {
      projections.forEach((_, i) => {
        const { n, inFeatures, outFeatures } = shapes[i], w = weights[i];
        // A bf16 weight's operand is dOut's cached bf16 copy (rmsNormBackward writes the residual stream's), else narrowed now.
        this.blas.gemm(this.#operand(gradients[i], w.dtype), w.address, d.address, n, inFeatures, outFeatures, false, false, w.dtype, 1,
          overwriteDx && i === 0 ? 0 : 1);
        // That copy, for the projection's LoRA (the next projection's product would replace it in the cache).
        if (w.dtype === "bf16" && projections[i].lora) {
          narrowed[i] = { address: this.#takeBf16Operand(gradients[i]), ld: outFeatures };
          owned.push(narrowed[i]!.address);
        }
      });
    }
    if (loras.length === 0) {
      for (const address of owned) this.#release(address);
      return;
    }
    const rows = loras[0].n, inFeatures = loras[0].inFeatures;
    const grouped = stackable(loras);
    const type = loraProducts(weights.some((w) => w.dtype === "bf16"));
    const stackedRank = loras.reduce((sum, l) => sum + l.rank, 0);
    // The dOut products' operands: bf16 copies beside bf16 weights (dOut's as above, else narrowed now; each kept
    // x Aᵀ tensor narrowed once, each B), else the f32 tensors themselves.
    const dOutOperands = type === "tf32" ? this.#bf16LoraOperands(loras, narrowed, owned)
      : loras.map((l) => ({ g: l.g.address, ldg: l.outFeatures, kept: keptAddress(l.kept), b: l.b.address, type }));
    // scale · dOut B of every LoRA, side by side in one [rows, Σ rank] buffer when stacked.
    const dDown = this.context.pool.allocate(Math.max(1, rows * (grouped ? stackedRank : Math.max(...loras.map((l) => l.rank)))) * 4);
    try {
      let column = 0;
      for (const [j, l] of loras.entries()) {
        const o = dOutOperands[j];
        this.blas.gemm(o.g, o.kept, l.dB.address, l.outFeatures, l.rank, rows, true, false, o.type, l.scale, 1, { a: o.ldg, b: l.kept.width });
        const at = grouped ? dDown + BigInt(column * 4) : dDown, width = grouped ? stackedRank : l.rank;
        this.blas.gemm(o.g, o.b, at, rows, l.rank, l.outFeatures, false, false, o.type, l.scale, 0, { a: o.ldg, c: width });
        column += l.rank;
        if (grouped) continue;
        this.blas.gemm(dDown, xs.address, l.dA.address, l.rank, inFeatures, rows, true, false, type, 1, 1);
        if (d) this.blas.gemm(dDown, l.a.address, d.address, rows, inFeatures, l.rank, false, false, type, 1, 1);
      }
      if (grouped) {
        this.blas.gemm(dDown, xs.address, loras[0].dA.address, stackedRank, inFeatures, rows, true, false, type, 1, 1);
        if (d) this.blas.gemm(dDown, loras[0].a.address, d.address, rows, inFeatures, stackedRank, false, false, type, 1, 1);
      }
    } finally {
      this.context.pool.free(dDown);
      for (const address of owned) this.#release(address);
    }
  }

  /**
   * projectionsBackward's bf16 operands of a LoRA's products with dOut: dOut's copy where the input gradient's product
   * left one (`narrowed`, by projection), and the kept x Aᵀ (each tensor once), B and any other dOut narrowed now, in as
   * few launches as #narrowAll takes. Every new copy goes to `owned` for the caller to release.
   */
  #bf16LoraOperands(loras: readonly { g: CudaTensor; b: CudaTensor; kept: KeptDown; outFeatures: number; projection: number }[],
    narrowed: readonly ({ address: bigint; ld: number } | null)[], owned: bigint[]) {
    const keptTensors = [...new Set(loras.map((l) => l.kept.tensor))];
    const missing = loras.filter((l) => narrowed[l.projection] === null);
    const sources = [...keptTensors, ...loras.map((l) => l.b), ...missing.map((l) => l.g)];
    const copies = this.#narrowAll(sources.map((t) => ({ source: t.address, count: t.size })));
    owned.push(...copies);
    const copyOf = (t: CudaTensor, from: number) => copies[sources.indexOf(t, from)];
    return loras.map((l) => {
      const g = narrowed[l.projection] ?? { address: copyOf(l.g, keptTensors.length + loras.length), ld: l.outFeatures };
      return { g: g.address, ldg: g.ld, kept: copyOf(l.kept.tensor, 0) + BigInt(l.kept.column * 2), b: copyOf(l.b, keptTensors.length), type: "bf16" as const };
    });
  }

  ropeBackward(dq: Tensor, dk: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number): void {
    this.#rotate(dq, dk, positions, invFreq, headDim, -1);
  }

  swigluBackward(gateUp: Tensor, dOut: Tensor, dGate: Tensor, dUp: Tensor, overwrite = false, loras: InputLoras | null = null): void {
    const g = f32("swiglu gate/up", gateUp), d = f32("swiglu output gradient", dOut);
    const dg = f32("swiglu gate gradient", dGate), du = f32("swiglu up gradient", dUp);
    const { inter } = swigluShape("cuda backend", g, d);
    expectSize("swiglu gate gradient", dg, d.size);
    expectSize("swiglu up gradient", du, d.size);
    dg.version++;
    du.version++;
    // Beside bf16 weights, the gradients' bf16 operand for gate/up's stacked product too (projectionsBackward).
    this.#dropMergedGradients();
    const merged = this.#bf16Matrices ? this.#transient().allocate(Math.max(1, 2 * d.size) * 2) : 0n;
    if (merged) this.#mergedGradients = { parts: [dg, du], versions: [dg.version, du.version], address: merged };
    // The forward's kept LoRAs, which it left out of gateUp (the same rule picks them), added again on the way in.
    const kept = loras ? this.#keptGateUpLoras(loras, g, inter) : null;
    if (kept) {
      this.#launch("swiglu_backward_kept_lora", kept.grid, [keptColumns], [["ptr", g.address], ["ptr", d.address], ["ptr", dg.address],
        ["ptr", du.address], ["ptr", merged], ["i32", inter], ["i32", kept.rows], ["i32", overwrite ? 0 : 1], ...kept.args]);
      return;
    }
    this.#launch("swiglu_backward", [gridFor(d.size)], [256], [["ptr", g.address], ["ptr", d.address], ["ptr", dg.address], ["ptr", du.address],
      ["ptr", merged], ["i32", inter], ["i32", overwrite ? 0 : 1], ["i64", d.size]]);
  }

  /** The merged bf16 gradients of `parts` as swigluBackward left them (the caller releases them), or null. */
  #takeMergedGradients(parts: readonly CudaTensor[]): bigint | null {
    const cached = this.#mergedGradients;
    if (!cached || cached.parts.length !== parts.length || !parts.every((p, i) => p === cached.parts[i] && p.version === cached.versions[i])) return null;
    this.#mergedGradients = null;
    return cached.address;
  }

  #dropMergedGradients(): void {
    if (this.#mergedGradients) this.#release(this.#mergedGradients.address);
    this.#mergedGradients = null;
  }

  gatherRowsBackward(rowIndex: Int32Array, dOut: Tensor, dx: Tensor): void {
    const g = f32("gathered rows' gradient", dOut), d = f32("gathered input gradient", dx);
    const width = d.size / d.shape[0];
    expectSize("gathered rows' gradient", g, rowIndex.length * width);
    checkRowIndex(rowIndex, d.shape[0]);
    d.version++;
    if (rowIndex.length === 0) return;
    this.#withIndices(rowIndex, (index) => this.#launch("gather_rows_backward", [rowIndex.length], [rowThreads(width)],
      [["ptr", index], ["ptr", g.address], ["ptr", d.address], ["i32", width]]));
  }

  /**
   * Row chunk by vocabulary chunk: a cuBLAS logits block, folded into each row's online log-sum-exp state on the
   * device; the host finishes the few numbers per row in float64 as the CPU does.
   */
  targetLogprobs(hidden: Tensor, head: Tensor, targets: Int32Array, chunks: ChunkSizes): TokenLogprobs {
    const rows = targets.length;
    const logprobs = new Float32Array(rows), entropies = new Float32Array(rows), logsumexp = new Float32Array(rows);
    if (rows === 0) return { logprobs, entropies, logsumexp };
    const h = f32("final hidden states", hidden), w = cuda(head);
    const initial = new Float32Array(rows * 4);
    for (let r = 0; r < rows; r++) initial.set([-Infinity, 0, 0, NaN], r * 4);
    const state = cuda(this.upload(initial, [rows, 4]));
    try {
      this.#forEachLogitBlock(h, w, targets, chunks, (block, _headRows, targetIndex, r0, rc, v0, vc) => {
        this.#launch("logprob_block_stats", [rc], [rowThreads(vc, 1024)], [["ptr", block], ["i32", vc], ["i32", v0],
          ["ptr", targetIndex + BigInt(r0 * 4)], ["ptr", state.address + BigInt(r0 * 16)]]);
      });
      const [max, sum, sumZ, target] = [0, 1, 2, 3];
      const s = this.download(state);
      for (let r = 0; r < rows; r++) {
        const lse = s[r * 4 + max] + Math.log(s[r * 4 + sum]);
        logsumexp[r] = lse;
        entropies[r] = lse - s[r * 4 + sumZ] / s[r * 4 + sum];
        logprobs[r] = targets[r] >= 0 ? s[r * 4 + target] - lse : NaN;
      }
    } finally {
      this.free(state);
    }
    return { logprobs, entropies, logsumexp };
  }

  /**
   * dz = g · (onehot − softmax) per block, then dHidden += dz · head and (full-parameter training) dHead += dzᵀ · hidden.
   * Beside a bf16 head without dHead, dz goes straight to bf16, the operand of the head's product.
   */
  targetLogprobsBackward(hidden: Tensor, head: Tensor, targets: Int32Array, logsumexp: Float32Array, dLogprobs: Float32Array,
    dHidden: Tensor, dHead: Tensor | null, chunks: ChunkSizes): void {
    const rows = targets.length;
    if (rows === 0) return;
    const d = f32("final hidden gradient", dHidden), h = f32("final hidden states", hidden), w = cuda(head);
    const dh = dHead === null ? null : f32("LM head gradient", dHead);
    if (dh) {
      expectSize("LM head gradient", dh, w.size);
      dh.version++;
    }
    const dim = h.size / rows;
    d.version++;
    const perRow = cuda(this.upload(Float32Array.from([...logsumexp, ...dLogprobs]), [2, rows]));
    const lse = perRow.address, grad = lse + BigInt(rows * 4);
    const dzBf16 = w.dtype === "bf16" && !dh ? this.context.pool.allocate(Math.min(chunks.rowChunk, rows) * Math.min(chunks.vocabChunk, w.shape[0]) * 2) : 0n;
    try {
      this.#forEachLogitBlock(h, w, targets, chunks, (block, headRows, targetIndex, r0, rc, v0, vc) => {
        this.#launch("logprob_block_grad", [rc], [rowThreads(vc)], [["ptr", block], ["ptr", dzBf16], ["i32", vc], ["i32", v0],
          ["ptr", targetIndex + BigInt(r0 * 4)], ["ptr", lse + BigInt(r0 * 4)], ["ptr", grad + BigInt(r0 * 4)]]);
        // dHidden[r0 .. r0+rc] += dz [rc, vc] · head[v0 .. v0+vc] [vc, dim]
        const dRows = new CudaTensor([rc, dim], "f32", d.address + BigInt(r0 * dim * 4));
        if (dzBf16) this.blas.gemm(dzBf16, headRows.address, dRows.address, rc, dim, vc, false, false, "bf16", 1, 1);
        else this.#product(new CudaTensor([rc, vc], "f32", block), headRows, dRows, rc, dim, vc, false, false, 1, 1);
        // dHead[v0 .. v0+vc] += dzᵀ [vc, rc] · hidden[r0 .. r0+rc] [rc, dim]
        if (dh) this.blas.gemm(block, h.address + BigInt(r0 * dim * 4), dh.address + BigInt(v0 * dim * 4), vc, dim, rc, true, false, "f32", 1, 1);
      });
    } finally {
      this.free(perRow);
      if (dzBf16) this.context.pool.free(dzBf16);
    }
  }

  sumOfSquares(tensors: readonly Tensor[]): number {
    if (tensors.length === 0) return 0;
    const ts = tensors.map((tensor) => f32("gradient", tensor));
    const pool = this.context.pool;
    const partials = pool.allocate(ts.length * sumSquaresBlocks * 4);
    try {
      this.#launchOverTensors("sum_squares", ts.map((t) => [t.address]), ts.map((t) => t.size), [["ptr", partials]], sumSquaresBlocks);
      const host = new Float32Array(ts.length * sumSquaresBlocks);
      this.context.download(partials, host);
      let sum = 0;
      for (const partial of host) sum += partial;
      return sum;
    } finally {
      pool.free(partials);
    }
  }

  adamw(params: readonly AdamWTensors[], scalars: AdamWScalars): void {
    const { clip, learningRate, beta1, beta2, eps, weightDecay, correction1, correction2 } = scalars;
    const rows = params.map(({ value, grad, m, v }) => {
      const p = f32("parameter", value), g = f32("gradient", grad), ms = f32("first moment", m), vs = f32("second moment", v);
      for (const [name, t] of [["gradient", g], ["first moment", ms], ["second moment", vs]] as const) expectSize(name, t, p.size);
      p.version++;
      ms.version++;
      vs.version++;
      return { addresses: [p.address, g.address, ms.address, vs.address], size: p.size };
    });
    this.#launchOverTensors("adamw_update", rows.map((r) => r.addresses), rows.map((r) => r.size), [["f32", clip], ["f32", learningRate],
      ["f32", beta1], ["f32", beta2], ["f32", eps], ["f32", weightDecay], ["f32", correction1], ["f32", correction2]], 64);
  }

  /**
   * One launch of an adamw.cu kernel over many tensors: a table of each tensor's addresses, then every tensor's
   * element count, uploaded for the launch; grid (blocks along each tensor, tensors). `blocks` is the most blocks a
   * tensor gets (sum_squares: exactly its partials' count per tensor).
   */
  #launchOverTensors(kernel: "zero_tensors" | "sum_squares" | "adamw_update", addresses: bigint[][], sizes: number[], rest: KernelArg[],
    blocks: number): void {
    const count = sizes.length;
    if (count === 0) return;
    if (count > MAX_GRID_Y) throw new ArtError("too_many_tensors", `cuda backend: ${kernel} over ${count} tensors; a launch takes at most 65,535 (the grid's y)`);
    const fields = addresses[0]!.length;
    const table = new BigUint64Array(count * (fields + 1));
    for (let t = 0; t < count; t++) {
      addresses[t]!.forEach((address, f) => (table[t * fields + f] = address));
      table[count * fields + t] = BigInt(sizes[t]!);
    }
    const grid = kernel === "sum_squares" ? blocks : Math.min(blocks, gridFor(Math.max(...sizes)));
    const address = this.context.pool.allocate(table.byteLength);
    try {
      this.context.upload(address, table);
      this.#launch(kernel, [grid, count], [256], [["ptr", address], ["i32", count], ...rest]);
    } finally {
      this.context.pool.free(address); // stream-ordered: reused only by later work
    }
  }

  /** Waits for every queued op. */
  synchronize(): void {
    this.context.synchronize();
  }

  /** cuBLAS goes first (its destroy waits for the device), then the context, which runs even if cuBLAS fails. */
  dispose(): void {
    this.#dropBf16Copy();
    this.#dropMergedGradients();
    for (const entry of this.#indexCache) this.context.pool.free(entry.address);
    this.#indexCache = [];
    this.#graphs?.dispose();
    try {
      this.blas.dispose();
    } finally {
      this.context.dispose();
    }
  }

  // ---- helpers --------------------------------------------------------------------------------------------------

  #launch(name: KernelName, grid: [number, number?, number?], block: [number], args: readonly KernelArg[], sharedBytes = 0): void {
    checkKernelArgs(name, args);
    this.context.launch(this.#kernels[name], { grid, block, sharedBytes }, args);
  }

  /**
   * Where the op about to write `out` (its version already bumped) also writes out's bf16 copy, which becomes the
   * cached GEMM operand of that version of out; 0n (none) until a bf16 matrix has been uploaded, since only bf16
   * GEMMs read such copies. Norms, attention and SwiGLU produce the inputs of every projection this way, so no
   * conversion kernel runs between them and their GEMMs.
   */
  #bf16Output(out: CudaTensor): bigint {
    if (!this.#bf16Matrices) return 0n;
    this.#dropBf16Copy();
    const address = this.#transient().allocate(out.size * 2);
    this.#bf16Copy = { tensor: out, version: out.version, address };
    return address;
  }

  /** A GEMM's activation operand for a matrix of `type`: x itself (f32), or its bf16 copy. */
  #operand(x: CudaTensor, type: DType): bigint {
    return type === "f32" ? x.address : this.#bf16Operand(x);
  }

  /** The bf16 copy of activation `x`, made once per version of x and kept until x changes or another is needed. */
  #bf16Operand(x: CudaTensor): bigint {
    const cached = this.#bf16Copy;
    if (cached && cached.tensor === x && cached.version === x.version) return cached.address;
    this.#dropBf16Copy();
    const address = this.#narrow(x.address, x.size);
    this.#bf16Copy = { tensor: x, version: x.version, address };
    return address;
  }

  #dropBf16Copy(): void {
    if (this.#bf16Copy) this.#release(this.#bf16Copy.address);
    this.#bf16Copy = null;
  }

  /**
   * A bf16 copy of `x` for the caller to keep and release: x's cached copy where current (taken out of the cache, so
   * nothing else frees it meanwhile), else a new one.
   */
  #takeBf16Operand(x: CudaTensor): bigint {
    if (!this.#roundedForProduct(x)) return this.#narrow(x.address, x.size);
    const address = this.#bf16Copy!.address;
    this.#bf16Copy = null;
    return address;
  }

  /** Whether `x`'s current bf16 copy exists: a bf16 weight's product has just read x rounded to bf16. */
  #roundedForProduct(x: CudaTensor): boolean {
    const copy = this.#bf16Copy;
    return copy !== null && copy.tensor === x && copy.version === x.version;
  }

  /** A bf16 copy of `count` f32 values (the caller frees it). */
  #narrow(source: bigint, count: number): bigint {
    return this.#narrowAll([{ source, count }])[0];
  }

  /** bf16 copies of several runs of f32 values, four to a launch (the caller frees them). */
  #narrowAll(parts: readonly { source: bigint; count: number }[]): bigint[] {
    const copies = parts.map(({ count }) => this.#transient().allocate(Math.max(1, count) * 2));
    this.#narrowInto(parts, copies);
    return copies;
  }

  /** f32_to_bf16 of each part into its destination, four parts to a launch. */
  #narrowInto(parts: readonly { source: bigint; count: number }[], destinations: readonly bigint[]): void {
    for (let first = 0; first < parts.length; first += narrowParts) {
      const args = Array.from({ length: narrowParts }, (_, j): KernelArg[] => {
        const part = parts[first + j];
        return part ? [["ptr", part.source], ["ptr", destinations[first + j]], ["i64", part.count]] : [["ptr", 0n], ["ptr", 0n], ["i64", 0]];
      }).flat();
      const total = parts.slice(first, first + narrowParts).reduce((sum, { count }) => sum + count, 0);
      if (total > 0) this.#launch("f32_to_bf16", [gridFor(total)], [256], args);
    }
  }

  /** In-place RoPE of q and k by sign · the angles (sign −1 is the backward), one launch for both. */
  #rotate(q: Tensor, k: Tensor, positions: Int32Array, invFreq: Tensor, headDim: number, sign: 1 | -1): void {
    const qs = f32("rope q", q), ks = f32("rope k", k), f = cuda(invFreq);
    expectSize("rope inverse frequencies", f, headDim / 2);
    expectMultiple("rope q", qs, positions.length * headDim);
    expectMultiple("rope k", ks, positions.length * headDim);
    qs.version++;
    ks.version++;
    const qHeads = qs.size / (positions.length * headDim), kHeads = ks.size / (positions.length * headDim);
    this.#launch(f.dtype === "bf16" ? "rope_bf16" : "rope_f32", [positions.length], [rowThreads(((qHeads + kHeads) * headDim) / 2, 128)],
      [["ptr", qs.address], ["ptr", ks.address], ["ptr", this.#indices(positions)], ["ptr", f.address], ["i32", qHeads], ["i32", kHeads],
        ["i32", headDim], ["f32", sign]]);
  }

  /** The address of a norm's rstd output (written by the launch about to be queued), or 0n for none. */
  #rstd(rstd: Tensor | null, groups: number): bigint {
    if (!rstd) return 0n;
    const t = f32("rmsnorm rstd", rstd);
    expectSize("rmsnorm rstd", t, groups);
    t.version++;
    return t.address;
  }

  /** c = op(a) · op(b) with b a weight-like operand: a bf16 b takes a narrowed to bf16. */
  #product(a: CudaTensor, b: CudaTensor, c: CudaTensor, m: number, n: number, k: number, transA: boolean, transB: boolean,
    alpha: number, beta: number): void {
    if (b.dtype === "f32") {
      this.blas.gemm(a.address, b.address, c.address, m, n, k, transA, transB, "f32", alpha, beta);
      return;
    }
    const narrow = this.#narrow(a.address, a.size);
    try {
      this.blas.gemm(narrow, b.address, c.address, m, n, k, transA, transB, "bf16", alpha, beta);
    } finally {
      this.#release(narrow);
    }
  }

  /**
   * The chunk loop both logprob passes share: for each row chunk × vocabulary chunk, the logits block [rc, vc] =
   * hidden[r0 .. r0+rc] · head[v0 .. v0+vc]ᵀ in one reused device buffer, handed to `visit` with those head rows and
   * the targets on the device.
   */
  #forEachLogitBlock(h: CudaTensor, w: CudaTensor, targets: Int32Array, chunks: ChunkSizes,
    visit: (block: bigint, headRows: CudaTensor, targetIndex: bigint, r0: number, rc: number, v0: number, vc: number) => void): void {
    const rows = targets.length;
    const [vocab, dim] = w.shape;
    const pool = this.context.pool;
    const block = pool.allocate(Math.min(chunks.rowChunk, rows) * Math.min(chunks.vocabChunk, vocab) * 4);
    // The hidden rows as the head's products read them: beside a bf16 head, their bf16 copy for every block, taken
    // once (the one gathered with them where it is current, else narrowed here).
    const narrowed = w.dtype === "bf16" ? this.#takeBf16Operand(h) : null;
    const elementBytes = w.dtype === "bf16" ? 2 : 4;
    try {
      this.#withIndices(targets, (targetIndex) => {
        for (let r0 = 0; r0 < rows; r0 += chunks.rowChunk) {
          const rc = Math.min(chunks.rowChunk, rows - r0);
          const hiddenRows = (narrowed ?? h.address) + BigInt(r0 * dim * elementBytes);
          for (let v0 = 0; v0 < vocab; v0 += chunks.vocabChunk) {
            const vc = Math.min(chunks.vocabChunk, vocab - v0);
            const headRows = new CudaTensor([vc, dim], w.dtype, w.address + BigInt(v0 * dim * elementBytes));
            this.blas.gemm(hiddenRows, headRows.address, block, rc, vc, dim, false, true, w.dtype, 1, 0);
            visit(block, headRows, targetIndex, r0, rc, v0, vc);
          }
        }
      });
    } finally {
      pool.free(block);
      if (narrowed !== null) this.#release(narrowed);
    }
  }

  /**
   * out[j] += Σ_r a[r, j], or Σ_r a[r, j] · x[r, j] · rowScale[r] with `weighted` (a norm weight's gradient), over the
   * rows of a [rows, out.size]: partial sums of COLUMN_SUM_ROWS rows per block, then their sum, both in row order.
   */
  #columnSums(a: CudaTensor, weighted: { x: CudaTensor; rowScale: CudaTensor } | null, out: CudaTensor): void {
    const width = out.size, rows = a.size / width;
    if (rows === 0) return;
    // Blocks of COLUMN_SUM_ROWS rows, or more where that many blocks would pass the grid's y limit (a Qwen3 q-norm's
    // rows are tokens × heads: 4M at 131k tokens and 32 heads).
    const rowsPerBlock = Math.max(COLUMN_SUM_ROWS, Math.ceil(rows / MAX_GRID_Y));
    const blocks = Math.ceil(rows / rowsPerBlock), threads = rowThreads(width), columnBlocks = Math.ceil(width / threads);
    const pool = this.context.pool;
    const partial = pool.allocate(blocks * width * 4);
    try {
      this.#launch("column_sums_partial", [columnBlocks, blocks], [threads], [["ptr", a.address], ["ptr", weighted?.x.address ?? 0n],
        ["ptr", weighted?.rowScale.address ?? 0n], ["ptr", partial], ["i32", width], ["i32", rows], ["i32", rowsPerBlock]]);
      this.#launch("column_sums_add", [columnBlocks], [threads], [["ptr", partial], ["ptr", out.address], ["i32", width], ["i32", blocks]]);
    } finally {
      pool.free(partial);
    }
  }

  /** Uploads a small int32 array for the launches `use` queues; freed after them (later stream work reuses it). */
  #withIndices(values: Int32Array, use: (address: bigint) => void): void {
    const pool = this.context.pool;
    const address = pool.allocate(Math.max(4, values.byteLength));
    try {
      this.context.upload(address, values);
      use(address);
    } finally {
      pool.free(address);
    }
  }

  /** GraphHost.record: `run` captured into a graph, with the backend in recording mode meanwhile. */
  #record(run: () => Tensor, inputs: Map<Int32Array, bigint>, arena: MemoryPool) {
    // A cached bf16 operand made before the recording must not be baked into it (its block is freed and reused).
    this.#dropBf16Copy();
    const recording: Recording = { arena, inputs, deferred: new Map() };
    this.#recording = recording;
    let output: CudaTensor | null = null, graph: bigint | null = null, failure: { error: unknown } | null = null;
    try {
      this.context.beginCapture();
      try {
        output = cuda(run());
      } catch (error) {
        failure = { error };
      }
      try {
        graph = this.context.endCapture();
      } catch (error) {
        failure ??= { error };
      }
    } catch (error) {
      failure = { error };
    } finally {
      this.#recording = null;
      this.#dropBf16Copy();
    }
    const deferred = [...recording.deferred.values()];
    if (failure || !output || graph === null) {
      if (graph !== null) this.context.destroyGraph(graph);
      for (const upload of deferred) this.context.pool.free(upload.address);
      throw failure ? failure.error : new ArtError("cuda_graph", "recording a decode pass produced no graph");
    }
    return { graph, output, deferred };
  }

  #attentionPlan(rows: RowPlacement, group: number, headDim: number): AttentionPlan {
    const last = this.#lastPlan;
    if (last && last.group === group && last.headDim === headDim && sameContent(last.slots, rows.slots) && sameContent(last.positions, rows.positions)) {
      return last.plan;
    }
    const plan = planAttention(rows.slots, rows.positions, group, headDim);
    this.#lastPlan = { slots: Int32Array.from(rows.slots), positions: Int32Array.from(rows.positions), group, headDim, plan };
    return plan;
  }

  /**
   * Device copy of a small int32 array; reused while the same array comes back with the same content. While a pass
   * is recorded: a pass input's fixed address, or a copy of the graph's own that is written once the capture ends.
   */
  #indices(host: Int32Array): bigint {
    const recording = this.#recording;
    if (recording) {
      const input = recording.inputs.get(host);
      if (input !== undefined) return input;
      let upload = recording.deferred.get(host);
      if (!upload) {
        upload = { address: this.context.pool.allocate(Math.max(4, host.byteLength)), data: Int32Array.from(host) };
        recording.deferred.set(host, upload);
      }
      return upload.address;
    }
    const hit = this.#indexCache.find((entry) => entry.host === host && sameContent(entry.snapshot, host));
    if (hit) return hit.address;
    const address = this.context.pool.allocate(Math.max(4, host.byteLength));
    this.context.upload(address, host);
    this.#indexCache.unshift({ host, snapshot: Int32Array.from(host), address });
    // The evicted copy may still be read by queued kernels; the pool reuses it only for later stream work.
    if (this.#indexCache.length > indexCacheEntries) this.context.pool.free(this.#indexCache.pop()!.address);
    return address;
  }
}

/** Rows, query heads and KV heads of packed attention's q:[rows, heads·hd] and k:[rows, kvHeads·hd]. */
function packedShape(q: CudaTensor, k: CudaTensor, headDim: number): { rows: number; heads: number; kvHeads: number } {
  const rows = q.shape[0];
  const heads = q.size / (rows * headDim), kvHeads = k.size / (rows * headDim);
  if (!(Number.isInteger(heads) && Number.isInteger(kvHeads) && heads % kvHeads === 0)) {
    throw new ArtError("wrong_shape", `cuda backend: attention q [${q.shape}] and k [${k.shape}] are not whole heads of ${headDim} in groups`);
  }
  return { rows, heads, kvHeads };
}

/**
 * The embedding backward's launch plan: the distinct tokens of `ids` in ascending order, where each one's rows start
 * in the row list (and one past the last), then the row list, the rows of each token in ascending order.
 */
function embeddingPlan(ids: Int32Array): { plan: Int32Array; tokens: number } {
  const rows = Array.from(ids.keys()).sort((a, b) => ids[a] - ids[b] || a - b);
  const tokens: number[] = [], starts: number[] = [];
  rows.forEach((row, i) => {
    if (i === 0 || ids[row] !== ids[rows[i - 1]]) {
      tokens.push(ids[row]);
      starts.push(i);
    }
  });
  starts.push(rows.length);
  return { plan: Int32Array.from([...tokens, ...starts, ...rows]), tokens: tokens.length };
}

function checkRowIndex(rowIndex: Int32Array, rows: number): void {
  for (const row of rowIndex) {
    if (!(row >= 0 && row < rows)) throw new ArtError("bad_row_index", `row index ${row} outside 0..${rows - 1}`);
  }
}

function sameContent(a: Int32Array, b: Int32Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
