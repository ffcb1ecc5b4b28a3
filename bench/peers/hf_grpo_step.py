"""ART-equivalent Python peer for bench/grpo-step.ts: the same GRPO steps (bench/grpo-workloads.json, token for token) on
random bf16 checkpoints of bench/cuda-shapes.json's shapes, with transformers (sdpa attention) and PEFT on the GPU.

  rollouts      transformers `generate`, sampling at temperature 1 without top-k, exactly generatedTokens per turn
                (min_new_tokens = max_new_tokens). Rollouts whose trajectories have the same length run as one batch:
                2048's 64 at once; ART-E's one group of 4 after another (their tool results differ in length). Each turn
                continues the batch's KV cache from the turn before (what vLLM's prefix cache spares ART), in a static
                cache, for which `generate` compiles its decode step (torch.compile, CUDA graphs), or, where that fails
                or does not compile (--generation auto), in a dynamic cache without compiling; "generation" says which
                ran. No vLLM: this peer is transformers' fastest generation, not ART's engine.
  training      one step of PEFT LoRA (r 8, alpha 16, all seven projections, adapters in float32) over the step's
                trajectories, each one sequence whose sampled tokens are trained: ART's rows (sequences in order, each row
                up to the longest trajectory rounded up to a multiple of 2048 tokens, never mixing two lengths), one AdamW
                update per row (lr 5e-6, betas 0.9 / 0.99, weight decay 0.1, gradient norm clipped at 0.1) on the loss of
                hf_train_step.py (the GRPO surrogate at ratio 1: -sum(A * logp) / number of trained tokens in the row),
                advantages (r - mean) / (std + 1e-6) per group, rewards a rollout's index in its group as in the art-ts
                bench; logits of the trained positions only (logits_to_keep). A step out of memory is redone with
                gradient checkpointing (which ART's Unsloth path always uses): "gradientCheckpointing" says so.
  adapter swap  ART reloads the trained LoRA into its inference engine from disk: save_pretrained of the trained adapter,
                then its weights read back (load_peft_weights) into the adapter the rollouts sample with, a second
                adapter on the same base weights (vLLM's LoRA slot).
Per workload: 1 warm-up step (compilation, allocator), then --steps measured ones with their rollout, training and
swap times; peak memory (torch's max allocated and reserved bytes) over all of them. Not done here: a group's prompt
held once in a packed row, its completions attending to it (ART's packing, and art-ts's sharePrompts; here every
sequence is computed whole), and old logprobs (ratio 1, as hf_train_step.py: one elementwise op per token).
Prints JSON that bench/grpo-step.ts reads with --peer; with --out, writes it there after each workload instead, so a
run cut short keeps what it measured. A workload that fails records its error.

Usage: python3 bench/peers/hf_grpo_step.py [--shapes qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--workloads 2048,arte]
       [--steps 2] [--groups N] [--rollouts N] [--turns N] [--generation auto|static|dynamic] [--out file.json]
"""
import argparse
import gc
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

import peft
import torch
import transformers
from peft.utils import load_peft_weights

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b")
parser.add_argument("--workloads", default="2048,arte")
parser.add_argument("--steps", type=int, default=2, help="measured steps after the warm-up step")
parser.add_argument("--groups", type=int)
parser.add_argument("--rollouts", type=int, help="rollouts per group")
parser.add_argument("--turns", type=int)
parser.add_argument("--generation", choices=["auto", "static", "dynamic"], default="auto",
                    help="auto: a static cache with torch.compile, or the dynamic cache where that fails or does not compile")
parser.add_argument("--out")
args = parser.parse_args()

here = os.path.dirname(__file__)
with open(os.path.join(here, "..", "cuda-shapes.json")) as f:
    shapes = json.load(f)
with open(os.path.join(here, "..", "grpo-workloads.json")) as f:
    spec = json.load(f)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ROW_MULTIPLE = 2048


def resolve(name):
    """The workload with this run's sizes, keyed as bench/grpo-step.ts keys it (it compares them before a ratio)."""
    workload = {k: v for k, v in spec[name].items() if k != "about"}
    for key, value in (("groups", args.groups), ("rolloutsPerGroup", args.rollouts), ("turns", args.turns)):
        if value is not None:
            workload[key] = value
    return workload


workloads = {name: resolve(name) for name in args.workloads.split(",")}


def between(w, group):
    return w["betweenTokens"][group % len(w["betweenTokens"])]


def trajectory_tokens(w, group):
    return w["promptTokens"] + (w["turns"] - 1) * (w["generatedTokens"] + between(w, group)) + w["generatedTokens"]


def sampled_positions(w, group):
    """Where a trajectory of `group` holds its sampled tokens."""
    first = [w["promptTokens"] + turn * (w["generatedTokens"] + between(w, group)) for turn in range(w["turns"])]
    return [start + i for start in first for i in range(w["generatedTokens"])]


