/**
 * Fused, chunked logprobs: the logprob of each row's target token (and the entropy of its distribution)
 * straight from the final hidden states and the LM head, without ever holding [rows × vocab] logits.
 *
 * Rows are taken `rowChunk` at a time and the vocabulary `vocabChunk` at a time; only one
 * [rowChunk × vocabChunk] block of logits exists at once. Per row an online log-sum-exp keeps the running
 * max m, s = Σ e^(z−m) and u = Σ e^(z−m)·z, so that logsumexp = m + ln s and entropy = logsumexp − u/s.
 * The backward recomputes each block (cheaper than storing it) and needs only the saved logsumexp.
 * `fastExp` (the WebAssembly kernels', CpuBackendOptions.elementwise) computes a row's exponentials in f32 four at a time; without it
 * each is Math.exp in float64, the portable reference.
 */
import type { ChunkSizes, TokenLogprobs } from "../backend.ts";
import type { Gemm } from "./gemm.ts";
import type { WasmElementwise } from "./wasm-elementwise.ts";

/** logits block [rc × vc] = hidden[r0..r0+rc] · head[v0..v0+vc]ᵀ */
function logitBlock(
  gemm: Gemm, block: Float32Array, hidden: Float32Array, head: Float32Array, r0: number, rc: number, v0: number, vc: number, dim: number,
): void {
  gemm.nt(hidden.subarray(r0 * dim, (r0 + rc) * dim), head.subarray(v0 * dim, (v0 + vc) * dim), rc, dim, vc, block);
}

export function chunkedLogprobs(
  gemm: Gemm, fastExp: WasmElementwise | null, hidden: Float32Array, head: Float32Array, targets: ArrayLike<number>, dim: number, vocab: number,
  chunks: ChunkSizes,
): TokenLogprobs {
  const rows = targets.length;
  const logprobs = new Float32Array(rows);
  const entropies = new Float32Array(rows);
  const logsumexp = new Float32Array(rows);
  const block = new Float32Array(chunks.rowChunk * chunks.vocabChunk);
  const exps = new Float32Array(fastExp ? chunks.vocabChunk : 0);
  for (let r0 = 0; r0 < rows; r0 += chunks.rowChunk) {
    const rc = Math.min(chunks.rowChunk, rows - r0);
    const max = new Float64Array(rc).fill(-Infinity);
    const sum = new Float64Array(rc);
    const sumZ = new Float64Array(rc);
    const targetLogit = new Float64Array(rc).fill(NaN);
    for (let v0 = 0; v0 < vocab; v0 += chunks.vocabChunk) {
      const vc = Math.min(chunks.vocabChunk, vocab - v0);
      logitBlock(gemm, block, hidden, head, r0, rc, v0, vc, dim);
      for (let r = 0; r < rc; r++) {
        const off = r * vc;
        let m = max[r];
        for (let v = 0; v < vc; v++) if (block[off + v] > m) m = block[off + v];
        // rescale the running sums to the new max before adding this block
        const rescale = Math.exp(max[r] - m);
        let s = sum[r] * rescale;
        let u = sumZ[r] * rescale;
        fastExp?.expShifted(block.subarray(off, off + vc), m, exps);
        for (let v = 0; v < vc; v++) {
          const z = block[off + v];
          const e = fastExp ? exps[v] : Math.exp(z - m);
          s += e;
          u += e * z;
        }
        max[r] = m;
        sum[r] = s;
        sumZ[r] = u;
        const target = targets[r0 + r];
        if (target >= v0 && target < v0 + vc) targetLogit[r] = block[off + target - v0];
      }
    }
    for (let r = 0; r < rc; r++) {
      const lse = max[r] + Math.log(sum[r]);
      logsumexp[r0 + r] = lse;
      entropies[r0 + r] = lse - sumZ[r] / sum[r];
      logprobs[r0 + r] = targets[r0 + r] >= 0 ? targetLogit[r] - lse : NaN;
    }
  }
  return { logprobs, entropies, logsumexp };
}

/**
 * Backward of the target logprobs: with g = dLogprobs[row], dz = g · (onehot(target) − softmax(z)).
 * dHidden += dz · head; dHead += dzᵀ · hidden (skipped when dHead is null, i.e. a frozen LM head).
 * Rows whose gradient is 0 cost nothing.
 */
export function chunkedLogprobsBackward(
  gemm: Gemm, fastExp: WasmElementwise | null, dHidden: Float32Array, dHead: Float32Array | null, dLogprobs: Float32Array,
  hidden: Float32Array, head: Float32Array, targets: ArrayLike<number>, logsumexp: Float32Array,
  dim: number, vocab: number, chunks: ChunkSizes,
): void {
  const active: number[] = [];
  for (let r = 0; r < targets.length; r++) if (dLogprobs[r] !== 0 && targets[r] >= 0) active.push(r);
  const rowChunk = chunks.rowChunk;
  const block = new Float32Array(rowChunk * chunks.vocabChunk);
  const packedHidden = new Float32Array(rowChunk * dim);
  const packedDHidden = new Float32Array(rowChunk * dim);
  for (let c0 = 0; c0 < active.length; c0 += rowChunk) {
    const rc = Math.min(rowChunk, active.length - c0);
    for (let r = 0; r < rc; r++) packedHidden.set(hidden.subarray(active[c0 + r] * dim, active[c0 + r] * dim + dim), r * dim);
    packedDHidden.fill(0);
    for (let v0 = 0; v0 < vocab; v0 += chunks.vocabChunk) {
      const vc = Math.min(chunks.vocabChunk, vocab - v0);
      logitBlock(gemm, block, packedHidden, head, 0, rc, v0, vc, dim);
      for (let r = 0; r < rc; r++) {
        const row = active[c0 + r];
        const g = dLogprobs[row];
        const lse = logsumexp[row];
        const target = targets[row];
        const off = r * vc;
        fastExp?.expShifted(block.subarray(off, off + vc), lse, block.subarray(off, off + vc));
        for (let v = 0; v < vc; v++) {
          const p = fastExp ? block[off + v] : Math.exp(block[off + v] - lse);
          block[off + v] = g * ((v0 + v === target ? 1 : 0) - p);
        }
      }
      const dz = block.subarray(0, rc * vc);
      gemm.nnAccumulate(packedDHidden, dz, head.subarray(v0 * dim, (v0 + vc) * dim), rc, vc, dim);
      if (dHead !== null) gemm.tnAccumulate(dHead.subarray(v0 * dim, (v0 + vc) * dim), dz, packedHidden, rc, vc, dim);
    }
    for (let r = 0; r < rc; r++) {
      const dOff = active[c0 + r] * dim;
      for (let i = 0; i < dim; i++) dHidden[dOff + i] += packedDHidden[r * dim + i];
    }
  }
}
