// The training ops of the CPU backend (forward and backward) against PyTorch autograd and against finite differences
// of their own forward (fixtures: scripts/reference/training_ops.py, in test/fixtures/training/).
import { describe, expect, it } from "vitest";
import type { LoraWeights, Tensor } from "../../lib/model/backend.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { dotLoss, finiteDifferences, loadFixture, relativeError } from "./check.ts";

interface Case {
  inputs: Record<string, number[]>; upstream: number[]; output: number[]; grads: Record<string, number[]>;
  [extra: string]: unknown;
}
const fixtures = loadFixture<Record<string, Case>>("training/ops.json");
const TOLERANCE = 1e-3;
const cpu = new CpuBackend();

/** A fresh f32 tensor holding a copy of `data` (the forward under finite differences sees every perturbation). */
const tensor = (data: ArrayLike<number>, shape: number[]): Tensor => cpu.upload(Float32Array.from(data), shape);
/** Runs `op` on fresh tensors and returns `out`'s values, freeing everything it made. */
function valuesOf(out: Tensor, made: Tensor[]): Float32Array {
  const values = cpu.download(out);
  for (const t of [out, ...made]) cpu.free(t);
  return values;
}

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

/** Gradient tensors of zeros shaped like the inputs, read back by name after the backward. */
function gradients(inputs: Record<string, { data: Float32Array; shape: number[] }>, backward: (d: Record<string, Tensor>) => void): Record<string, Float32Array> {
  const d = Object.fromEntries(Object.entries(inputs).map(([k, { shape }]) => [k, cpu.zeros(shape)]));
  backward(d);
  return Object.fromEntries(Object.entries(d).map(([k, t]) => [k, cpu.download(t)]));
}

