import { describe, expect, it } from "vitest";
import { PROJECTIONS } from "../../lib/model/lora.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { dotLoss, relativeError, tensorFiniteDifferences } from "./check.ts";
import { ARCHITECTURES, fixtureBatch, loadTinyModel } from "./tiny-fixture.ts";

/**
 * Every gradient is held to PyTorch's float64 autograd (measured ≤ 7.2e-6 relative, all three architectures, LoRA and
 * full-parameter). Finite differences of the f32 forward are an independent check with an error of their own: the
 * forward's rounding divided by the step, measured up to 1.1e-3 against the same PyTorch gradients.
 */
const PYTORCH_TOLERANCE = 5e-5;
const FINITE_DIFFERENCE_TOLERANCE = 3e-3;

describe.each(ARCHITECTURES)("%s: backward through the whole transformer", (arch) => {
  const { fixture, transformer } = loadTinyModel(arch);
  const config = transformer.config, backend = transformer.backend;
  const batch = fixtureBatch(fixture);
  const upstream = Float32Array.from(fixture.upstream);
  const loraModel = (recomputeActivations: boolean) => {
    const model = new DifferentiableTransformer(transformer, {
      lora: { rank: fixture.rank, alpha: fixture.alpha, targetModules: [...PROJECTIONS], useRslora: false },
      recomputeActivations,
    });
    for (const p of model.parameterTensors()) backend.write(p.value, Float32Array.from(fixture.lora[p.name].data));
    return model;
  };
  const lossOf = (model: DifferentiableTransformer) => () => dotLoss(model.forward(batch, { keepActivations: false }).logprobs, upstream);

  it("LoRA forward logprobs match PyTorch (two packed sequences)", () => {
    const model = loraModel(false);
    expect(relativeError(model.forward(batch).logprobs, fixture.logprobsLora)).toBeLessThan(1e-5);
    expect(relativeError(model.forward(batch, { useAdapter: false }).logprobs, fixture.logprobsBase)).toBeLessThan(1e-5);
  });

  for (const recompute of [false, true]) {
    it(`every LoRA A/B gradient matches PyTorch and finite differences${recompute ? " (recomputed activations)" : ""}`, () => {
      const model = loraModel(recompute);
      model.zeroGradients();
      model.backward(model.forward(batch), upstream);
      const params = model.parameterTensors();
      expect(params.length).toBe(config.numLayers * 7 * 2);
      for (const p of params) {
        const grad = backend.download(p.grad);
        expect(relativeError(grad, fixture.loraGrads[p.name]), `${p.name} vs PyTorch`).toBeLessThan(PYTORCH_TOLERANCE);
        if (recompute) continue; // same numbers; finite differences once is enough
        expect(relativeError(grad, tensorFiniteDifferences(backend, p.value, lossOf(model))), `${p.name} vs finite differences`).toBeLessThan(FINITE_DIFFERENCE_TOLERANCE);
      }
    });
  }

  it('"auto" recomputes the layers whose activations would not fit, with the same gradients as keeping them all', () => {
    const gradientsOf = (model: DifferentiableTransformer) => {
      model.zeroGradients();
      const pass = model.forward(batch);
      const kept = pass.layers.map((layer) => layer.acts !== null);
      model.backward(pass, upstream);
      return { kept, grads: model.parameterTensors().map((p) => backend.download(p.grad)) };
    };
    const reference = gradientsOf(loraModel(false));
    const auto = loraModel(false);
    auto.recomputeActivations = "auto";
    expect(gradientsOf(auto).kept).toEqual([true, true]); // the CPU reports no memory figure: everything stays
    // Room for the first layer's activations only (asked before and after its forward, then once a layer): the second
    // is recomputed in the backward.
    let asked = 0;
    backend.availableMemory = () => (asked++ < 3 ? 2 ** 40 : 0);
    try {
      const mixed = gradientsOf(auto);
      expect(mixed.kept).toEqual([true, false]);
      expect(mixed.grads).toEqual(reference.grads); // recomputing runs the very same ops: bit for bit
    } finally {
      delete backend.availableMemory;
    }
  });

  it("every weight gradient in full-parameter mode matches PyTorch and finite differences", () => {
    const model = new DifferentiableTransformer(transformer, { lora: null });
    model.zeroGradients();
    model.backward(model.forward(batch), upstream);
    const params = model.parameterTensors();
    expect(params.map((p) => p.name).sort()).toEqual(Object.keys(fixture.fullGrads).sort());
    for (const p of params) {
      const grad = backend.download(p.grad);
      expect(relativeError(grad, fixture.fullGrads[p.name]), `${p.name} vs PyTorch`).toBeLessThan(PYTORCH_TOLERANCE);
      expect(relativeError(grad, tensorFiniteDifferences(backend, p.value, lossOf(model))), `${p.name} vs finite differences`).toBeLessThan(FINITE_DIFFERENCE_TOLERANCE);
    }
  });
});
