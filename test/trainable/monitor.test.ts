/**
 * Stopping rules and alarms on synthetic histories whose right answer is known: a plateau, a divergence of train and
 * validation reward, a jump, perfect scores validation does not share, a collapse; and how often they fire falsely on
 * noisy but healthy runs (seeded). The metrics the alarms read are checked on hand-built trajectory groups.
 */
import { describe, expect, it } from "vitest";
import { seededRandom, type Rng } from "../../lib/core/random.ts";
import { alarms, metricSeries, stopDecision, type Alarm } from "../../lib/trainable/monitor.ts";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { summarizeGroups, type HistoryRow } from "../../lib/trainable/store.ts";

/** A normal draw (Box-Muller) from the seeded generator. */
const normal = (rng: Rng) => Math.sqrt(-2 * Math.log(1 - rng())) * Math.cos(2 * Math.PI * rng());

/** A healthy run's distinct_2grams: answers of a group share a few more word pairs as the policy settles. */
const settling = (s: number) => Math.max(0.55, 0.8 - 0.01 * s);

/**
 * A run of `steps` training rows whose true train reward follows `trainCurve` and validation (every `every` steps)
 * `valCurve`; each logged mean is the mean of 32 rewards with std 0.3, so its standard error is 0.053. The train rows'
 * distinct_2grams follow `diversity` with noise of std 0.05 (drawn after the rest, so the rewards do not change with it).
 */
function run(steps: number, trainCurve: (s: number) => number, valCurve: (s: number) => number, seed: number, every = 2, diversity = settling): HistoryRow[] {
  const rng = seededRandom(seed);
  const rows: HistoryRow[] = [];
  for (let s = 0; s < steps; s++) {
    rows.push({
      step: s, recorded_at: "", training_step: s + 1, "train/reward": trainCurve(s) + (0.3 / Math.sqrt(32)) * normal(rng),
      "train/reward_std_dev": 0.3, "train/trajectories": 32, "train/flat_groups": 0.1, "loss/entropy": 1.2 - 0.02 * s,
      "time/step_wall_s": 10, "throughput/trained_tokens": 5000,
    });
    if (s % every === 0) rows.push({ step: s, recorded_at: "", "val/reward": valCurve(s) + (0.3 / Math.sqrt(32)) * normal(rng), "val/reward_std_dev": 0.3, "val/trajectories": 32 });
  }
  for (const row of rows) if ("train/reward" in row) row["train/distinct_2grams"] = diversity(row.step) + 0.05 * normal(rng);
  return rows;
}

/** Successes in `n` trials of chance `p`. */
const binomial = (rng: Rng, n: number, p: number) => Array.from({ length: n }, () => rng()).filter((u) => u < p).length;

/**
 * A run whose rollouts score 0 or 1, 32 a step, each 1 with chance `trainChance(step)` (validation: `valChance`,
 * every 2 steps, or none): the share at 1 is both the reward and the perfect share.
 */
function binaryRun(steps: number, trainChance: (s: number) => number, valChance: ((s: number) => number) | null, seed: number): HistoryRow[] {
  const rng = seededRandom(seed);
  const logged = (split: string, chance: number) => {
    const share = binomial(rng, 32, chance) / 32;
    return { [`${split}/reward`]: share, [`${split}/reward_std_dev`]: Math.sqrt(share * (1 - share)), [`${split}/trajectories`]: 32, [`${split}/perfect_share`]: share };
  };
  const rows: HistoryRow[] = [];
  for (let s = 0; s < steps; s++) {
    rows.push({ step: s, recorded_at: "", training_step: s + 1, ...logged("train", trainChance(s)) });
    if (valChance && s % 2 === 0) rows.push({ step: s, recorded_at: "", ...logged("val", valChance(s)) });
  }
  return rows;
}

/** A rollout whose last turn is a sampled Choice with this text (and tool calls). */
const answer = (content: string | null, reward = 0, toolCalls: { id: string; name: string; args: string }[] = []): Trajectory => new Trajectory({
  messagesAndChoices: [{ role: "user", content: "Move?" }, {
    index: 0, finish_reason: "stop", logprobs: null,
    message: { role: "assistant", content, refusal: null, tool_calls: toolCalls.map(({ id, name, args }) => ({ id, type: "function" as const, function: { name, arguments: args } })) },
  } as Choice],
  reward,
});

const rising = (s: number) => 0.2 + 0.03 * s;
const risingThenFlat = (s: number) => Math.min(0.2 + 0.05 * s, 0.7);

