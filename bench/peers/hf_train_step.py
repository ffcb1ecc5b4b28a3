"""PEFT peer for bench/cuda-train.ts: one LoRA training step (forward + backward + AdamW) of random bf16 checkpoints of
the shapes in bench/cuda-shapes.json, with transformers (sdpa attention) and PEFT (rank 8, alpha 16, all seven
projections, adapters in float32 as PEFT keeps them), tokens/s and peak GPU memory. The loss is the same as the art-ts
bench's: the GRPO surrogate at ratio 1 over the second half of every sequence, advantages alternating +1 / -1.
Prints JSON that bench/cuda-train.ts reads with --peer.

Usage: python3 bench/peers/hf_train_step.py [--shapes qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b]
       [--batches 8x1024,2x4096] [--steps 3] [--checkpointing]
Results are keyed "<shape> <sequences>x<tokens>"; a configuration that fails (out of memory) records its error.
"""
import argparse
import json
import os
import time

import peft
import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-3b,qwen2.5-7b")
parser.add_argument("--batches", default="8x1024,2x4096", help="sequences x tokens per sequence, comma-separated")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing (what Unsloth/ART use)")
args = parser.parse_args()

with open(os.path.join(os.path.dirname(__file__), "..", "cuda-shapes.json")) as f:
    shapes = json.load(f)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

results = {}
torch.manual_seed(0)
batches = [tuple(int(x) for x in batch.split("x")) for batch in args.batches.split(",")]
for name in args.shapes.split(","):
    config = transformers.Qwen2Config(**{k: v for k, v in shapes[name].items() if k not in ("architectures", "torch_dtype")},
                                      attn_implementation="sdpa")
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    if args.checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=PROJECTIONS))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.1)
    for seqs, length in batches:
        ids = torch.randint(0, config.vocab_size, (seqs, length), device="cuda")
        advantages = torch.tensor([1.0 if s % 2 == 0 else -1.0 for s in range(seqs)], device="cuda")[:, None]
        trained = torch.zeros(seqs, length - 1, device="cuda")
        trained[:, length // 2 - 1:] = 1  # tokens length/2 .. length-1 (predicted from rows length/2-1 .. length-2)

        def train_step():
            logits = model(input_ids=ids).logits
            logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(advantages * trained * logprobs).sum() / trained.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 0.1)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        key = f"{name} {seqs}x{length}"
        try:
            train_step()  # warm-up
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            seconds = []
            for _ in range(args.steps):
                start = time.perf_counter()
                train_step()
                torch.cuda.synchronize()
                seconds.append(time.perf_counter() - start)
            results[key] = {"tokensPerSecond": round(seqs * length / min(seconds)), "stepSeconds": [round(s, 4) for s in seconds],
                            "peakMemoryBytes": torch.cuda.max_memory_allocated()}
        except torch.cuda.OutOfMemoryError as error:
            results[key] = {"error": f"out of memory: {str(error).splitlines()[0]}"}
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    del model, optimizer
    torch.cuda.empty_cache()

print(json.dumps({
    "peer": f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}",
    "device": torch.cuda.get_device_name(0),
    "settings": {"batches": args.batches, "lora": {"rank": 8, "alpha": 16, "targets": "all 7 projections"},
                 "gradientCheckpointing": args.checkpointing, "dtype": "bfloat16 base, float32 adapters", "attention": "sdpa"},
    "command": "python3 bench/peers/hf_train_step.py " + " ".join(__import__("sys").argv[1:]),
    "results": results,
}, indent=2))
