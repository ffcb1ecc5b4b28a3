// Decode passes as CUDA graphs (lib/cuda/decode-graphs.ts), the host side on the recording device: when a pass is
// run eagerly, recorded or replayed; what a replay uploads and launches; what a graph reads is written before it
// runs and stays allocated while it exists; failures switch graphs off without losing the pass. What replays
// compute is checked against eager passes by the parity suites (emulator and GPU).
import { describe, expect, it } from "vitest";
import { CudaBackend, type CudaBackendOptions } from "../../lib/cuda/backend.ts";
import type { KvCache, Tensor } from "../../lib/model/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { type LayerLoras } from "../../lib/model/lora.ts";
import { type Transformer } from "../../lib/model/transformer.ts";
import { tinyCheckpoint } from "../model/helpers.ts";
import { RecordingDevice } from "./recording-device.ts";

function setup(options: CudaBackendOptions = {}) {
  const device = new RecordingDevice();
  const messages: string[] = [];
  const backend = new CudaBackend(device, device.gemm(), RecordingDevice.kernels(), { graphs: true, log: (m) => messages.push(m), ...options });
  const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 3 }), backend, "bf16");
  const cache = model.createKvCache(4, 256);
  const stats = () => backend.decodeGraphStats();
  const done = () => {
    cache.free();
    model.free();
    expect(device.graphs.size).toBe(0);
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  };
  return { device, backend, model, cache, messages, stats, done };
}

/** One decode row per slot, all at `position`; frees the logits unless `keep`. */
function decode(model: Transformer, cache: KvCache, slots: number[], position: number, options: { keep?: boolean; loras?: LayerLoras[] } = {}): Tensor {
  const logits = model.forward(Int32Array.from(slots, (s) => 1 + s), { slots: Int32Array.from(slots), positions: Int32Array.from(slots, () => position) },
    cache, null, options.loras);
  if (!options.keep) model.backend.free(logits);
  return logits;
}

