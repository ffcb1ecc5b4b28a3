/**
 * TrainingOps on the CUDA backend: the training pass (lib/grpo/model.ts) over device tensors, for LoRA training.
 * The frozen base weights are the engine's own tensors (f32 or bf16); LoRA A/B, their gradients, the AdamW moments
 * and every activation are f32. Products run on cuBLAS (`gemm`): a bf16 weight takes its other operand narrowed to
 * bf16, f32 accumulation either way. The row-wise and elementwise ops are kernels/training.cu; each one's CPU
 * reference is lib/grpo/ops.ts / logprobs.ts, and the parity suite (test/cuda/training-parity-suite.ts) checks them
 * against it.
 *
 * Full-parameter training stays on the CPU (weight, bias, norm and embedding gradients have no kernels here).
 */
import { ArtError } from "../core/errors.ts";
import type { Tensor } from "../model/backend.ts";
import type { ChunkSizes, TokenLogprobs } from "../grpo/logprobs.ts";
import { ropeTables } from "../grpo/ops.ts";
import type { AdamWScalars, AttentionSegment, AttentionShape, RopeTensors, TrainingOps } from "../grpo/training-ops.ts";
import { type CudaBackend, CudaTensor, type DeviceQueue } from "./backend.ts";
import { Blas, type GemmType } from "./blas.ts";

/** A general row-major GEMM (Blas.gemm's contract); the emulated device provides a reference one. */
export interface TrainingGemm {
  gemm(a: bigint, b: bigint, c: bigint, m: number, n: number, k: number, transA: boolean, transB: boolean,
       operandType: GemmType, alpha?: number, beta?: number): void;
}

/** Blocks of the sum-of-squares reduction per tensor. */
const sumSquaresBlocks = 64;

function device(tensor: Tensor): CudaTensor {
  if (!(tensor instanceof CudaTensor)) throw new ArtError("wrong_backend", "a tensor from another backend was passed to the CUDA training ops");
  return tensor;
}

function f32(name: string, tensor: Tensor): CudaTensor {
  const t = device(tensor);
  if (t.dtype !== "f32") throw new ArtError("wrong_dtype", `cuda training: ${name} must be f32, got ${t.dtype}`);
  return t;
}

/** Marks tensors written (a cached derived copy of them, such as the backend's bf16 GEMM operand, goes stale). */
function written(...tensors: (CudaTensor | null)[]): void {
  for (const t of tensors) if (t) t.version++;
}

function frozenOnly(what: string, gradient: Tensor | null): void {
  if (gradient !== null) {
    throw new ArtError("cuda_unsupported", `cuda training: ${what} gradients are not implemented on CUDA (full-parameter training); train a LoRA adapter, or train on device "cpu"`);
  }
}

function rowThreads(width: number, cap = 256): number {
  return Math.min(cap, Math.max(32, Math.ceil(width / 32) * 32));
}

function gridFor(n: number): number {
  return Math.max(1, Math.min(Math.ceil(n / 256), 8192));
}

export class CudaTrainingOps implements TrainingOps {
  readonly name = "cuda" as const;
  readonly fullParameter = false;
  /** 1024 rows × 16384 vocabulary entries: a 64 MB f32 block, 80 blocks for 8 × 1024 tokens of a 152k vocabulary. */
  readonly logitChunks = { rowChunk: 1024, vocabChunk: 16384 };
  readonly backend: CudaBackend<DeviceQueue>;
  readonly #gemm: TrainingGemm;

  constructor(backend: CudaBackend<DeviceQueue>, gemm: TrainingGemm) {
    this.backend = backend;
    this.#gemm = gemm;
  }

  owns(tensor: Tensor): boolean {
    return tensor instanceof CudaTensor;
  }

  // ---- memory ---------------------------------------------------------------------------------------------------

  zeros(shape: readonly number[]): Tensor {
    return this.backend.zeros(shape);
  }

  upload(data: Float32Array, shape: readonly number[]): Tensor {
    return this.backend.upload(data, shape, "f32");
  }

  download(tensor: Tensor): Float32Array {
    return this.backend.download(tensor);
  }

