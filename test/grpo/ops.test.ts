import { describe, expect, it } from "vitest";
import {
  attentionBackward, attentionForward, embeddingBackward, embeddingForward, linearBackward, linearForward,
  loraBackward, loraForward, rmsnormBackward, rmsnormForward, ropeApply, ropeTables, swigluBackward, swigluForward,
} from "../../lib/grpo/ops.ts";
import { chunkedLogprobs, chunkedLogprobsBackward } from "../../lib/grpo/logprobs.ts";
import { dotLoss, finiteDifferences, loadFixture, relativeError } from "./check.ts";

interface Case {
  inputs: Record<string, number[]>; upstream: number[]; output: number[]; grads: Record<string, number[]>;
  [extra: string]: unknown;
}
const fixtures = loadFixture<Record<string, Case>>("ops.json");
const TOLERANCE = 1e-3;

/**
 * Checks one op three ways: forward against PyTorch, backward against PyTorch autograd, backward against
 * finite differences of our own forward. `forward` returns the output; `backward` returns grads by input name.
 */
function checkOp(
  name: string,
  forward: (inputs: Record<string, Float32Array>) => Float32Array,
  backward: (inputs: Record<string, Float32Array>, upstream: Float32Array) => Record<string, Float32Array>,
): void {
  const fixture = fixtures[name];
  const inputs = Object.fromEntries(Object.entries(fixture.inputs).map(([k, v]) => [k, Float32Array.from(v)]));
  const upstream = Float32Array.from(fixture.upstream);
  expect(relativeError(forward(inputs), fixture.output), `${name} forward`).toBeLessThan(TOLERANCE);
  const grads = backward(inputs, upstream);
  for (const [input, expected] of Object.entries(fixture.grads)) {
    expect(relativeError(grads[input], expected), `${name} d${input} vs PyTorch`).toBeLessThan(TOLERANCE);
    const numeric = finiteDifferences(inputs[input], () => dotLoss(forward(inputs), upstream));
    expect(relativeError(grads[input], numeric), `${name} d${input} vs finite differences`).toBeLessThan(TOLERANCE);
  }
}

const zeros = (a: Float32Array) => new Float32Array(a.length);

