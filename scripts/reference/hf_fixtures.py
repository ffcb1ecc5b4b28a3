"""Ground truth from Hugging Face itself: tiny random checkpoints built with transformers' own config classes and
saved with save_pretrained, a PEFT LoRA adapter saved by PEFT, and what transformers + PEFT compute from them. The CPU
tests (test/model/hf-fixtures.test.ts) check the engine, the adapter loader and the trainer's gradients against these.

For each of qwen2 (GQA, q/k/v biases, tied head), qwen3 (head_dim 16 != hidden/heads 8, q/k norms, untied head) and
llama (rope_theta 1e6, untied head), under test/fixtures/hf/<arch>/:
  checkpoint/          config.json + model.safetensors (float32), from save_pretrained
  adapter/             adapter_config.json + adapter_model.safetensors from PEFT's save_pretrained: rank 4, alpha 8,
                       all seven projections, A and B both random (B non-zero, so the adapter changes the logits)
  expected.safetensors ids [2, T], assistant [2, T] (1 where a token is trained), advantages [2],
                       logits [2, T, V] (base model), adapter_logits [2, T, V] (with the adapter), loss [1], and one
                       gradient per LoRA tensor under its PEFT name (base_model.model.model.layers.N...lora_A.weight)
The loss is the GRPO surrogate at ratio 1: -sum(advantage * logprob over assistant tokens) / their count, where the
logprob of token t is log_softmax(logits[t - 1])[ids[t]]. Both sequences have the same number of assistant tokens,
so art-ts's per-trajectory token weights are all 1 and its GRPO loss is exactly this one. Every tensor is float32
(ids and the mask too, exact as small integers): the dtypes art-ts's safetensors reader takes.
The tokenizer (test/fixtures/hf/tokenizer/) is a byte-level BPE trained by Hugging Face tokenizers on a fixed corpus;
expected-encodings.json holds its ids for a few strings.

Everything is computed in float32 on the CPU, in eager attention, so the numbers do not depend on the GPU.
Usage (on a machine with torch, transformers, peft, tokenizers): python3 scripts/reference/hf_fixtures.py [out-dir]
"""
import json
import os
import sys

import peft
import safetensors.torch
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "test", "fixtures", "hf")
VOCAB = 300
SEQUENCE = 12
PROMPT = 5  # tokens 0..4 are the prompt; 5..11 are trained
ADVANTAGES = [1.0, -0.5]
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, attn_implementation="eager",
              initializer_range=0.15)  # larger than the default 0.02, so the logits spread over several units
CONFIGS = {
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6,
                                              tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                              rms_norm_eps=1e-6, attention_bias=False, tie_word_embeddings=False),
    "llama": lambda: transformers.LlamaConfig(**COMMON, num_key_value_heads=1, rope_theta=1e6, rms_norm_eps=1e-5,
                                              attention_bias=False, mlp_bias=False, tie_word_embeddings=False),
}
MODELS = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM,
          "llama": transformers.LlamaForCausalLM}


def write_tokenizer(directory):
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
              "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
              "Reinforcement learning from rewards, ranked by a judge.", "def add(a, b):\n    return a + b\n"] * 4
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    os.makedirs(directory, exist_ok=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                                    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}, f, indent=2)
    texts = ["Hello, world!", "The lazy dog jumps.", "<|im_start|>user\nhi<|im_end|>", "héllo wörld 42 ✓"]
    with open(os.path.join(directory, "expected-encodings.json"), "w") as f:
        json.dump([{"text": t, "ids": tokenizer.encode(t).ids} for t in texts], f, indent=1)


def perturb(model, generator):
    # transformers initialises norms to exactly 1 and biases to 0; move them so those paths are exercised too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
            elif "norm" in name:
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=generator))


def token_logprobs(logits, ids):
    return torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]


def write_arch(arch, index):
    directory = os.path.join(OUT, arch)
    torch.manual_seed(100 + index)
    generator = torch.Generator().manual_seed(200 + index)
    model = MODELS[arch](CONFIGS[arch]()).float().eval()
    perturb(model, generator)
    model.save_pretrained(os.path.join(directory, "checkpoint"))

    ids = torch.randint(0, VOCAB, (2, SEQUENCE), generator=generator)
    assistant = torch.zeros(2, SEQUENCE, dtype=torch.int64)
    assistant[:, PROMPT:] = 1
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()

    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=PROJECTIONS, bias="none")
    adapted = peft.get_peft_model(model, lora)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
    adapted.save_pretrained(os.path.join(directory, "adapter"))
    os.remove(os.path.join(directory, "adapter", "README.md"))  # PEFT's model-card template, not part of the adapter
    adapted.eval()
    adapted.zero_grad()
    adapter_logits = adapted(input_ids=ids).logits.float()
    logprobs = token_logprobs(adapter_logits, ids)
    weights = torch.tensor(ADVANTAGES)[:, None] * assistant[:, 1:].float()
    loss = -(weights * logprobs).sum() / assistant[:, 1:].sum()
    loss.backward()

    tensors = {"ids": ids.float(), "assistant": assistant.float(), "advantages": torch.tensor(ADVANTAGES), "logits": logits,
               "adapter_logits": adapter_logits.detach(), "loss": loss.detach().reshape(1)}
    for name, p in adapted.named_parameters():
        if p.grad is not None:
            tensors[name.replace(".default.weight", ".weight")] = p.grad.detach().clone()
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "expected.safetensors"))
    return {"arch": arch, "loss": loss.item(), "gradients": len(tensors) - 6}


torch.use_deterministic_algorithms(True)
write_tokenizer(os.path.join(OUT, "tokenizer"))
summary = [write_arch(arch, i) for i, arch in enumerate(CONFIGS)]
versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__}
with open(os.path.join(OUT, "versions.json"), "w") as f:
    json.dump(versions, f, indent=2)
print(json.dumps({"out": OUT, "versions": versions, "fixtures": summary}))
