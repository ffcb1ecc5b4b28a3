"""Hugging Face transformers peer for bench/cuda-decode.ts: the same model shapes (bench/cuda-shapes.json) with random
bf16 weights on the GPU, decode tokens/s at the same batches and lengths (greedy, EOS ignored) and prefill tokens/s.
Prints JSON that bench/cuda-decode.ts reads with --peer.

Usage: python3 bench/peers/hf_generate.py [--shapes qwen2.5-0.5b,qwen2.5-1.5b] [--batches 1,8,64]
       [--prompt 128] [--steps 128] [--prefill 1x512,8x512,1x4096]
Decode time = generate(prompt, steps new tokens) minus generate(prompt, 1 new token), so prefill is excluded, as in
the art-ts bench. decodeLoop is the same greedy decode as a plain loop of model forwards over the KV cache, without
generate's machinery: the fastest this stack decodes without torch.compile.
"""
import argparse
import json
import os
import time

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
parser.add_argument("--batches", default="1,8,64")
parser.add_argument("--prompt", type=int, default=128)
parser.add_argument("--steps", type=int, default=128)
parser.add_argument("--prefill", default="1x512,8x512,1x4096", help="sequences x tokens per prefill, comma-separated")
args = parser.parse_args()

with open(os.path.join(os.path.dirname(__file__), "..", "cuda-shapes.json")) as f:
    shapes = json.load(f)


def timed(fn, repeats=1):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


results = {}
torch.manual_seed(0)
for name in args.shapes.split(","):
    config = transformers.Qwen2Config(**{k: v for k, v in shapes[name].items() if k not in ("architectures", "torch_dtype")},
                                      attn_implementation="sdpa")
    # Built directly on the GPU in bf16: a CPU float32 init of 1.5B parameters alone takes minutes.
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    decode, decode_loop, prefill = {}, {}, {}

    def forward_loop(ids, steps):
        """Seconds for `steps` greedy decode forwards after the prompt's prefill (not timed)."""
        out = model(input_ids=ids, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    with torch.inference_mode():
        for batch in [int(b) for b in args.batches.split(",")]:
            ids = torch.randint(0, config.vocab_size, (batch, args.prompt), device="cuda")
            mask = torch.ones_like(ids)

            def run(new_tokens):
                return lambda: model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

            run(8)()  # warm-up: kernels, allocator, generate's caches
            full, first = timed(run(args.steps)), timed(run(1))
            decode[str(batch)] = round(batch * (args.steps - 1) / (full - first), 1)
            decode_loop[str(batch)] = round(batch * (args.steps - 1) / forward_loop(ids, args.steps - 1), 1)
        for batch, length in (tuple(int(x) for x in size.split("x")) for size in args.prefill.split(",")):
            ids = torch.randint(0, config.vocab_size, (batch, length), device="cuda")
            model(input_ids=ids, logits_to_keep=1)  # warm-up
            seconds = timed(lambda: model(input_ids=ids, logits_to_keep=1), repeats=3)
            prefill[f"{batch}x{length}"] = round(batch * length / seconds)
    results[name] = {"decode": decode, "decodeLoop": decode_loop, "prefill": prefill}
    del model
    torch.cuda.empty_cache()

print(json.dumps({
    "peer": "transformers " + transformers.__version__ + ", torch " + torch.__version__,
    "device": torch.cuda.get_device_name(0),
    "settings": {"promptLength": args.prompt, "steps": args.steps, "prefillLength": args.prefill, "dtype": "bfloat16"},
    "results": results,
}, indent=2))
