"""Independent PyTorch reference for lib/grpo/loss.ts: GRPO policy losses and their gradients wrt new logprobs.

Every option of policyLoss (CISPO and PPO, ratios per token / sequence / their average / geometric average,
truncated importance sampling, k3 KL, per-token advantages) and ART's KL penalty on advantages, written from
ART's definitions with autograd doing the derivatives. Writes test/fixtures/grpo/losses.json.
Run: /usr/bin/python3 scripts/reference/grpo_losses.py
"""
import json
import math
import os

import torch

torch.manual_seed(1)
torch.set_default_dtype(torch.float64)
n = 8
new0 = -torch.rand(n) * 3
old0 = new0 + torch.randn(n) * 0.4  # ratios land on both sides of the clip range
ref = new0 + torch.randn(n) * 0.3
weight = 0.37


def flat(t):
    return [None if math.isnan(x) else round(float(x), 8) for x in t.reshape(-1).tolist()]


def ratio(new, old, level):
    old = torch.where(torch.isnan(old), new.detach(), old)  # unknown: sampled by the current policy
    diff = new - old
    token = torch.exp(diff)
    sequence = torch.exp(diff.mean()).expand(n)
    return {"token": token, "sequence": sequence, "average": (token + sequence) / 2,
            "geometric_average": token.sqrt() * sequence.sqrt()}[level]


def policy(name, new, old, advantages, eps, eps_high, level, cap):
    rho = ratio(new, old, level)
    if name == "ppo":
        loss = -torch.minimum(rho * advantages, rho.clamp(1 - eps, 1 + eps_high) * advantages)
    else:
        loss = -(rho.detach().clamp(1 - eps, 1 + eps_high) * advantages * new)
    if cap is not None:
        loss = loss * rho.clamp(max=cap).detach()
    return (weight * loss).sum()


def k3(new):
    delta = ref - new
    return (weight * (torch.exp(delta) - delta - 1)).sum()


def shaped(advantage, coef):
    kl = new0 - ref
    return advantage + coef * (kl.mean() - kl)


cases = []


def case(name, eps, eps_high, level, advantage, kl_coef, cap, penalty, old):
    advantages = shaped(advantage, penalty) if penalty else torch.full((n,), advantage)
    new = new0.clone().requires_grad_(True)
    loss = policy(name, new, old, advantages, eps, eps_high, level, cap) + kl_coef * k3(new)
    loss.backward()
    cases.append({"policyLoss": name, "epsilon": eps, "epsilonHigh": eps_high, "importanceSampling": level,
                  "advantage": advantage, "klPenaltyCoef": penalty, "advantages": flat(advantages), "klCoef": kl_coef,
                  "truncatedImportanceSampling": cap, "old": flat(old), "loss": float(loss), "grad": flat(new.grad)})


levels = ["token", "sequence", "average", "geometric_average"]
for name, eps, eps_high in [("ppo", 0.2, 0.2), ("ppo", 0.2, 0.28), ("cispo", 1.0, 4.0), ("cispo", 0.1, 0.1)]:
    for level in levels:
        for advantage in [1.3, -0.8]:
            for kl_coef in [0.0, 0.5]:
                for cap in [None, 1.1]:
                    case(name, eps, eps_high, level, advantage, kl_coef, cap, 0.0, old0)
            case(name, eps, eps_high, level, advantage, 0.0, None, 0.3, old0)  # KL-shaped advantages
# unknown old logprobs: ratio 1 with the new logprob's gradient, also through the sequence ratio
old_nan = old0.clone()
old_nan[2] = float("nan")
old_nan[5] = float("nan")
for name, eps, eps_high in [("ppo", 0.2, 0.2), ("cispo", 1.0, 4.0)]:
    for level in levels:
        case(name, eps, eps_high, level, 1.3, 0.0, None, 0.0, old_nan)

out = os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "grpo", "losses.json")
with open(out, "w") as f:
    json.dump({"new": flat(new0), "ref": flat(ref), "weight": weight, "cases": cases}, f)
print("wrote", os.path.normpath(out), len(cases), "cases")
