/**
 * RULER: relative scores from an LLM judge for a group of trajectories (after ART's rewards/ruler.py).
 * Identical trajectories are judged once; each judge's answer is parsed leniently, re-asked when unusable,
 * clamped into [0, 1], and cached on disk. Several judges can score the same group: their scores are
 * combined (mean or median) and their rank agreement reported.
 */
import process from "node:process";
import { ArtError } from "../core/errors.ts";
import { errorMessage, type Message, type Tool, type Trajectory, TrajectoryGroup } from "../core/trajectory.ts";
import { clipText } from "../core/text.ts";
import { InvalidAnswer, type JudgedEntry, parseJudgeAnswer } from "./answer.ts";
import { cacheKey, DEFAULT_CACHE_DIR, JudgementCache } from "./cache.ts";
import { type Judge, type JudgeSpec, resolveJudge, type TransportRetryOptions } from "./judge.ts";
import { answerSchema, buildJudgePrompt, DEFAULT_RUBRIC, type SubScoreSpec } from "./prompt.ts";
import { mean, median, spearman } from "./stats.ts";

export interface RulerOptions {
  /** One judge or several; see JudgeSpec. */
  judge: JudgeSpec | JudgeSpec[];
  /** What a good trajectory is; default: DEFAULT_RUBRIC. */
  rubric?: string;
  /** Named parts of the rubric scored separately and returned beside the overall score. */
  subScores?: SubScoreSpec[];
  /** How several judges' scores combine. Default "mean". */
  aggregate?: "mean" | "median";
  /** The tools the agent had (ruler() only; rulerScoreGroup reads them from the trajectories). */
  tools?: Tool[];
  /** true (default): cache answers under .art/ruler-cache; { dir } elsewhere; false: always ask the judge. */
  cache?: boolean | { dir: string };
  /** Per request. Default 120. */
  timeoutSeconds?: number;
  /** Retries of HTTP failures and timeouts. Default 3 attempts, 1 s then 2 s apart. */
  retries?: TransportRetryOptions;
  /** How many times a judge is asked when its answer cannot be used (wrong count, no JSON...). Default 3. */
  maxAnswerAttempts?: number;
}

export interface RulerScore {
  /** The <trajectory id> this message list was judged under; identical lists share one. */
  trajectoryId: number;
  /** In [0, 1]: the judges' scores combined. */
  score: number;
  explanation: string;
  subScores: Record<string, number>;
  /** Each judge's score, by judge name. */
  judgeScores: Record<string, number>;
  /** How many numbers the judges gave for this trajectory were outside [0, 1] and clamped. */
  clamped: number;
}

export interface RulerResult {
  /** One per input message list, in input order. */
  scores: RulerScore[];
  /** Mean pairwise Spearman correlation between the judges' scores; null with one judge or nothing to rank. */
  agreement: number | null;
  /** Judges whose answer came from the cache. */
  cacheHits: number;
  /** Judges that failed while others answered (if all fail, ruler throws). */
  judgeFailures: { judge: string; message: string }[];
}

/** Scores message lists relative to one another. */
export async function ruler(messageLists: Message[][], options: RulerOptions): Promise<RulerResult> {
  if (!Array.isArray(messageLists) || !messageLists.every(Array.isArray)) {
    throw new ArtError("ruler_input", "RULER: messageLists must be an array of message arrays (one per trajectory).");
  }
  const judges = uniquelyNamed((Array.isArray(options.judge) ? options.judge : [options.judge]).map((spec) => resolveJudge(spec, options.retries)));
  if (judges.length === 0) throw new ArtError("ruler_judge_config", "RULER: no judge given; pass judge: \"openai/o4-mini\" or an endpoint.");
  const settings = checkedSettings(options);
  if (messageLists.length === 0) return { scores: [], agreement: null, cacheHits: 0, judgeFailures: [] };

  const { unique, blockOf } = distinct(messageLists);
  const subScores = options.subScores ?? [];
  const request: JudgementRequest = {
    ...settings,
    prompt: buildJudgePrompt({ trajectories: unique, tools: options.tools, rubric: options.rubric ?? DEFAULT_RUBRIC, subScores }),
    schema: answerSchema(unique.length, subScores),
    count: unique.length,
    subScoreNames: subScores.map((s) => s.name),
    cache: options.cache === false ? null : new JudgementCache(typeof options.cache === "object" ? options.cache.dir : DEFAULT_CACHE_DIR),
  };
  const outcomes = await Promise.allSettled(judges.map((judge) => judgeOnce(judge, request)));
  const answered = judges.flatMap((judge, i) => (outcomes[i].status === "fulfilled" ? [{ judge, ...outcomes[i].value }] : []));
  const judgeFailures = judges.flatMap((judge, i) => {
    const outcome = outcomes[i];
    return outcome.status === "rejected" ? [{ judge: judge.name, message: errorMessage(outcome.reason) }] : [];
  });
  if (answered.length === 0) {
    const first = (outcomes[0] as PromiseRejectedResult).reason;
    if (judges.length === 1) throw first;
    throw new ArtError("ruler_judge_failed", `RULER: every judge failed:\n${judgeFailures.map((f) => `  - ${f.judge}: ${f.message}`).join("\n")}`, { cause: first });
  }

  const perBlock = combineAnswers(answered, unique.length, request.subScoreNames, options.aggregate === "median" ? median : mean);
  return {
    scores: blockOf.map((block) => ({ trajectoryId: block + 1, ...structuredClone(perBlock[block]) })),
    agreement: judgeAgreement(answered.map((a) => a.entries.map((e) => e.score))),
    cacheHits: answered.filter((a) => a.cached).length,
    judgeFailures,
  };
}

