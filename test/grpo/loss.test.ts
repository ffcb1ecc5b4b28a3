import { describe, expect, it } from "vitest";
import { adamwStep, createAdamWState } from "../../lib/grpo/adamw.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { type ImportanceSampling, learningRateAt, resolveTrainConfig, type PolicyLoss } from "../../lib/grpo/config.ts";
import { crossEntropyLoss, groupAdvantages, klShapedAdvantages, policyLoss, trajectoryTokenWeights } from "../../lib/grpo/loss.ts";
import { loadFixture, relativeError } from "../model/check.ts";

interface LossFixture {
  new: number[]; ref: number[]; weight: number;
  cases: { policyLoss: PolicyLoss; epsilon: number; epsilonHigh: number; importanceSampling: ImportanceSampling;
    advantage: number; klPenaltyCoef: number; advantages: number[]; klCoef: number; truncatedImportanceSampling: number | null;
    old: (number | null)[]; loss: number; grad: number[] }[];
}
const fixture = loadFixture<LossFixture>("grpo/losses.json");

describe("advantages and token weights", () => {
  it("centres rewards on the group mean and scales by the population std + 1e-6", () => {
    const adv = groupAdvantages([1, 0, 0, 1], true);
    expect(adv.map((a) => Number(a.toFixed(5)))).toEqual([1, -1, -1, 1]);
    expect(groupAdvantages([3, 1], false)).toEqual([1, -1]);
  });

  it("gives an all-equal group zero advantages (nothing to train)", () => {
    expect(groupAdvantages([0.5, 0.5, 0.5], true)).toEqual([0, 0, 0]);
    // 0.1 · 3 / 3 is not 0.1 in floating point: still exact zeros, not a rounding residue
    expect(groupAdvantages([0.1, 0.1, 0.1], true)).toEqual([0, 0, 0]);
    expect(groupAdvantages([0.1, 0.1, 0.1], false)).toEqual([0, 0, 0]);
  });

  it("weights each trajectory's tokens by 1/length, normalised to mean 1 over tokens", () => {
    const w = trajectoryTokenWeights([2, 6, 0]);
    expect(w[2]).toBe(0);
    expect(w[0] * 2 + w[1] * 6).toBeCloseTo(8, 10);
    expect(w[0] * 2).toBeCloseTo(w[1] * 6, 10);
  });
});

describe("policy losses match PyTorch autograd", () => {
  for (const c of fixture.cases) {
    const old = Float32Array.from(c.old, (x) => x ?? NaN);
    const label = `${c.policyLoss} eps ${c.epsilon}/${c.epsilonHigh} ${c.importanceSampling} A=${c.advantage}` +
      `${c.klPenaltyCoef ? ` KL-shaped ${c.klPenaltyCoef}` : ""} kl=${c.klCoef} cap=${c.truncatedImportanceSampling}${old.some(Number.isNaN) ? " unknown old" : ""}`;
    it(label, () => {
      const config = resolveTrainConfig({
        policyLoss: c.policyLoss, epsilon: c.epsilon, epsilonHigh: c.epsilonHigh, importanceSampling: c.importanceSampling,
        klCoef: c.klCoef, truncatedImportanceSampling: c.truncatedImportanceSampling,
      });
      const newLogprobs = Float32Array.from(fixture.new), refLogprobs = Float32Array.from(fixture.ref);
      const advantages = c.klPenaltyCoef > 0
        ? klShapedAdvantages(c.advantage, newLogprobs, refLogprobs, c.klPenaltyCoef, newLogprobs.reduce((a, x, i) => a + (x - refLogprobs[i]) / newLogprobs.length, 0))
        : new Float32Array(newLogprobs.length).fill(c.advantage);
      expect(relativeError(advantages, c.advantages)).toBeLessThan(1e-6);
      const result = policyLoss({ newLogprobs, oldLogprobs: old, refLogprobs, advantages, weight: fixture.weight }, config);
      expect(Math.abs(result.loss - c.loss) / Math.max(1e-6, Math.abs(c.loss))).toBeLessThan(1e-5);
      expect(relativeError(result.dNewLogprobs, c.grad)).toBeLessThan(1e-5);
    });
  }

  it("counts clipped tokens and treats unknown old logprobs as ratio 1", () => {
    const config = resolveTrainConfig({ policyLoss: "ppo" });
    const result = policyLoss({
      newLogprobs: Float32Array.of(-1, -1, -1), oldLogprobs: Float32Array.of(-2, NaN, -0.5),
      refLogprobs: null, advantages: Float32Array.of(1, 1, 1), weight: 1,
    }, config);
    // ratio e^1 > 1.2 with A > 0 is clipped (no gradient); NaN old → ratio 1; e^-0.5 < 0.8 is not clipped for A > 0
    expect(result.clippedTokens).toBe(1);
    expect(Array.from(result.dNewLogprobs)).toEqual([0, -1, -Math.fround(Math.exp(-0.5))]);
  });

  it("SFT cross-entropy is −weight·Σ logp", () => {
    const { loss, dNewLogprobs } = crossEntropyLoss(Float32Array.of(-1, -2), 0.5);
    expect(loss).toBeCloseTo(1.5, 6);
    expect(Array.from(dNewLogprobs)).toEqual([-0.5, -0.5]);
  });
});