describe("decode passes as CUDA graphs (recording device)", () => {
  it("a decode shape runs eagerly once, is recorded the second time, then costs one upload and one graph launch", () => {
    const { device, model, cache, stats, done } = setup();
    const loaded = device.launches.length; // narrowing the weights to bf16
    decode(model, cache, [0, 1, 2], 10);
    const eager = { launches: device.launches.length - loaded, gemms: device.gemms.length };
    // The embedding, then per layer the split, the attention, two add + RMSNorms (the second the next layer's norm, or
    // the final one) and the SwiGLU, the first layer's input norm: 12 for the 2-layer model.
    expect(eager.launches).toBe(12);
    expect(stats()).toEqual({ recorded: 0, replayed: 0, eager: 1, graphs: 0, disabled: null });
    decode(model, cache, [0, 1, 2], 11);
    expect(stats()).toEqual({ recorded: 1, replayed: 0, eager: 1, graphs: 1, disabled: null });
    const [graph] = device.graphs.keys();
    // The recording holds the eager pass's launches (the GEMMs go through cuBLAS on the captured stream).
    expect(device.graphs.get(graph)!.map((l) => l.name)).toEqual(device.launches.slice(loaded).map((l) => l.name));
    const before = { launches: device.launches.length, gemms: device.gemms.length, events: device.events.length, graphLaunches: device.graphLaunches };
    for (let position = 12; position < 20; position++) decode(model, cache, [0, 1, 2], position);
    expect(stats()).toEqual({ recorded: 1, replayed: 8, eager: 1, graphs: 1, disabled: null });
    expect(device.launches.length).toBe(before.launches);
    expect(device.gemms.length).toBe(before.gemms);
    expect(device.graphLaunches - before.graphLaunches).toBe(8);
    expect(device.events.slice(before.events).map((e) => e.event)).toEqual(Array(8).fill(["upload", "launchGraph"]).flat());
    done();
  });

  it("what a graph reads is uploaded before it first runs: the step's inputs before recording, its tiles after", () => {
    const { device, model, cache, done } = setup();
    decode(model, cache, [0, 1, 2], 10);
    decode(model, cache, [0, 1, 2], 11);
    const [graph] = device.graphs.keys();
    const recorded = device.graphs.get(graph)!;
    const events = device.events;
    const captured = events.findIndex((e) => e.event === "endCapture");
    const firstRun = events.findIndex((e) => e.event === "launchGraph");
    const uploadedBetween = (from: number, to: number, address: bigint) =>
      events.slice(from, to).some((e) => e.event === "upload" && e.address === address);
    const attention = recorded.find((l) => l.name.startsWith("attention_dpl"))!;
    const [tileStart, tileRows] = [attention.args[5][1], attention.args[6][1]] as bigint[];
    expect(uploadedBetween(captured, firstRun, tileStart)).toBe(true);
    expect(uploadedBetween(captured, firstRun, tileRows)).toBe(true);
    const embedding = recorded.find((l) => l.name.startsWith("embedding"))!;
    expect(uploadedBetween(0, captured, embedding.args[1][1] as bigint)).toBe(true); // ids | slots | positions
    done();
  });

  it("a new key window, row count, LoRA set or cache is a new shape; held logits make the next pass eager", () => {
    const { backend, model, cache, stats, done } = setup();
    const twice = (slots: number[], position: number, loras?: LayerLoras[]) => {
      decode(model, cache, slots, position, { loras });
      decode(model, cache, slots, position, { loras });
    };
    twice([0, 1, 2], 62);
    twice([0, 1, 2], 63); // keys 64: the same window
    expect(stats()).toMatchObject({ recorded: 1, replayed: 2, eager: 1 });
    twice([0, 1, 2], 64); // keys 65: window 128
    twice([0, 1], 64);
    const { hiddenSize: d, numHeads, headDim } = model.config;
    const loras: LayerLoras[] = [{ q_proj: { a: backend.zeros([2, d]), b: backend.zeros([numHeads * headDim, 2]), scale: 1 } }, {}];
    twice([0, 1], 64, loras);
    const other = model.createKvCache(4, 256);
    decode(model, other, [0, 1], 64);
    decode(model, other, [0, 1], 64);
    expect(stats()).toMatchObject({ recorded: 5, replayed: 2, eager: 5, graphs: 5 });
    other.free(); // its graph goes with it
    expect(stats()).toMatchObject({ graphs: 4 });
    // While a pass's logits are held, no graph may run (they may be any graph's scratch): eager, then replays again.
    const held = decode(model, cache, [0, 1], 64, { keep: true });
    decode(model, cache, [0, 1], 64);
    expect(stats()).toMatchObject({ replayed: 3, eager: 6 });
    backend.free(held);
    decode(model, cache, [0, 1], 64);
    expect(stats()).toMatchObject({ replayed: 4, eager: 6 });
    for (const t of Object.values(loras[0]).flatMap((l) => [l!.a, l!.b])) backend.free(t);
    done();
  });

  it("a replay refuses what the eager pass refuses: rows outside the cache, ids outside the vocabulary", () => {
    const { model, cache, done } = setup();
    decode(model, cache, [0, 1], 5);
    decode(model, cache, [0, 1], 5);
    expect(() => decode(model, cache, [0, 7], 5)).toThrowError("row 1 names slot 7 position 5; the KV cache has 4 slots of 256 positions");
    expect(() => decode(model, cache, [0, 1], 256)).toThrowError("row 0 names slot 0 position 256; the KV cache has 4 slots of 256 positions");
    expect(() => model.forward(Int32Array.from([1, 999]), { slots: Int32Array.from([0, 1]), positions: Int32Array.from([5, 5]) }, cache, null))
      .toThrowError("token id 999 is outside the vocabulary (0..255)");
    done();
  });

  for (const where of ["begin", "end"] as const) {
    it(`a recording that fails at its ${where} switches graphs off, says why, and the pass still runs`, () => {
      const { device, model, cache, messages, stats, done } = setup();
      device.failCapture = where;
      const loaded = device.launches.length;
      decode(model, cache, [0, 1], 5);
      const launches = device.launches.length - loaded;
      const logits = decode(model, cache, [0, 1], 6, { keep: true });
      expect(logits.shape).toEqual([2, model.config.vocabSize]);
      expect(device.launches.length - loaded).toBe(2 * launches); // run eagerly after the failed recording
      model.backend.free(logits);
      expect(messages).toEqual([`art-ts cuda: CUDA graphs are off for this backend, decode passes run without them (slower): recording one failed: recording device: capture ${where === "begin" ? "refused" : "invalidated"}`]);
      expect(stats()).toMatchObject({ recorded: 0, replayed: 0, graphs: 0, disabled: `recording device: capture ${where === "begin" ? "refused" : "invalidated"}` });
      decode(model, cache, [0, 1], 7);
      decode(model, cache, [0, 1], 8);
      expect(device.launches.length - loaded).toBe(4 * launches);
      expect(device.graphLaunches).toBe(0);
      done();
    });
  }

  for (const when of ["first run", "replay"] as const) {
    it(`a graph launch that fails at its ${when} switches graphs off, and the pass runs eagerly`, () => {
      const { device, model, cache, messages, stats, done } = setup();
      const loaded = device.launches.length;
      decode(model, cache, [0, 1], 5);
      const launches = device.launches.length - loaded;
      if (when === "replay") decode(model, cache, [0, 1], 6);
      device.failGraphLaunch = true;
      const logits = decode(model, cache, [0, 1], 7, { keep: true });
      expect(logits.shape).toEqual([2, model.config.vocabSize]);
      expect(device.launches.length - loaded).toBe(2 * launches);
      model.backend.free(logits);
      expect(messages).toEqual([`art-ts cuda: CUDA graphs are off for this backend, decode passes run without them (slower): ${when === "replay" ? "replaying" : "running"} one failed: recording device: graph launch failed`]);
      expect(stats()).toMatchObject({ graphs: 0, disabled: "recording device: graph launch failed" });
      done();
    });
  }

  it("out of memory while recording switches graphs off; the graphs already recorded never lose their memory", () => {
    const { device, model, cache, messages, stats, done } = setup();
    decode(model, cache, [0, 1, 2], 5);
    decode(model, cache, [0, 1, 2], 5); // recorded: its scratch is the arena's
    decode(model, cache, [0, 1], 5); // another shape, eagerly: its blocks are cached by the main pool
    device.pool.trim();
    device.limitBytes = device.outstandingBytes + 512; // the graph's input buffer, then nothing more from the device
    const logits = decode(model, cache, [0, 1], 5, { keep: true });
    expect(logits.shape).toEqual([2, model.config.vocabSize]); // the pass ran, eagerly
    expect(stats()).toMatchObject({ recorded: 1, graphs: 0 });
    expect(stats()!.disabled).toMatch(/^out of GPU memory allocating \d+ bytes/);
    expect(messages[0]).toMatch(/^art-ts cuda: CUDA graphs are off for this backend, .*: recording one failed: out of GPU memory/);
    model.backend.free(logits);
    device.limitBytes = Infinity;
    done();
  });

  it("with graphs off every pass runs eagerly", () => {
    const { device, model, cache, stats, done } = setup({ graphs: false });
    const loaded = device.launches.length;
    decode(model, cache, [0], 0);
    const launches = device.launches.length - loaded;
    for (let position = 1; position < 3; position++) decode(model, cache, [0], position);
    expect(stats()).toBeNull();
    expect(device.graphLaunches).toBe(0);
    expect(device.launches.length - loaded).toBe(3 * launches);
    done();
  });
});
