/**
 * Evaluating a policy on scenarios with the rollout function training uses: the model under training (validation),
 * its base model, a prompted model behind any OpenAI-compatible endpoint, or a scripted player (baselines). The
 * rollout decides which policy plays; this runs it over the scenarios and says how it should sample.
 */
import { ArtError } from "../core/errors.ts";
import { gatherTrajectoryGroups } from "../core/gather.ts";
import type { ProgressReporter } from "../core/progress.ts";
import type { Trajectory, TrajectoryGroup } from "../core/trajectory.ts";

/**
 * How an evaluation samples: "sampled" as training does (the policy GRPO trains), or "greedy" (temperature 0, the
 * policy as an agent would be deployed). The two differ, so a history keeps them apart (`{split}/greedy`).
 */
export type EvaluationMode = "sampled" | "greedy";

/** What a rollout is told about the evaluation it is part of. */
export interface EvaluationContext {
  /** The rollout samples accordingly: temperature 0 for "greedy". */
  mode: EvaluationMode;
  /** Which of the scenario's `repeats` this is (0-based), e.g. to seed its requests. */
  repeat: number;
}

/** Plays one scenario with the policy the rollout closes over, as training's rollouts do. */
export type ScenarioRollout<S> = (scenario: S, context: EvaluationContext) => Promise<Trajectory>;

export interface EvaluateOptions {
  /** Default "sampled". */
  mode?: EvaluationMode;
  /** Trajectories per scenario, each scenario's forming one group; default 1. More steady a sampled evaluation. */
  repeats?: number;
  /** The progress line's label. */
  description?: string;
  /** Failed rollouts tolerated, as gather counts them (a count, or below 1 a fraction); default 0. */
  maxExceptions?: number;
  /** false for no progress output. */
  progress?: ProgressReporter | false;
}

/**
 * Runs `rollout` on every scenario (`repeats` times each, concurrently) and returns one group per scenario, ready for
 * `model.log()`, `model.logBaseline()` or a plot. A scenario whose rollouts all failed has no group (gather drops it).
 */
export async function evaluateScenarios<S>(scenarios: readonly S[], rollout: ScenarioRollout<S>, options: EvaluateOptions = {}): Promise<TrajectoryGroup[]> {
  const mode = checkMode(options.mode ?? "sampled", "evaluateScenarios");
  const repeats = options.repeats ?? 1;
  if (!Number.isInteger(repeats) || repeats < 1) {
    throw new ArtError("bad_evaluation", `evaluateScenarios: repeats must be a whole number of trajectories per scenario, 1 or more; got ${JSON.stringify(repeats)}`);
  }
  if (scenarios.length === 0) {
    throw new ArtError("bad_evaluation", "evaluateScenarios: no scenarios to evaluate on; pass the validation scenarios (an empty list would log a reward of nothing)");
  }
  return gatherTrajectoryGroups(
    scenarios.map((scenario) => Array.from({ length: repeats }, (_, repeat) => () => rollout(scenario, { mode, repeat }))),
    { description: options.description ?? `evaluate (${mode})`, maxExceptions: options.maxExceptions, progress: options.progress },
  );
}

/** `mode` if it is one, else an error naming `where`. */
export function checkMode(mode: unknown, where: string): EvaluationMode {
  if (mode !== "sampled" && mode !== "greedy") {
    throw new ArtError("bad_evaluation", `${where}: mode must be "sampled" (as training samples) or "greedy" (temperature 0); got ${JSON.stringify(mode)}`);
  }
  return mode;
}