describe("training kernels match PyTorch autograd and finite differences", () => {
  it("linear with bias", () => {
    const [rows, fin, fout] = [5, 6, 7];
    checkOp("linear", ({ x, weight, bias }) => {
      const out = new Float32Array(rows * fout);
      linearForward(out, x, weight, bias, rows, fin, fout);
      return out;
    }, ({ x, weight, bias }, up) => {
      const g = { x: zeros(x), weight: zeros(weight), bias: zeros(bias) };
      linearBackward(g.x, g.weight, g.bias, up, x, weight, rows, fin, fout);
      return g;
    });
  });

  it("LoRA (rsLoRA scale) on a frozen linear: dA, dB and dx", () => {
    const [rows, fin, fout, rank] = [5, 6, 7, 3];
    const scale = fixtures.lora.scale as number;
    const forward = ({ x, weight, a, b }: Record<string, Float32Array>) => {
      const out = new Float32Array(rows * fout);
      linearForward(out, x, weight, null, rows, fin, fout);
      loraForward(out, new Float32Array(rows * rank), x, a, b, scale, rows, fin, fout, rank);
      return out;
    };
    checkOp("lora", forward, ({ x, weight, a, b }, up) => {
      const g = { x: zeros(x), weight: zeros(weight), a: zeros(a), b: zeros(b) };
      const xa = new Float32Array(rows * rank);
      loraForward(new Float32Array(rows * fout), xa, x, a, b, scale, rows, fin, fout, rank);
      linearBackward(g.x, g.weight, null, up, x, weight, rows, fin, fout);
      loraBackward(g.x, g.a, g.b, up, x, xa, a, b, scale, rows, fin, fout, rank);
      return g;
    });
  });

  it("RMSNorm", () => {
    const [rows, dim] = [5, 6];
    const eps = fixtures.rmsnorm.eps as number;
    checkOp("rmsnorm", ({ x, weight }) => {
      const out = new Float32Array(rows * dim);
      rmsnormForward(out, new Float32Array(rows), x, weight, rows, dim, eps);
      return out;
    }, ({ x, weight }, up) => {
      const rstd = new Float32Array(rows);
      rmsnormForward(new Float32Array(rows * dim), rstd, x, weight, rows, dim, eps);
      const g = { x: zeros(x), weight: zeros(weight) };
      rmsnormBackward(g.x, g.weight, up, x, rstd, weight, rows, dim);
      return g;
    });
  });

  it("RoPE (half split, arbitrary positions)", () => {
    const [rows, heads, headDim] = [5, 4, 6];
    const invFreq = Float64Array.from({ length: headDim / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / headDim));
    const tables = ropeTables(fixtures.rope.positions as number[], invFreq);
    checkOp("rope", ({ x }) => {
      const out = Float32Array.from(x);
      ropeApply(out, tables, rows, heads);
      return out;
    }, (_inputs, up) => {
      const dx = Float32Array.from(up);
      ropeApply(dx, tables, rows, heads, true);
      return { x: dx };
    });
  });

  it("causal grouped-query attention (4 query heads over 2 kv heads)", () => {
    const { heads, kvHeads, headDim, len } = fixtures.attention as unknown as Record<string, number>;
    checkOp("attention", ({ q, k, v }) => {
      const out = new Float32Array(len * heads * headDim);
      attentionForward(out, new Float32Array(heads * len * len), q, k, v, len, len, heads, kvHeads, headDim);
      return out;
    }, ({ q, k, v }, up) => {
      const probs = new Float32Array(heads * len * len);
      attentionForward(new Float32Array(len * heads * headDim), probs, q, k, v, len, len, heads, kvHeads, headDim);
      const g = { q: zeros(q), k: zeros(k), v: zeros(v) };
      attentionBackward(g.q, g.k, g.v, up, probs, q, k, v, len, len, heads, kvHeads, headDim);
      return g;
    });
  });

  it("attention over several query blocks and a shared prefix (keyLen > queryLen) equals a float64 reference, forward and backward", () => {
    const heads = 4, kvHeads = 2, headDim = 8, group = heads / kvHeads;
    let seed = 7;
    const random = (n: number) => Float32Array.from({ length: n }, () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5) * 2);
    for (const [queryLen, keyLen] of [[70, 70], [45, 83]]) {
      const offset = keyLen - queryLen, qStride = heads * headDim, kvStride = kvHeads * headDim;
      const q = random(queryLen * qStride), k = random(keyLen * kvStride), v = random(keyLen * kvStride), dout = random(queryLen * qStride);
      // Reference: one (query, head) at a time, in float64.
      const out64 = new Float64Array(q.length), dq64 = new Float64Array(q.length), dk64 = new Float64Array(k.length), dv64 = new Float64Array(v.length);
      for (let h = 0; h < heads; h++) {
        const kv = Math.floor(h / group) * headDim;
        for (let t = 0; t < queryLen; t++) {
          const qAt = t * qStride + h * headDim, seen = offset + t + 1;
          const dot = (a: Float32Array, aAt: number, b: Float32Array, bAt: number) => {
            let sum = 0;
            for (let j = 0; j < headDim; j++) sum += a[aAt + j] * b[bAt + j];
            return sum;
          };
          const scores = Array.from({ length: seen }, (_, s) => dot(q, qAt, k, s * kvStride + kv) / Math.sqrt(headDim));
          const max = Math.max(...scores), e = scores.map((x) => Math.exp(x - max)), z = e.reduce((a, b) => a + b, 0);
          const p = e.map((x) => x / z);
          const dp = Array.from({ length: seen }, (_, s) => dot(dout, qAt, v, s * kvStride + kv));
          const weighted = p.reduce((a, x, s) => a + x * dp[s], 0);
          for (let s = 0; s < seen; s++) {
            const ds = (p[s] * (dp[s] - weighted)) / Math.sqrt(headDim);
            for (let j = 0; j < headDim; j++) {
              out64[qAt + j] += p[s] * v[s * kvStride + kv + j];
              dq64[qAt + j] += ds * k[s * kvStride + kv + j];
              dk64[s * kvStride + kv + j] += ds * q[qAt + j];
              dv64[s * kvStride + kv + j] += p[s] * dout[qAt + j];
            }
          }
        }
      }
      const out = new Float32Array(q.length), probs = new Float32Array(heads * queryLen * keyLen);
      attentionForward(out, probs, q, k, v, queryLen, keyLen, heads, kvHeads, headDim);
      const g = { q: new Float32Array(q.length).fill(1), k: new Float32Array(k.length).fill(1), v: new Float32Array(v.length).fill(1) };
      attentionBackward(g.q, g.k, g.v, dout, probs, q, k, v, queryLen, keyLen, heads, kvHeads, headDim);
      const maxDiff = (a: Float32Array, b: Float64Array, base = 0) => Math.max(...a.map((x, i) => Math.abs(x - base - b[i])));
      expect(maxDiff(out, out64)).toBeLessThan(1e-5);
      // The gradients accumulate onto what the buffers held (1 here).
      expect(maxDiff(g.q, dq64, 1)).toBeLessThan(1e-5);
      expect(maxDiff(g.k, dk64, 1)).toBeLessThan(1e-5);
      expect(maxDiff(g.v, dv64, 1)).toBeLessThan(1e-5);
    }
  });

  it("SwiGLU", () => {
    checkOp("swiglu", ({ gate, up }) => {
      const out = zeros(gate);
      swigluForward(out, gate, up, gate.length);
      return out;
    }, ({ gate, up }, dout) => {
      const g = { gate: zeros(gate), up: zeros(up) };
      swigluBackward(g.gate, g.up, dout, gate, up, gate.length);
      return g;
    });
  });

  it("embedding (repeated ids accumulate)", () => {
    const ids = fixtures.embedding.ids as number[];
    checkOp("embedding", ({ table }) => {
      const out = new Float32Array(ids.length * 4);
      embeddingForward(out, table, ids, 4);
      return out;
    }, ({ table }, up) => {
      const g = { table: zeros(table) };
      embeddingBackward(g.table, up, ids, 4);
      return g;
    });
  });
});