describe("the CPU backend's training ops match PyTorch autograd and finite differences", () => {
  it("linear with bias", () => {
    const [rows, fin, fout] = [5, 6, 7];
    checkOp("linear", ({ x, weight, bias }) => {
      const t = [tensor(x, [rows, fin]), tensor(weight, [fout, fin]), tensor(bias, [fout])];
      const out = cpu.zeros([rows, fout]);
      cpu.linear(t[0], t[1], t[2], out);
      return valuesOf(out, t);
    }, ({ x, weight, bias }, up) => gradients({ x: { data: x, shape: [rows, fin] }, weight: { data: weight, shape: [fout, fin] }, bias: { data: bias, shape: [fout] } },
      (d) => cpu.projectionsBackward(tensor(x, [rows, fin]), [{ weight: tensor(weight, [fout, fin]), dOut: tensor(up, [rows, fout]), dWeight: d.weight, dBias: d.bias }], d.x)));
  });

  it("LoRA (rsLoRA scale) on a frozen linear: dA, dB and dx", () => {
    const [rows, fin, fout, rank] = [5, 6, 7, 3];
    const scale = fixtures.lora.scale as number;
    const lora = (a: Float32Array, b: Float32Array): LoraWeights => ({ a: tensor(a, [rank, fin]), b: tensor(b, [fout, rank]), scale });
    checkOp("lora", ({ x, weight, a, b }) => {
      const t = [tensor(x, [rows, fin]), tensor(weight, [fout, fin])];
      const out = cpu.zeros([rows, fout]);
      cpu.linear(t[0], t[1], null, out);
      cpu.addLoras(t[0], [{ lora: lora(a, b), out, column: 0 }]);
      return valuesOf(out, t);
    }, ({ x, weight, a, b }, up) => {
      const xs = tensor(x, [rows, fin]), w = tensor(weight, [fout, fin]), adapter = lora(a, b), down = { tensor: cpu.zeros([rows, rank]), column: 0 };
      cpu.addLoras(xs, [{ lora: adapter, out: cpu.zeros([rows, fout]), column: 0, down }]);
      const dOut = tensor(up, [rows, fout]);
      return gradients({ x: { data: x, shape: [rows, fin] }, weight: { data: weight, shape: [fout, fin] }, a: { data: a, shape: [rank, fin] }, b: { data: b, shape: [fout, rank] } },
        (d) => cpu.projectionsBackward(xs, [{ weight: w, dOut, dWeight: d.weight, dBias: null, lora: { weights: adapter, down, dA: d.a, dB: d.b } }], d.x));
    });
  });

  it("RMSNorm", () => {
    const [rows, dim] = [5, 6];
    const eps = fixtures.rmsnorm.eps as number;
    checkOp("rmsnorm", ({ x, weight }) => {
      const t = [tensor(x, [rows, dim]), tensor(weight, [dim])];
      const out = cpu.zeros([rows, dim]);
      cpu.rmsNorm(t[0], t[1], eps, out);
      return valuesOf(out, t);
    }, ({ x, weight }, up) => {
      const xs = tensor(x, [rows, dim]), w = tensor(weight, [dim]), rstd = cpu.zeros([rows]);
      cpu.rmsNorm(xs, w, eps, cpu.zeros([rows, dim]), rstd);
      return gradients({ x: { data: x, shape: [rows, dim] }, weight: { data: weight, shape: [dim] } },
        (d) => cpu.rmsNormBackward(xs, w, rstd, tensor(up, [rows, dim]), d.x, d.weight));
    });
  });

  it("RoPE (half split, arbitrary positions)", () => {
    const [rows, heads, headDim] = [5, 4, 6];
    const positions = Int32Array.from(fixtures.rope.positions as number[]);
    const invFreq = tensor(Float64Array.from({ length: headDim / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / headDim)), [headDim / 2]);
    // The fixture's heads split between q (the first 3 of each row) and k (the last), rotated by one call.
    const qWidth = 3 * headDim, kWidth = (heads - 3) * headDim, width = heads * headDim;
    const split = (x: Float32Array) => [
      tensor(Float32Array.from({ length: rows * qWidth }, (_, i) => x[Math.floor(i / qWidth) * width + (i % qWidth)]), [rows, qWidth]),
      tensor(Float32Array.from({ length: rows * kWidth }, (_, i) => x[Math.floor(i / kWidth) * width + qWidth + (i % kWidth)]), [rows, kWidth]),
    ] as const;
    const join = (q: Tensor, k: Tensor) => {
      const [qs, ks] = [cpu.download(q), cpu.download(k)];
      return Float32Array.from({ length: rows * width }, (_, i) => {
        const row = Math.floor(i / width), col = i % width;
        return col < qWidth ? qs[row * qWidth + col] : ks[row * kWidth + col - qWidth];
      });
    };
    checkOp("rope", ({ x }) => {
      const [q, k] = split(x);
      cpu.rope(q, k, positions, invFreq, headDim);
      return join(q, k);
    }, (_inputs, up) => {
      const [dq, dk] = split(up);
      cpu.ropeBackward(dq, dk, positions, invFreq, headDim);
      return { x: join(dq, dk) };
    });
  });

  it("causal grouped-query attention (4 query heads over 2 kv heads)", () => {
    const { heads, kvHeads, headDim, len } = fixtures.attention as unknown as Record<string, number>;
    const segments = [{ start: 0, length: len }];
    const shapes = { q: [len, heads * headDim], k: [len, kvHeads * headDim], v: [len, kvHeads * headDim] };
    checkOp("attention", ({ q, k, v }) => {
      const t = [tensor(q, shapes.q), tensor(k, shapes.k), tensor(v, shapes.v)];
      const out = cpu.zeros(shapes.q);
      t.push(cpu.packedAttention(t[0], t[1], t[2], segments, headDim, out));
      return valuesOf(out, t);
    }, ({ q, k, v }, up) => {
      const qs = tensor(q, shapes.q), ks = tensor(k, shapes.k), vs = tensor(v, shapes.v);
      const out = cpu.zeros(shapes.q), saved = cpu.packedAttention(qs, ks, vs, segments, headDim, out);
      return gradients({ q: { data: q, shape: shapes.q }, k: { data: k, shape: shapes.k }, v: { data: v, shape: shapes.v } },
        (d) => cpu.packedAttentionBackward(qs, ks, vs, out, saved, segments, headDim, tensor(up, shapes.q), d.q, d.k, d.v));
    });
  });

  it("attention over several query blocks and a shared prefix equals a float64 reference, forward and backward", () => {
    const heads = 4, kvHeads = 2, headDim = 8, group = heads / kvHeads;
    let seed = 7;
    const random = (n: number) => Float32Array.from({ length: n }, () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648 - 0.5) * 2);
    // [200, 261]: several of the fast path's 128-row query blocks and 128-key blocks, a partial one of each.
    for (const [queryLen, keyLen] of [[70, 70], [45, 83], [200, 261]]) {
      // The last queryLen rows attend to every row before them: a completion after a prompt of keyLen − queryLen rows.
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
      // Packed: the prompt's rows (their own queries unused here) and the completion's, which sees them as its prefix.
      const rows = keyLen, padded = (x: Float32Array) => {
        const all = new Float32Array(rows * qStride);
        all.set(x, offset * qStride);
        return all;
      };
      const segments = [{ start: offset, length: queryLen, prefix: { start: 0, length: offset } }];
      const qs = tensor(padded(q), [rows, qStride]), ks = tensor(k, [rows, kvStride]), vs = tensor(v, [rows, kvStride]);
      const out = cpu.zeros([rows, qStride]);
      const saved = cpu.packedAttention(qs, ks, vs, segments, headDim, out);
      const dq = tensor(new Float32Array(rows * qStride).fill(1), [rows, qStride]);
      const dk = tensor(new Float32Array(k.length).fill(1), [rows, kvStride]), dv = tensor(new Float32Array(v.length).fill(1), [rows, kvStride]);
      cpu.packedAttentionBackward(qs, ks, vs, out, saved, segments, headDim, tensor(padded(dout), [rows, qStride]), dq, dk, dv);
      const maxDiff = (a: Float32Array, b: Float64Array, base = 0) => Math.max(...a.map((x, i) => Math.abs(x - base - b[i])));
      expect(maxDiff(cpu.download(out).subarray(offset * qStride), out64)).toBeLessThan(1e-5);
      // The gradients accumulate onto what the buffers held (1 here).
      expect(maxDiff(cpu.download(dq).subarray(offset * qStride), dq64, 1)).toBeLessThan(1e-5);
      expect(maxDiff(cpu.download(dk), dk64, 1)).toBeLessThan(1e-5);
      expect(maxDiff(cpu.download(dv), dv64, 1)).toBeLessThan(1e-5);
    }
  });

  it("SwiGLU over the fused gate/up product (gate, then up, in each row)", () => {
    const fixture = fixtures.swiglu.inputs;
    // The fixture's 30 values as rows of 6: each row of gateUp holds a row of gate, then the same row of up.
    const width = 6, rows = fixture.gate.length / width, shape = [rows, width];
    const gateUp = (gate: Float32Array, up: Float32Array) => {
      const fused = new Float32Array(2 * gate.length);
      for (let r = 0; r < rows; r++) {
        fused.set(gate.subarray(r * width, (r + 1) * width), 2 * r * width);
        fused.set(up.subarray(r * width, (r + 1) * width), (2 * r + 1) * width);
      }
      return tensor(fused, [rows, 2 * width]);
    };
    checkOp("swiglu", ({ gate, up }) => {
      const fused = gateUp(gate, up), out = cpu.zeros(shape);
      cpu.swiglu(fused, out);
      return valuesOf(out, [fused]);
    }, ({ gate, up }, dout) => gradients({ gate: { data: gate, shape }, up: { data: up, shape } },
      (d) => cpu.swigluBackward(gateUp(gate, up), tensor(dout, shape), d.gate, d.up)));
  });

  it("embedding (repeated ids accumulate)", () => {
    const ids = Int32Array.from(fixtures.embedding.ids as number[]);
    checkOp("embedding", ({ table }) => {
      const t = tensor(table, [table.length / 4, 4]);
      const out = cpu.zeros([ids.length, 4]);
      cpu.embedding(t, ids, out);
      return valuesOf(out, [t]);
    }, ({ table }, up) => gradients({ table: { data: table, shape: [table.length / 4, 4] } },
      (d) => cpu.embeddingBackward(ids, tensor(up, [ids.length, 4]), d.table)));
  });
});

