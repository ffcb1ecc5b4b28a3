/**
 * Public names of the model area (the engine, device-independent): checkpoints, tokenizer, the op vocabulary and the
 * CPU backend, the transformer's inference and training passes, LoRA and PEFT adapters, generation.
 */
export type * from "./backend.ts";
export { allowedTokenMask, allowedTokenWords } from "./backend.ts";
export { MODEL_TYPES, parseConfig, readConfig } from "./config.ts";
export type { ModelConfig, ModelType, RopeScaling } from "./config.ts";
export { openSafetensors, writeSafetensors } from "./safetensors.ts";
export type { SafetensorsDType, TensorInfo, TensorStore, TensorToWrite } from "./safetensors.ts";
export { huggingFaceHubCache, resolveModelDir } from "./resolve.ts";
export { loadTokenizer, parseToolCalls } from "./tokenizer.ts";
export type { StreamDecoder, Tokenizer } from "./tokenizer.ts";
export type { ChatTemplateOptions } from "./tokenizer-template.ts";
export type { ParsedToolCall, ParsedToolCalls } from "./tool-calls.ts";
export { loadTransformer, loadWeights, ropeInverseFrequencies, sequenceLogits, Transformer } from "./transformer.ts";
export type { Attend, LayerActivations, LayerWeights, Linear, ModelWeights } from "./transformer.ts";
export { DEFAULT_LORA, loraScale, PROJECTIONS, projectionPath, projectionShape } from "./lora.ts";
export type { LayerLoras, LoraConfig, Projection } from "./lora.ts";
export { DifferentiableTransformer, Param } from "./training.ts";
export type {
  DifferentiableTransformerOptions, ForwardPass, LoraParams, ParameterTensors, SequenceBatch,
} from "./training.ts";
export { ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, loadAdapter, readAdapter, writeAdapter } from "./peft.ts";
export type { Adapter } from "./peft.ts";
export { decode, generate } from "./generate.ts";
export type {
  DecodeSampling, DecodeSequence, GenerateOptions, GenerateRequest, GenerateResult, GeneratedToken, SampledToken, SamplingOptions, TopLogprob,
} from "./generate.ts";