describe("TrainConfig", () => {
  it("has ART's defaults", () => {
    const c = resolveTrainConfig();
    expect(c.learningRate).toBe(5e-6);
    expect(c.lora).toEqual({ rank: 8, alpha: 16, useRslora: false,
      targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] });
    expect([c.beta1, c.beta2, c.weightDecay, c.maxGradNorm]).toEqual([0.9, 0.99, 0.1, 0.1]);
    expect(c).toMatchObject({
      policyLoss: "cispo", epsilon: 1, epsilonHigh: 4, importanceSampling: "token", truncatedImportanceSampling: null, klCoef: 0,
      klPenaltyCoef: 0, optimizerSteps: "packed_rows", packedSequenceLength: null, maxSequenceLength: 32768, allowTrainingWithoutLogprobs: false,
    });
    expect(resolveTrainConfig({ policyLoss: "ppo" })).toMatchObject({ epsilon: 0.2, epsilonHigh: 0.2 });
  });

  it("refuses bad values with a message naming the key", () => {
    expect(() => resolveTrainConfig({ learningRate: -1 })).toThrow("TrainConfig.learningRate must be a positive number, got -1");
    expect(() => resolveTrainConfig({ lora: { targetModules: ["qkv" as never] } })).toThrow("TrainConfig.lora.targetModules");
    expect(() => resolveTrainConfig({ schedule: { kind: "cosine", totalSteps: 0 } })).toThrow("schedule.totalSteps");
    expect(() => resolveTrainConfig({ importanceSampling: "mean" as never })).toThrow('TrainConfig.importanceSampling must be "token", "sequence", "average" or "geometric_average"');
    expect(() => resolveTrainConfig({ optimizerSteps: "rows" as never })).toThrow('TrainConfig.optimizerSteps must be "packed_rows" or "one"');
    expect(() => resolveTrainConfig({ truncatedImportanceSampling: 0 })).toThrow("TrainConfig.truncatedImportanceSampling must be a positive number");
    expect(() => resolveTrainConfig({ recomputeActivations: "yes" as never })).toThrow('TrainConfig.recomputeActivations must be true, false or "auto"');
  });

  it("warms up linearly, then holds or follows a cosine or a line", () => {
    const constant = resolveTrainConfig({ learningRate: 1, schedule: { warmupSteps: 3 } });
    expect([0, 1, 2, 3, 10].map((s) => learningRateAt(constant, s))).toEqual([0.25, 0.5, 0.75, 1, 1]);
    const cosine = resolveTrainConfig({ learningRate: 1, schedule: { kind: "cosine", totalSteps: 10 } });
    expect(learningRateAt(cosine, 0)).toBe(1);
    expect(learningRateAt(cosine, 5)).toBeCloseTo(0.5, 10);
    expect(learningRateAt(cosine, 10)).toBeCloseTo(0, 10);
    const linear = resolveTrainConfig({ learningRate: 1, schedule: { kind: "linear", warmupSteps: 2, totalSteps: 12, minLearningRate: 0.2 } });
    [1 / 3, 2 / 3, 1, 0.6, 0.2, 0.2].forEach((rate, i) => expect(learningRateAt(linear, [0, 1, 2, 7, 12, 20][i])).toBeCloseTo(rate, 12));
  });
});

describe("AdamW", () => {
  const options = { learningRate: 0.1, beta1: 0.9, beta2: 0.99, eps: 1e-8, weightDecay: 0.1, maxGradNorm: 1 };
  const cpu = new CpuBackend();
  const param = () => ({ name: "w", value: cpu.upload(Float32Array.of(1, -2), [2]), grad: cpu.upload(Float32Array.of(0.3, -0.4), [2]), shape: [2] });

  it("matches torch.optim.AdamW with clip_grad_norm_ over two steps", () => {
    const p = param();
    const state = createAdamWState();
    adamwStep(cpu, [p], state, { ...options, maxGradNorm: 0.1 });
    cpu.write(p.grad, Float32Array.of(0.5, 0.1));
    adamwStep(cpu, [p], state, { ...options, maxGradNorm: 0.1 });
    // torch 1.13: AdamW([w], lr=0.1, betas=(0.9, 0.99), weight_decay=0.1) after clip_grad_norm_(0.1) each step
    expect(relativeError(cpu.download(p.value), [0.7827590107917786, -1.813753604888916])).toBeLessThan(1e-6);
  });

  it("refuses a non-finite gradient and changes nothing", () => {
    const p = param();
    cpu.write(p.grad, Float32Array.of(0.3, NaN));
    const state = createAdamWState();
    expect(() => adamwStep(cpu, [p], state, options)).toThrow(/gradient of w is not finite.*no weights were changed/);
    expect(Array.from(cpu.download(p.value))).toEqual([1, -2]);
    expect(state.step).toBe(0);
  });
});
