/**
 * Stopping rules and alarms on synthetic histories whose right answer is known: a plateau, a divergence of train and
 * validation reward, a jump, a collapse; and how often they fire falsely on noisy but healthy runs (seeded).
 */
import { describe, expect, it } from "vitest";
import { seededRandom, type Rng } from "../../lib/core/random.ts";
import { alarms, metricSeries, stopDecision } from "../../lib/trainable/monitor.ts";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { summarizeGroups, type HistoryRow } from "../../lib/trainable/store.ts";

/** A normal draw (Box-Muller) from the seeded generator. */
const normal = (rng: Rng) => Math.sqrt(-2 * Math.log(1 - rng())) * Math.cos(2 * Math.PI * rng());

/**
 * A run of `steps` training rows whose true train reward follows `trainCurve` and validation (every `every` steps)
 * `valCurve`; each logged mean is the mean of 32 rewards with std 0.3, so its standard error is 0.053.
 */
function run(steps: number, trainCurve: (s: number) => number, valCurve: (s: number) => number, seed: number, every = 2): HistoryRow[] {
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
  return rows;
}

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
  });

  it("measure repeated answers per group, and alarm when groups collapse onto one answer", () => {
    const answer = (content: string): Trajectory => new Trajectory({
      messagesAndChoices: [{ role: "user", content: "Move?" }, { index: 0, finish_reason: "stop", logprobs: null, message: { role: "assistant", content, refusal: null } } as Choice],
      reward: 0,
    });
    // Group 1: a, a, b, c -> 2 of 4 repeat; group 2: d, d -> 2 of 2; a group of one is left out.
    const row = summarizeGroups("train", [new TrajectoryGroup(["a", "a", "b", "c"].map(answer)), new TrajectoryGroup(["d", "d"].map(answer)), new TrajectoryGroup([answer("e")])]);
    expect(row["train/repeated_answers"]).toBeCloseTo(4 / 6, 10);

    const history = run(12, rising, rising, 13);
    const trainRows = history.filter((row) => "train/reward" in row);
    trainRows.forEach((row, i) => (row["train/repeated_answers"] = Math.min(0.1 + 0.08 * i, 0.95)));
    expect(kinds(history)).toContain("repeated_answers");
    // Answers that always repeated (a task with one right answer, already learnt) are no collapse.
    trainRows.forEach((row) => (row["train/repeated_answers"] = 0.9));
    expect(kinds(history)).not.toContain("repeated_answers");
  });

  it("stay quiet on noisy but healthy runs (seeded false-alarm rate)", () => {
    let raised = 0;
    for (let seed = 0; seed < 200; seed++) if (alarms(run(30, risingThenFlat, risingThenFlat, 500 + seed)).length > 0) raised++;
    expect(raised / 200).toBeLessThan(0.05);
  });
});