describe("stopping rules", () => {
  it("read a metric's standard error from its row", () => {
    const [first] = metricSeries(run(1, rising, rising, 1), "train/reward");
    expect(first!.stdErr).toBeCloseTo(0.3 / Math.sqrt(32), 12);
  });

  it("stop on a plateau of validation reward, and not while it still rises", () => {
    const rule = { kind: "plateau", metric: "val/reward", patience: 4 } as const;
    const flat = stopDecision(run(40, risingThenFlat, risingThenFlat, 2), [rule]);
    expect(flat.stop).toBe(true);
    expect(flat.reason).toMatch(/^stop: plateau of val\/reward: best 0\.\d+ at step \d+, \d+ evaluation\(s\) since without a change beyond 0\.0\d+$/);
    expect(stopDecision(run(20, rising, rising, 3), [rule]).stop).toBe(false);
    expect(stopDecision(run(4, rising, rising, 3), [rule]).reason).toMatch(/2 evaluation\(s\), a plateau needs more than 4/);
  });

  it("stop at a target, within a budget, and on a hybrid only when both metrics level off", () => {
    const history = run(12, rising, rising, 4);
    expect(stopDecision(history, [{ kind: "target", metric: "train/reward", atLeast: 0.4 }]).stop).toBe(true);
    expect(stopDecision(history, [{ kind: "target", metric: "train/reward", atLeast: 5 }]).reason).toMatch(/^go on: target train\/reward >= 5: 0\.\d+ at step 11$/);
    expect(stopDecision(history, [{ kind: "budget", steps: 12 }])).toEqual({ stop: true, reason: "stop: budget: steps 12/12" });
    expect(stopDecision(history, [{ kind: "budget", tokens: 1e6, pricePerMillionTokens: 2, money: 0.1 }])).toEqual({ stop: true, reason: "stop: budget: trained tokens 60000/1000000, money 0.12/0.1" });
    expect(stopDecision(history, [{ kind: "budget", seconds: 1000 }]).stop).toBe(false);
    // Validation has levelled off but train reward still climbs: a hybrid rule goes on.
    const diverging = run(40, rising, risingThenFlat, 5);
    const hybrid = { kind: "hybrid", primary: { kind: "plateau", metric: "val/reward", patience: 4 }, secondary: { kind: "plateau", metric: "train/reward", patience: 4 } } as const;
    expect(stopDecision(diverging, [hybrid.primary]).stop).toBe(true);
    expect(stopDecision(diverging, [hybrid]).stop).toBe(false);
    expect(stopDecision(run(40, risingThenFlat, risingThenFlat, 6), [hybrid]).stop).toBe(true);
  });

  it("rarely call a noisy but improving run a plateau (seeded false-stop rate)", () => {
    let falseStops = 0;
    for (let seed = 0; seed < 200; seed++) {
      if (stopDecision(run(20, rising, rising, 100 + seed), [{ kind: "plateau", metric: "val/reward", patience: 4 }]).stop) falseStops++;
    }
    expect(falseStops / 200).toBeLessThan(0.05);
  });
});

