// The parity suite: every CUDA op against the CPU backend on random inputs (sampling draw for draw: the CPU sampler
// is the reference of the kernel's algorithm), logits of tiny checkpoints against the CPU engine, greedy generation
// token-identical, and decode passes replayed as CUDA graphs bit-identical to eager ones. Defined once, run on a GPU (parity.test.ts, ART_TEST_GPU=1) and
// on the CPU emulation of the kernels (emulated-parity.test.ts).
// Tolerances: ops with f32 operands agree to f32 rounding; bf16 weights are bf16-rounded on both backends, but
// the CUDA backend also narrows activations to bf16 for the GEMM and keeps the KV cache in bf16 (relative error ~2^-8).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { seededRandom } from "../../lib/core/random.ts";
import { type Backend, type DType, type SamplingParams, type Tensor, allowedTokenMask } from "../../lib/model/backend.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { generate, decode } from "../../lib/model/generate.ts";
import { loadTransformer, sequenceLogits } from "../../lib/model/transformer.ts";
import type { CudaBackend, CudaBackendOptions, DeviceQueue } from "../../lib/cuda/backend.ts";
import { type LayerLoras } from "../../lib/model/lora.ts";
import { Batcher } from "../../lib/serve/batcher.ts";
import { type Transformer } from "../../lib/model/transformer.ts";
import { tinyCheckpoint } from "../model/helpers.ts";
import { probeKvSlotCopy } from "../model/kv-copy-probe.ts";
import { random, relativeError } from "./compare.ts";

/** Products through TF32 tensor cores against the CPU's f32 (measured on the emulator: up to 5.2e-4). */
export const TF32_TOLERANCE = 2e-3;

export interface ParitySuiteOptions {
  /** Vocabulary of the log-softmax and sampling tests (the emulator uses a smaller one). */
  vocab: number;
  /** Longest context of the attention tests. */
  maxContext: number;
  /** Vocabulary and number of stratified draws of the top-k / top-p distribution test. */
  drawVocab: number;
  draws: number;
}

