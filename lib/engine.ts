/**
 * art-ts/engine: the engine's low-level API, below TrainableModel. Loading a checkpoint onto a device
 * (`loadCausalLM`), the tokenizer and chat templates, safetensors, the op vocabulary and its backends (CPU, CUDA),
 * the transformer's inference and training passes, LoRA and PEFT adapters, generation, the GRPO step runner and its
 * losses, and the OpenAI-compatible model server. docs/engine.md is its reference.
 */
export * from "./model/mod.ts";
export { CpuBackend, CpuTensor } from "./model/cpu/backend.ts";
export * from "./load/mod.ts";
export * from "./cuda/mod.ts";
export * from "./grpo/mod.ts";
export * from "./serve/mod.ts";
