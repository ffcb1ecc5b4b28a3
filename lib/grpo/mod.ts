/** GRPO / SFT training on the engine: TrainConfig, losses, the training model, Trainer, PEFT adapters, tokenisation. */
export { PROJECTIONS, DEFAULT_LORA, resolveTrainConfig, learningRateAt, loraScale } from "./config.ts";
export type { TrainConfig, TrainConfigInit, LoraConfig, Projection, PolicyLoss, ImportanceSampling, Schedule } from "./config.ts";
export { groupAdvantages, trajectoryTokenWeights, policyLoss, crossEntropyLoss } from "./loss.ts";
export type { PolicyTokens, PolicyLossResult } from "./loss.ts";
export { adamwStep, adamwStepOn, createAdamWState, gradientNorm } from "./adamw.ts";
export type { AdamWState, AdamWOptions, TrainableParameter, ParameterTensors } from "./adamw.ts";
export { CpuTrainingOps, cpuTrainingOps } from "./cpu-training-ops.ts";
export type { TrainingOps, AttentionSegment, AttentionShape, RopeTensors, AdamWScalars } from "./training-ops.ts";
export { chunkedLogprobs, chunkedLogprobsBackward } from "./logprobs.ts";
export type { TokenLogprobs, ChunkSizes } from "./logprobs.ts";
export { TrainingModel, Param, projectionPath } from "./model.ts";
export type { SequenceBatch, Segment, ForwardPass, TrainingModelOptions, LoraParams } from "./model.ts";
export { Trainer, checkpointDir, toBatch, trainedCount } from "./train.ts";
export type { TrainingSequence, StepResult, StepMetrics, Objective } from "./train.ts";
export { saveAdapter, readAdapter, loadAdapter, ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE } from "./peft.ts";
export type { Adapter } from "./peft.ts";
export { tokenizeHistory, tokenizeGroups, tokenizeForSft } from "./tokenize.ts";
export type { ChatTokenizer, TokenizedGroups, TokenizedHistory } from "./tokenize.ts";
