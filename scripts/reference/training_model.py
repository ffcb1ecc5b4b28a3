"""Independent PyTorch reference for the training pass (lib/model/training.ts): a plain qwen2 / qwen3 / llama forward written from the
architecture's definition, autograd gradients of sum(upstream * target logprobs) for every LoRA A/B (LoRA mode) and
for every weight (full-parameter mode). Two sequences share the batch (attention stays within each).

Writes test/fixtures/training/model-{qwen2,qwen3,llama}.json. Run: /usr/bin/python3 scripts/reference/training_model.py
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)

CONFIGS = {
    # GQA 4 query heads over 2 kv heads, q/k/v biases, untied head
    "qwen2": {"model_type": "qwen2", "vocab_size": 20, "hidden_size": 8, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False},
    # per-head q/k RMSNorm, tied embeddings
    "qwen3": {"model_type": "qwen3", "vocab_size": 20, "hidden_size": 8, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False},
    # llama3 rope scaling, 4 query heads over 1 kv head, attention_bias (q/k/v/o biases)
    "llama": {"model_type": "llama", "vocab_size": 20, "hidden_size": 8, "intermediate_size": 12,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 2,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": True,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8}},
}
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA = 2, 4.0


def shapes(c):
    d, h, kv, hd, i = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
    return {"q_proj": (h * hd, d), "k_proj": (kv * hd, d), "v_proj": (kv * hd, d), "o_proj": (d, h * hd),
            "gate_proj": (i, d), "up_proj": (i, d), "down_proj": (d, i)}


def module(p):
    return "self_attn" if p in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"


def make_weights(c, gen):
    w = {}
    d, hd = c["hidden_size"], c["head_dim"]
    w["model.embed_tokens.weight"] = torch.randn(c["vocab_size"], d, generator=gen)
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        for proj, shape in shapes(c).items():
            w[f"{p}{module(proj)}.{proj}.weight"] = torch.randn(*shape, generator=gen) / math.sqrt(shape[1])
        bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
        if bias:
            for proj in ["q_proj", "k_proj", "v_proj"] + ([] if c["model_type"] == "qwen2" else ["o_proj"]):
                w[f"{p}self_attn.{proj}.bias"] = 0.1 * torch.randn(shapes(c)[proj][0], generator=gen)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
    w["model.norm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = torch.randn(c["vocab_size"], d, generator=gen) / math.sqrt(d)
    return w


def make_lora(c, gen):
    lora = {}
    for l in range(c["num_hidden_layers"]):
        for proj, (out_f, in_f) in shapes(c).items():
            prefix = f"base_model.model.model.layers.{l}.{module(proj)}.{proj}"
            lora[prefix + ".lora_A.weight"] = torch.randn(RANK, in_f, generator=gen) / math.sqrt(in_f)
            lora[prefix + ".lora_B.weight"] = 0.5 * torch.randn(out_f, RANK, generator=gen)  # non-zero: dA ≠ 0
    return lora


def inv_freq(c):
    hd = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = c.get("rope_scaling")
    if not rs:
        return inv
    low_wl = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
    high_wl = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
    out = []
    for f in inv.tolist():
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(f)
        elif wl > low_wl:
            out.append(f / rs["factor"])
        else:
            smooth = (rs["original_max_position_embeddings"] / wl - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            out.append((1 - smooth) * f / rs["factor"] + smooth * f)
    return torch.tensor(out)


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, positions, inv):
    ang = positions[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


def forward(c, w, lora, tokens, positions, segments, targets):
    n = len(tokens)
    h, kv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    inv = inv_freq(c)
    pos = torch.tensor(positions, dtype=torch.float64)
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]

    def lin(l, proj, inp):
        name = f"model.layers.{l}.{module(proj)}.{proj}"
        y = inp @ w[name + ".weight"].T
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        if lora is not None:
            a, b = lora[f"base_model.model.{name}.lora_A.weight"], lora[f"base_model.model.{name}.lora_B.weight"]
            y = y + (ALPHA / RANK) * (inp @ a.T) @ b.T
        return y

    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = rms(x, w[p + "input_layernorm.weight"], eps)
        q = lin(l, "q_proj", a).view(n, h, hd)
        k = lin(l, "k_proj", a).view(n, kv, hd)
        v = lin(l, "v_proj", a).view(n, kv, hd)
        if c["model_type"] == "qwen3":
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, inv), rope(k, pos, inv)
        outs = []
        for start, length in segments:
            qs, ks, vs = q[start:start + length], k[start:start + length], v[start:start + length]
            ks, vs = ks.repeat_interleave(h // kv, 1), vs.repeat_interleave(h // kv, 1)
            scores = torch.einsum("thd,shd->hts", qs, ks) / math.sqrt(hd)
            mask = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)
            outs.append(torch.einsum("hts,shd->thd", scores.masked_fill(mask, float("-inf")).softmax(-1), vs))
        attn = torch.cat(outs, 0).reshape(n, h * hd)
        x = x + lin(l, "o_proj", attn)
        m = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(l, "down_proj", torch.nn.functional.silu(lin(l, "gate_proj", m)) * lin(l, "up_proj", m))
    final = rms(x, w["model.norm.weight"], eps)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["model.embed_tokens.weight"]
    logp = (final @ head.T).log_softmax(-1)
    rows = [r for r, t in enumerate(targets) if t >= 0]
    return logp[torch.tensor(rows), torch.tensor([targets[r] for r in rows])]


def flat(t):
    return [float("%.7g" % x) for x in t.detach().reshape(-1).tolist()]


for index, (name, c) in enumerate(CONFIGS.items()):
    gen = torch.Generator().manual_seed(100 + index)
    weights = make_weights(c, gen)
    lora = make_lora(c, gen)
    tokens = [int(t) for t in torch.randint(0, c["vocab_size"], (9,), generator=gen)]
    segments = [[0, 5], [5, 4]]
    positions = [0, 1, 2, 3, 4, 0, 1, 2, 3]
    targets = tokens[1:5] + [-1] + tokens[6:9] + [-1]  # next token within each sequence
    upstream = torch.randn(sum(1 for t in targets if t >= 0), generator=gen)

    for t in list(weights.values()) + list(lora.values()):
        t.requires_grad_(True)
    logp_lora = forward(c, weights, lora, tokens, positions, segments, targets)
    (logp_lora * upstream).sum().backward()
    lora_grads = {k: flat(v.grad) for k, v in lora.items()}
    for t in weights.values():
        t.grad = None
    logp_base = forward(c, weights, None, tokens, positions, segments, targets)
    (logp_base * upstream).sum().backward()
    full_grads = {k: flat(v.grad) for k, v in weights.items()}

    fixture = {"config": c, "rank": RANK, "alpha": ALPHA, "tokens": tokens, "positions": positions, "segments": segments,
               "targets": targets, "upstream": flat(upstream),
               "weights": {k: {"shape": list(v.shape), "data": flat(v)} for k, v in weights.items()},
               "lora": {k: {"shape": list(v.shape), "data": flat(v)} for k, v in lora.items()},
               "logprobsLora": flat(logp_lora), "logprobsBase": flat(logp_base),
               "loraGrads": lora_grads, "fullGrads": full_grads}
    out = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "training", f"model-{name}.json")
    with open(out, "w") as f:
        json.dump(fixture, f)
    print("wrote", os.path.normpath(out))
