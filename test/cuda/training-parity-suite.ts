// The training ops of the CUDA backend against the CPU backend's: every op on random inputs, then the whole LoRA
// training pass of tiny qwen2 / qwen3 / llama checkpoints (logprobs, every LoRA gradient, one AdamW step). Defined
// once, run on the CPU emulation of the kernels (training-emulated-parity.test.ts) and on a GPU
// (training-parity.test.ts, ART_TEST_GPU=1).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CudaBackend, DeviceQueue } from "../../lib/cuda/backend.ts";
import type { Backend, PackedSegment, Tensor } from "../../lib/model/backend.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import { f32ToBf16 } from "../../lib/model/safetensors.ts";
import { readAdapter } from "../../lib/model/peft.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer, sequenceLogits, type Transformer } from "../../lib/model/transformer.ts";
import { adamwStep, createAdamWState } from "../../lib/grpo/adamw.ts";
import { Trainer } from "../../lib/grpo/train.ts";
import type { TrainingSequence } from "../../lib/grpo/tokenize.ts";
import { ARCHITECTURES, loadTinyModel } from "../model/tiny-fixture.ts";
import { random, relativeError as relativeErrorFrom } from "./compare.ts";

/** Each value rounded to the nearest bf16 (what the tensor cores read). */
function bf16Values(values: Float32Array): Float32Array {
  return Float32Array.from(values, (x) => new Float32Array(Uint32Array.of(f32ToBf16(x) << 16).buffer)[0]);
}

/** A LoRA's gradients from products with bf16 operands against the CPU's f32 (measured: up to 3.4e-3). */
const BF16_LORA_GRADIENT_TOLERANCE = 1e-2;

/** Gradients can be legitimately tiny: a floor far below them keeps the measure relative. */
const relativeError = (reference: Float32Array, actual: Float32Array) => relativeErrorFrom(reference, actual, 1e-12);

