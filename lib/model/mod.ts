/** Public names of the model area: checkpoints, tokenizer, the backend interface, the transformer, generation, loadCausalLM. */
export type * from "./backend.ts";
export { allowedTokenMask, allowedTokenWords } from "./backend.ts";
export { parseConfig, MODEL_TYPES } from "./config.ts";
export type { ModelConfig, ModelType, RopeScaling } from "./config.ts";
export { openSafetensors, writeSafetensors } from "./safetensors.ts";
export type { SafetensorsDType, TensorInfo, TensorStore, TensorToWrite } from "./safetensors.ts";
export { resolveModelDir, huggingFaceHubCache } from "./resolve.ts";
export { loadTokenizer, parseToolCalls } from "./tokenizer.ts";
export type { Tokenizer, StreamDecoder } from "./tokenizer.ts";
export type { ChatTemplateOptions } from "./tokenizer-template.ts";
export type { ParsedToolCall, ParsedToolCalls } from "./tool-calls.ts";
export { CpuBackend } from "./cpu/backend.ts";
export { Transformer, loadWeights, ropeInverseFrequencies } from "./transformer.ts";
export type { LayerActivations, LayerLoras, LayerWeights, ModelWeights, ProjectionName } from "./transformer.ts";
export { generate, step } from "./generate.ts";
export type {
  GenerateOptions, GenerateRequest, GenerateResult, GeneratedToken, SampledToken, SamplingOptions, StepSampling, StepSequence, TopLogprob,
} from "./generate.ts";
export { loadCausalLM, loadTransformer, readConfig, sequenceLogits } from "./load.ts";
export type { CausalLM, CausalLMRequest, Device, LoadOptions } from "./load.ts";
