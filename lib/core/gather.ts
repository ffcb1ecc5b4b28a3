/**
 * Gathering rollouts (after ART's gather_trajectory_groups / gather_trajectories): every rollout runs at once,
 * a rollout that throws is recorded rather than fatal until more than `maxExceptions` have failed, and a
 * progress reporter sees running metric averages and completion-token counts as rollouts finish.
 */
import { ArtError } from "./errors.ts";
import { interruptScope, throwIfInterrupted } from "./interrupt.ts";
import { defaultProgressReporter, type GatherProgressState, type ProgressReporter } from "./progress.ts";
import { describeValue, errorMessage, sampledTokenCount, Trajectory, TrajectoryGroup, type RolloutException } from "./trajectory.ts";

/** A rollout: a pending trajectory, or a function that starts one. */
export type Rollout = Promise<Trajectory> | (() => Promise<Trajectory>);

/**
 * A group to gather: its rollouts (gather then tracks each one), or a group already built or pending
 * (e.g. from TrajectoryGroup.fromRollouts; its exceptions are counted when it resolves).
 */
export type GroupSource = Iterable<Rollout> | TrajectoryGroup | Promise<TrajectoryGroup> | (() => Promise<TrajectoryGroup>);

/** What afterEach may do with a finished group: keep or replace it, expand it into several, or drop it (null). */
export type AfterEachResult = TrajectoryGroup | TrajectoryGroup[] | null;

export interface GatherOptions {
  /** The progress line's label. Default "gather". */
  description?: string;
  /**
   * Failed rollouts tolerated: a count (0, 1, 2, ...) or, below 1, a fraction of all rollouts. Default 0.
   * One more failure than allowed makes the gather throw.
   */
  maxExceptions?: number;
  /** false for no progress output; default: the installed default reporter (a terminal line on stderr). */
  progress?: ProgressReporter | false;
}

export interface GatherGroupsOptions extends GatherOptions {
  /** Runs on each group as soon as it is complete (e.g. RULER judging), concurrently with the rest. */
  afterEach?: (group: TrajectoryGroup) => AfterEachResult | Promise<AfterEachResult>;
}

/**
 * Runs every group's rollouts concurrently and returns the groups in input order (after afterEach). A group
 * left with no trajectory, because all its rollouts failed, is dropped: there is nothing in it to train on.
 */
export async function gatherTrajectoryGroups(groups: Iterable<GroupSource>, options: GatherGroupsOptions = {}): Promise<TrajectoryGroup[]> {
  const tracker = new GatherTracker(options);
  const sources = [...groups].map((source) => (isGroupLike(source) ? source : [...source]));
  tracker.expectRollouts(sources.reduce((n, source) => n + (Array.isArray(source) ? source.length : 0), 0));
  tracker.expectOpaqueGroups(sources.filter((source) => !Array.isArray(source)).length);
  const settledGroups = Promise.all(
    sources.map(async (source) => {
      const group = Array.isArray(source) ? await tracker.runGroup(source) : await tracker.awaitGroup(source);
      // Once the gather has failed its result is discarded: skip afterEach (often a paid judge call).
      if (group === null || group.trajectories.length === 0 || tracker.isFinished) return [];
      const processed = options.afterEach ? await options.afterEach(group) : group;
      return processed === null ? [] : Array.isArray(processed) ? processed : [processed];
    }),
  );
  const results = await tracker.run(settledGroups);
  return results.flat();
}

/** Runs rollouts concurrently and returns the trajectories that succeeded, in input order. */
export async function gatherTrajectories(rollouts: Iterable<Rollout>, options: GatherOptions = {}): Promise<Trajectory[]> {
  const tracker = new GatherTracker(options);
  const list = [...rollouts];
  tracker.expectRollouts(list.length);
  const group = await tracker.run(tracker.runGroup(list));
  return group.trajectories;
}

function isGroupLike(source: GroupSource): source is TrajectoryGroup | Promise<TrajectoryGroup> | (() => Promise<TrajectoryGroup>) {
  return source instanceof TrajectoryGroup || typeof source === "function" || typeof (source as { then?: unknown }).then === "function";
}

/** Completion tokens a trajectory sampled: each Choice's token_ids, else the length of its logprobs. */
export function completionTokenCount(trajectory: Trajectory): number {
  return trajectory.choices().reduce((count, choice) => count + (sampledTokenCount(choice) ?? 0), 0);
}

/** The bookkeeping of one gather: counts, running averages, the exception limit and the reporter. */
class GatherTracker {
  private readonly description: string;
  private readonly maxExceptions: number;
  private readonly reporter: ProgressReporter | null;
  private readonly startTime = Date.now();
  private total = 0;
  private opaqueGroupsPending = 0;
  private completed = 0;
  private completionTokens = 0;
  private readonly exceptions: RolloutException[] = [];
  private readonly metricSums = new Map<string, number>();
  private readonly metricCounts = new Map<string, number>();
  private failWith: ((error: ArtError) => void) | null = null;
  private finished = false;

  constructor(options: GatherOptions) {
    this.description = options.description ?? "gather";
    this.maxExceptions = options.maxExceptions ?? 0;
    if (!(this.maxExceptions >= 0) || (this.maxExceptions >= 1 && !Number.isInteger(this.maxExceptions))) {
      throw new ArtError(
        "invalid_option",
        `gather: maxExceptions must be a whole count (0, 1, 2, ...) or a fraction between 0 and 1, got ${this.maxExceptions}.`,
      );
    }
    throwIfInterrupted(`gather "${this.description}", before its rollouts started`);
    this.reporter = options.progress === false ? null : (options.progress ?? defaultProgressReporter(this.description));
  }

