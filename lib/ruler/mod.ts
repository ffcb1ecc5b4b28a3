export { ruler, rulerScoreGroup, type RulerOptions, type RulerGroupOptions, type RulerResult, type RulerScore } from "./ruler.ts";
export {
  endpointClient,
  JUDGE_PROVIDERS,
  resolveJudge,
  type Judge,
  type JudgeEndpoint,
  type JudgeRequest,
  type JudgeSpec,
  type StructuredOutputMode,
  type TransportRetryOptions,
} from "./judge.ts";
export { DEFAULT_RUBRIC, type SubScoreSpec } from "./prompt.ts";
export { DEFAULT_CACHE_DIR } from "./cache.ts";
export { calibrateRuler, calibrationReport, type CalibrationReport, type GroupCalibration } from "./calibrate.ts";
export { kendallTau, spearman } from "./stats.ts";
