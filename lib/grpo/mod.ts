/** Public names of the GRPO area (the algorithm): TrainConfig, advantages and losses, trajectories → tokens, the step runner. */
export { learningRateAt, resolveTrainConfig } from "./config.ts";
export type { ImportanceSampling, PolicyLoss, Schedule, TrainConfig, TrainConfigInit } from "./config.ts";
export { crossEntropyLoss, groupAdvantages, policyLoss, trajectoryTokenWeights } from "./loss.ts";
export type { PolicyLossResult, PolicyTokens } from "./loss.ts";
export { adamwStep, createAdamWState } from "./adamw.ts";
export type { AdamWOptions, AdamWState } from "./adamw.ts";
export { checkpointDir, normalizedAdvantages, Trainer, toBatch, trainedCount } from "./train.ts";
export type { Objective, StepMetrics, StepResult } from "./train.ts";
export { tokenizeForSft, tokenizeGroups, tokenizeHistory } from "./tokenize.ts";
export type { ChatTokenizer, TokenizedGroups, TokenizedHistory, TrainingSequence } from "./tokenize.ts";
