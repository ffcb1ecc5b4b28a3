/**
 * TrainingOps on the CPU: CpuTensors (the engine's own Float32Arrays) handed to the readable kernels of ops.ts and
 * logprobs.ts. This is the reference a device implementation is checked against.
 */
import { ArtError } from "../core/errors.ts";
import { shapeSize, type Tensor } from "../model/backend.ts";
import { CpuTensor } from "../model/cpu/backend.ts";
import { chunkedLogprobs, chunkedLogprobsBackward, type ChunkSizes, DEFAULT_CHUNKS, type TokenLogprobs } from "./logprobs.ts";
import {
  adamwUpdate, attentionBackward, attentionForward, embeddingBackward, embeddingForward, linearBackward, linearForward,
  loraBackward, loraForward, rmsnormBackward, rmsnormForward, ropeApply, ropeTables, sumOfSquares, swigluBackward,
  swigluForward,
} from "./ops.ts";
import type { AdamWScalars, AttentionSegment, AttentionShape, RopeTensors, TrainingOps } from "./training-ops.ts";

function data(tensor: Tensor): Float32Array {
  if (!(tensor instanceof CpuTensor)) throw new ArtError("wrong_backend", "a tensor from another backend was passed to the CPU training ops");
  return tensor.data;
}

function optional(tensor: Tensor | null): Float32Array | null {
  return tensor === null ? null : data(tensor);
}

/** K or V rows a segment attends to: its own rows, behind a copy of its prefix's rows when it has one. */
function segmentKeys(x: Float32Array, segment: AttentionSegment, width: number): Float32Array {
  const own = x.subarray(segment.start * width, (segment.start + segment.length) * width);
  if (!segment.prefix) return own;
  const { start, length } = segment.prefix;
  const keys = new Float32Array((length + segment.length) * width);
  keys.set(x.subarray(start * width, (start + length) * width));
  keys.set(own, length * width);
  return keys;
}

/** Adds a segment's key gradients back to the rows they came from (the prefix's rows and its own). */
function scatterKeyGradients(dx: Float32Array, dKeys: Float32Array, segment: AttentionSegment, width: number): void {
  const prefixLength = segment.prefix?.length ?? 0;
  const add = (rowStart: number, from: number, rows: number) => {
    for (let i = 0; i < rows * width; i++) dx[rowStart * width + i] += dKeys[from * width + i];
  };
  if (segment.prefix) add(segment.prefix.start, 0, prefixLength);
  add(segment.start, prefixLength, segment.length);
}

/** Keys a segment's queries see. */
function keyLength(segment: AttentionSegment): number {
  return segment.length + (segment.prefix?.length ?? 0);
}

export class CpuTrainingOps implements TrainingOps {
  readonly name = "cpu" as const;
  readonly fullParameter = true;
  readonly logitChunks = DEFAULT_CHUNKS;

  owns(tensor: Tensor): boolean {
    return tensor instanceof CpuTensor;
  }

  zeros(shape: readonly number[]): Tensor {
    return new CpuTensor([...shape], "f32", new Float32Array(shapeSize(shape)));
  }

  upload(values: Float32Array, shape: readonly number[]): Tensor {
    if (values.length !== shapeSize(shape)) throw new ArtError("wrong_shape", `cpu training ops: ${values.length} values cannot fill shape [${shape}]`);
    return new CpuTensor([...shape], "f32", values);
  }

  download(tensor: Tensor): Float32Array {
    return data(tensor).slice();
  }

  write(tensor: Tensor, values: Float32Array): void {
    data(tensor).set(values);
  }

  zero(tensor: Tensor): void {
    data(tensor).fill(0);
  }

  free(tensor: Tensor): void {
    (tensor as CpuTensor).data = new Float32Array(0);
  }

  copy(x: Tensor): Tensor {
    return new CpuTensor(x.shape, "f32", Float32Array.from(data(x)));
  }

  add(out: Tensor, a: Tensor, b: Tensor): void {
    const o = data(out), x = data(a), y = data(b);
    for (let i = 0; i < o.length; i++) o[i] = x[i] + y[i];
  }

  gatherRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void {
    const o = data(out), xs = data(x);
    rows.forEach((row, i) => o.set(xs.subarray(row * width, row * width + width), i * width));
  }

  scatterRows(out: Tensor, x: Tensor, rows: Int32Array, width: number): void {
    const o = data(out), xs = data(x);
    rows.forEach((row, i) => o.set(xs.subarray(i * width, i * width + width), row * width));
  }

  embedding(out: Tensor, table: Tensor, ids: Int32Array, dim: number): void {
    embeddingForward(data(out), data(table), ids, dim);
  }

  embeddingBackward(dTable: Tensor, dOut: Tensor, ids: Int32Array, dim: number): void {
    embeddingBackward(data(dTable), data(dOut), ids, dim);
  }

  linear(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | null, rows: number, inFeatures: number, outFeatures: number): void {
    linearForward(data(out), data(x), data(weight), optional(bias), rows, inFeatures, outFeatures);
  }

  linearBackward(dx: Tensor | null, dWeight: Tensor | null, dBias: Tensor | null, dOut: Tensor, x: Tensor, weight: Tensor,
    rows: number, inFeatures: number, outFeatures: number): void {
    linearBackward(optional(dx), optional(dWeight), optional(dBias), data(dOut), data(x), data(weight), rows, inFeatures, outFeatures);
  }