describe("alarms", () => {
  const kinds = (history: HistoryRow[]) => alarms(history).map((a) => a.kind);
  /** Whether `kind` is raised at any training step of the run, as a loop asking each step would see it. */
  const raisedAtSomeStep = (history: HistoryRow[], kind: Alarm["kind"]) =>
    history.filter((row) => "train/reward" in row).some((row) => kinds(history.filter((r) => r.step <= row.step)).includes(kind));

  it("catch train reward rising while validation falls", () => {
    const hacked = run(30, rising, (s) => 0.6 - 0.03 * s, 7);
    expect(kinds(hacked)).toContain("reward_up_validation_down");
    expect(alarms(hacked)[0]!.message).toMatch(/train\/reward rose by 0\.\d+ while val\/reward fell by 0\.\d+ over the last 6 evaluations/);
  });

  it("catch a jump after a plateau", () => {
    const jump = run(20, (s) => (s < 19 ? 0.3 : 0.95), (s) => 0.3, 8);
    expect(kinds(jump)).toContain("reward_jump");
  });

  it("catch entropy collapse, signal-less groups and rising failures", () => {
    const history = run(10, rising, rising, 9);
    const trainRows = history.filter((row) => "train/reward" in row);
    trainRows.forEach((row, i) => {
      row["loss/entropy"] = 1.2 * 0.6 ** i;
      row["train/invalid_move"] = i < 6 ? 0.02 : 0.4;
    });
    trainRows.at(-1)!["train/flat_groups"] = 0.75;
    expect(kinds(history).sort()).toEqual(["entropy_collapse", "no_signal", "rising_failures"]);
    // A validation logged after the last training step does not re-date them: each keeps its metric's step.
    const lastTrainStep = trainRows.at(-1)!.step;
    const validated = [...history, { step: lastTrainStep + 1, recorded_at: "", "val/reward": 0.5 }];
    expect(alarms(validated).map((a) => [a.kind, a.step])).toEqual(alarms(history).map((a) => [a.kind, lastTrainStep]));
  });

  it("measure repeated answers per group, and alarm when groups collapse onto one answer", () => {
    // Group 1: a, a, b, c -> 2 of 4 repeat; group 2: d, d -> 2 of 2; a group of one is left out.
    const row = summarizeGroups("train", [new TrajectoryGroup(["a", "a", "b", "c"].map((c) => answer(c))), new TrajectoryGroup(["d", "d"].map((c) => answer(c))), new TrajectoryGroup([answer("e")])]);
    expect(row["train/repeated_answers"]).toBeCloseTo(4 / 6, 10);
    // The same tool call repeats whatever id the engine drew for it; other arguments are another answer.
    const call = (id: string, args: string) => answer(null, 0, [{ id, name: "return_final_answer", args }]);
    const calls = summarizeGroups("train", [new TrajectoryGroup([call("c1", '{"answer":"4B"}'), call("c2", '{"answer":"4B"}'), call("c3", '{"answer":"5C"}')])]);
    expect(calls["train/repeated_answers"]).toBeCloseTo(2 / 3, 10);

    const history = run(12, rising, rising, 13);
    const trainRows = history.filter((row) => "train/reward" in row);
    trainRows.forEach((row, i) => (row["train/repeated_answers"] = Math.min(0.1 + 0.08 * i, 0.95)));
    expect(kinds(history)).toContain("repeated_answers");
    // Answers that always repeated (a task with one right answer, already learnt) are no collapse.
    trainRows.forEach((row) => (row["train/repeated_answers"] = 0.9));
    expect(kinds(history)).not.toContain("repeated_answers");
  });

  it("catch nearly every rollout newly at the top score while validation stays put", () => {
    // A loophole found at step 16: every rollout scores 1 from then on; held-out tasks do not improve.
    const hacked = binaryRun(22, (s) => (s < 16 ? 0.3 : 1), () => 0.3, 14);
    expect(kinds(hacked)).toContain("perfect_scores");
    expect(alarms(hacked).find((a) => a.kind === "perfect_scores")!.message).toMatch(/^100% of the step's rollouts got the top reward \(up by \d+ points\) while val\/reward changed by -?0\.\d+ \(noise 0\.\d+\)/);
    // Without a validation split nothing can confirm it: the alarm fires and says so (the window is then the last 6 steps).
    const unchecked = binaryRun(19, (s) => (s < 16 ? 0.3 : 1), null, 14);
    expect(alarms(unchecked).find((a) => a.kind === "perfect_scores")!.message).toMatch(/val\/reward has fewer than 4 values to confirm it/);
    // Validation rising with it is success, not a loophole, at every step (validation at 100% too: its rows' error 0
    // must not hide the rise); scores that were always perfect did not rise.
    expect(raisedAtSomeStep(binaryRun(30, (s) => (s < 16 ? 0.3 : 1), (s) => (s < 16 ? 0.3 : 0.9), 14), "perfect_scores")).toBe(false);
    expect(raisedAtSomeStep(binaryRun(30, (s) => (s < 16 ? 0.3 : 1), (s) => (s < 16 ? 0.3 : 1), 14), "perfect_scores")).toBe(false);
    expect(kinds(binaryRun(22, () => 0.97, () => 0.3, 14))).not.toContain("perfect_scores");
  });

  it("rarely call an honest solution suspicious: validation rises with it (seeded false-alarm rate, at every step)", () => {
    const solving = (s: number) => 1 / (1 + Math.exp(-(s - 12) / 2.5));
    let raised = 0;
    for (let seed = 0; seed < 200; seed++) {
      if (raisedAtSomeStep(binaryRun(40, solving, (s) => 0.9 * solving(s), 900 + seed), "perfect_scores")) raised++;
    }
    expect(raised / 200).toBeLessThan(0.05);
  });

  it("catch the answers of a group collapsing onto the same words", () => {
    const collapsing = (s: number) => (s < 10 ? 0.75 : Math.max(0.15, 0.75 - 0.08 * (s - 10)));
    const history = run(24, rising, rising, 15, 2, collapsing);
    expect(kinds(history)).toContain("diversity_collapse");
    expect(alarms(history).find((a) => a.kind === "diversity_collapse")!.message).toMatch(/^train\/distinct_2grams fell to 0\.1\d over the last 3 steps from 0\.7\d over the first 6 \(below half by more than its noise, 0\.0\d+\)/);
    expect(kinds(run(24, rising, rising, 15))).not.toContain("diversity_collapse");
  });

  it("want distinct_2grams below half its first window by more than its noise", () => {
    const rows = (values: number[]): HistoryRow[] => values.map((value, step) => ({ step, recorded_at: "", "train/distinct_2grams": value }));
    const first = [0.5, 0.7, 0.6, 0.5, 0.7, 0.6]; // mean 0.6: half is 0.3
    expect(kinds(rows([...first, 0.45, 0.05, 0.15, 0.1]))).toEqual(["diversity_collapse"]);
    expect(kinds(rows([...first, 0.45, 0.35, 0.35, 0.35]))).toEqual([]); // fell, but not to half
    expect(kinds(rows([...first, 0.45, 0.18, 0.38, 0.28]))).toEqual([]); // below half by less than its noise
    // A first window and a later half-window that do not overlap: 9 values at least.
    expect(kinds(rows([0.7, 0.7, 0.7, 0.7, 0.7, 0.05, 0.05, 0.05]))).toEqual([]);
    expect(kinds(rows([0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.05, 0.05, 0.05]))).toEqual(["diversity_collapse"]);
  });

  it("rarely call a settling run's diversity collapsed (seeded false-alarm rate)", () => {
    let raised = 0;
    for (let seed = 0; seed < 200; seed++) if (kinds(run(30, risingThenFlat, risingThenFlat, 1500 + seed, 2, (s) => 0.8 - 0.012 * s)).includes("diversity_collapse")) raised++;
    expect(raised / 200).toBeLessThan(0.05);
  });

  it("stay quiet on noisy but healthy runs (seeded false-alarm rate)", () => {
    let raised = 0;
    for (let seed = 0; seed < 200; seed++) if (alarms(run(30, risingThenFlat, risingThenFlat, 500 + seed)).length > 0) raised++;
    expect(raised / 200).toBeLessThan(0.05);
  });
});

describe("what summarizeGroups logs for the alarms", () => {
  const group = (...trajectories: Trajectory[]) => new TrajectoryGroup(trajectories);

  it("flat_groups: the share of groups of several trajectories whose rewards are all equal, exactly", () => {
    const at = (...rewards: number[]) => group(...rewards.map((r) => answer("x", r)));
    // 0.1 three times has a floating-point spread of 1e-17: still flat, as its advantages are exactly 0
    expect(summarizeGroups("train", [at(0.1, 0.1, 0.1), at(1, 0), at(0.5, 0.5), at(0.3)])["train/flat_groups"]).toBeCloseTo(2 / 3, 10);
  });

  it("perfect_share: the share at the split's top reward, once that top is 1 or more", () => {
    const at = (...rewards: number[]) => rewards.map((r) => answer("x", r));
    expect(summarizeGroups("train", [group(...at(1, 1, 0.5, 0)), group(...at(1, 0.2))])["train/perfect_share"]).toBeCloseTo(3 / 6, 10);
    expect(summarizeGroups("train", [group(...at(0.9, 0.9, 0.4))])["train/perfect_share"]).toBe(0); // no one reached 1
    expect(summarizeGroups("train", [group(...at(0.7 + 0.2 + 0.1, 1, 0))])["train/perfect_share"]).toBeCloseTo(2 / 3, 10); // 0.9999999999999999 is 1
    expect(summarizeGroups("train", [group(...at(2, 2, 1.5))])["train/perfect_share"]).toBeCloseTo(2 / 3, 10); // a reward above 1: its top
    expect(summarizeGroups("train", [])["train/perfect_share"]).toBe(0);
  });

  it("distinct_2grams: distinct over all word pairs of a group's final answers, averaged over groups", () => {
    // "the cat sat" + "The cat, ran" -> the cat, cat sat, the cat, cat ran: 3 distinct of 4. Two equal answers: 2 of 4.
    // A group of one and a group of one-word answers have nothing to compare and are left out.
    const row = summarizeGroups("train", [
      group(answer("the cat sat"), answer("The cat, ran")), group(answer("a b c"), answer("a b c")), group(answer("x y z")), group(answer("B2"), answer("A1")),
    ]);
    expect(row["train/distinct_2grams"]).toBeCloseTo((3 / 4 + 2 / 4) / 2, 10);
    // Tool calls count by name and arguments, so two equal calls are a collapse whatever their ids.
    const call = (id: string, args: string) => answer(null, 0, [{ id, name: "return_final_answer", args }]);
    expect(summarizeGroups("train", [group(call("c1", '{"answer":"room 4B"}'), call("c2", '{"answer":"room 4B"}'))])["train/distinct_2grams"]).toBeCloseTo(1 / 2, 10);
    // Only earlier turns had words: the final answers decide, so there is nothing to measure (not a collapse to 0).
    const earlier = new Trajectory({ messagesAndChoices: [...answer("many words here").messagesAndChoices, ...answer("B2").messagesAndChoices] });
    expect("train/distinct_2grams" in summarizeGroups("train", [group(earlier, answer("A1"))])).toBe(false);
  });
});
