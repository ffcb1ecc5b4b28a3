/**
 * art-ts: agent reinforcement training (GRPO + RULER) for TypeScript. This is the entry notebooks and agents import
 * (`art-ts`): trajectories and gathering, TrainableModel, RULER, the task environments, notebook display and plots,
 * errors and configuration types. The engine's low-level API (loading checkpoints onto a device, the tokenizer,
 * backends and their ops, the training step runner, safetensors, PEFT adapters, the model server) is `art-ts/engine`
 * (lib/engine.ts).
 */

// Trajectories, gathering and the helpers around them.
export { isChoice, Trajectory, TrajectoryGroup } from "./core/trajectory.ts";
export type { Choice, History, Message, MessageOrChoice, MetricValue, Tool } from "./core/trajectory.ts";
export { gatherTrajectories, gatherTrajectoryGroups } from "./core/gather.ts";
export { captureTrajectory } from "./core/capture.ts";
export type { GatherOptions } from "./core/gather.ts";
export { iterateDataset, limitConcurrency, retry } from "./core/concurrency.ts";
export type { DatasetStep, IterateDatasetOptions, RetryOptions } from "./core/concurrency.ts";
export { ArtError } from "./core/errors.ts";
export { seededRandom, type Rng } from "./core/random.ts";

// The trainable model: rollouts and training in one process, and its configuration.
export { TrainableModel } from "./trainable/model.ts";
// The JSONL reader of trainSftFromFile(), for notebooks that hold lines out to evaluate.
export { readSftConversations } from "./trainable/model.ts";
// The base URL of the in-process server: with `model.server.fetch` it connects any agent framework (docs/gather.md).
export { IN_PROCESS_BASE_URL } from "./serve/model-server.ts";
export type { ModelState, SftOptions, SftResult, TrainableModelOptions, TrainResult } from "./trainable/model.ts";
export type { HistoryRow } from "./trainable/store.ts";
// Accuracy, cost per 1,000 runs and latency of baselines beside the trained model (ART·E's table; docs/stopping.md).
export { costTable } from "./trainable/cost.ts";
export type { Device } from "./load/causal-lm.ts";
export type { ImportanceSampling, PolicyLoss, Schedule, TrainConfig, TrainConfigInit } from "./grpo/config.ts";
export type { StepResult } from "./grpo/train.ts";
export { DEFAULT_LORA, type LoraConfig } from "./model/lora.ts";

// RULER: relative scores from an LLM judge.
export { ruler, rulerScoreGroup } from "./ruler/ruler.ts";
export type { RulerGroupOptions, RulerOptions, RulerResult, RulerScore } from "./ruler/ruler.ts";
export { endpointClient, JUDGE_PROVIDERS, type Judge, type JudgeEndpoint, type JudgeSpec } from "./ruler/judge.ts";
export { DEFAULT_RUBRIC, type SubScoreSpec } from "./ruler/prompt.ts";
export { calibrateRuler, calibrationReport, type CalibrationReport } from "./ruler/calibrate.ts";

// Task environments: the names the cookbook's notebooks use. Each environment's whole API (boards, parsers, rewards,
// scripted players, option types) is `envs` (lib/envs/mod.ts), e.g. `envs.Game2048`, and ART·E's `arte`
// (lib/envs/arte/mod.ts), e.g. `arte.loadEnronQuestions`.
export * as envs from "./envs/mod.ts";
export * as arte from "./envs/arte/mod.ts";
export { greedyPolicy2048, rollout2048 } from "./envs/game2048.ts";
export {
  heuristicPolicyTicTacToe, parseTicTacToeMove, randomOpponent, rolloutTicTacToe, squareName, TicTacToeBoard, TICTACTOE_REWARDS,
} from "./envs/tictactoe.ts";
export { generateTemporalClue, guessPolicyTemporalClue, rolloutTemporalClue, solverPolicyTemporalClue, type TemporalCluePuzzle } from "./envs/temporal-clue.ts";
export { randomCodenamesPolicy, rolloutCodenames, scriptedCodenamesPolicy } from "./envs/codenames.ts";
export { generateInbox, type Email, type InboxQuestion } from "./envs/arte/inbox.ts";
export { EmailDatabase } from "./envs/arte/database.ts";
export { ARTE_TOOLS, InboxTools } from "./envs/arte/tools.ts";
export { arteSystemPrompt, rolloutArte, scoreArteAnswer } from "./envs/arte/rollout.ts";
export { inboxMcpServer } from "./envs/arte/mcp.ts";
export { COMPLETE_TASK_TOOL, connectMcp, generateMcpScenarios, rolloutMcp, type McpScenario, type McpServerSpec } from "./envs/mcp.ts";

// Notebook display: live progress, plots, transcripts, parameters.
export { display } from "./notebook/display.ts";
export { detectKernel } from "./notebook/kernel.ts";
// Inside the Deno kernel, Kernel > Interrupt stops art-ts loops between steps instead of ending the kernel.
import "./notebook/interrupt.ts";
export { progress, type ProgressOptions } from "./notebook/progress.ts";
export { compareRewards, rewardCurve, rewardDistribution, stepRecord, type RewardCurveOptions, type StepRecord } from "./notebook/plot.ts";
export { groupTranscript, transcript } from "./notebook/transcript.ts";
export { lossCurve } from "./notebook/plot.ts";
export { compareMeans, type MeanComparison } from "./notebook/stats.ts";
export { envNumber, envString } from "./notebook/params.ts";
