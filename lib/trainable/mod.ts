/** Public names of the trainable-model area: one engine for rollouts and training, and its on-disk layout. */
export { readSftConversations, TrainableModel } from "./model.ts";
export type { JsonValue, ModelState, SftConversation, SftOptions, SftResult, TrainableModelOptions, TrainResult, ValidateOptions, Validation } from "./model.ts";
export { evaluateScenarios } from "./evaluate.ts";
export type { EvaluateOptions, EvaluationContext, EvaluationMode, ScenarioRollout } from "./evaluate.ts";
export { readHistory, summarizeGroups } from "./store.ts";
export type { HistoryRow } from "./store.ts";
export { alarms, metricSeries, stopDecision } from "./monitor.ts";
export type { Alarm, AlarmOptions, PlateauRule, Point, StopDecision, StoppingRule } from "./monitor.ts";
export { costTable, CostTable } from "./cost.ts";
export type { CostModel, CostRow, CostTableOptions, TokenPrice } from "./cost.ts";
