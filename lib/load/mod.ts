/** Public names of the load area: a checkpoint on the device of your choice (CUDA when it works, else the CPU). */
export { loadCausalLM } from "./causal-lm.ts";
export type { CausalLM, CausalLMRequest, Device, LoadOptions } from "./causal-lm.ts";
