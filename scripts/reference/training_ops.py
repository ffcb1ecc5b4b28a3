"""Independent PyTorch autograd reference for the training ops of the CPU backend (lib/model/cpu: kernels.ts,
attention.ts, logprobs.ts), which the CUDA backend's are checked against in turn.

Writes test/fixtures/training/ops.json: for each op, its inputs, an upstream gradient, the forward output and the
autograd gradients of sum(output * upstream) with respect to every input. Run with Debian's torch 1.13:
    /usr/bin/python3 scripts/reference/training_ops.py
"""
import json
import math
import os

import torch

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)  # the reference is exact; the TypeScript side is float32


def rand(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).requires_grad_(True)


def flat(t):
    return [round(float(x), 7) for x in t.detach().reshape(-1).tolist()]


def case(inputs, output, extra=None):
    upstream = torch.randn_like(output)
    (output * upstream).sum().backward()
    result = {"inputs": {k: flat(v) for k, v in inputs.items()}, "upstream": flat(upstream), "output": flat(output),
              "grads": {k: flat(v.grad) for k, v in inputs.items() if v.requires_grad}}
    if extra:
        result.update(extra)
    return result


fixtures = {}
rows, fin, fout, rank = 5, 6, 7, 3

x, w, b = rand(rows, fin), rand(fout, fin), rand(fout)
fixtures["linear"] = case({"x": x, "weight": w, "bias": b}, x @ w.T + b)

x, w, a, bb = rand(rows, fin), rand(fout, fin), rand(rank, fin), rand(fout, rank)
scale = 16 / math.sqrt(rank)  # rsLoRA scale alpha / sqrt(r)
fixtures["lora"] = case({"x": x, "weight": w, "a": a, "b": bb}, x @ w.T + scale * (x @ a.T) @ bb.T, {"scale": scale})

x, g = rand(rows, fin), rand(fin)
eps = 1e-6
fixtures["rmsnorm"] = case({"x": x, "weight": g}, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g,
                           {"eps": eps})

seq, heads, kv_heads, head_dim = 5, 4, 2, 6
positions = torch.tensor([0, 1, 2, 7, 8], dtype=torch.float64)
inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
angles = positions[:, None] * inv_freq[None, :]
cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]


def rotate_half(t):
    half = t.shape[-1] // 2
    return torch.cat([-t[..., half:], t[..., :half]], -1)


q = rand(seq, heads, head_dim)
fixtures["rope"] = case({"x": q}, q * cos + rotate_half(q) * sin,
                        {"positions": positions.tolist(), "theta": 10000.0})

q, k, v = rand(seq, heads, head_dim), rand(seq, kv_heads, head_dim), rand(seq, kv_heads, head_dim)
group = heads // kv_heads
kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
scores = torch.einsum("thd,shd->hts", q, kr) / math.sqrt(head_dim)
mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
fixtures["attention"] = case({"q": q, "k": k, "v": v}, torch.einsum("hts,shd->thd", probs, vr),
                             {"heads": heads, "kvHeads": kv_heads, "headDim": head_dim, "len": seq})

gate, up = rand(rows, fin, scale=2.0), rand(rows, fin)
fixtures["swiglu"] = case({"gate": gate, "up": up}, torch.nn.functional.silu(gate) * up)

table = rand(9, 4)
ids = [3, 0, 3, 8, 1]
fixtures["embedding"] = case({"table": table}, table[torch.tensor(ids)], {"ids": ids})

rows_lp, dim, vocab = 7, 5, 23
hidden, head = rand(rows_lp, dim), rand(vocab, dim)
targets = [4, 22, 0, -1, 13, 13, 7]
logits = hidden @ head.T
logp_all = logits.log_softmax(-1)
idx = torch.tensor([max(t, 0) for t in targets])
logp = logp_all.gather(1, idx[:, None])[:, 0] * torch.tensor([1.0 if t >= 0 else 0.0 for t in targets])
entropy = -(logp_all.exp() * logp_all).sum(-1)
fixtures["logprobs"] = case({"hidden": hidden, "head": head}, logp,
                            {"targets": targets, "entropies": flat(entropy), "dim": dim, "vocab": vocab})

out = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "training", "ops.json")
with open(out, "w") as f:
    json.dump(fixtures, f)
print("wrote", os.path.normpath(out))