def batches(w):
    """Groups whose trajectories have the same length, which run (and train) together."""
    by_gap = {}
    for group in range(w["groups"]):
        by_gap.setdefault(between(w, group), []).append(group)
    return list(by_gap.values())


def describe(error):
    """An error in one line, for the JSON."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def synchronized_seconds(start):
    torch.cuda.synchronize()
    return time.perf_counter() - start


class Peer:
    """One shape's model: the base in bf16 with two LoRA adapters, "default" (trained) and "rollout" (sampled from)."""

    def __init__(self, name):
        self.config = transformers.Qwen2Config(**{k: v for k, v in shapes[name].items() if k not in ("architectures", "torch_dtype")},
                                               attn_implementation="sdpa")
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            base = transformers.Qwen2ForCausalLM(self.config)
        torch.set_default_dtype(torch.float32)
        lora = lambda: peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=PROJECTIONS)  # noqa: E731
        self.model = peft.get_peft_model(base, lora())
        self.model.add_adapter("rollout", lora())
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=5e-6, betas=(0.9, 0.99), weight_decay=0.1)
        self.adapter_dir = tempfile.mkdtemp(prefix="hf-grpo-adapter-")
        self.static_caches = {}  # rows -> StaticCache, reused (reset) so the compiled decode step sees the same buffers
        self.generation = "static" if args.generation in ("auto", "static") else "dynamic"
        self.generation_note = None
        self.checkpointing = False
        self.reload_adapter()

    def reload_adapter(self):
        """ART's swap: the trained adapter to disk, and from there into the adapter the rollouts sample with."""
        # The embeddings are not trained; "auto" would look the base model up on the Hub to decide.
        self.model.save_pretrained(self.adapter_dir, selected_adapters=["default"], save_embedding_layers=False)
        weights = load_peft_weights(self.adapter_dir, device="cuda")
        loaded = peft.set_peft_model_state_dict(self.model, weights, adapter_name="rollout")
        if loaded.unexpected_keys:
            raise RuntimeError(f"the saved adapter has weights the rollout adapter lacks: {loaded.unexpected_keys[:3]}")

    def cache(self, rows, length):
        if self.generation == "dynamic":
            return transformers.DynamicCache()
        if rows not in self.static_caches:
            self.static_caches[rows] = transformers.StaticCache(config=self.config, max_cache_len=length)
        cache = self.static_caches[rows]
        cache.reset()
        return cache

    def rollout_batch(self, w, groups, cache_length):
        """The batch's trajectories, [rows, tokens]: random prompt and observation ids, the sampled ids between them."""
        per_group, generated, vocab = w["rolloutsPerGroup"], w["generatedTokens"], self.config.vocab_size
        rows = len(groups) * per_group
        # A group's rollouts share their first prompt, as in the art-ts bench.
        ids = torch.randint(0, vocab, (len(groups), w["promptTokens"]), device="cuda").repeat_interleave(per_group, dim=0)
        cache = self.cache(rows, cache_length)
        for turn in range(w["turns"]):
            if turn > 0:
                ids = torch.cat([ids, torch.randint(0, vocab, (rows, between(w, groups[0])), device="cuda")], dim=1)
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                      max_new_tokens=generated, min_new_tokens=generated, do_sample=True, temperature=1.0,
                                      top_k=0, top_p=1.0, pad_token_id=0, return_dict_in_generate=True)
            if out.sequences.shape[1] != ids.shape[1] + generated:
                raise RuntimeError(f"generate sampled {out.sequences.shape[1] - ids.shape[1]} tokens, not {generated}")
            ids, cache = out.sequences, out.past_key_values
        return ids

    def rollouts(self, w):
        self.model.set_adapter("rollout")
        self.model.eval()
        longest = max(trajectory_tokens(w, group) for group in range(w["groups"]))
        run = lambda: [(groups, self.rollout_batch(w, groups, longest)) for groups in batches(w)]  # noqa: E731
        if self.generation != "static" or args.generation != "auto":
            return run()
        try:
            trajectories = run()
            if self.compiled():
                return trajectories
            self.generation_note = "generate did not compile its decode step"
        except Exception as error:  # noqa: BLE001 — any failure of the compiled path falls back, and says why
            self.generation_note = describe(error)
        # A static cache pays off through its compiled decode step only; without it, the dynamic cache is faster.
        self.generation = "dynamic"
        self.static_caches.clear()
        torch.cuda.empty_cache()
        return run()

    def compiled(self):
        """Whether generate compiled its forward for the static cache (it keeps the compiled call on the model)."""
        return hasattr(self.model.get_base_model(), "_compiled_call")

    def train(self, w, trajectories):
        """One GRPO step: a row of sequences per AdamW update. Returns the number of updates."""
        self.model.set_adapter("default")
        self.model.train()
        per_group = w["rolloutsPerGroup"]
        rewards = torch.arange(per_group, dtype=torch.float32, device="cuda")
        advantage = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-6)
        longest = max(trajectory_tokens(w, group) for group in range(w["groups"]))
        row_tokens = math.ceil(longest / ROW_MULTIPLE) * ROW_MULTIPLE
        updates = 0
        for groups, ids in trajectories:
            positions = torch.tensor(sampled_positions(w, groups[0]), device="cuda")
            targets = ids[:, positions]
            advantages = advantage.repeat(len(groups))
            per_row = max(1, row_tokens // ids.shape[1])
            for start in range(0, ids.shape[0], per_row):
                rows = slice(start, start + per_row)
                # The logits at position p - 1 predict the token at p: only those of the sampled tokens are computed.
                logits = self.model(input_ids=ids[rows], use_cache=False, logits_to_keep=positions - 1).logits
                logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[rows, :, None])[..., 0]
                loss = -(advantages[rows, None] * logprobs).sum() / logprobs.numel()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.trainable, 0.1)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                updates += 1
        return updates

    def train_or_checkpoint(self, w, trajectories):
        try:
            return self.train(w, trajectories)
        except torch.cuda.OutOfMemoryError:
            if self.checkpointing:
                raise
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            self.checkpointing = True
            return self.train(w, trajectories)

    def step(self, w):
        start = time.perf_counter()
        trajectories = self.rollouts(w)
        rollout_seconds = synchronized_seconds(start)
        start = time.perf_counter()
        updates = self.train_or_checkpoint(w, trajectories)
        training_seconds = synchronized_seconds(start)
        start = time.perf_counter()
        self.reload_adapter()
        swap_seconds = synchronized_seconds(start)
        generated = w["groups"] * w["rolloutsPerGroup"] * w["turns"] * w["generatedTokens"]
        return {"rolloutSeconds": round(rollout_seconds, 3), "trainingSeconds": round(training_seconds, 3),
                "adapterSwapMs": round(swap_seconds * 1000, 1),
                "stepSeconds": round(rollout_seconds + training_seconds + swap_seconds, 3),
                "generatedTokensPerSecond": round(generated / rollout_seconds, 1), "generatedTokens": generated,
                "gradientSteps": updates}

    def measure(self, w):
        self.static_caches.clear()  # the last workload's, sized for its batches
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.step(w)  # warm-up
        steps = [self.step(w) for _ in range(args.steps)]
        keys = ["rolloutSeconds", "trainingSeconds", "adapterSwapMs", "stepSeconds", "generatedTokensPerSecond"]
        mean = {key: round(sum(s[key] for s in steps) / len(steps), 1 if key in ("adapterSwapMs", "generatedTokensPerSecond") else 3) for key in keys}
        if self.generation == "static":
            generation = "static cache, decode step compiled by generate" if self.compiled() else "static cache, not compiled"
        else:
            generation = "dynamic cache, not compiled"
        if self.generation_note:
            generation += f" (a static cache with torch.compile was tried first: {self.generation_note})"
        return {"steps": steps, "mean": mean, "peakMemoryBytes": torch.cuda.max_memory_allocated(),
                "peakReservedBytes": torch.cuda.max_memory_reserved(), "generation": generation,
                "gradientCheckpointing": self.checkpointing}