describe("target logprobs", () => {
  const fixture = fixtures.logprobs;
  const { dim, vocab } = fixture as unknown as { dim: number; vocab: number };
  const targets = Int32Array.from(fixture.targets as number[]);
  // chunks smaller than rows and vocab, with ragged tails, so the online log-sum-exp really merges blocks
  const chunks = { rowChunk: 3, vocabChunk: 5 };
  const logprobsOf = (hidden: Float32Array, head: Float32Array) =>
    cpu.targetLogprobs(tensor(hidden, [targets.length, dim]), tensor(head, [vocab, dim]), targets, chunks);

  it("logprobs and entropies match PyTorch's log_softmax, rows without a target give NaN", () => {
    const result = logprobsOf(Float32Array.from(fixture.inputs.hidden), Float32Array.from(fixture.inputs.head));
    expect(Number.isNaN(result.logprobs[3])).toBe(true);
    const withZero = Array.from(result.logprobs, (x) => (Number.isNaN(x) ? 0 : x));
    expect(relativeError(withZero, fixture.output)).toBeLessThan(1e-5);
    expect(relativeError(result.entropies, fixture.entropies as number[])).toBeLessThan(1e-5);
  });

  it("gradients wrt hidden states and LM head match PyTorch and finite differences", () => {
    const hidden = Float32Array.from(fixture.inputs.hidden);
    const head = Float32Array.from(fixture.inputs.head);
    const upstream = Float32Array.from(fixture.upstream);
    const loss = () => dotLoss(Array.from(logprobsOf(hidden, head).logprobs, (x) => (Number.isNaN(x) ? 0 : x)), upstream);
    const { logsumexp } = logprobsOf(hidden, head);
    const dHidden = cpu.zeros([targets.length, dim]), dHead = cpu.zeros([vocab, dim]);
    cpu.targetLogprobsBackward(tensor(hidden, [targets.length, dim]), tensor(head, [vocab, dim]), targets, logsumexp, upstream, dHidden, dHead, chunks);
    expect(relativeError(cpu.download(dHidden), fixture.grads.hidden)).toBeLessThan(TOLERANCE);
    expect(relativeError(cpu.download(dHead), fixture.grads.head)).toBeLessThan(TOLERANCE);
    expect(relativeError(cpu.download(dHidden), finiteDifferences(hidden, loss))).toBeLessThan(TOLERANCE);
    expect(relativeError(cpu.download(dHead), finiteDifferences(head, loss))).toBeLessThan(TOLERANCE);
  });
});