  loraForward(out: Tensor, xa: Tensor, x: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void {
    loraForward(data(out), data(xa), data(x), data(a), data(b), scale, rows, inFeatures, outFeatures, rank);
  }

  loraBackward(dx: Tensor | null, dA: Tensor, dB: Tensor, dOut: Tensor, x: Tensor, xa: Tensor, a: Tensor, b: Tensor, scale: number,
    rows: number, inFeatures: number, outFeatures: number, rank: number): void {
    loraBackward(optional(dx), data(dA), data(dB), data(dOut), data(x), data(xa), data(a), data(b), scale, rows, inFeatures, outFeatures, rank);
  }

  rmsnorm(out: Tensor, rstd: Tensor, x: Tensor, weight: Tensor, rows: number, dim: number, eps: number): void {
    rmsnormForward(data(out), data(rstd), data(x), data(weight), rows, dim, eps);
  }

  rmsnormBackward(dx: Tensor, dWeight: Tensor | null, dOut: Tensor, x: Tensor, rstd: Tensor, weight: Tensor, rows: number, dim: number): void {
    rmsnormBackward(data(dx), optional(dWeight), data(dOut), data(x), data(rstd), data(weight), rows, dim);
  }

  ropeTables(positions: Int32Array, inverseFrequencies: Float32Array): RopeTensors {
    const { cos, sin, half } = ropeTables(positions, inverseFrequencies);
    return { cos: this.upload(cos, [positions.length, half]), sin: this.upload(sin, [positions.length, half]), half };
  }

  rope(x: Tensor, tables: RopeTensors, rows: number, heads: number, inverse: boolean): void {
    ropeApply(data(x), { cos: data(tables.cos), sin: data(tables.sin), half: tables.half }, rows, heads, inverse);
  }

  /** Saves the softmax probabilities: per segment [heads, length, keys], segments one after another. */
  attention(out: Tensor, q: Tensor, k: Tensor, v: Tensor, segments: readonly AttentionSegment[], shape: AttentionShape): Tensor {
    const { heads: h, kvHeads: kv, headDim: hd } = shape;
    const saved = new Float32Array(segments.reduce((total, s) => total + h * s.length * keyLength(s), 0));
    const o = data(out), qs = data(q), ks = data(k), vs = data(v);
    let offset = 0;
    for (const segment of segments) {
      const { start, length } = segment;
      const keyLen = keyLength(segment);
      const probs = saved.subarray(offset, offset + h * length * keyLen);
      attentionForward(o.subarray(start * h * hd, (start + length) * h * hd), probs, qs.subarray(start * h * hd, (start + length) * h * hd),
        segmentKeys(ks, segment, kv * hd), segmentKeys(vs, segment, kv * hd), length, keyLen, h, kv, hd);
      offset += probs.length;
    }
    return new CpuTensor([saved.length], "f32", saved);
  }

  attentionBackward(dq: Tensor, dk: Tensor, dv: Tensor, dOut: Tensor, saved: Tensor, q: Tensor, k: Tensor, v: Tensor,
    segments: readonly AttentionSegment[], shape: AttentionShape): void {
    const { heads: h, kvHeads: kv, headDim: hd } = shape;
    const dqs = data(dq), dks = data(dk), dvs = data(dv), dOuts = data(dOut), probs = data(saved), qs = data(q), ks = data(k), vs = data(v);
    let offset = 0;
    for (const segment of segments) {
      const { start, length } = segment;
      const rowsOf = (x: Float32Array) => x.subarray(start * h * hd, (start + length) * h * hd);
      const keyLen = keyLength(segment);
      const dKeys = new Float32Array(keyLen * kv * hd);
      const dValues = new Float32Array(keyLen * kv * hd);
      const size = h * length * keyLen;
      attentionBackward(rowsOf(dqs), dKeys, dValues, rowsOf(dOuts), probs.subarray(offset, offset + size), rowsOf(qs),
        segmentKeys(ks, segment, kv * hd), segmentKeys(vs, segment, kv * hd), length, keyLen, h, kv, hd);
      scatterKeyGradients(dks, dKeys, segment, kv * hd);
      scatterKeyGradients(dvs, dValues, segment, kv * hd);
      offset += size;
    }
  }

  swiglu(out: Tensor, gate: Tensor, up: Tensor, size: number): void {
    swigluForward(data(out), data(gate), data(up), size);
  }

  swigluBackward(dGate: Tensor, dUp: Tensor, dOut: Tensor, gate: Tensor, up: Tensor, size: number): void {
    swigluBackward(data(dGate), data(dUp), data(dOut), data(gate), data(up), size);
  }

  logprobs(hidden: Tensor, head: Tensor, targets: Int32Array, dim: number, vocab: number, chunks: ChunkSizes): TokenLogprobs {
    return chunkedLogprobs(data(hidden), data(head), targets, dim, vocab, chunks);
  }

  logprobsBackward(dHidden: Tensor, dHead: Tensor | null, dLogprobs: Float32Array, hidden: Tensor, head: Tensor,
    targets: Int32Array, logsumexp: Float32Array, dim: number, vocab: number, chunks: ChunkSizes): void {
    chunkedLogprobsBackward(data(dHidden), optional(dHead), dLogprobs, data(hidden), data(head), targets, logsumexp, dim, vocab, chunks);
  }

  sumOfSquares(tensors: readonly Tensor[]): number {
    return sumOfSquares(tensors.map(data));
  }

  adamw(value: Tensor, grad: Tensor, m: Tensor, v: Tensor, scalars: AdamWScalars): void {
    adamwUpdate(data(value), data(grad), data(m), data(v), scalars);
  }
}

/** The one CPU instance (it holds no state). */
export const cpuTrainingOps = new CpuTrainingOps();