  write(tensor: Tensor, data: Float32Array): void {
    const t = f32("written tensor", tensor);
    if (data.length !== t.size) throw new ArtError("wrong_shape", `cuda training: ${data.length} values cannot fill [${t.shape}]`);
    this.backend.context.upload(t.address, data);
    written(t);
  }

  zero(tensor: Tensor): void {
    const t = device(tensor);
    this.backend.context.zero(t.address, t.bytes);
    written(t);
  }

  free(tensor: Tensor): void {
    this.backend.free(tensor);
  }

  copy(x: Tensor): Tensor {
    const out = this.backend.zeros(x.shape);
    this.backend.addInPlace(out, x);
    return out;
  }

  add(out: Tensor, a: Tensor, b: Tensor): void {
    if (out !== a) {
      this.zero(out);
      this.backend.addInPlace(out, a);
    }
    this.backend.addInPlace(out, b);
  }

  gatherRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void {
    if (rows.length === 0) return;
    const source = device(x);
    // The backend's gather reads the row count from the shape; view x as [rows, width].
    const view = new CudaTensor([source.size / width, width], source.dtype, source.address);
    this.backend.gatherRows(view, rows, out);
  }

  scatterRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void {
    if (rows.length === 0) return;
    const o = f32("scatter out", out), xs = f32("scatter input", x);
    written(o);
    this.#withIndices(rows, (index) => this.backend.launch("scatter_rows", [rows.length], [rowThreads(width)],
      [["ptr", xs.address], ["ptr", index], ["ptr", o.address], ["i32", width]]));
  }

  // ---- layer ops --------------------------------------------------------------------------------------------------

  embedding(out: Tensor, table: Tensor, ids: Int32Array): void {
    this.backend.embedding(table, ids, out);
  }

  embeddingBackward(dTable: Tensor): void {
    frozenOnly("embedding", dTable);
  }

  linear(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | null): void {
    this.backend.linear(x, weight, bias, out);
  }

  /** dx += dOut · W (W [out, in], bf16 or f32); the weight and bias are frozen here. */
  linearBackward(dx: Tensor | null, dWeight: Tensor | null, dBias: Tensor | null, dOut: Tensor, _x: Tensor, weight: Tensor,
    rows: number, inFeatures: number, outFeatures: number): void {
    frozenOnly("base weight", dWeight);
    frozenOnly("bias", dBias);
    if (dx === null) return;
    const d = f32("linear input gradient", dx), g = f32("linear output gradient", dOut), w = device(weight);
    written(d);
    this.#product(g, w, d, rows, inFeatures, outFeatures, false, false, 1, 1);
  }

  loraForward(out: Tensor, xa: Tensor, x: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void {
    const o = f32("linear out", out), down = f32("LoRA x·Aᵀ", xa), xs = f32("linear input", x), as = f32("LoRA A", a), bs = f32("LoRA B", b);
    written(o, down);
    this.#gemm.gemm(xs.address, as.address, down.address, rows, rank, inFeatures, false, true, "f32", 1, 0);
    this.#gemm.gemm(down.address, bs.address, o.address, rows, outFeatures, rank, false, true, "f32", scale, 1);
  }

  /** dB += scale · dOutᵀ · xa; g = scale · dOut · B; dA += gᵀ · x; dx += g · A. */
  loraBackward(dx: Tensor | null, dA: Tensor, dB: Tensor, dOut: Tensor, x: Tensor, xa: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void {
    const gradA = f32("LoRA A gradient", dA), gradB = f32("LoRA B gradient", dB), g = f32("linear output gradient", dOut);
    const xs = f32("linear input", x), down = f32("LoRA x·Aᵀ", xa), as = f32("LoRA A", a), bs = f32("LoRA B", b);
    written(gradA, gradB);
    this.#gemm.gemm(g.address, down.address, gradB.address, outFeatures, rank, rows, true, false, "f32", scale, 1);
    const dDown = this.backend.context.pool.allocate(rows * rank * 4);
    try {
      this.#gemm.gemm(g.address, bs.address, dDown, rows, rank, outFeatures, false, false, "f32", scale, 0);
      this.#gemm.gemm(dDown, xs.address, gradA.address, rank, inFeatures, rows, true, false, "f32", 1, 1);
      if (dx !== null) {
        const d = f32("linear input gradient", dx);
        written(d);
        this.#gemm.gemm(dDown, as.address, d.address, rows, inFeatures, rank, false, false, "f32", 1, 1);
      }
    } finally {
      this.backend.context.pool.free(dDown);
    }
  }

  rmsnorm(out: Tensor, rstd: Tensor, x: Tensor, weight: Tensor, rows: number, dim: number, eps: number): void {
    const o = f32("rmsnorm out", out), s = f32("rmsnorm rstd", rstd), xs = f32("rmsnorm input", x), w = device(weight);
    written(o, s);
    this.backend.launch(w.dtype === "bf16" ? "rmsnorm_keep_bf16" : "rmsnorm_keep_f32", [rows], [rowThreads(dim)],
      [["ptr", xs.address], ["ptr", w.address], ["f32", eps], ["ptr", o.address], ["ptr", s.address], ["i32", dim]]);
  }

  rmsnormBackward(dx: Tensor, dWeight: Tensor | null, dOut: Tensor, x: Tensor, rstd: Tensor, weight: Tensor, rows: number, dim: number): void {
    frozenOnly("norm weight", dWeight);
    const d = f32("rmsnorm input gradient", dx), g = f32("rmsnorm output gradient", dOut), xs = f32("rmsnorm input", x);
    const s = f32("rmsnorm rstd", rstd), w = device(weight);
    written(d);
    this.backend.launch(w.dtype === "bf16" ? "rmsnorm_backward_bf16" : "rmsnorm_backward_f32", [rows], [rowThreads(dim)],
      [["ptr", d.address], ["ptr", g.address], ["ptr", xs.address], ["ptr", s.address], ["ptr", w.address], ["i32", dim]]);
  }

  /** The CPU's own tables (float64 angles rounded once), uploaded: both backends rotate by identical numbers. */
  ropeTables(positions: Int32Array, inverseFrequencies: Float32Array): RopeTensors {
    const { cos, sin, half } = ropeTables(positions, inverseFrequencies);
    return { cos: this.upload(cos, [positions.length, half]), sin: this.upload(sin, [positions.length, half]), half };
  }

  rope(x: Tensor, tables: RopeTensors, rows: number, heads: number, inverse: boolean): void {
    const xs = f32("rope input", x);
    written(xs);
    this.backend.launch("rope_rotate", [rows], [rowThreads(heads * tables.half, 128)], [["ptr", xs.address],
      ["ptr", device(tables.cos).address], ["ptr", device(tables.sin).address], ["i32", heads], ["i32", tables.half], ["f32", inverse ? -1 : 1]]);
  }

  /** Saves the log-sum-exp of every (row, head): [rows, heads]. */
  attention(out: Tensor, q: Tensor, k: Tensor, v: Tensor, segments: readonly AttentionSegment[], shape: AttentionShape): Tensor {
    const { heads, kvHeads, headDim } = shape;
    const o = f32("attention out", out), qs = f32("attention q", q), ks = f32("attention k", k), vs = f32("attention v", v);
    const rows = qs.size / (heads * headDim);
    checkTrainingHeadDim(headDim);
    written(o);
    const lse = device(this.backend.zeros([rows, heads]));
    const pairs = rows * heads;
    this.#withIndices(rowKeys(segments, rows), (index) => this.backend.launch("attention_train_forward", [Math.ceil(pairs / pairsPerBlock)],
      [pairsPerBlock * 32], [["ptr", qs.address], ["ptr", ks.address], ["ptr", vs.address], ["ptr", index], ["ptr", o.address],
        ["ptr", lse.address], ["i32", heads], ["i32", kvHeads], ["i32", headDim], ["i32", pairs]]));
    return lse;
  }

  attentionBackward(dq: Tensor, dk: Tensor, dv: Tensor, dOut: Tensor, saved: Tensor, q: Tensor, k: Tensor, v: Tensor,
    segments: readonly AttentionSegment[], shape: AttentionShape): void {
    const { heads, kvHeads, headDim } = shape;
    const dqs = f32("attention dq", dq), dks = f32("attention dk", dk), dvs = f32("attention dv", dv), g = f32("attention output gradient", dOut);
    const qs = f32("attention q", q), ks = f32("attention k", k), vs = f32("attention v", v), lse = f32("attention log-sum-exp", saved);
    const rows = qs.size / (heads * headDim);
    written(dqs, dks, dvs);
    checkTrainingHeadDim(headDim);
    // Δ = Σ p·dP per (row, head), written by the dq pass for the dk/dv pass.
    const delta = device(this.backend.zeros([rows, heads]));
    const pairs = rows * heads;
    try {
      this.#withIndices(rowKeys(segments, rows), (index) => this.backend.launch("attention_train_backward_dq", [Math.ceil(pairs / pairsPerBlock)],
        [pairsPerBlock * 32], [["ptr", dqs.address], ["ptr", delta.address], ["ptr", g.address], ["ptr", qs.address], ["ptr", ks.address],
          ["ptr", vs.address], ["ptr", lse.address], ["ptr", index], ["i32", heads], ["i32", kvHeads], ["i32", headDim], ["i32", pairs]]));
      const { offsets, ranges } = keyQueryRanges(segments, rows);
      this.#withIndices(offsets, (offsetIndex) => this.#withIndices(ranges, (rangeIndex) =>
        this.backend.launch("attention_train_backward_dkdv", [rows, kvHeads], [pairsPerBlock * 32], [["ptr", dks.address], ["ptr", dvs.address],
          ["ptr", g.address], ["ptr", qs.address], ["ptr", ks.address], ["ptr", vs.address], ["ptr", lse.address], ["ptr", delta.address],
          ["ptr", offsetIndex], ["ptr", rangeIndex], ["i32", heads], ["i32", kvHeads], ["i32", headDim]], 2 * pairsPerBlock * headDim * 4)));
    } finally {
      this.free(delta);
    }
  }

  swiglu(out: Tensor, gate: Tensor, up: Tensor): void {
    this.backend.swiglu(gate, up, out);
  }

  swigluBackward(dGate: Tensor, dUp: Tensor, dOut: Tensor, gate: Tensor, up: Tensor, size: number): void {
    const dg = f32("swiglu gate gradient", dGate), du = f32("swiglu up gradient", dUp);
    written(dg, du);
    this.backend.launch("swiglu_backward", [gridFor(size)], [256], [["ptr", dg.address], ["ptr", du.address],
      ["ptr", f32("swiglu output gradient", dOut).address], ["ptr", f32("swiglu gate", gate).address], ["ptr", f32("swiglu up", up).address], ["i64", size]]);
  }

  // ---- logprobs -------------------------------------------------------------------------------------------------

  /**
   * Row chunk by vocabulary chunk: a cuBLAS logits block, folded into each row's online log-sum-exp state on the
   * device; the host finishes the few numbers per row in float64 as the CPU does.
   */
  logprobs(hidden: Tensor, head: Tensor, targets: Int32Array, dim: number, vocab: number, chunks: ChunkSizes): TokenLogprobs {
    const rows = targets.length;
    const logprobs = new Float32Array(rows), entropies = new Float32Array(rows), logsumexp = new Float32Array(rows);
    if (rows === 0) return { logprobs, entropies, logsumexp };
    const h = f32("final hidden states", hidden), w = device(head);
    const initial = new Float32Array(rows * 4);
    for (let r = 0; r < rows; r++) initial.set([-Infinity, 0, 0, NaN], r * 4);
    const state = device(this.upload(initial, [rows, 4]));
    try {
      this.#forEachLogitBlock(h, w, targets, dim, vocab, chunks, (block, _headRows, targetIndex, r0, rc, v0, vc) => {
        this.backend.launch("logprob_block_stats", [rc], [rowThreads(vc, 1024)], [["ptr", block], ["i32", vc], ["i32", v0],
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

  /** dz = g · (onehot − softmax) per block, then dHidden += dz · head (the LM head is frozen here). */
  logprobsBackward(dHidden: Tensor, dHead: Tensor | null, dLogprobs: Float32Array, hidden: Tensor, head: Tensor,
    targets: Int32Array, logsumexp: Float32Array, dim: number, vocab: number, chunks: ChunkSizes): void {
    frozenOnly("LM head", dHead);
    const rows = targets.length;
    if (rows === 0) return;
    const d = f32("final hidden gradient", dHidden), h = f32("final hidden states", hidden), w = device(head);
    written(d);
    const perRow = this.upload(Float32Array.from([...logsumexp, ...dLogprobs]), [2, rows]);
    const lse = device(perRow).address, grad = lse + BigInt(rows * 4);
    try {
      this.#forEachLogitBlock(h, w, targets, dim, vocab, chunks, (block, headRows, targetIndex, r0, rc, v0, vc) => {
        this.backend.launch("logprob_block_grad", [rc], [rowThreads(vc)], [["ptr", block], ["i32", vc], ["i32", v0],
          ["ptr", targetIndex + BigInt(r0 * 4)], ["ptr", lse + BigInt(r0 * 4)], ["ptr", grad + BigInt(r0 * 4)]]);
        // dHidden[r0 .. r0+rc] += dz [rc, vc] · head[v0 .. v0+vc] [vc, dim]
        const dRows = new CudaTensor([rc, dim], "f32", d.address + BigInt(r0 * dim * 4));
        this.#product(new CudaTensor([rc, vc], "f32", block), headRows, dRows, rc, dim, vc, false, false, 1, 1);
      });
    } finally {
      this.free(perRow);
    }
  }

  /**
   * The chunk loop both logprob passes share: for each row chunk × vocabulary chunk, the logits block [rc, vc] =
   * hidden[r0 .. r0+rc] · head[v0 .. v0+vc]ᵀ in one reused device buffer, handed to `visit` with those head rows and
   * the targets on the device.
   */
  #forEachLogitBlock(h: CudaTensor, w: CudaTensor, targets: Int32Array, dim: number, vocab: number, chunks: ChunkSizes,
    visit: (block: bigint, headRows: CudaTensor, targetIndex: bigint, r0: number, rc: number, v0: number, vc: number) => void): void {
    const rows = targets.length;
    const pool = this.backend.context.pool;
    const block = pool.allocate(Math.min(chunks.rowChunk, rows) * Math.min(chunks.vocabChunk, vocab) * 4);
    try {
      this.#withIndices(targets, (targetIndex) => {
        for (let r0 = 0; r0 < rows; r0 += chunks.rowChunk) {
          const rc = Math.min(chunks.rowChunk, rows - r0);
          for (let v0 = 0; v0 < vocab; v0 += chunks.vocabChunk) {
            const vc = Math.min(chunks.vocabChunk, vocab - v0);
            const hiddenRows = new CudaTensor([rc, dim], "f32", h.address + BigInt(r0 * dim * 4));
            const headRows = new CudaTensor([vc, dim], w.dtype, w.address + BigInt(v0 * dim * (w.dtype === "bf16" ? 2 : 4)));
            this.#product(hiddenRows, headRows, new CudaTensor([rc, vc], "f32", block), rc, vc, dim, false, true, 1, 0);
            visit(block, headRows, targetIndex, r0, rc, v0, vc);
          }
        }
      });
    } finally {
      pool.free(block);
    }
  }

  // ---- optimiser --------------------------------------------------------------------------------------------------

  sumOfSquares(tensors: readonly Tensor[]): number {
    if (tensors.length === 0) return 0;
    const pool = this.backend.context.pool;
    const partials = pool.allocate(tensors.length * sumSquaresBlocks * 4);
    try {
      tensors.forEach((tensor, i) => {
        const t = f32("gradient", tensor);
        this.backend.launch("sum_squares", [sumSquaresBlocks], [256],
          [["ptr", t.address], ["i64", t.size], ["ptr", partials + BigInt(i * sumSquaresBlocks * 4)]]);
      });
      const host = new Float32Array(tensors.length * sumSquaresBlocks);
      this.backend.context.download(partials, host);
      let sum = 0;
      for (const partial of host) sum += partial;
      return sum;
    } finally {
      pool.free(partials);
    }
  }

  adamw(value: Tensor, grad: Tensor, m: Tensor, v: Tensor, scalars: AdamWScalars): void {
    const p = f32("parameter", value);
    const { clip, learningRate, beta1, beta2, eps, weightDecay, correction1, correction2 } = scalars;
    written(p);
    this.backend.launch("adamw_update", [gridFor(p.size)], [256], [["ptr", p.address], ["ptr", f32("gradient", grad).address],
      ["ptr", f32("first moment", m).address], ["ptr", f32("second moment", v).address], ["i64", p.size], ["f32", clip],
      ["f32", learningRate], ["f32", beta1], ["f32", beta2], ["f32", eps], ["f32", weightDecay], ["f32", correction1], ["f32", correction2]]);
  }

  // ---- helpers --------------------------------------------------------------------------------------------------

  /** c = op(a) · op(b) with b a weight-like operand: a bf16 b takes a narrowed to bf16. */
  #product(a: CudaTensor, b: CudaTensor, c: CudaTensor, m: number, n: number, k: number, transA: boolean, transB: boolean,
    alpha: number, beta: number): void {
    if (b.dtype === "f32") {
      this.#gemm.gemm(a.address, b.address, c.address, m, n, k, transA, transB, "f32", alpha, beta);
      return;
    }
    const pool = this.backend.context.pool;
    const narrow = pool.allocate(a.size * 2);
    try {
      this.backend.launch("f32_to_bf16", [gridFor(a.size)], [256], [["ptr", a.address], ["ptr", narrow], ["i64", a.size]]);
      this.#gemm.gemm(narrow, b.address, c.address, m, n, k, transA, transB, "bf16", alpha, beta);
    } finally {
      pool.free(narrow);
    }
  }

  /** Uploads a small int32 array for the launches `use` queues; freed after them (later stream work reuses it). */
  #withIndices(values: Int32Array, use: (address: bigint) => void): void {
    const pool = this.backend.context.pool;
    const address = pool.allocate(Math.max(4, values.byteLength));
    try {
      this.backend.context.upload(address, values);
      use(address);
    } finally {
      pool.free(address);
    }
  }
}