results = {}


def report():
    return {
        "peer": f"transformers {transformers.__version__}, peft {peft.__version__}, torch {torch.__version__}",
        "device": torch.cuda.get_device_name(0),
        "settings": {"warmupSteps": 1, "measuredSteps": args.steps, "generation": args.generation,
                     "lora": {"rank": 8, "alpha": 16, "targets": "all 7 projections"}, "dtype": "bfloat16 base, float32 adapters",
                     "attention": "sdpa", "optimizer": "AdamW lr 5e-6, betas (0.9, 0.99), weight decay 0.1, clip 0.1, one update per row"},
        "command": "python3 bench/peers/hf_grpo_step.py " + " ".join(sys.argv[1:]),
        "workloads": workloads,
        "results": results,
    }


def save():
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            json.dump(report(), f, indent=2)
        os.replace(args.out + ".tmp", args.out)


torch.manual_seed(0)
for shape in args.shapes.split(","):
    results[shape] = {}
    try:
        peer = Peer(shape)
    except Exception as error:  # noqa: BLE001 — e.g. out of memory building it: the shape records it, the next one runs
        traceback.print_exc()
        results[shape] = {name: {"error": describe(error)} for name in workloads}
        save()
        continue
    for name, workload in workloads.items():
        try:
            results[shape][name] = peer.measure(workload)
        except Exception as error:  # noqa: BLE001 — recorded (out of memory, a failed compile), the next one runs
            traceback.print_exc()
            results[shape][name] = {"error": describe(error)}
            peer.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
        save()
    shutil.rmtree(peer.adapter_dir, ignore_errors=True)
    del peer
    torch._dynamo.reset()  # compiled graphs hold the model
    gc.collect()
    torch.cuda.empty_cache()

if args.out:
    print(f"wrote {args.out}", file=sys.stderr)
else:
    print(json.dumps(report(), indent=2))