export function defineTrainingParitySuite(title: string, skip: boolean, create: () => CudaBackend<DeviceQueue>): void {
describe.skipIf(skip)(title, () => {
  const cpu = new CpuBackend();
  let gpu: CudaBackend<DeviceQueue>;
  beforeAll(() => {
    gpu = create();
  });
  afterAll(() => gpu?.dispose());

  type Pair = [Tensor, Tensor];
  /** The same values on both; "bf16" rounds them on the CPU as the device stores them. */
  function both(data: Float32Array, shape: number[], dtype: "f32" | "bf16" = "f32"): Pair {
    return [cpu.upload(Float32Array.from(data), shape, dtype), gpu.upload(data, shape, dtype)];
  }
  const zeros = (shape: number[]): Pair => [cpu.zeros(shape), gpu.zeros(shape)];
  const error = ([c, g]: Pair) => relativeError(cpu.download(c), gpu.download(g));
  const run = (op: (backend: Backend, i: 0 | 1) => void) => {
    op(cpu, 0);
    op(gpu, 1);
  };

  // 150 rows of 40: three blocks of column_sums_partial's 64 rows, the last one partial.
  it("rmsNorm keeps rstd, its backward adds dx and the weight's gradient (f32 and bf16 weights, rows and heads)", () => {
    for (const dtype of ["f32", "bf16"] as const) {
      for (const [rows, dim] of [[5, 96], [20, 6], [150, 40]]) {
        const x = both(random(rows * dim, 1), [rows, dim]), w = both(random(dim, 2), [dim], dtype);
        const out = zeros([rows, dim]), rstd = zeros([rows]);
        run((b, i) => b.rmsNorm(x[i], w[i], 1e-6, out[i], rstd[i]));
        expect(error(out)).toBeLessThan(1e-5);
        expect(error(rstd)).toBeLessThan(1e-5);
        const dOut = both(random(rows * dim, 3), [rows, dim]), dx = both(random(rows * dim, 4), [rows, dim]);
        run((b, i) => b.rmsNormBackward(x[i], w[i], rstd[i], dOut[i], dx[i], null));
        expect(error(dx)).toBeLessThan(1e-5);
        // The weight's gradient, added to what it held (measured: within 1.5e-7 relative).
        const dW = both(random(dim, 5), [dim]);
        run((b, i) => b.rmsNormBackward(x[i], w[i], rstd[i], dOut[i], dx[i], dW[i]));
        expect(error(dx)).toBeLessThan(1e-5);
        expect(error(dW)).toBeLessThan(5e-7);
      }
    }
  });

  // Full-parameter training's gradients of the base weights: a projection's weight and bias, the embedding table
  // (tokens repeated, in no order; the rows of a token summed by one block) and the LM head, each added to what the
  // gradient held. 130 rows: three blocks of the bias's column sums. Measured: within 4.7e-7 relative.
  it("full-parameter gradients: a projection's weight and bias, the embedding table, the LM head", () => {
    const rows = 130, inF = 24, outF = 40;
    const x = both(random(rows * inF, 60), [rows, inF]), dOut = both(random(rows * outF, 61), [rows, outF]);
    const w = both(random(outF * inF, 62, 0.2), [outF, inF]);
    const dx = both(random(rows * inF, 63), [rows, inF]), dW = both(random(outF * inF, 64), [outF, inF]), dBias = both(random(outF, 65), [outF]);
    run((b, i) => b.projectionsBackward(x[i], [{ weight: w[i], dOut: dOut[i], dWeight: dW[i], dBias: dBias[i] }], dx[i]));
    for (const grad of [dx, dW, dBias]) expect(error(grad)).toBeLessThan(1e-6);

    const vocab = 50, dim = 20;
    const ids = Int32Array.from({ length: rows }, (_, r) => (r * 7 + (r % 3) * 11) % 37);
    const dRows = both(random(rows * dim, 66), [rows, dim]), dTable = both(random(vocab * dim, 67), [vocab, dim]);
    run((b, i) => b.embeddingBackward(ids, dRows[i], dTable[i]));
    expect(error(dTable)).toBeLessThan(1e-6);
    expect(() => gpu.embeddingBackward(Int32Array.of(3, vocab), gpu.zeros([2, dim]), dTable[1])).toThrow("token id 50 is outside the vocabulary (0..49)");

    const hiddenRows = 7, chunks = { rowChunk: 3, vocabChunk: 50 }, headVocab = 130;
    const targets = Int32Array.from([0, 129, 50, 49, 7, 100, 3]);
    const hidden = both(random(hiddenRows * dim, 68), [hiddenRows, dim]), head = both(random(headVocab * dim, 69), [headVocab, dim]);
    const dLogprobs = Float32Array.from([0.5, -1, 0, 2, 0.25, -0.75, 1]);
    const dHidden = both(random(hiddenRows * dim, 70), [hiddenRows, dim]), dHead = both(random(headVocab * dim, 71, 0.01), [headVocab, dim]);
    const [c, g] = [cpu.targetLogprobs(hidden[0], head[0], targets, chunks), gpu.targetLogprobs(hidden[1], head[1], targets, chunks)];
    cpu.targetLogprobsBackward(hidden[0], head[0], targets, c.logsumexp, dLogprobs, dHidden[0], dHead[0], chunks);
    gpu.targetLogprobsBackward(hidden[1], head[1], targets, g.logsumexp, dLogprobs, dHidden[1], dHead[1], chunks);
    expect(error(dHidden)).toBeLessThan(1e-6);
    expect(error(dHead)).toBeLessThan(1e-6);
  });

  it("rope's backward rotates back", () => {
    const positions = Int32Array.from([0, 1, 7, 300, 4000]), heads = 3, half = 8;
    const invFreq = both(Float32Array.from({ length: half }, (_, j) => 1 / 1e4 ** (j / half)), [half]);
    const x = both(random(positions.length * heads * 2 * half, 5), [positions.length, heads * 2 * half]);
    const y = both(random(positions.length * 2 * half, 6), [positions.length, 2 * half]); // one kv head
    run((b, i) => b.ropeBackward(x[i], y[i], positions, invFreq[i], 2 * half));
    expect(error(x)).toBeLessThan(2e-3);
    expect(error(y)).toBeLessThan(2e-3);
    run((b, i) => b.rope(x[i], y[i], positions, invFreq[i], 2 * half));
    expect(error(x)).toBeLessThan(2e-3);
    expect(error(y)).toBeLessThan(2e-3);
  });

  // Forward and backward run on tensor cores: q, k, v, dout, the probabilities and dS rounded to bf16, sums in f32.
  // With inputs that are bf16 values already, what is left is the rounding of the probabilities and dS (measured:
  // output within 9.6e-4 relative, gradients within 2.8e-3); with f32 inputs, the inputs' rounding too (output within
  // 3.6e-3, gradients within 4.8e-3). A key masked off by one in either pass puts a gradient off by 8e-2 or more.
  // Head sizes: each instantiation.
  // Head size 16 also has 6 rows in no segment after them: those stay zero, where the device otherwise leaves its
  // scratch (lse, Δ, the per-head dk/dv) unzeroed, as the segments then write every row of it.
  for (const [headDim, kvHeads, bf16Inputs] of [[8, 2, true], [16, 1, false], [64, 2, true], [64, 4, false], [128, 2, true], [128, 1, false]] as const) {
    const heads = 4, padding = headDim === 16 ? 6 : 0;
    it(`attention over packed segments with a shared prefix, head size ${headDim}, GQA ${heads}/${kvHeads}, ${bf16Inputs ? "bf16" : "f32"} inputs${padding ? ", rows in no segment" : ""}: output and dq, dk, dv`, () => {
      // a plain sequence, a prompt stored once, two completions reading all of it and one reading its first 40 rows:
      // several query and key tiles, a prefix ending inside a warp's keys
      const segments: PackedSegment[] = [{ start: 0, length: 5 }, { start: 5, length: 70 },
        { start: 75, length: 80, prefix: { start: 5, length: 70 } }, { start: 155, length: 3, prefix: { start: 5, length: 70 } },
        { start: 158, length: 20, prefix: { start: 5, length: 40 } }];
      const rows = 178 + padding, qw = heads * headDim, kw = kvHeads * headDim;
      const inputs = (n: number, seed: number) => (bf16Inputs ? bf16Values(random(n, seed)) : random(n, seed));
      const q = both(inputs(rows * qw, 6), [rows, qw]), k = both(inputs(rows * kw, 7), [rows, kw]), v = both(inputs(rows * kw, 8), [rows, kw]);
      const out = zeros([rows, qw]);
      const saved = [cpu.packedAttention(q[0], k[0], v[0], segments, headDim, out[0]), gpu.packedAttention(q[1], k[1], v[1], segments, headDim, out[1])];
      const dOut = both(inputs(rows * qw, 9), [rows, qw]);
      const dq = zeros([rows, qw]), dk = zeros([rows, kw]), dv = zeros([rows, kw]);
      run((b, i) => b.packedAttentionBackward(q[i], k[i], v[i], out[i], saved[i], segments, headDim, dOut[i], dq[i], dk[i], dv[i]));
      expect(error(out)).toBeLessThan(bf16Inputs ? 2e-3 : 8e-3);
      for (const grad of [dq, dk, dv]) expect(error(grad)).toBeLessThan(bf16Inputs ? 6e-3 : 1e-2);
      for (const [tensor, width] of [[out, qw], [dq, qw], [dk, kw], [dv, kw]] as const) {
        expect(gpu.download(tensor[1]).subarray(178 * width).every((x) => x === 0)).toBe(true);
      }
      // Written, not added (overwrite): into fresh buffers (NaN bytes on the emulated device) the same gradients, and
      // zeros in the rows of no segment.
      const fresh = [[qw, 0], [kw, 1], [kw, 2]].map(([width]) => [cpu.empty([rows, width]), gpu.empty([rows, width])] as [Tensor, Tensor]);
      run((b, i) => b.packedAttentionBackward(q[i], k[i], v[i], out[i], saved[i], segments, headDim, dOut[i], fresh[0][i], fresh[1][i], fresh[2][i], true));
      for (const [j, grad] of [dq, dk, dv].entries()) {
        expect(gpu.download(fresh[j][1])).toEqual(gpu.download(grad[1]));
        expect(cpu.download(fresh[j][0])).toEqual(cpu.download(grad[0]));
      }
      // q, k and v stored as bf16 (attentionInputs: as a training pass keeps them on the GPU) give the same bits as the
      // f32 ones, which the kernels narrow first: output, log-sum-exp and gradients.
      const narrowed = [q, k, v].map(([, t]) => gpu.upload(gpu.download(t), [...t.shape], "bf16"));
      expect(narrowed.map((t) => t.dtype)).toEqual(["bf16", "bf16", "bf16"]);
      const narrowedOut = gpu.empty([rows, qw]);
      const narrowedSaved = gpu.packedAttention(narrowed[0], narrowed[1], narrowed[2], segments, headDim, narrowedOut);
      expect(gpu.download(narrowedOut).subarray(0, 178 * qw)).toEqual(gpu.download(out[1]).subarray(0, 178 * qw));
      expect(gpu.download(narrowedSaved)).toEqual(gpu.download(saved[1]));
      const narrowedGrads = [qw, kw, kw].map((width) => gpu.empty([rows, width]));
      gpu.packedAttentionBackward(narrowed[0], narrowed[1], narrowed[2], out[1], saved[1], segments, headDim, dOut[1], narrowedGrads[0],
        narrowedGrads[1], narrowedGrads[2], true);
      for (const [j, grad] of [dq, dk, dv].entries()) expect(gpu.download(narrowedGrads[j])).toEqual(gpu.download(grad[1]));
      // The dq pass at head size 128 on a device whose blocks hold one buffer of K and V (sm_86/89's 99 KiB), where an
      // H100 takes two: the same arithmetic on another copy schedule, so the same bits.
      if (headDim !== 128) return;
      const device = gpu.context.device, own = device.sharedBytesPerBlock, oneBuffer = [qw, kw, kw].map((width) => gpu.empty([rows, width]));
      try {
        device.sharedBytesPerBlock = 99 * 1024;
        gpu.packedAttentionBackward(q[1], k[1], v[1], out[1], saved[1], segments, headDim, dOut[1], oneBuffer[0], oneBuffer[1], oneBuffer[2], true);
      } finally {
        device.sharedBytesPerBlock = own;
      }
      for (const [j, grad] of [dq, dk, dv].entries()) expect(gpu.download(oneBuffer[j])).toEqual(gpu.download(grad[1]));
    });
  }

  // A training pass's gate/up LoRAs (x Aᵀ kept for the backward, their A rows of one stacked tensor): the CUDA backend
  // adds them in the SwiGLU and again in its backward (swiglu_kept_lora), where the CPU adds them into gateUp first.
  // 70 rows and 300 columns: a partial tile of each; rank 5 and 8; both halves, or up's alone.
  for (const [rank, halves] of [[8, ["gate", "up"]], [5, ["up"]]] as const) {
    it(`swiglu and its backward with a training pass's kept LoRAs, rank ${rank}, ${halves.join(" and ")}: as addLoras first, the x Aᵀ kept`, () => {
      const n = 70, inter = 300, inF = 48;
      const x = both(random(n * inF, 40), [n, inF]), gateUpData = random(n * 2 * inter, 41), gateUp = both(gateUpData, [n, 2 * inter]);
      const a = both(random(halves.length * rank * inF, 42), [halves.length * rank, inF]);
      const bs = halves.map((_, j) => both(random(inter * rank, 43 + j), [inter, rank]));
      const down = zeros([n, halves.length * rank]);
      const loras = (i: 0 | 1) => ({
        x: x[i], targets: halves.map((half, j) => ({
          lora: { a: [cpu, gpu][i].view(a[i], j * rank, rank), b: bs[j][i], scale: 0.75 + j }, out: gateUp[i],
          column: half === "gate" ? 0 : inter, down: { tensor: down[i], column: j * rank } })),
      });
      const out = zeros([n, inter]);
      run((b, i) => b.swiglu(gateUp[i], out[i], loras(i)));
      expect(error(out)).toBeLessThan(1e-5);
      expect(error(down)).toBeLessThan(1e-5);
      // The device left gateUp as it was (its backward adds the LoRAs again); the CPU added them into it.
      expect(gpu.download(gateUp[1])).toEqual(gateUpData);
      expect(relativeError(cpu.download(gateUp[0]), gateUpData)).toBeGreaterThan(1e-3);
      const dOut = both(random(n * inter, 50), [n, inter]);
      const grads = [0, 1].map(() => [cpu.empty([n, inter]), gpu.empty([n, inter])] as Pair);
      run((b, i) => b.swigluBackward(gateUp[i], dOut[i], grads[0][i], grads[1][i], true, loras(i)));
      for (const grad of grads) expect(error(grad)).toBeLessThan(1e-5);
      // Added, not written: the same gradients again on top.
      run((b, i) => b.swigluBackward(gateUp[i], dOut[i], grads[0][i], grads[1][i], false, loras(i)));
      for (const grad of grads) expect(error(grad)).toBeLessThan(1e-5);
    });
  }

  it("swiglu backward, gather of rows and its backward", () => {
    const n = 8, inter = 125;
    const gateUp = both(random(n * 2 * inter, 10), [n, 2 * inter]), dOut = both(random(n * inter, 12), [n, inter]);
    const dGate = both(random(n * inter, 13), [n, inter]), dUp = both(random(n * inter, 14), [n, inter]);
    run((b, i) => b.swigluBackward(gateUp[i], dOut[i], dGate[i], dUp[i]));
    expect(error(dGate)).toBeLessThan(1e-5);
    expect(error(dUp)).toBeLessThan(1e-5);
    // Written, not added: into fresh buffers (NaN bytes on the emulated device) the values alone.
    const fresh = [[cpu.empty([n, inter]), gpu.empty([n, inter])], [cpu.empty([n, inter]), gpu.empty([n, inter])]] as [Tensor, Tensor][];
    run((b, i) => b.swigluBackward(gateUp[i], dOut[i], fresh[0][i], fresh[1][i], true));
    const added = [[cpu.zeros([n, inter]), gpu.zeros([n, inter])], [cpu.zeros([n, inter]), gpu.zeros([n, inter])]] as [Tensor, Tensor][];
    run((b, i) => b.swigluBackward(gateUp[i], dOut[i], added[0][i], added[1][i]));
    for (const j of [0, 1]) {
      expect(error(fresh[j])).toBeLessThan(1e-5);
      expect(cpu.download(fresh[j][0])).toEqual(cpu.download(added[j][0]));
      expect(gpu.download(fresh[j][1])).toEqual(gpu.download(added[j][1]));
    }
    const x = both(random(6 * 10, 15), [6, 10]), picked = zeros([3, 10]), back = both(random(6 * 10, 16), [6, 10]);
    const rows = Int32Array.from([4, 0, 5]);
    run((b, i) => b.gatherRows(x[i], rows, picked[i]));
    expect(error(picked)).toBe(0);
    run((b, i) => b.gatherRowsBackward(rows, picked[i], back[i]));
    expect(error(back)).toBe(0);
  });

  it("a projection's input gradient (f32 and bf16 weights), LoRA forward keeping x·Aᵀ, its backward", () => {
    const rows = 7, inF = 24, outF = 40, rank = 4;
    const x = both(random(rows * inF, 16), [rows, inF]), dOut = both(random(rows * outF, 17), [rows, outF]);
    for (const [dtype, tolerance] of [["f32", 1e-5], ["bf16", 1.5e-2]] as const) {
      const w = both(random(outF * inF, 18, 0.2), [outF, inF], dtype), bias = both(random(outF, 19), [outF]);
      const out = zeros([rows, outF]), dx = both(random(rows * inF, 20), [rows, inF]);
      run((b, i) => b.linear(x[i], w[i], bias[i], out[i]));
      expect(error(out)).toBeLessThan(tolerance);
      const base = (i: 0 | 1) => [{ weight: w[i], dOut: dOut[i], dWeight: null, dBias: null }];
      run((b, i) => b.projectionsBackward(x[i], base(i), dx[i]));
      expect(error(dx)).toBeLessThan(tolerance);
      // Written, not added (overwriteDx): a fresh buffer gets dOut W alone, as a zeroed one would.
      const fresh = [cpu.empty([rows, inF]), gpu.empty([rows, inF])] as [Tensor, Tensor], zeroed = zeros([rows, inF]);
      run((b, i) => b.projectionsBackward(x[i], base(i), fresh[i], true));
      run((b, i) => b.projectionsBackward(x[i], base(i), zeroed[i]));
      expect(error(fresh)).toBeLessThan(tolerance);
      expect(gpu.download(fresh[1])).toEqual(gpu.download(zeroed[1]));
    }
    const w = both(random(outF * inF, 18, 0.2), [outF, inF]);
    const a = both(random(rank * inF, 21, 0.2), [rank, inF]), b = both(random(outF * rank, 22, 0.2), [outF, rank]);
    const lora = (i: 0 | 1) => ({ a: a[i], b: b[i], scale: 2 });
    const out = zeros([rows, outF]), down = zeros([rows, rank]);
    run((backend, i) => {
      backend.linear(x[i], w[i], null, out[i]);
      backend.addLoras(x[i], [{ lora: lora(i), out: out[i], column: 0, down: { tensor: down[i], column: 0 } }]);
    });
    expect(error(out)).toBeLessThan(1e-5);
    expect(error(down)).toBeLessThan(1e-5);
    const dA = both(random(rank * inF, 24), [rank, inF]), dB = both(random(outF * rank, 25), [outF, rank]), dx = zeros([rows, inF]);
    run((backend, i) => backend.projectionsBackward(x[i], [{ weight: w[i], dOut: dOut[i], dWeight: null, dBias: null,
      lora: { weights: lora(i), down: { tensor: down[i], column: 0 }, dA: dA[i], dB: dB[i] } }], dx[i]));
    for (const grad of [dA, dB, dx]) expect(error(grad)).toBeLessThan(1e-5);
  });

  // q/k/v as the engine lays them out (the weights rows of one stacked weight; a LoRA's A matrices and their gradients
  // rows of one tensor, the x·Aᵀ side by side), which CUDA takes as stacked products (with bf16 weights the output
  // gradients side by side in one bf16 operand), and the same in tensors of their own, a projection at a time: both
  // against the CPU, which always goes a projection at a time.
  it("a group of projections reading one input: stacked and separate (f32 and bf16 weights), LoRAs forward and backward", () => {
    const rows = 9, inF = 24, rank = 4, outs = [40, 16, 16], scales = [2, 0.5, 1];
    const x = both(random(rows * inF, 40), [rows, inF]);
    const weightValues = random(40 * inF + 2 * 16 * inF, 41, 0.2), weightRows = outs.map((_, p) => outs.slice(0, p).reduce((a, b) => a + b, 0));
    const dOuts = outs.map((outF, p) => both(random(rows * outF, 44 + p), [rows, outF]));
    const bs = outs.map((outF, p) => both(random(outF * rank, 47 + p, 0.2), [outF, rank]));
    const aValues = random(outs.length * rank * inF, 50, 0.2), dAValues = random(outs.length * rank * inF, 51);
    const dBs = () => outs.map((outF, p) => both(random(outF * rank, 52 + p), [outF, rank]));
    for (const [dtype, tolerance] of [["f32", 1e-5], ["bf16", 1.5e-2]] as const) for (const layout of ["stacked", "separate"] as const) {
      /** Rows first .. first + count − 1 of values [·, inF]: views of one tensor (stacked), or a tensor of their own. */
      const rowsOf = (stacked: Pair, values: Float32Array, first: number, count: number, type: "f32" | "bf16" = "f32"): Pair => layout === "stacked"
        ? [cpu.view(stacked[0], first, count), gpu.view(stacked[1], first, count)]
        : both(values.slice(first * inF, (first + count) * inF), [count, inF], type);
      const stackedW = both(weightValues, [weightValues.length / inF, inF], dtype);
      const weights = outs.map((outF, p) => rowsOf(stackedW, weightValues, weightRows[p], outF, dtype));
      const stackedA = both(aValues, [outs.length * rank, inF]), stackedDA = both(dAValues, [outs.length * rank, inF]);
      const as = outs.map((_, p) => rowsOf(stackedA, aValues, p * rank, rank)), dAs = outs.map((_, p) => rowsOf(stackedDA, dAValues, p * rank, rank));
      const dB = dBs();
      const lora = (p: number, i: 0 | 1) => ({ a: as[p][i], b: bs[p][i], scale: scales[p] });
      const down = zeros([rows, outs.length * rank]), projected = outs.map((outF) => zeros([rows, outF]));
      run((backend, i) => backend.addLoras(x[i], outs.map((_, p) => ({ lora: lora(p, i), out: projected[p][i], column: 0, down: { tensor: down[i], column: p * rank } }))));
      for (const out of projected) expect(error(out)).toBeLessThan(1e-5);
      expect(error(down)).toBeLessThan(1e-5);
      const dx = [cpu.empty([rows, inF]), gpu.empty([rows, inF])] as Pair;
      run((backend, i) => backend.projectionsBackward(x[i], outs.map((_, p) => ({ weight: weights[p][i], dOut: dOuts[p][i], dWeight: null, dBias: null,
        lora: { weights: lora(p, i), down: { tensor: down[i], column: p * rank }, dA: dAs[p][i], dB: dB[p][i] } })), dx[i], true));
      expect(error(dx), `${dtype} ${layout} dx`).toBeLessThan(tolerance);
      // Beside bf16 weights the LoRA's products with dOut read its bf16 copy, with x Aᵀ and B rounded to bf16 too
      // (measured here: dA and dB within 3.4e-3 relative, summing 9 rows; f32 weights: 1.7e-7).
      for (const p of outs.keys()) {
        expect(error(dAs[p]), `${dtype} ${layout} dA ${p}`).toBeLessThan(dtype === "f32" ? 1e-5 : BF16_LORA_GRADIENT_TOLERANCE);
        expect(error(dB[p]), `${dtype} ${layout} dB ${p}`).toBeLessThan(dtype === "f32" ? 1e-5 : BF16_LORA_GRADIENT_TOLERANCE);
      }
    }
  });

  it("target logprobs and their backward (f32 and bf16 LM head, ragged chunks)", () => {
    const rows = 7, dim = 16, vocab = 130, chunks = { rowChunk: 3, vocabChunk: 50 };
    const targets = Int32Array.from([0, 129, 50, 49, 7, 100, 3]);
    const hidden = both(random(rows * dim, 26), [rows, dim]);
    const dLogprobs = Float32Array.from([0.5, -1, 0, 2, 0.25, -0.75, 1]);
    for (const [dtype, tolerance] of [["f32", 1e-5], ["bf16", 1.5e-2]] as const) {
      const head = both(random(vocab * dim, 27), [vocab, dim], dtype);
      const [c, g] = [cpu.targetLogprobs(hidden[0], head[0], targets, chunks), gpu.targetLogprobs(hidden[1], head[1], targets, chunks)];
      // a bf16 head takes the hidden states narrowed to bf16 on the device (the CPU keeps them f32)
      expect(relativeError(c.logprobs, g.logprobs), `${dtype} logprobs`).toBeLessThan(tolerance);
      expect(relativeError(c.entropies, g.entropies), `${dtype} entropies`).toBeLessThan(tolerance);
      const dHidden = both(random(rows * dim, 28), [rows, dim]);
      cpu.targetLogprobsBackward(hidden[0], head[0], targets, c.logsumexp, dLogprobs, dHidden[0], null, chunks);
      gpu.targetLogprobsBackward(hidden[1], head[1], targets, g.logsumexp, dLogprobs, dHidden[1], null, chunks);
      expect(error(dHidden)).toBeLessThan(tolerance);
    }
  });

  it("sum of squares, the AdamW update and zeroing, each over tensors of different sizes in one call", () => {
    const sizes = [1000, 77, 3000];
    const tensors = sizes.map((size, k) => both(random(size, 29 + k), [size]));
    const [c, g] = [cpu.sumOfSquares(tensors.map((t) => t[0])), gpu.sumOfSquares(tensors.map((t) => t[1]))];
    expect(Math.abs(c - g) / c).toBeLessThan(1e-5);
    // Each tensor's own share: a launch that mixed up the tensors' table entries would get these wrong.
    for (const t of tensors) expect(Math.abs(cpu.sumOfSquares([t[0]]) - gpu.sumOfSquares([t[1]])) / cpu.sumOfSquares([t[0]])).toBeLessThan(1e-5);
    const params = sizes.map((size, k) => ({
      value: both(random(size, 31 + k), [size]), grad: tensors[k]!, m: both(random(size, 41 + k, 0.1), [size]),
      v: both(Float32Array.from(random(size, 51 + k), (x) => x * x), [size]),
    }));
    const scalars = { clip: 0.5, learningRate: 1e-2, beta1: 0.9, beta2: 0.99, eps: 1e-8, weightDecay: 0.1, correction1: 1 - 0.9 ** 3, correction2: 1 - 0.99 ** 3 };
    run((b, i) => b.adamw(params.map((p) => ({ value: p.value[i], grad: p.grad[i], m: p.m[i], v: p.v[i] })), scalars));
    for (const p of params) for (const t of [p.value, p.m, p.v]) expect(error(t)).toBeLessThan(1e-6);
    gpu.zero([params[0]!.value[1], params[2]!.m[1]]);
    expect(gpu.download(params[0]!.value[1]).every((x) => x === 0)).toBe(true);
    expect(gpu.download(params[2]!.m[1]).every((x) => x === 0)).toBe(true);
    expect(gpu.download(params[1]!.value[1]).some((x) => x !== 0)).toBe(true); // not in the list: untouched
  });

  /** The same rank-2 LoRA on all projections of the CPU's and the device's model, B ≠ 0 (seeded from `seed`) so that every A gradient is nonzero too. */
  function loraPair(onCpu: Transformer, onGpu: Transformer, seed: number): [DifferentiableTransformer, DifferentiableTransformer] {
    const lora = { rank: 2, alpha: 4, targetModules: [...PROJECTIONS], useRslora: false };
    const models: [DifferentiableTransformer, DifferentiableTransformer] = [new DifferentiableTransformer(onCpu, { lora, seed: 3 }), new DifferentiableTransformer(onGpu, { lora, seed: 3 })];
    models[0].loras.forEach((p, i) => {
      const b = Float32Array.from(random(p.b.tensor.size, seed + i, 0.3));
      cpu.write(p.b.tensor, b);
      gpu.write(models[1].loras[i].b.tensor, b);
    });
    return models;
  }

  for (const arch of ARCHITECTURES) {
    it(`${arch} tiny checkpoint: the whole LoRA pass (logprobs, every gradient), an AdamW step, the sampler's view and a PEFT save/load equal the CPU's`, () => {
      const { transformer: onCpu, dir } = loadTinyModel(arch);
      const onGpu = loadTransformer(dir, gpu, "f32");
      const models = loraPair(onCpu, onGpu, 40);
      // two completions sharing a prompt (packed once) and a plain sequence; advantages of both signs
      const sequence = (tokens: number[], promptLength: number, advantage: number, trajectory: number): TrainingSequence => ({
        tokens, trainable: Uint8Array.from(tokens, (_, t) => (t >= promptLength ? 1 : 0)), logprobs: new Float32Array(tokens.length).fill(NaN), advantage, trajectory,
      });
      const sequences = [sequence([1, 5, 9, 2, 7, 3], 3, 1, 0), sequence([1, 5, 9, 4, 4], 3, -1, 1), sequence([6, 2, 8, 11, 3, 19, 0], 2, 0.5, 2)];
      const trainers = models.map((model) => new Trainer(model, { learningRate: 1e-2, microBatchSize: 3 }));
      const [c, g] = trainers.map((trainer) => trainer.computeGradients(sequences));
      // The device's attention runs in bf16 (q, k, v, dout, the probabilities and dS rounded; measured on these
      // checkpoints: the CISPO loss, −Σ A·logp here, within 1.9e-3 relative, entropy within 3.7e-3, every LoRA
      // gradient within 4.2e-2 relative, the gradient norm within 1.3e-3).
      expect(Math.abs(c.loss - g.loss)).toBeLessThan(5e-3 * Math.max(1, Math.abs(c.loss)));
      expect(Math.abs(c.entropy - g.entropy)).toBeLessThan(1e-2);
      for (const [name, grad] of c.gradients) expect(relativeError(grad, g.gradients.get(name)!), name).toBeLessThan(8e-2);
      const before = models[1].parameterTensors().map((p) => gpu.download(p.value));
      const [stepC, stepG] = trainers.map((trainer) => trainer.trainStep(sequences));
      expect(Math.abs(stepC.gradNorm - stepG.gradNorm) / stepC.gradNorm).toBeLessThan(3e-3);
      // The device's AdamW step is what the CPU's AdamW makes of the device's own parameters and gradients. (Between
      // the backends the first step can differ by the learning rate: it moves each parameter by about that along its
      // gradient's sign, which bf16 may flip for a gradient near zero.)
      const { beta1, beta2, adamEps: eps, weightDecay, maxGradNorm, learningRate } = trainers[1].config;
      const expected = models[1].parameterTensors().map((p, i) => ({ name: p.name, shape: p.shape, value: cpu.upload(Float32Array.from(before[i]), p.shape),
        grad: cpu.upload(Float32Array.from(g.gradients.get(p.name)!), p.shape) }));
      adamwStep(cpu, expected, createAdamWState(), { learningRate, beta1, beta2, eps, weightDecay, maxGradNorm });
      models[1].parameterTensors().forEach((p, i) => expect(relativeError(cpu.download(expected[i].value), gpu.download(p.value)), p.name).toBeLessThan(1e-6));
      // The sampler reads the trained adapter tensors themselves: the device's engine with them gives the CPU engine's
      // logits with the same values (to the device's bf16 KV cache), and differs from the base model by far more.
      const ids = [1, 5, 9, 2, 7, 3, 11];
      const trainedOnCpu = models[1].engineLoras().map((layer) => Object.fromEntries(Object.entries(layer).map(([name, lora]) =>
        [name, { a: cpu.upload(gpu.download(lora.a), lora.a.shape), b: cpu.upload(gpu.download(lora.b), lora.b.shape), scale: lora.scale }])));
      const adapted = sequenceLogits(onCpu, ids, trainedOnCpu);
      expect(relativeError(adapted, sequenceLogits(onGpu, ids, models[1].engineLoras()))).toBeLessThan(1e-2);
      expect(relativeError(adapted, sequenceLogits(onCpu, ids))).toBeGreaterThan(5e-2);
      // A CUDA-trained adapter saves as PEFT and loads back (onto CUDA) with the same values.
      const adapterDir = mkdtempSync(join(tmpdir(), "art-cuda-adapter-"));
      const trained = models[1].parameterTensors().map((p) => gpu.download(p.value));
      models[1].saveAdapter(adapterDir);
      const reloaded = new DifferentiableTransformer(onGpu, { lora: null, adapter: readAdapter(adapterDir, onGpu.config) });
      reloaded.parameterTensors().forEach((p, i) => expect(gpu.download(p.value)).toEqual(trained[i]));
      rmSync(adapterDir, { recursive: true, force: true });
      onGpu.free();
    });
  }

  // Every weight trained (lora: null), on fresh f32 copies of the checkpoint on both backends, since the step
  // updates the weights in place.
  for (const arch of ARCHITECTURES) {
    it(`${arch} tiny checkpoint: a full-parameter pass (every weight's gradient) and an AdamW step equal the CPU's`, () => {
      const { dir } = loadTinyModel(arch);
      const [onCpu, onGpu] = [loadTransformer(dir, cpu, "f32"), loadTransformer(dir, gpu, "f32")];
      const models = [onCpu, onGpu].map((t) => new DifferentiableTransformer(t, { lora: null }));
      const tokens = [1, 5, 9, 2, 7, 3, 11, 4, 8, 6, 2, 9];
      const sequences: TrainingSequence[] = [0, 1].map((s) => ({ tokens: tokens.map((t) => (t + 3 * s) % 20), trainable: Uint8Array.from(tokens, (_, t) => (t >= 4 ? 1 : 0)),
        logprobs: new Float32Array(tokens.length).fill(NaN), advantage: s === 0 ? 1 : -0.5, trajectory: s }));
      const trainers = models.map((model) => new Trainer(model, { lora: null, learningRate: 1e-3, microBatchSize: 2 }));
      const [c, g] = trainers.map((trainer) => trainer.computeGradients(sequences));
      // The device's attention runs in bf16 (measured on these checkpoints: the loss within 1.4e-3 relative, every
      // gradient within 4.9e-2, the norm weights' the furthest: each sums over every row).
      expect(Math.abs(c.loss - g.loss)).toBeLessThan(5e-3 * Math.max(1, Math.abs(c.loss)));
      expect([...g.gradients.keys()]).toEqual([...c.gradients.keys()]);
      for (const [name, grad] of c.gradients) {
        expect(relativeError(grad, g.gradients.get(name)!), name).toBeLessThan(8e-2);
        expect(grad.some((x) => x !== 0), name).toBe(true);
      }
      // The step moves every weight on the device as the CPU's AdamW moves the device's own weights by its gradients.
      const before = models[1].parameterTensors().map((p) => gpu.download(p.value));
      trainers[1].trainStep(sequences);
      const { beta1, beta2, adamEps: eps, weightDecay, maxGradNorm, learningRate } = trainers[1].config;
      const expected = models[1].parameterTensors().map((p, i) => ({ name: p.name, shape: p.shape, value: cpu.upload(Float32Array.from(before[i]), p.shape),
        grad: cpu.upload(Float32Array.from(gpu.download(p.grad)), p.shape) }));
      adamwStep(cpu, expected, createAdamWState(), { learningRate, beta1, beta2, eps, weightDecay, maxGradNorm });
      models[1].parameterTensors().forEach((p, i) => {
        expect(relativeError(cpu.download(expected[i].value), gpu.download(p.value)), p.name).toBeLessThan(1e-6);
        expect(gpu.download(p.value), p.name).not.toEqual(before[i]);
      });
      onCpu.free();
      onGpu.free();
    });
  }

  // bf16 base weights on both (the CPU rounds them alike): the device then narrows every product's activation operand
  // to bf16, writes the residual stream's gradient in bf16 beside it (rmsNormBackward), merges q/k/v's and gate/up's
  // output gradients into one bf16 operand and takes each group's input gradient in one product.
  it("qwen2 tiny checkpoint with bf16 weights: the whole LoRA pass's loss and every LoRA gradient near the CPU's", () => {
    const { dir } = loadTinyModel("qwen2");
    const [onCpu, onGpu] = [loadTransformer(dir, cpu, "bf16"), loadTransformer(dir, gpu, "bf16")];
    const models = loraPair(onCpu, onGpu, 60);
    const tokens = [1, 5, 9, 2, 7, 3, 11, 4, 8, 6, 2, 9];
    const sequences: TrainingSequence[] = [0, 1].map((s) => ({ tokens: tokens.map((t) => (t + 3 * s) % 20), trainable: Uint8Array.from(tokens, (_, t) => (t >= 4 ? 1 : 0)),
      logprobs: new Float32Array(tokens.length).fill(NaN), advantage: s === 0 ? 1 : -0.5, trajectory: s }));
    const [c, g] = models.map((model) => new Trainer(model, { learningRate: 1e-2, microBatchSize: 2 }).computeGradients(sequences));
    // Measured on the emulator: the loss within 1.6e-5 relative, every LoRA gradient within 1.0e-2.
    expect(Math.abs(c.loss - g.loss)).toBeLessThan(1e-4 * Math.max(1, Math.abs(c.loss)));
    for (const [name, grad] of c.gradients) expect(relativeError(grad, g.gradients.get(name)!), name).toBeLessThan(5e-2);
    for (const model of models) model.free();
    onGpu.free();
  });
});
}