  get isFinished(): boolean {
    return this.finished;
  }

  expectRollouts(n: number): void {
    this.total += n;
  }

  expectOpaqueGroups(n: number): void {
    this.opaqueGroupsPending += n;
  }

  /** Resolves with the work's result, or rejects as soon as too many rollouts have failed. */
  async run<T>(work: Promise<T>): Promise<T> {
    const tooMany = new Promise<never>((_, reject) => {
      this.failWith = reject;
    });
    // An interrupt rejects at once; the rollouts in flight finish in the background and are dropped.
    const interrupt = interruptScope(() => `gather "${this.description}" (${this.completed}/${this.total} rollouts finished)`, (error) => this.failWith?.(error));
    try {
      const result = await Promise.race([work, tooMany]);
      const error = this.exceptionLimitError(true);
      if (error) throw error;
      return result;
    } finally {
      interrupt.end();
      this.finished = true;
      await this.reporter?.finish(this.state());
    }
  }

  async runGroup(rollouts: Rollout[]): Promise<TrajectoryGroup> {
    const group = new TrajectoryGroup();
    const outcomes = await Promise.all(rollouts.map((rollout) => this.runRollout(rollout)));
    for (const outcome of outcomes) {
      if (outcome instanceof Trajectory) group.trajectories.push(outcome);
      else group.exceptions.push(outcome);
    }
    return group;
  }

  async awaitGroup(source: TrajectoryGroup | Promise<TrajectoryGroup> | (() => Promise<TrajectoryGroup>)): Promise<TrajectoryGroup | null> {
    let group: TrajectoryGroup | null = null;
    let failure: RolloutException | null = null;
    try {
      group = await (typeof source === "function" ? source() : source);
      if (!(group instanceof TrajectoryGroup)) throw new TypeError(`a group resolved to ${describeValue(group)}, not a TrajectoryGroup`);
    } catch (error) {
      failure = { error, message: errorMessage(error) };
      group = null;
    }
    this.opaqueGroupsPending--;
    if (failure) {
      this.total += 1;
      this.recordException(failure);
    } else if (group) {
      this.total += group.trajectories.length + group.exceptions.length;
      for (const trajectory of group.trajectories) this.recordTrajectory(trajectory);
      for (const exception of group.exceptions) this.recordException(exception);
    }
    return group;
  }

  private async runRollout(rollout: Rollout): Promise<Trajectory | RolloutException> {
    try {
      const trajectory = await (typeof rollout === "function" ? rollout() : rollout);
      if (!(trajectory instanceof Trajectory)) throw new TypeError(`a rollout returned ${describeValue(trajectory)}, not a Trajectory`);
      this.recordTrajectory(trajectory);
      return trajectory;
    } catch (error) {
      const exception = { error, message: errorMessage(error) };
      this.recordException(exception);
      return exception;
    }
  }

  private recordTrajectory(trajectory: Trajectory): void {
    this.completed++;
    this.completionTokens += completionTokenCount(trajectory);
    this.addMetric("reward", trajectory.reward);
    for (const [name, value] of Object.entries(trajectory.metrics)) this.addMetric(name, Number(value));
    this.report();
  }

  private recordException(exception: RolloutException): void {
    this.completed++;
    this.exceptions.push(exception);
    this.report();
    const error = this.exceptionLimitError(this.opaqueGroupsPending === 0);
    if (error && !this.finished) this.failWith?.(error);
  }

  private addMetric(name: string, value: number): void {
    if (!Number.isFinite(value)) return;
    this.metricSums.set(name, (this.metricSums.get(name) ?? 0) + value);
    this.metricCounts.set(name, (this.metricCounts.get(name) ?? 0) + 1);
  }

  /** A fractional limit is only judged once the total is final (every pending group has resolved). */
  private exceptionLimitError(totalIsFinal: boolean): ArtError | null {
    const isFraction = this.maxExceptions > 0 && this.maxExceptions < 1;
    if (isFraction && !totalIsFinal) return null;
    const allowed = isFraction ? Math.floor(this.maxExceptions * this.total) : this.maxExceptions;
    if (this.exceptions.length <= allowed) return null;
    const shown = this.exceptions.slice(0, 3).map((e) => `  - ${e.message}`).join("\n");
    const limit = isFraction ? `${this.maxExceptions} of ${this.total} rollouts = ${allowed}` : String(allowed);
    return new ArtError(
      "too_many_exceptions",
      `${this.description}: ${this.exceptions.length} of ${this.total} rollouts failed, more than maxExceptions allows (${limit}). ` +
        `First errors:\n${shown}\nFix the rollout, or raise maxExceptions (a count, or a fraction such as 0.1) to tolerate failures.`,
      { cause: this.exceptions[0].error },
    );
  }

  private report(): void {
    if (!this.finished) this.reporter?.update(this.state());
  }

  private state(): GatherProgressState {
    const metrics: Record<string, number> = {};
    for (const [name, sum] of this.metricSums) metrics[name] = sum / this.metricCounts.get(name)!;
    return {
      description: this.description,
      completed: this.completed,
      total: this.total,
      exceptions: this.exceptions.length,
      metrics,
      completionTokens: this.completionTokens,
      elapsedSeconds: (Date.now() - this.startTime) / 1000,
    };
  }
}