describe("chunked logprobs", () => {
  const fixture = fixtures.logprobs;
  const { dim, vocab } = fixture as unknown as { dim: number; vocab: number };
  const targets = fixture.targets as number[];
  // chunks smaller than rows and vocab, with ragged tails, so the online log-sum-exp really merges blocks
  const chunks = { rowChunk: 3, vocabChunk: 5 };

  it("logprobs and entropies match PyTorch's log_softmax, rows without a target give NaN", () => {
    const hidden = Float32Array.from(fixture.inputs.hidden);
    const head = Float32Array.from(fixture.inputs.head);
    const result = chunkedLogprobs(hidden, head, targets, dim, vocab, chunks);
    expect(Number.isNaN(result.logprobs[3])).toBe(true);
    const withZero = Array.from(result.logprobs, (x) => (Number.isNaN(x) ? 0 : x));
    expect(relativeError(withZero, fixture.output)).toBeLessThan(1e-5);
    expect(relativeError(result.entropies, fixture.entropies as number[])).toBeLessThan(1e-5);
  });

  it("gradients wrt hidden states and LM head match PyTorch and finite differences", () => {
    const hidden = Float32Array.from(fixture.inputs.hidden);
    const head = Float32Array.from(fixture.inputs.head);
    const upstream = Float32Array.from(fixture.upstream);
    const loss = () => {
      const lp = chunkedLogprobs(hidden, head, targets, dim, vocab, chunks).logprobs;
      return dotLoss(Array.from(lp, (x) => (Number.isNaN(x) ? 0 : x)), upstream);
    };
    const { logsumexp } = chunkedLogprobs(hidden, head, targets, dim, vocab, chunks);
    const dHidden = zeros(hidden);
    const dHead = zeros(head);
    chunkedLogprobsBackward(dHidden, dHead, upstream, hidden, head, targets, logsumexp, dim, vocab, chunks);
    expect(relativeError(dHidden, fixture.grads.hidden)).toBeLessThan(TOLERANCE);
    expect(relativeError(dHead, fixture.grads.head)).toBeLessThan(TOLERANCE);
    expect(relativeError(dHidden, finiteDifferences(hidden, loss))).toBeLessThan(TOLERANCE);
    expect(relativeError(dHead, finiteDifferences(head, loss))).toBeLessThan(TOLERANCE);
  });
});
