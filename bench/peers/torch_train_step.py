"""PyTorch peer for bench/train-cpu.ts: the same LoRA GRPO step (forward, PPO token loss, backward, grad-norm clip,
AdamW) on the same checkpoint and the same token batch, timed on the CPU.

The model is written from the architecture's definition (this machine has torch but not transformers/peft), as
batched [B, T] tensors with a causal mask; LoRA A/B are the only parameters with gradients, rank/alpha as given.
Usage: python3 torch_train_step.py <checkpoint-dir> <batch.json> <steps> <threads>
→ one JSON line on stdout: the seconds of each timed step (after one warm-up step)
"""
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "reference"))
from transformer_reference import read_safetensors  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_blas import blas_report  # noqa: E402

PROJ = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
        "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def main():
    ckpt, batch_file, steps, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    c = json.load(open(os.path.join(ckpt, "config.json")))
    w = {name: t.float() for name, t in read_safetensors(os.path.join(ckpt, "model.safetensors")).items()}
    batch = json.load(open(batch_file))
    rank, alpha = batch["rank"], batch["alpha"]
    tokens = torch.tensor(batch["tokens"])               # [B, T]
    trainable = torch.tensor(batch["trainable"]).bool()   # [B, T]
    advantages = torch.tensor(batch["advantages"])        # [B]
    B, T = tokens.shape
    d, h, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // h)
    eps = c["rms_norm_eps"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    lora = {}
    for l in range(c["num_hidden_layers"]):
        for proj, mod in PROJ.items():
            weight = w[f"model.layers.{l}.{mod}.{proj}.weight"]
            a = torch.empty(rank, weight.shape[1]).uniform_(-1 / math.sqrt(weight.shape[1]), 1 / math.sqrt(weight.shape[1]))
            lora[(l, proj)] = (a.requires_grad_(True), torch.zeros(weight.shape[0], rank).requires_grad_(True))
    params = [p for pair in lora.values() for p in pair]
    opt = torch.optim.AdamW(params, lr=5e-6, betas=(0.9, 0.99), weight_decay=0.1)

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rope(x):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def lin(l, proj, x):
        name = f"model.layers.{l}.{PROJ[proj]}.{proj}"
        y = x @ w[name + ".weight"].T
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        a, b = lora[(l, proj)]
        return y + (alpha / rank) * (x @ a.T) @ b.T

    def step():
        x = w["model.embed_tokens.weight"][tokens]
        for l in range(c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            a = rms(x, w[p + "input_layernorm.weight"])
            q = rope(lin(l, "q_proj", a).view(B, T, h, hd)).transpose(1, 2)
            k = rope(lin(l, "k_proj", a).view(B, T, kv, hd)).transpose(1, 2).repeat_interleave(h // kv, 1)
            v = lin(l, "v_proj", a).view(B, T, kv, hd).transpose(1, 2).repeat_interleave(h // kv, 1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            attn = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ v).transpose(1, 2).reshape(B, T, h * hd)
            x = x + lin(l, "o_proj", attn)
            m = rms(x, w[p + "post_attention_layernorm.weight"])
            x = x + lin(l, "down_proj", torch.nn.functional.silu(lin(l, "gate_proj", m)) * lin(l, "up_proj", m))
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        logp = (rms(x, w["model.norm.weight"])[:, :-1] @ head.T).log_softmax(-1)
        lp = logp.gather(-1, tokens[:, 1:, None])[..., 0]
        sel = trainable[:, 1:]
        ratio = torch.exp(lp - lp.detach())
        adv = advantages[:, None].expand_as(lp)
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        weights = sel.float() / sel.sum(1, keepdim=True) / B  # each sequence counts the same
        loss = (per_token * weights).sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.1)
        opt.step()
        return float(loss)

    step()  # warm-up
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"peer": f"pytorch {torch.__version__} (CPU, {threads} thread{'s' if threads > 1 else ''})",
                      "stepSeconds": times, **blas_report()}))


main()