function checkedSettings(options: RulerOptions): { timeoutSeconds: number; maxAnswerAttempts: number } {
  const maxAnswerAttempts = options.maxAnswerAttempts ?? 3;
  const timeoutSeconds = options.timeoutSeconds ?? 120;
  if (!Number.isInteger(maxAnswerAttempts) || maxAnswerAttempts < 1) {
    throw new ArtError("invalid_option", `RULER: maxAnswerAttempts must be a positive integer, got ${maxAnswerAttempts}.`);
  }
  if (!(timeoutSeconds > 0)) throw new ArtError("invalid_option", `RULER: timeoutSeconds must be positive, got ${timeoutSeconds}.`);
  const names = (options.subScores ?? []).map((s) => s.name);
  if (names.some((name) => typeof name !== "string" || name === "") || new Set(names).size !== names.length) {
    throw new ArtError("invalid_option", `RULER: sub-score names must be distinct non-empty strings, got ${JSON.stringify(names)}.`);
  }
  return { timeoutSeconds, maxAnswerAttempts };
}

/** The distinct message lists, and for each input list the index of its distinct copy. */
function distinct(messageLists: Message[][]): { unique: Message[][]; blockOf: number[] } {
  const indexByContent = new Map<string, number>();
  const unique: Message[][] = [];
  const blockOf = messageLists.map((messages) => {
    const key = JSON.stringify(messages);
    let index = indexByContent.get(key);
    if (index === undefined) {
      index = unique.push(messages) - 1;
      indexByContent.set(key, index);
    }
    return index;
  });
  return { unique, blockOf };
}

/** Per distinct trajectory: the judges' scores and sub-scores combined, their explanations joined. */
function combineAnswers(
  answered: { judge: Judge; entries: JudgedEntry[] }[],
  count: number,
  subScoreNames: string[],
  combine: (values: number[]) => number,
): Omit<RulerScore, "trajectoryId">[] {
  return Array.from({ length: count }, (_, block) => {
    const entries = answered.map((a) => a.entries[block]);
    const subScores: Record<string, number> = {};
    for (const name of subScoreNames) subScores[name] = combine(entries.map((e) => e.subScores[name]));
    return {
      score: combine(entries.map((e) => e.score)),
      explanation: answered.length === 1 ? entries[0].explanation : answered.map((a, j) => `${a.judge.name}: ${entries[j].explanation}`).join("\n"),
      subScores,
      judgeScores: Object.fromEntries(answered.map((a, j) => [a.judge.name, entries[j].score])),
      clamped: entries.reduce((n, e) => n + e.clamped, 0),
    };
  });
}

export interface RulerGroupOptions extends RulerOptions {
  /** On failure, warn and return null (gather's afterEach then drops the group) instead of throwing. */
  swallowExceptions?: boolean;
}

/**
 * Judges a group and returns a judged copy (the input is left alone): reward becomes the judge's score,
 * metrics gain independent_reward (the old reward), ruler_score, ruler_clamped, per-judge scores
 * (ruler_score/<judge>, with several judges) and sub-scores (ruler_sub_score/<name>); the explanation goes to logs.
 */