/** The training attention kernels run one (row, head) pair per warp, this many warps per block. */
const pairsPerBlock = 4;

/** Their lanes hold up to 8 dimensions each (TRAIN_DIMS_PER_LANE in training.cu). */
function checkTrainingHeadDim(headDim: number): void {
  if (headDim > 32 * 8) throw new ArtError("cuda_unsupported", `cuda training attention: head size ${headDim} is over 256`);
}

/** Per row: its segment's first row, its prefix's first row, its prefix's length (see attention_train_forward). */
function rowKeys(segments: readonly AttentionSegment[], rows: number): Int32Array {
  const keys = new Int32Array(rows * 3);
  for (const segment of segments) {
    for (let row = segment.start; row < segment.start + segment.length; row++) {
      keys.set([segment.start, segment.prefix?.start ?? 0, segment.prefix?.length ?? 0], row * 3);
    }
  }
  return keys;
}

/**
 * For every key row, the query rows that attend to it, as [first, end) ranges in CSR form (offsets[key] ..
 * offsets[key + 1] index the pairs in `ranges`): the rows of its own segment from the key on (causal), and every
 * row of each segment that reads it as part of a shared prefix.
 */
export function keyQueryRanges(segments: readonly AttentionSegment[], rows: number): { offsets: Int32Array; ranges: Int32Array } {
  const perKey: number[][] = Array.from({ length: rows }, () => []);
  for (const { start, length, prefix } of segments) {
    const end = start + length;
    for (let key = start; key < end; key++) perKey[key].push(key, end);
    if (prefix) for (let key = prefix.start; key < prefix.start + prefix.length; key++) perKey[key].push(start, end);
  }
  const offsets = new Int32Array(rows + 1);
  perKey.forEach((pairs, key) => (offsets[key + 1] = offsets[key] + pairs.length / 2));
  return { offsets, ranges: Int32Array.from(perKey.flat()) };
}

/** The training ops of a CUDA backend made by createCudaBackend (its cuBLAS handle runs the general GEMMs). */
export function createCudaTrainingOps(backend: CudaBackend<DeviceQueue>): CudaTrainingOps {
  if (!(backend.blas instanceof Blas)) {
    throw new ArtError("cuda_unsupported", "cuda training needs the backend's cuBLAS (a CudaBackend from createCudaBackend)");
  }
  return new CudaTrainingOps(backend, backend.blas);
}
