"""Independent PyTorch reference for lib/grpo/loss.ts: GRPO policy losses and their gradients wrt new logprobs.

Writes test/fixtures/grpo/losses.json. Run: /usr/bin/python3 scripts/reference/grpo_losses.py
"""
import json
import os

import torch

torch.manual_seed(1)
torch.set_default_dtype(torch.float64)
n = 8
new0 = -torch.rand(n) * 3
old = new0 + torch.randn(n) * 0.4  # ratios land on both sides of the clip range
ref = new0 + torch.randn(n) * 0.3
weight = 0.37


def flat(t):
    return [round(float(x), 8) for x in t.reshape(-1).tolist()]


def ppo(new, advantage, eps, eps_high, sequence):
    if sequence:
        s = torch.exp((new - old).mean())
        return -n * weight * torch.minimum(s * advantage, s.clamp(1 - eps, 1 + eps_high) * advantage)
    r = torch.exp(new - old)
    return -(weight * torch.minimum(r * advantage, r.clamp(1 - eps, 1 + eps_high) * advantage)).sum()


def cispo(new, advantage, eps, eps_high, sequence):
    if sequence:
        ratio = torch.exp((new - old).mean()).expand(n)
    else:
        ratio = torch.exp(new - old)
    return -(weight * ratio.clamp(1 - eps, 1 + eps_high).detach() * advantage * new).sum()


def k3(new):
    delta = ref - new
    return (weight * (torch.exp(delta) - delta - 1)).sum()


cases = []
for name, fn, eps, eps_high in [("ppo", ppo, 0.2, 0.2), ("ppo", ppo, 0.2, 0.28), ("cispo", cispo, 1.0, 4.0),
                                ("cispo", cispo, 0.1, 0.1)]:
    for sequence in [False, True]:
        for advantage in [1.3, -0.8]:
            for kl_coef in [0.0, 0.5]:
                new = new0.clone().requires_grad_(True)
                loss = fn(new, advantage, eps, eps_high, sequence) + kl_coef * k3(new)
                loss.backward()
                cases.append({"policyLoss": name, "epsilon": eps, "epsilonHigh": eps_high,
                              "importanceSampling": "sequence" if sequence else "token", "advantage": advantage,
                              "klCoef": kl_coef, "loss": float(loss), "grad": flat(new.grad)})

out = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "grpo", "losses.json")
with open(out, "w") as f:
    json.dump({"new": flat(new0), "old": flat(old), "ref": flat(ref), "weight": weight, "cases": cases}, f)
print("wrote", os.path.normpath(out), len(cases), "cases")