export async function rulerScoreGroup(group: TrajectoryGroup, options: RulerGroupOptions): Promise<TrajectoryGroup | null> {
  let result: RulerResult;
  try {
    result = await ruler(
      group.trajectories.map((t) => t.messages()),
      { ...options, tools: options.tools ?? toolsOf(group.trajectories) },
    );
  } catch (error) {
    if (!options.swallowExceptions) throw error;
    process.stderr.write(`RULER: dropping a group of ${group.trajectories.length} trajectories: ${errorMessage(error)}\n`);
    return null;
  }
  const judged = new TrajectoryGroup(group.trajectories.map((t) => t.clone()), { exceptions: group.exceptions, metadata: group.metadata });
  judged.trajectories.forEach((trajectory, i) => {
    const score = result.scores[i];
    trajectory.metrics.independent_reward = trajectory.reward;
    trajectory.metrics.ruler_score = score.score;
    trajectory.metrics.ruler_clamped = score.clamped;
    if (Object.keys(score.judgeScores).length > 1) {
      for (const [judge, value] of Object.entries(score.judgeScores)) trajectory.metrics[`ruler_score/${judge}`] = value;
    }
    if (result.agreement !== null) trajectory.metrics.ruler_judge_agreement = result.agreement;
    for (const [name, value] of Object.entries(score.subScores)) trajectory.metrics[`ruler_sub_score/${name}`] = value;
    trajectory.reward = score.score;
    trajectory.log(`RULER explanation: ${score.explanation}`);
  });
  return judged;
}

interface JudgementRequest {
  prompt: Message[];
  schema: Record<string, unknown>;
  count: number;
  subScoreNames: string[];
  timeoutSeconds: number;
  maxAnswerAttempts: number;
  cache: JudgementCache | null;
}

/** One judge's scores for the distinct trajectories: from the cache, or asked (and re-asked while unusable). */
async function judgeOnce(judge: Judge, request: JudgementRequest): Promise<{ entries: JudgedEntry[]; cached: boolean }> {
  const key = cacheKey([judge.cacheKey, request.prompt, request.schema]);
  const hit = await request.cache?.get(key);
  if (hit && hit.length === request.count) return { entries: hit, cached: true };
  let conversation = request.prompt;
  let problem = "";
  let answer = "";
  for (let attempt = 1; attempt <= request.maxAnswerAttempts; attempt++) {
    answer = await judge.complete({ messages: conversation, schema: request.schema, timeoutSeconds: request.timeoutSeconds });
    try {
      const entries = parseJudgeAnswer(answer, request.count, request.subScoreNames);
      await request.cache?.set(key, entries).catch(() => undefined); // a cache that cannot be written only costs a later request
      return { entries, cached: false };
    } catch (error) {
      if (!(error instanceof InvalidAnswer)) throw error;
      problem = error.message;
      conversation = [
        ...request.prompt,
        { role: "assistant", content: answer },
        {
          role: "user",
          content:
            `That answer could not be used: ${problem}. Reply again with only the JSON object, holding exactly ${request.count} ` +
            `entries with trajectory_id "1" to "${request.count}", each with an explanation and a score between 0 and 1.`,
        },
      ];
    }
  }
  throw new ArtError(
    "ruler_bad_answer",
    `RULER: judge ${judge.name} gave no usable answer in ${request.maxAnswerAttempts} attempts (last problem: ${problem}; ` +
      `the answer began ${JSON.stringify(clipText(answer, 200))}). Use a stronger judge, or one that supports structured output.`,
  );
}

/** Judge names label metrics, so two judges with the same name get "#2", "#3" suffixes. */
function uniquelyNamed(judges: Judge[]): Judge[] {
  const seen = new Map<string, number>();
  return judges.map((judge) => {
    const n = (seen.get(judge.name) ?? 0) + 1;
    seen.set(judge.name, n);
    return n === 1 ? judge : { name: `${judge.name}#${n}`, cacheKey: judge.cacheKey, complete: (r) => judge.complete(r) };
  });
}

/** The tools the trajectories had, each named tool once. */
function toolsOf(trajectories: Trajectory[]): Tool[] | undefined {
  const byName = new Map<string, Tool>();
  for (const t of trajectories) for (const tool of t.tools ?? []) byName.set(tool.type === "function" ? tool.function.name : JSON.stringify(tool), tool);
  return byName.size > 0 ? [...byName.values()] : undefined;
}

function judgeAgreement(scoresByJudge: number[][]): number | null {
  const correlations: number[] = [];
  for (let a = 0; a < scoresByJudge.length; a++) {
    for (let b = a + 1; b < scoresByJudge.length; b++) {
      const rho = spearman(scoresByJudge[a], scoresByJudge[b]);
      if (Number.isFinite(rho)) correlations.push(rho);
    }
  }
  return correlations.length > 0 ? mean(correlations) : null;
}
