#!/usr/bin/python3
"""PyTorch CPU peer for bench/cpu-engine.ts: the same checkpoint, batch and lengths, greedy decoding with a KV cache,
in float32 with plain torch ops. Prints {"prefillTokensPerSecond", "decodeTokensPerSecond"} (best of repeats after
one warm-up).

usage: torch_cpu_engine.py CHECKPOINT_DIR BATCH PROMPT_LENGTH DECODE_TOKENS REPEATS THREADS
"""
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "reference"))
from transformer_reference import inverse_frequencies, read_checkpoint  # noqa: E402
sys.path.insert(0, os.path.dirname(__file__))
from torch_blas import blas_report  # noqa: E402


def rms_norm(x, weight, eps):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


class Model:
    def __init__(self, directory):
        with open(os.path.join(directory, "config.json")) as f:
            self.cfg = cfg = json.load(f)
        self.w = {k: v.float().contiguous() for k, v in read_checkpoint(directory).items()}
        self.heads, self.kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg["rms_norm_eps"]
        self.inv = inverse_frequencies(self.hd, cfg["rope_theta"], cfg.get("rope_scaling")).float()
        self.bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
        self.head = self.w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else self.w["lm_head.weight"]

    def rope(self, x, positions):
        angles = positions[:, None].float() * self.inv[None, :]
        cos, sin = torch.cos(angles)[None, None], torch.sin(angles)[None, None]
        half = self.hd // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    def forward(self, ids, cache, start):
        """ids: [B, T] at positions start..start+T-1; cache: per layer (k, v) [B, kv, maxT, hd]. Returns last-row logits."""
        B, T = ids.shape
        positions = torch.arange(start, start + T)
        x = self.w["model.embed_tokens.weight"][ids]
        mask = torch.full((T, start + T), float("-inf")).triu(start + 1)
        for layer in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            w = self.w
            a = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            lin = lambda name: torch.nn.functional.linear(a, w[p + f"self_attn.{name}.weight"], w.get(p + f"self_attn.{name}.bias") if self.bias else None)
            q = self.rope(lin("q_proj").view(B, T, self.heads, self.hd).transpose(1, 2), positions)
            k = self.rope(lin("k_proj").view(B, T, self.kv, self.hd).transpose(1, 2), positions)
            v = lin("v_proj").view(B, T, self.kv, self.hd).transpose(1, 2)
            keys, values = cache[layer]
            keys[:, :, start:start + T] = k
            values[:, :, start:start + T] = v
            k_all = keys[:, :, :start + T].repeat_interleave(self.heads // self.kv, dim=1)
            v_all = values[:, :, :start + T].repeat_interleave(self.heads // self.kv, dim=1)
            scores = q @ k_all.transpose(-1, -2) / math.sqrt(self.hd) + mask
            attn = (torch.softmax(scores, dim=-1) @ v_all).transpose(1, 2).reshape(B, T, -1)
            x = x + torch.nn.functional.linear(attn, w[p + "self_attn.o_proj.weight"])
            m = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            gate = torch.nn.functional.linear(m, w[p + "mlp.gate_proj.weight"])
            up = torch.nn.functional.linear(m, w[p + "mlp.up_proj.weight"])
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w[p + "mlp.down_proj.weight"])
        last = rms_norm(x[:, -1], self.w["model.norm.weight"], self.eps)
        return last @ self.head.T


def main():
    directory = sys.argv[1]
    batch, prompt_length, decode_tokens, repeats, threads = map(int, sys.argv[2:7])
    torch.set_num_threads(threads)
    model = Model(directory)
    vocab = model.cfg["vocab_size"]
    prompts = torch.tensor([[(i * 7919 + b * 104729 + 13) % vocab for i in range(prompt_length)] for b in range(batch)])
    best_prefill = best_decode = float("inf")
    with torch.no_grad():
        for r in range(repeats + 1):
            shape = (batch, model.kv, prompt_length + decode_tokens, model.hd)
            cache = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(model.cfg["num_hidden_layers"])]
            start = time.perf_counter()
            ids = model.forward(prompts, cache, 0).argmax(dim=-1)
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            for t in range(decode_tokens):
                ids = model.forward(ids[:, None], cache, prompt_length + t).argmax(dim=-1)
            decode = time.perf_counter() - start
            if r > 0:
                best_prefill, best_decode = min(best_prefill, prefill), min(best_decode, decode)
    print(json.dumps({
        "prefillTokensPerSecond": batch * prompt_length / best_prefill,
        "decodeTokensPerSecond": batch * decode_tokens / best_decode,
        **blas_report(),
    }))


if __name__ == "__main__":
    main()