export function defineParitySuite(title: string, skip: boolean, create: (options?: CudaBackendOptions) => CudaBackend<DeviceQueue>,
                                  { vocab, maxContext, drawVocab, draws }: ParitySuiteOptions): void {
describe.skipIf(skip)(title, () => {
  const cpu = new CpuBackend();
  let gpu: CudaBackend<DeviceQueue>;
  beforeAll(() => {
    gpu = create();
  });
  afterAll(() => gpu?.dispose());

  /** The same data on both backends. */
  function both(data: Float32Array, shape: number[], dtype: DType = "f32"): [Tensor, Tensor] {
    return [cpu.upload(data, shape, dtype), gpu.upload(data, shape, dtype)];
  }
  function zeros(shape: number[]): [Tensor, Tensor] {
    return [cpu.zeros(shape), gpu.zeros(shape)];
  }
  function error(pair: [Tensor, Tensor]): number {
    return relativeError(cpu.download(pair[0]), gpu.download(pair[1]));
  }
  const run = (op: (b: Backend, i: 0 | 1) => void) => {
    op(cpu, 0);
    op(gpu, 1);
  };

  it("uploads and downloads f32 exactly and bf16 with the CPU's rounding", () => {
    const data = random(10_001, 1);
    for (const dtype of ["f32", "bf16"] as const) expect(error(both(data, [10_001], dtype))).toBe(0);
  });

  it("embedding (f32 and bf16 tables)", () => {
    for (const dtype of ["f32", "bf16"] as const) {
      const table = both(random(50 * 96, 2), [50, 96], dtype), out = zeros([7, 96]);
      const ids = Int32Array.from([0, 49, 3, 3, 17, 8, 1]);
      run((b, i) => b.embedding(table[i], ids, out[i]));
      expect(error(out)).toBe(0);
    }
  });

  it("rmsNorm over rows and per head, addRmsNorm", () => {
    for (const dtype of ["f32", "bf16"] as const) {
      const x = both(random(5 * 896, 3), [5, 896]), out = zeros([5, 896]);
      const w = both(random(896, 4), [896], dtype), head = both(random(64, 5), [64], dtype);
      run((b, i) => b.rmsNorm(x[i], w[i], 1e-6, out[i]));
      expect(error(out)).toBeLessThan(1e-5);
      run((b, i) => b.rmsNorm(x[i], head[i], 1e-6, out[i]));
      expect(error(out)).toBeLessThan(1e-5);
      const residual = both(random(5 * 896, 6), [5, 896]), rstd = zeros([5]);
      run((b, i) => b.addRmsNorm(residual[i], x[i], residual[i], w[i], 1e-6, out[i], rstd[i]));
      expect(error(residual)).toBeLessThan(1e-6);
      expect(error(out)).toBeLessThan(1e-5);
      expect(error(rstd)).toBeLessThan(1e-5);
    }
  });

  // A prefill-sized batch and decode-sized ones (cuBLAS picks other kernels for a single row).
  it("linear: f32 and bf16 weights, bias, unmerged LoRA, 9, 8 and 1 rows", () => {
    const inF = 896, outF = 1200, rank = 8;
    for (const [n, dtype, tolerance] of [[9, "f32", 1e-5], [9, "bf16", 1.5e-2], [8, "bf16", 1.5e-2], [1, "bf16", 1.5e-2]] as const) {
      const x = both(random(n * inF, 7), [n, inF]);
      const w = both(random(outF * inF, 8, 0.05), [outF, inF], dtype), bias = both(random(outF, 9), [outF]);
      const a = both(random(rank * inF, 10, 0.05), [rank, inF], dtype), bB = both(random(outF * rank, 11, 0.05), [outF, rank], dtype);
      const out = zeros([n, outF]);
      run((b, i) => b.linear(x[i], w[i], null, out[i]));
      expect(error(out)).toBeLessThan(tolerance);
      run((b, i) => {
        b.linear(x[i], w[i], bias[i], out[i]);
        b.addLoras(x[i], [{ lora: { a: a[i], b: bB[i], scale: 2 }, out: out[i], column: 0 }]);
      });
      expect(error(out)).toBeLessThan(tolerance);
    }
  });

  // The layer's stacked projections: q, k, v as one product split with their biases; gate and up as one product
  // whose halves each take their LoRA; every weight a view of the stacked one (pointer offsets on CUDA).
  it("stacked projections: views of a weight, splitColumns with biases, LoRA into a block of columns", () => {
    const n = 5, inF = 64, widths = [48, 16, 16], total = 80, inter = 40, rank = 4;
    for (const dtype of ["f32", "bf16"] as const) {
      const tolerance = dtype === "f32" ? 1e-5 : 1.5e-2;
      const x = both(random(n * inF, 30), [n, inF]);
      const qkv = both(random(total * inF, 31, 0.1), [total, inF], dtype), bias = both(random(total, 32), [total]);
      const fused = zeros([n, total]), parts = widths.map((w) => zeros([n, w]));
      run((b, i) => {
        b.linear(x[i], qkv[i], null, fused[i]);
        b.splitColumns(fused[i], bias[i], parts.map((p) => p[i]));
      });
      // Each part equals its own projection through a view of the stacked weight and bias.
      let row = 0;
      for (const [j, w] of widths.entries()) {
        const alone = zeros([n, w]);
        run((b, i) => b.linear(x[i], b.view(qkv[i], row, w), b.view(bias[i], row, w), alone[i]));
        expect(error(parts[j])).toBeLessThan(tolerance);
        expect(relativeError(gpu.download(parts[j][1]), gpu.download(alone[1]))).toBeLessThan(1e-6);
        row += w;
      }
      const gateUp = both(random(2 * inter * inF, 33, 0.1), [2 * inter, inF], dtype), product = zeros([n, 2 * inter]);
      const a = both(random(rank * inF, 34, 0.1), [rank, inF]), up = both(random(inter * rank, 35, 0.1), [inter, rank]), down = zeros([n, rank]);
      run((b, i) => {
        b.linear(x[i], gateUp[i], null, product[i]);
        b.addLoras(x[i], [{ lora: { a: a[i], b: up[i], scale: 0.5 }, out: product[i], column: inter, down: { tensor: down[i], column: 0 } }]);
      });
      expect(error(product)).toBeLessThan(tolerance);
      // Beside bf16 weights the LoRA's f32 products run on TF32 tensor cores (operands to 11 significant bits).
      expect(error(down)).toBeLessThan(dtype === "f32" ? 1e-5 : TF32_TOLERANCE);
      const hidden = zeros([n, inter]);
      run((b, i) => b.swiglu(product[i], hidden[i]));
      expect(error(hidden)).toBeLessThan(tolerance);
    }
  });

  it("rope (rotate-half) of q and k together, at positions up to 4000", () => {
    const hd = 64, heads = 14, kvHeads = 2, positions = Int32Array.from([0, 1, 2, 100, 4000, 77]);
    const invFreq = Float32Array.from({ length: hd / 2 }, (_, j) => 1 / 1e6 ** ((2 * j) / hd));
    const q = both(random(positions.length * heads * hd, 12), [positions.length, heads * hd]), f = both(invFreq, [hd / 2]);
    const k = both(random(positions.length * kvHeads * hd, 13), [positions.length, kvHeads * hd]);
    run((b, i) => b.rope(q[i], k[i], positions, f[i], hd));
    expect(error(q)).toBeLessThan(2e-3);
    expect(error(k)).toBeLessThan(2e-3);
  });

  it("splitColumns with a rotation: q, k and v from their one product, biased, q and k rotated, in one launch", () => {
    const hd = 64, heads = 14, kvHeads = 2, positions = Int32Array.from([0, 1, 2, 100, 4000, 77]), n = positions.length;
    const widths = [heads * hd, kvHeads * hd, kvHeads * hd], total = (heads + 2 * kvHeads) * hd;
    const invFreq = Float32Array.from({ length: hd / 2 }, (_, j) => 1 / 1e6 ** ((2 * j) / hd));
    for (const dtype of ["f32", "bf16"] as const) {
      const fused = both(random(n * total, 40), [n, total]), bias = both(random(total, 41), [total]), f = both(invFreq, [hd / 2], dtype);
      const rotated = widths.map((w) => zeros([n, w])), apart = widths.map((w) => zeros([n, w]));
      run((b, i) => b.splitColumns(fused[i], bias[i], rotated.map((p) => p[i]), { positions, invFreq: f[i], headDim: hd }));
      gpu.splitColumns(fused[1], bias[1], apart.map((p) => p[1]));
      gpu.rope(apart[0][1], apart[1][1], positions, f[1], hd);
      // Written as bf16 (a training pass's q, k and v for the tensor-core attention): the f32 results rounded.
      const narrowed = widths.map((w) => gpu.empty([n, w], "bf16"));
      gpu.splitColumns(fused[1], bias[1], narrowed, { positions, invFreq: f[1], headDim: hd });
      for (const [j, part] of rotated.entries()) {
        expect(error(part)).toBeLessThan(2e-3);  // rope's tolerance: sincosf against the CPU's f64 angle
        // The same roundings as the split and the rotation launched apart.
        expect(relativeError(gpu.download(part[1]), gpu.download(apart[j][1]))).toBeLessThan(1e-6);
        expect(gpu.download(narrowed[j])).toEqual(cpu.download(cpu.upload(gpu.download(part[1]), [n, widths[j]], "bf16")));
      }
      // bf16 parts only as all three, rotated: the plain split and the separate rope write f32.
      expect(() => gpu.splitColumns(fused[1], bias[1], narrowed)).toThrow(/bf16 parts only as q, k and v all bf16 with a rotation/);
      expect(() => gpu.splitColumns(fused[1], bias[1], [narrowed[0], rotated[1][1], rotated[2][1]], { positions, invFreq: f[1], headDim: hd }))
        .toThrow(/bf16 parts only/);
    }
  });

  // An inference pass's q/k/v LoRAs ride the split that rotates q and k (split_rope_lora): the same bits as addLoras
  // then splitColumns on the GPU, and the CPU's numbers; a projection without a LoRA (k here, once) is left alone.
  it("splitColumns with a rotation and the q/k/v LoRAs: one launch, the same bits as addLoras then the split", () => {
    const hd = 32, heads = 6, kvHeads = 2, widths = [heads * hd, kvHeads * hd, kvHeads * hd], total = (heads + 2 * kvHeads) * hd;
    const invFreq = Float32Array.from({ length: hd / 2 }, (_, j) => 1 / 1e4 ** ((2 * j) / hd));
    for (const [n, inF, rank, loraType, freqType, parts] of [[1, 96, 8, "f32", "f32", [0, 1, 2]], [3, 200, 16, "bf16", "bf16", [0, 2]],
      [70, 64, 64, "bf16", "f32", [0, 1, 2]]] as const) {
      const tolerance = loraType === "f32" ? 2e-3 : 1e-2;  // rope's sincosf against the CPU's f64 angle
      const positions = Int32Array.from({ length: n }, (_, i) => 3 + 7 * i);
      const x = both(random(n * inF, 90 + n), [n, inF]), product = random(n * total, 91), bias = both(random(total, 92), [total]);
      const f = both(invFreq, [hd / 2], freqType);
      const adapters = parts.map((p) => ({ p, a: both(random(rank * inF, 93 + p, 0.1), [rank, inF], loraType),
        b: both(random(widths[p] * rank, 96 + p, 0.1), [widths[p], rank], loraType), scale: 0.5 + p }));
      const fresh = () => ({ fused: both(product, [n, total]), outs: widths.map((w) => zeros([n, w])) });
      const targets = (t: { fused: [Tensor, Tensor] }, i: 0 | 1) => adapters.map(({ p, a, b, scale }) =>
        ({ lora: { a: a[i], b: b[i], scale }, out: t.fused[i], column: widths.slice(0, p).reduce((sum, w) => sum + w, 0) }));
      const rotate = (i: 0 | 1) => ({ positions, invFreq: f[i], headDim: hd });
      const folded = fresh(), apart = fresh();
      run((b, i) => b.splitColumns(folded.fused[i], bias[i], folded.outs.map((o) => o[i]), rotate(i), { x: x[i], targets: targets(folded, i) }));
      gpu.addLoras(x[1], targets(apart, 1));
      gpu.splitColumns(apart.fused[1], bias[1], apart.outs.map((o) => o[1]), rotate(1));
      for (const [j, part] of folded.outs.entries()) {
        expect(relativeError(gpu.download(apart.outs[j][1]), gpu.download(part[1]))).toBe(0);
        expect(error(part)).toBeLessThan(tolerance);
      }
    }
  });

  for (const [heads, kvHeads, hd] of [[14, 2, 64], [12, 2, 128], [4, 4, 80], [8, 1, 16]] as const) {
    it(`attention ${heads}/${kvHeads} heads, head_dim ${hd}: prefill, mixed prefill + decode, long decode (split keys)`, () => {
      const spec = { numLayers: 2, numKvHeads: kvHeads, headDim: hd, numSlots: 3, maxPositions: maxContext + 1 };
      const caches = [cpu.createKvCache(spec), gpu.createKvCache(spec)] as const;
      let seed = 100;
      const pass = (slots: number[], positions: number[]) => {
        const n = slots.length;
        const q = both(random(n * heads * hd, seed++), [n, heads * hd]);
        const k = both(random(n * kvHeads * hd, seed++), [n, kvHeads * hd]), v = both(random(n * kvHeads * hd, seed++), [n, kvHeads * hd]);
        const out = zeros([n, heads * hd]);
        const rows = { slots: Int32Array.from(slots), positions: Int32Array.from(positions) };
        run((b, i) => b.attention(q[i], k[i], v[i], caches[i], 1, rows, out[i]));
        return error(out);
      };
      const range = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i);
      // Two prompts prefill together (the first long enough for the tensor-core prefill, the second not); then a mixed
      // pass (two decode rows + a third prompt); then the third prompt's next chunk (tensor-core prefill past 64 keys)
      // beside a decode row whose keys are split across blocks (the batcher's chunked prefill, and its prefix reuse);
      // then slot 0 fills up to maxContext (several tensor-core tiles) and decodes there, where the keys are split, and
      // so do the three slots together. The bf16 KV cache (and, in the tensor-core prefill, bf16
      // q and probabilities) puts the output within 3.9e-3 of the CPU's on the emulator.
      const [a, b] = [Math.floor(maxContext / 5), Math.floor(maxContext / 27)];
      expect(pass([...Array(a).fill(0), ...Array(b).fill(1)], [...range(0, a), ...range(0, b)])).toBeLessThan(1e-2);
      expect(pass([0, 1, 2, 2, 2, 2, 2], [a, b, ...range(0, 5)])).toBeLessThan(1e-2);
      expect(pass([1, ...Array(70).fill(2)], [b + 1, ...range(5, 70)])).toBeLessThan(1e-2);
      expect(pass(Array(maxContext - a - 1).fill(0), range(a + 1, maxContext - a - 1))).toBeLessThan(1e-2);
      expect(pass([0], [maxContext])).toBeLessThan(1e-2);
      // A decode pass of three slots, each its own tile, with keys split: each tile's partials in their own rows.
      expect(pass([0, 1, 2], [maxContext, b + 2, 75])).toBeLessThan(1e-2);
      caches.forEach((c) => c.free());
    });
  }

  it("copyKvSlot: the target attends like a cache written directly, and like the CPU backend", () => {
    const shape = { numLayers: 2, numHeads: 4, numKvHeads: 2, headDim: 16 };
    const lengths = { sourceLength: 40, otherLength: 7, targetLength: 50, numPositions: 33 };
    const [c, g] = [probeKvSlotCopy(cpu, shape, lengths), probeKvSlotCopy(gpu, shape, lengths)];
    // The copy moves bf16 values unchanged: exactly what writing them there gives.
    expect(g.copied).toEqual(g.direct);
    expect(g.targetRow).toEqual(g.sourceRow);
    for (let layer = 0; layer < shape.numLayers; layer++) {
      expect(relativeError(c.copied[layer], g.copied[layer])).toBeLessThan(2e-2);
      expect(relativeError(c.targetRow[layer], g.targetRow[layer])).toBeLessThan(2e-2);
    }
  });

  // An inference pass's LoRAs of a group run in one launch (lora_fused) up to 64 row-rank pairs, in two (lora_down,
  // lora_up over tiles of 64 rows) for more; a kept x·Aᵀ takes the GEMMs. All against the CPU: q/k/v into three
  // outputs, gate/up into the two halves of one, rank 8, 16 and 64, a last tile of 8 rows.
  it("grouped LoRAs: q/k/v and the gate/up halves, 1 to 200 rows (tiles of 64), f32 and bf16 adapters, rank 8 and 64", () => {
    const inF = 96, widths = [64, 32, 32], inter = 300;
    for (const [n, dtype, rank] of [[1, "f32", 8], [7, "bf16", 8], [8, "f32", 8], [9, "bf16", 8], [64, "f32", 64], [65, "f32", 8], [200, "bf16", 16]] as const) {
      const tolerance = dtype === "f32" ? 1e-5 : 1e-2;
      const x = both(random(n * inF, 40 + n), [n, inF]);
      const adapter = (outF: number, seed: number) => ({ a: both(random(rank * inF, seed, 0.1), [rank, inF], dtype), b: both(random(outF * rank, seed + 1, 0.1), [outF, rank], dtype) });
      const qkv = widths.map((w, j) => ({ ...adapter(w, 50 + 2 * j), out: both(random(n * w, 60 + j), [n, w]), scale: 0.5 + j }));
      run((b, i) => b.addLoras(x[i], qkv.map((t) => ({ lora: { a: t.a[i], b: t.b[i], scale: t.scale }, out: t.out[i], column: 0 }))));
      for (const t of qkv) expect(error(t.out)).toBeLessThan(tolerance);
      const gate = adapter(inter, 70), up = adapter(inter, 72), gateUp = both(random(n * 2 * inter, 74), [n, 2 * inter]);
      run((b, i) => b.addLoras(x[i], [{ lora: { a: gate.a[i], b: gate.b[i], scale: 2 }, out: gateUp[i], column: 0 },
        { lora: { a: up.a[i], b: up.b[i], scale: 2 }, out: gateUp[i], column: inter }]));
      expect(error(gateUp)).toBeLessThan(tolerance);
    }
  });

  // A decode pass's o and down LoRAs ride the add + RMSNorm that reads their outputs (add_rmsnorm_lora): the same bits
  // as addLoras then addRmsNorm on the GPU, and the CPU's numbers; b is left without the LoRA (only sum and out count).
  it("addRmsNorm with the LoRA of the projection it adds: one launch, the same bits as addLoras then addRmsNorm", () => {
    const d = 192;
    for (const [n, inF, rank, loraType, normType] of [[1, 96, 8, "f32", "f32"], [3, 300, 16, "bf16", "bf16"], [70, 96, 64, "bf16", "f32"], [5, 130, 8, "f32", "bf16"]] as const) {
      const tolerance = loraType === "f32" ? 1e-5 : 1e-2;
      const x = both(random(n * inF, 80 + n), [n, inF]), residual = random(n * d, 81), projected = random(n * d, 82);
      const a = both(random(rank * inF, 83, 0.1), [rank, inF], loraType), loraB = both(random(d * rank, 84, 0.1), [d, rank], loraType);
      const w = both(random(d, 85), [d], normType);
      const fresh = () => ({ residual: both(residual, [n, d]), b: both(projected, [n, d]), out: zeros([n, d]) });
      const target = (t: { b: [Tensor, Tensor] }, i: 0 | 1) => [{ lora: { a: a[i], b: loraB[i], scale: 1.5 }, out: t.b[i], column: 0 }];
      const folded = fresh(), apart = fresh();
      run((b, i) => b.addRmsNorm(folded.residual[i], folded.b[i], folded.residual[i], w[i], 1e-6, folded.out[i], null, { x: x[i], targets: target(folded, i) }));
      gpu.addLoras(x[1], target(apart, 1));
      gpu.addRmsNorm(apart.residual[1], apart.b[1], apart.residual[1], w[1], 1e-6, apart.out[1]);
      for (const key of ["residual", "out"] as const) {
        expect(relativeError(gpu.download(apart[key][1]), gpu.download(folded[key][1]))).toBe(0);
        expect(error(folded[key])).toBeLessThan(tolerance);
      }
    }
  });

  // An inference pass's gate/up LoRAs ride the SwiGLU (swiglu_lora, a block per row): the same bits as addLoras then
  // swiglu on the GPU, and the CPU's numbers; up alone once.
  it("swiglu with gate's and up's LoRAs: one launch, the same bits as addLoras then swiglu", () => {
    for (const [n, inF, inter, rank, loraType, parts] of [[1, 96, 300, 8, "f32", [0, 1]], [4, 130, 260, 16, "bf16", [1]], [70, 64, 96, 64, "bf16", [0, 1]]] as const) {
      const tolerance = loraType === "f32" ? 1e-5 : 1e-2;
      const x = both(random(n * inF, 100 + n), [n, inF]), product = random(n * 2 * inter, 101);
      const adapters = parts.map((p) => ({ p, a: both(random(rank * inF, 102 + p, 0.1), [rank, inF], loraType),
        b: both(random(inter * rank, 104 + p, 0.1), [inter, rank], loraType), scale: 2 - p }));
      const fresh = () => ({ gateUp: both(product, [n, 2 * inter]), out: zeros([n, inter]) });
      const targets = (t: { gateUp: [Tensor, Tensor] }, i: 0 | 1) => adapters.map(({ p, a, b, scale }) =>
        ({ lora: { a: a[i], b: b[i], scale }, out: t.gateUp[i], column: p * inter }));
      const folded = fresh(), apart = fresh();
      run((b, i) => b.swiglu(folded.gateUp[i], folded.out[i], { x: x[i], targets: targets(folded, i) }));
      gpu.addLoras(x[1], targets(apart, 1));
      gpu.swiglu(apart.gateUp[1], apart.out[1]);
      expect(relativeError(gpu.download(apart.out[1]), gpu.download(folded.out[1]))).toBe(0);
      expect(error(folded.out)).toBeLessThan(tolerance);
    }
  });

  it("swiglu, add, gatherRows, logSoftmax", () => {
    const gu = both(random(4 * 2 * 4864, 19), [4, 2 * 4864]), h = zeros([4, 4864]);
    run((b, i) => b.swiglu(gu[i], h[i]));
    expect(error(h)).toBeLessThan(1e-5);
    const g = both(random(4 * 4864, 20), [4, 4864]), u = both(random(4 * 4864, 21), [4, 4864]);
    run((b, i) => b.add(g[i], u[i], g[i]));
    expect(error(g)).toBe(0);
    const picked = zeros([3, 4864]);
    run((b, i) => b.gatherRows(g[i], Int32Array.from([3, 0, 3]), picked[i]));
    expect(error(picked)).toBe(0);
    const logits = both(random(3 * vocab, 22, 4), [3, vocab]), logprobs = zeros([3, vocab]);
    run((b, i) => b.logSoftmax(logits[i], logprobs[i]));
    expect(error(logprobs)).toBeLessThan(1e-5);
  });

  it("sampling: greedy ids, top logprobs, and draws (whole vocabulary, top-k, top-p) match the CPU; logprobs are the raw model's", () => {
    const rows = 6;
    const logits = both(random(rows * vocab, 30, 3), [rows, vocab]);
    const params = (temperature: number, topP = 1, topK = 0) => ({
      temperature: new Float32Array(rows).fill(temperature), topP: new Float32Array(rows).fill(topP),
      topK: new Int32Array(rows).fill(topK), uniforms: Float32Array.from({ length: rows }, (_, r) => (r + 0.37) / rows), numTopLogprobs: 5,
    });
    for (const p of [params(0), params(1), params(0.7, 0.95, 50)]) {
      const c = cpu.sample(logits[0], p), g = gpu.sample(logits[1], p);
      expect([...g.ids]).toEqual([...c.ids]);
      expect(relativeError(c.logprobs, g.logprobs)).toBeLessThan(1e-5);
      expect([...g.topIds]).toEqual([...c.topIds]);
      expect(relativeError(c.topLogprobs, g.topLogprobs)).toBeLessThan(1e-5);
    }
  });

  it("a row of NaN logits is refused (non_finite_logits) instead of drawing id -1, greedy or sampled, on both backends", () => {
    const data = random(2 * vocab, 31, 3);
    data.fill(NaN, vocab, vocab + 5); // row 1: a few NaN logits poison its whole distribution
    const logits = both(data, [2, vocab]);
    for (const temperature of [0, 1]) {
      const p = { temperature: new Float32Array(2).fill(temperature), topP: new Float32Array(2).fill(1), topK: new Int32Array(2),
        uniforms: Float32Array.of(0.3, 0.6), numTopLogprobs: 0 };
      for (const [b, name] of [[cpu, "cpu backend"], [gpu, "cuda backend"]] as const) {
        expect(() => b.sample(logits[b === cpu ? 0 : 1], p), `${name}, temperature ${temperature}`).toThrow(/row 1 of the logits is not numbers/);
      }
    }
  });

  it("top-k, top-p, tied logits and allowed-token masks: the kernel draws the CPU reference's id for every uniform", () => {
    const rows = 24, rng = seededRandom(40);
    for (const width of [drawVocab, drawVocab - 13]) { // the second is not a multiple of 32: masks end in a partial word
      const smooth = random(rows * width, 41, 3);
      const tied = smooth.map((x) => Math.round(x * 2) / 2); // many exact ties, also at the top-k / top-p cuts
      // Per row: no constraint, a single allowed token (in the last word), or a random ~30% of the vocabulary.
      const allowed = Array.from({ length: rows }, (_, r) =>
        r % 3 === 0 ? null : r % 3 === 1 ? [width - 1] : [...Array(width).keys()].filter(() => rng() < 0.3));
      for (const values of [smooth, tied]) {
        const logits = both(values, [rows, width]);
        for (const [round, masked] of [[0, false], [1, false], [0, true], [1, true]] as const) {
          const params: SamplingParams = {
            temperature: Float32Array.from({ length: rows }, (_, r) => [0, 0.6, 1, 1.4][(r + round) % 4]),
            topK: Int32Array.from({ length: rows }, (_, r) => [0, 1, 7, 40][(r + 2 * round) % 4]),
            topP: Float32Array.from({ length: rows }, (_, r) => [1, 0.9, 0.5][(r + round) % 3]),
            uniforms: Float32Array.from({ length: rows }, () => rng()),
            numTopLogprobs: 4,
            allowedTokens: masked ? allowedTokenMask(width, allowed) : undefined,
          };
          const c = cpu.sample(logits[0], params), g = gpu.sample(logits[1], params);
          expect([...g.ids]).toEqual([...c.ids]);
          expect(relativeError(c.logprobs, g.logprobs)).toBeLessThan(1e-5);
          expect([...g.topIds]).toEqual([...c.topIds]);
          // Disallowed alternatives (past a row's allowed tokens) carry -Infinity on both.
          expect([...g.topLogprobs].map(Number.isFinite)).toEqual([...c.topLogprobs].map(Number.isFinite));
          expect(relativeError(c.topLogprobs.filter(Number.isFinite), g.topLogprobs.filter(Number.isFinite))).toBeLessThan(1e-5);
        }
        logits.forEach((t, i) => (i === 0 ? cpu : gpu).free(t));
      }
    }
  });

  it("top-k and top-p draw exactly from the renormalised kept set (stratified uniforms hit every token its share)", () => {
    const row = random(drawVocab, 31, 2);
    for (const [temperature, topP, topK] of [[1, 0.9, 0], [0.8, 1, Math.floor(drawVocab / 50)], [1.3, 0.5, Math.floor(drawVocab / 20)]] as const) {
      // Expected: weights exp(l / T) over the top-k, then the smallest most-likely prefix with mass >= topP.
      const order = [...row.keys()].sort((a, b) => row[b] - row[a]);
      const kept = order.slice(0, topK > 0 ? topK : drawVocab);
      const weights = kept.map((i) => Math.exp((row[i] - row[order[0]]) / temperature));
      const total = weights.reduce((s, w) => s + w, 0);
      let mass = 0, count = 0;
      while (count < kept.length && mass < topP * total) mass += weights[count++];
      const expected = new Map(kept.slice(0, count).map((id, j) => [id, (weights[j] / mass) * draws]));
      const counts = new Map<number, number>();
      for (let start = 0; start < draws; start += 500) {
        const n = Math.min(500, draws - start);
        const batch = gpu.upload(Float32Array.from({ length: n * drawVocab }, (_, i) => row[i % drawVocab]), [n, drawVocab]);
        const result = gpu.sample(batch, {
          temperature: new Float32Array(n).fill(temperature), topP: new Float32Array(n).fill(topP), topK: new Int32Array(n).fill(topK),
          uniforms: Float32Array.from({ length: n }, (_, i) => (start + i + 0.5) / draws), numTopLogprobs: 0,
        });
        gpu.free(batch);
        for (const id of result.ids) counts.set(id, (counts.get(id) ?? 0) + 1);
      }
      for (const id of counts.keys()) expect(expected.has(id)).toBe(true);
      for (const [id, share] of expected) expect(Math.abs((counts.get(id) ?? 0) - share)).toBeLessThanOrEqual(1.01);
    }
  });

  for (const arch of ["qwen2", "qwen3", "llama"] as const) {
    it(`${arch} tiny checkpoint: logits match the CPU engine (bf16 weights on both)`, () => {
      const dir = tinyCheckpoint({ arch, seed: 7 });
      const onCpu = loadTransformer(dir, cpu, "bf16"), onGpu = loadTransformer(dir, gpu, "bf16");
      const ids = Array.from({ length: 40 }, (_, i) => (i * 37 + 11) % onCpu.config.vocabSize);
      expect(relativeError(sequenceLogits(onCpu, ids), sequenceLogits(onGpu, ids))).toBeLessThan(3e-2);
      onGpu.free();
    });

    it(`${arch} tiny checkpoint: greedy generation is token-identical to the CPU engine`, async () => {
      const dir = tinyCheckpoint({ arch, seed: 8 });
      const onCpu = loadTransformer(dir, cpu, "bf16"), onGpu = loadTransformer(dir, gpu, "bf16");
      const requests = [[1, 2, 3], [40, 41], [5, 9, 200, 7, 7]].map((promptIds) => ({ promptIds, temperature: 0, maxTokens: 24, stopIds: [] }));
      const [c, g] = [await generate(onCpu, requests), await generate(onGpu, requests)];
      expect(g.map((r) => r.tokenIds)).toEqual(c.map((r) => r.tokenIds));
      onGpu.free();
    });
  }

  it("the batcher's mixed passes (prompts chunked across passes, shared prefixes copied, beside decoding rows) give the CPU engine's greedy tokens", async () => {
    const dir = tinyCheckpoint({ arch: "qwen2", seed: 9 });
    const onCpu = loadTransformer(dir, cpu, "bf16"), onGpu = loadTransformer(dir, gpu, "bf16");
    const vocab = onCpu.config.vocabSize;
    // Three prompts of 90-130 tokens sharing their first 20, arriving one pass apart: the later ones copy the prefix and
    // prefill the rest in 32-token chunks (tensor-core runs past 64 keys) while the earlier ones decode.
    const prompts = [0, 1, 2].map((i) => Array.from({ length: 90 + 20 * i }, (_, t) => (t < 20 ? t * 13 + 5 : t * 31 + i * 7) % vocab));
    const serve = async (model: Transformer) => {
      const batcher = new Batcher(model, { numSlots: 4, maxPositions: 200, maxPrefillTokens: 32 });
      const results = await Promise.all(prompts.map(async (promptIds, i) => {
        for (let wait = 0; wait < i; wait++) await new Promise((resolve) => setImmediate(resolve));
        return batcher.submit({ promptIds, maxTokens: 12, temperature: 0, topP: 1, seed: i, numTopLogprobs: 0, stopTokenIds: [],
          constraint: null, loras: null });
      }));
      const { copiedTokens } = batcher.stats;
      await batcher.close();
      return { tokens: results.map((r) => r.tokens.map((t) => t.id)), copiedTokens };
    };
    const [c, g] = [await serve(onCpu), await serve(onGpu)];
    expect(g.copiedTokens).toBeGreaterThan(0);
    expect(g.tokens).toEqual(c.tokens);
    onGpu.free();
  });

  it("decode passes replayed as CUDA graphs give the very tokens and logprobs of eager passes, LoRA and its in-place updates included", () => {
    const eager = create({ graphs: false });
    const dir = tinyCheckpoint({ arch: "qwen2", seed: 9 });
    const models = [loadTransformer(dir, gpu, "bf16"), loadTransformer(dir, eager, "bf16")] as const;
    const loras = [randomLoras(models[0], 1), randomLoras(models[1], 1)] as const;
    const caches = models.map((m) => m.createKvCache(3, 128));
    const vocab = models[0].config.vocabSize;
    // Prompts of 50-60 tokens, then decoding across the 64-key window, where the attention plan changes.
    const prompts = [50, 55, 60].map((length, r) => Array.from({ length }, (_, i) => (i * 31 + r * 7 + 3) % vocab));
    const rng = seededRandom(12);
    const outputs: [number[][], number[][]] = [[], []];
    const positions = prompts.map((p) => p.length);
    let last = prompts.map((p) => p);
    const decodeTokens = (count: number, adapter: boolean) => {
      for (let t = 0; t < count; t++) {
        const uniforms = prompts.map(() => rng());
        const sampled = models.map((model, i) => decode(model, caches[i], prompts.map((_, slot) => ({
          slot, startPosition: positions[slot] - last[slot].length, tokens: last[slot],
          sample: { temperature: 0.9, topP: 1, topK: 20, uniform: uniforms[slot], topLogprobs: 2 },
        })), adapter ? loras[i] : undefined));
        sampled.forEach((tokens, i) => outputs[i].push(tokens.flatMap((token) => [token!.id, token!.logprob, ...token!.topLogprobs.flatMap((a) => [a.id, a.logprob])])));
        last = sampled[0].map((token) => [token!.id]);
        for (let slot = 0; slot < positions.length; slot++) positions[slot]++;
      }
    };
    const before = gpu.decodeGraphStats()!;
    decodeTokens(20, true); // prefill (eager), then decode passes
    const afterFirst = gpu.decodeGraphStats()!;
    expect(afterFirst.disabled).toBeNull();
    expect(afterFirst.recorded - before.recorded).toBe(2); // one graph per key window: 64, then 128
    expect(afterFirst.replayed - before.replayed).toBe(15); // 19 decode passes, per window one eager and one recorded
    // Training updates the adapter's tensors in place: the recorded graphs read the new values.
    loras.forEach((set, i) => set.forEach((layer, l) => {
      const b = layer.q_proj!.b as Tensor & { address: bigint };
      [gpu, eager][i].context.upload(b.address, random(b.size, 500 + l, 0.3));
    }));
    decodeTokens(10, true);
    expect(gpu.decodeGraphStats()!.recorded).toBe(afterFirst.recorded);
    expect(gpu.decodeGraphStats()!.replayed - afterFirst.replayed).toBe(10);
    decodeTokens(5, false); // no adapter: other launches, graphs of their own
    expect(gpu.decodeGraphStats()!.recorded).toBe(afterFirst.recorded + 1);
    expect(outputs[0]).toEqual(outputs[1]);
    caches.forEach((cache) => cache.free());
    models.forEach((model) => model.free());
    eager.dispose();
  });
});
}

/** A random rank-4 LoRA on q_proj and down_proj of every layer, in f32. */
function randomLoras(model: Transformer, seed: number): LayerLoras[] {
  const { hiddenSize: d, numHeads, headDim, intermediateSize: inter, numLayers } = model.config;
  const rank = 4, b = model.backend;
  return Array.from({ length: numLayers }, (_, l) => ({
    q_proj: { a: b.upload(random(rank * d, seed + 10 * l, 0.3), [rank, d]), b: b.upload(random(numHeads * headDim * rank, seed + 10 * l + 1, 0.3), [numHeads * headDim, rank]), scale: 2 },
    down_proj: { a: b.upload(random(rank * inter, seed + 10 * l + 2, 0.3), [rank, inter]), b: b.upload(random(d * rank, seed + 10 * l + 3, 0.3), [d, rank]), scale: 2 },
  }));
}
