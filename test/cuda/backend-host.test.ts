// The CUDA backend's host logic on a recording device (no GPU): whole forward passes and batched generation of the
// tiny checkpoints, launch by launch; shape and input errors; nothing left allocated.
import { describe, expect, it } from "vitest";
import { CudaBackend, type CudaTensor } from "../../lib/cuda/backend.ts";
import { type SamplingParams, allowedTokenMask } from "../../lib/model/backend.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { generate } from "../../lib/model/generate.ts";
import { PROJECTIONS, projectionShape } from "../../lib/model/lora.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { Batcher, MAX_MEMORY_SIZED_SLOTS } from "../../lib/serve/batcher.ts";
import { tinyCheckpoint } from "../model/helpers.ts";
import { RecordingDevice } from "./recording-device.ts";

function recordingBackend() {
  const device = new RecordingDevice();
  return { device, backend: new CudaBackend(device, device.gemm(), RecordingDevice.kernels()) };
}

describe("CUDA backend host logic (recording device)", () => {
  for (const arch of ["qwen2", "qwen3", "llama"] as const) {
    it(`${arch}: bf16 weights, batched greedy generation, then nothing left allocated`, async () => {
      const { device, backend } = recordingBackend();
      const model = loadTransformer(tinyCheckpoint({ arch, seed: 3 }), backend, "bf16");
      const requests = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]].map((promptIds) => ({ promptIds, temperature: 0.8, topK: 5, topLogprobs: 2, maxTokens: 4, stopIds: [] }));
      const results = await generate(model, requests);
      expect(results.map((r) => r.tokenIds.length)).toEqual([4, 4, 4]);
      const names = new Set(device.launches.map((l) => l.name));
      for (const kernel of ["f32_to_bf16", "embedding_bf16", "rmsnorm_f32", "kv_write", "add_rmsnorm_f32", "swiglu", "gather_rows", "sample"]) {
        expect(names.has(kernel)).toBe(true);
      }
      // q, k and v are split from their one product and rotated in one launch, unless a q/k norm comes between
      // (qwen3). qwen2's q/k/v biases ride on the split; no projection adds a bias of its own here.
      const split = arch === "qwen3" ? "split_columns" : "split_rope_f32";
      expect([...names].filter((name) => /split|rope/.test(name)).sort()).toEqual(arch === "qwen3" ? ["rope_f32", "split_columns"] : ["split_rope_f32"]);
      expect(names.has("add_bias_f32")).toBe(false);
      const splits = device.launches.filter((l) => l.name === split);
      expect(splits.every((l) => (l.args[1][1] !== 0n) === (arch === "qwen2"))).toBe(true);
      // Weights narrowed for bf16 GEMMs: every projection GEMM runs in bf16, the LM head too.
      expect(device.gemms.every((g) => g.type === "bf16")).toBe(true);
      model.free();
      expect(backend.context.pool.stats().inUseBytes).toBeLessThan(64 * 1024); // the small index cache only
      backend.dispose();
      expect(device.outstandingBytes).toBe(0);
    });
  }

  it("sizes a batcher's KV cache from the device's free memory, and names the knobs when it cannot fit", async () => {
    const { device, backend } = recordingBackend();
    const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 3 }), backend, "bf16");
    const { numLayers, numKvHeads, headDim } = model.config;
    const slotBytes = 2 * numLayers * numKvHeads * headDim * 64 * 2; // K and V, bf16, 64 positions
    expect(backend.kvCacheBytes({ numLayers, numKvHeads, headDim, numSlots: 1, maxPositions: 64 })).toBe(slotBytes);
    // 40.5 slots free: half of it holds 20; a quarter, 10.
    device.limitBytes = device.outstandingBytes + Math.floor(40.5 * slotBytes) - backend.context.pool.stats().cachedBytes;
    const sized = new Batcher(model, { maxPositions: 64 });
    expect(sized.numSlots).toBe(20);
    await sized.close();
    const quarter = new Batcher(model, { maxPositions: 64, kvCacheMemory: 0.25 });
    expect(quarter.numSlots).toBe(10);
    await quarter.close();
    expect(() => new Batcher(model, { maxPositions: 64, numSlots: 41 })).toThrow(/41 slots × 64 positions takes .* GiB, more than the .* GiB available: lower batcher.numSlots/);
    expect(() => new Batcher(model, { maxPositions: 64, kvCacheMemory: 0.02 })).toThrow(/one KV-cache slot of 64 positions takes .* more than 0.02 of the .* available: lower batcher.maxPositions/);
    expect(() => new Batcher(model, { kvCacheMemory: 1.5 })).toThrow(/kvCacheMemory must be a share of available memory in \(0, 1\], got 1.5/);
    // Plenty of memory: at most MAX_MEMORY_SIZED_SLOTS.
    device.limitBytes = Infinity;
    const capped = new Batcher(model, { maxPositions: 64 });
    expect(capped.numSlots).toBe(MAX_MEMORY_SIZED_SLOTS);
    await capped.close();
    model.free();
    backend.dispose();
  });

  it("splits long key ranges in decode and merges them; a long prompt's prefill goes to the tensor-core kernel", () => {
    const { device, backend } = recordingBackend();
    const spec = { numLayers: 1, numKvHeads: 2, headDim: 64, numSlots: 2, maxPositions: 2048 };
    const cache = backend.createKvCache(spec);
    const pass = (slots: number[], positions: number[]) => {
      const n = slots.length;
      const q = backend.zeros([n, 14 * 64]), k = backend.zeros([n, 128]), v = backend.zeros([n, 128]), out = backend.zeros([n, 14 * 64]);
      backend.attention(q, k, v, cache, 0, { slots: Int32Array.from(slots), positions: Int32Array.from(positions) }, out);
      for (const t of [q, k, v, out]) backend.free(t);
    };
    pass([0], [1500]);
    const decode = device.launches.filter((l) => l.name.startsWith("attention"));
    // One launch: the last split block of the tile's kv head merges the splits, counted in the cache's counters (after
    // its K and V, which took the cache's first kvCacheBytes).
    expect(decode.map((l) => l.name)).toEqual(["attention_dpl2"]);
    expect(decode[0].grid).toEqual([1, 2, decode[0].grid[2]]);
    expect(decode[0].grid[2]).toBeGreaterThan(1);
    const counters = (cache as unknown as { address: bigint }).address + BigInt(backend.kvCacheBytes(spec));
    expect(decode[0].args[20]).toEqual(["ptr", counters]);
    device.launches.length = 0;
    pass(Array(512).fill(1), Array.from({ length: 512 }, (_, i) => i));
    const prefill = device.launches.filter((l) => l.name.startsWith("attention"));
    expect(prefill.map((l) => [l.name, l.grid])).toEqual([["attention_prefill_hd64", [8, 14, 1]]]); // 64-row tiles × query heads
    // A decode row beside a 512-row prompt chunk: the split partials and their merge cover that one row only.
    device.launches.length = 0;
    pass([0, ...Array(512).fill(1)], [1501, ...Array.from({ length: 512 }, (_, i) => 512 + i)]);
    const mixed = device.launches.filter((l) => l.name.startsWith("attention"));
    expect(mixed.map((l) => l.name)).toEqual(["attention_prefill_hd64", "attention_dpl2"]);
    expect(mixed[1].grid[2]).toBeGreaterThan(1);
    expect(mixed[1].args[16]).toEqual(["i32", 1]); // partial_rows
    expect(mixed[1].args[20]).toEqual(["ptr", counters]);
    cache.free();
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("copies a KV slot in one launch over every layer's keys and values, and names bad arguments", () => {
    const { device, backend } = recordingBackend();
    const spec = { numLayers: 3, numKvHeads: 2, headDim: 64, numSlots: 4, maxPositions: 128 };
    const cache = backend.createKvCache(spec);
    backend.copyKvSlot(cache, 3, 1, 100);
    expect(device.launches.map((l) => [l.name, l.args.slice(1).map(([, value]) => value)]))
      .toEqual([["kv_copy_slot", [6, 4, 2, 128, 64, 3, 1, 100]]]);
    backend.copyKvSlot(cache, 0, 1, 0);
    expect(device.launches).toHaveLength(1); // nothing to copy, nothing launched
    expect(() => backend.copyKvSlot(cache, 1, 4, 1)).toThrowError("copyKvSlot: target slot 4 does not exist; the KV cache has slots 0..3");
    expect(() => backend.copyKvSlot(cache, 2, 2, 1)).toThrowError("copyKvSlot: source and target are both slot 2; copy between two different slots");
    expect(() => backend.copyKvSlot(cache, 0, 1, 129)).toThrowError("copyKvSlot: cannot copy 129 positions; a slot holds 0..128 positions");
    expect(() => backend.copyKvSlot(new CpuBackend().createKvCache(spec), 0, 1, 1)).toThrowError("a KV cache from another backend was passed to the CUDA backend");
    cache.free();
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("reuses device copies of the rows' positions and slots across layers", () => {
    const { device, backend } = recordingBackend();
    const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 4 }), backend, "f32");
    const cache = model.createKvCache(1, 16);
    const rows = { slots: new Int32Array(6), positions: Int32Array.from([0, 1, 2, 3, 4, 5]) };
    model.backend.free(model.forward(Int32Array.from([1, 2, 3, 4, 5, 6]), rows, cache, Int32Array.from([5])));
    const ropes = device.launches.filter((l) => l.name === "split_rope_f32");
    expect(ropes.length).toBe(model.config.numLayers); // the split and q and k's rotation in one launch
    expect(new Set(ropes.map((l) => l.args[5][1])).size).toBe(1);
    expect(device.gemms.every((g) => g.type === "f32")).toBe(true);
    cache.free();
    model.free();
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("bf16 GEMM inputs come from the kernels that produce them: no conversion kernel in a forward pass", () => {
    for (const weights of ["bf16", "f32"] as const) {
      const { device, backend } = recordingBackend();
      const model = loadTransformer(tinyCheckpoint({ arch: "qwen3", seed: 5 }), backend, weights);
      const cache = model.createKvCache(1, 8);
      device.launches.length = 0;
      const rows = { slots: new Int32Array(3), positions: Int32Array.from([0, 1, 2]) };
      model.backend.free(model.forward(Int32Array.from([1, 2, 3]), rows, cache, Int32Array.from([2])));
      // The attention input (q/k/v), the attention output (o), the MLP input (gate/up), the hidden (down), and the
      // final norm's output (the head) each get their bf16 copy from the kernel that writes them; per-head q/k norms
      // feed no GEMM and get none. With f32 weights nothing is narrowed.
      expect(device.launches.filter((l) => l.name === "f32_to_bf16")).toHaveLength(0);
      const copies = (name: string, index: number) => device.launches.filter((l) => l.name === name).map((l) => l.args[index][1] !== 0n);
      const bf16 = weights === "bf16";
      // RMSNorm: the first layer's input norm, each layer's q and k norms; a later layer's input norm is fused into
      // the add that ends the layer before it (add + RMSNorm, like the post-attention one), the final norm into the
      // last layer's, which runs past its attention over the scored row alone (gathered with its bf16 copy).
      expect(copies("rmsnorm_f32", 4)).toEqual([bf16, false, false, false, false]);
      // Layer 0: post-attention, into layer 1; layer 1: post-attention, into the final norm.
      expect(copies("add_rmsnorm_f32", 6)).toEqual([bf16, bf16, bf16, bf16]);
      expect(device.launches.filter((l) => l.name === "add")).toHaveLength(0);
      expect(copies("gather_rows", 4)).toEqual([bf16, false]); // the attention's output (o_proj's operand), the residual
      expect(copies("swiglu", 2)).toEqual([bf16, bf16]);
      expect(copies("attention_dpl1", 13)).toEqual([bf16, bf16]);
      // One product each for q/k/v, o, gate/up and down per layer, and the head.
      expect(device.gemms.length).toBe(4 * model.config.numLayers + 1);
      expect(device.gemms.every((g) => g.type === weights)).toBe(true);
      cache.free();
      model.free();
      backend.dispose();
      expect(device.outstandingBytes).toBe(0);
    }
  });

  it("an inference pass's LoRAs ride the ops after their products: q/k/v's the split, gate/up's the SwiGLU, o's and down's the add + RMSNorm", () => {
    const { device, backend } = recordingBackend();
    const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 4 }), backend, "bf16");
    const layers = model.config.numLayers;
    const adapter = (rank: number) => Array.from({ length: layers }, () => Object.fromEntries(PROJECTIONS.map((name) => {
      const { outFeatures, inFeatures } = projectionShape(model.config, name);
      return [name, { a: backend.zeros([rank, inFeatures]), b: backend.zeros([outFeatures, rank]), scale: 2 }];
    })));
    let loras = adapter(8);
    const cache = model.createKvCache(3, 320);
    const count = (rows: number, positions: (i: number) => number) => {
      device.launches.length = 0;
      device.gemms.length = 0;
      const placement = { slots: Int32Array.from({ length: rows }, (_, i) => (rows === 3 ? i : 0)), positions: Int32Array.from({ length: rows }, (_, i) => positions(i)) };
      backend.free(model.forward(new Int32Array(rows).fill(1), placement, cache, null, loras));
      const named = (name: string) => device.launches.filter((l) => l.name === name).length;
      return { fused: named("lora_fused_f32"), down: named("lora_down_f32"), up: named("lora_up_f32"), norms: named("add_rmsnorm_lora_f32_f32"),
        plainNorms: named("add_rmsnorm_f32"), splits: named("split_rope_lora_f32_f32"), plainSplits: named("split_rope_f32"),
        swiglus: named("swiglu_lora_f32"), plainSwiglus: named("swiglu"), gemms: device.gemms.length };
    };
    // q/k/v's LoRAs ride the split that rotates q and k, gate/up's the SwiGLU, o's the add + RMSNorm after attention,
    // down's the one before the next layer, or the last layer's the add + final RMSNorm (every row scored, as here):
    // none of those ops runs without its LoRA, and no GEMM runs beside the four products of each layer and the head
    // (it was two GEMMs per projection's LoRA).
    const folded = { norms: 2 * layers, plainNorms: 0, splits: layers, plainSplits: 0, swiglus: layers, plainSwiglus: 0, gemms: 4 * layers + 1 };
    expect(count(80, (i) => i)).toEqual({ fused: 0, down: 0, up: 0, ...folded });
    expect(count(3, () => 80)).toEqual({ fused: 0, down: 0, up: 0, ...folded });
    expect(count(9, (i) => 80 + i)).toEqual({ fused: 0, down: 0, up: 0, ...folded });
    // Rank 64 over 300 rows: each row re-reading gate/up's B (2 × 64 × 64 f32, 32 KiB) would pass LORA_FOLD_BYTES
    // (8 MiB), so gate/up's LoRAs take lora_down and lora_up (two tiles of 64 rows) before a plain SwiGLU; q/k/v's
    // (16 KiB a row) and o's and down's (8 KiB) still ride their ops.
    expect([model.config.hiddenSize, model.config.intermediateSize]).toEqual([32, 64]);
    loras = adapter(64);
    expect(count(300, (i) => i)).toEqual({ fused: 0, down: layers, up: layers, ...folded, swiglus: 0, plainSwiglus: layers });
    expect(device.launches.filter((l) => l.name === "lora_up_f32").every((l) => l.grid[2] === 5)).toBe(true);
    // A pass that scores only some rows (a prompt chunk's last) gathers them after the last layer's attention (its
    // output and the residual stream); the rest of that layer runs over them alone, its down LoRA riding the add +
    // final RMSNorm as before (plain RMSNorm: the first layer's input's only).
    loras = adapter(8);
    device.launches.length = 0;
    backend.free(model.forward(new Int32Array(3).fill(1), { slots: Int32Array.of(0, 0, 0), positions: Int32Array.of(90, 91, 92) }, cache, Int32Array.of(2), loras));
    expect(["lora_fused_f32", "add", "gather_rows", "rmsnorm_f32", "add_rmsnorm_lora_f32_f32"].map((name) => device.launches.filter((l) => l.name === name).length))
      .toEqual([0, 0, 2, 1, 2 * layers]);
    cache.free();
    model.free();
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("a training pass takes a group's LoRA down products, and their dA and dx, as one stacked GEMM each; free() gives its tensors back", () => {
    const { device, backend } = recordingBackend();
    const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 4 }), backend, "bf16");
    const layers = model.config.numLayers, rank = 5;
    const network = new DifferentiableTransformer(model, { lora: { rank, alpha: 10, targetModules: [...PROJECTIONS], useRslora: false } });
    const n = 24;
    const batch = { tokens: new Int32Array(n).fill(1), positions: Int32Array.from({ length: n }, (_, i) => i), segments: [{ start: 0, length: n }],
      targets: Int32Array.from({ length: n }, (_, i) => (i >= n / 2 ? 2 : -1)) };
    const gemms = () => device.gemms.splice(0);
    gemms();
    const pass = network.forward(batch);
    const forward = gemms();
    network.backward(pass, new Float32Array(pass.scoredRows.length).fill(1));
    const backward = gemms();
    // Recorded as the row-major product [rows, outF] over inF. Forward: x·Aᵀ of q/k/v (3 ranks wide) and of gate/up
    // (2 ranks) in one GEMM each, o's and down's alone; then a GEMM per LoRA's up product, but gate's and up's, which
    // the SwiGLU adds on its way in (swiglu_kept_lora), and its backward again.
    const count = (list: typeof forward, key: "rows" | "inF" | "outF", value: number) => list.filter((g) => g[key] === value).length;
    expect([3, 2, 1].map((k) => count(forward, "outF", k * rank))).toEqual([layers, layers, 2 * layers]);
    expect(count(forward, "inF", rank)).toBe(5 * layers);
    const launched = (name: string) => device.launches.filter((l) => l.name === name).length;
    expect([launched("swiglu_kept_lora"), launched("swiglu_backward_kept_lora"), launched("swiglu"), launched("swiglu_backward")]).toEqual([layers, layers, 0, 0]);
    // Backward: dA of the stacked A ([3·rank, in] and [2·rank, in], over the rows) and dx += (dOut B) A over the
    // stacked ranks, one GEMM each per group.
    expect([3, 2].map((k) => count(backward, "rows", k * rank))).toEqual([layers, layers]);
    expect([3, 2].map((k) => count(backward, "inF", k * rank))).toEqual([layers, layers]);
    // The bf16 base weights' input gradients: q/k/v's and gate/up's output gradients side by side in one bf16 operand
    // each, then one GEMM with the stacked weight (q/k/v's merged by a launch, gate/up's written so by the SwiGLU's
    // backward beside the f32 ones); o's and down's narrowed alone.
    expect(device.launches.filter((l) => l.name === "merge_columns_bf16")).toHaveLength(layers);
    const swigluBackwards = device.launches.filter((l) => l.name === "swiglu_backward_kept_lora");
    expect(swigluBackwards.every((l) => l.args[4][1] !== 0n)).toBe(true);
    // q, k and v leave the split rotated and in bf16 (attentionInputs), and both attention passes read those very
    // tensors: nothing narrows them in between.
    const splits = device.launches.filter((l) => l.name.startsWith("split"));
    expect([...new Set(splits.map((l) => l.name))]).toEqual(["split_rope_to_bf16_f32"]);
    const written = new Set(splits.flatMap((l) => l.args.slice(2, 5).map(([, value]) => value)));
    const attention = device.launches.filter((l) => /^packed_attention_(forward|backward_dq|backward_dkdv)_/.test(l.name));
    expect(attention).toHaveLength(3 * layers);
    expect(attention.every((l) => l.args.slice(0, 3).every(([, value]) => written.has(value)))).toBe(true);
    // Beside bf16 weights every f32 product (the LoRAs', forward and backward) runs on TF32 tensor cores.
    const types = (list: typeof forward) => [...new Set(list.map((g) => g.type))].sort();
    expect(types(forward)).toEqual(["bf16", "tf32"]);
    expect(types(backward)).toEqual(["bf16", "tf32"]);
    expect(forward.filter((g) => g.type === "tf32")).toHaveLength(5 * layers + 4 * layers);
    // free() gives back everything the network allocated: no parameter or gradient (views of the stacked A matrices
    // included) lies in a live block afterwards.
    const blocks = (network.parameterTensors().flatMap((p) => [p.value, p.grad]) as CudaTensor[]).map((t) => [t.address, t.bytes] as const);
    expect(blocks.every(([address, bytes]) => device.pool.owns(address, bytes))).toBe(true);
    network.free();
    expect(blocks.filter(([address, bytes]) => device.pool.owns(address, bytes))).toEqual([]);
    model.free();
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("a training pass over f32 weights keeps its LoRA products in f32 (no TF32): an f32 model's results are f32's", () => {
    const { device, backend } = recordingBackend();
    const model = loadTransformer(tinyCheckpoint({ arch: "qwen2", seed: 4 }), backend, "f32");
    const network = new DifferentiableTransformer(model, { lora: { rank: 4, alpha: 8, targetModules: [...PROJECTIONS], useRslora: false } });
    const n = 12;
    const pass = network.forward({ tokens: new Int32Array(n).fill(1), positions: Int32Array.from({ length: n }, (_, i) => i), segments: [{ start: 0, length: n }],
      targets: Int32Array.from({ length: n }, (_, i) => (i >= n / 2 ? 2 : -1)) });
    network.backward(pass, new Float32Array(pass.scoredRows.length).fill(1));
    expect(new Set(device.gemms.map((g) => g.type))).toEqual(new Set(["f32"]));
    network.free();
    model.free();
    backend.dispose();
  });

  it("sampling without alternatives passes null for their outputs (64 rows fill the output block exactly)", () => {
    const { device, backend } = recordingBackend();
    const rows = 64, logits = backend.zeros([rows, 50]);
    backend.sample(logits, { temperature: new Float32Array(rows), topP: new Float32Array(rows).fill(1), topK: new Int32Array(rows),
      uniforms: new Float32Array(rows), numTopLogprobs: 0 });
    const [args] = device.launches.filter((l) => l.name === "sample").map((l) => l.args);
    expect([args[10], args[11]]).toEqual([["ptr", 0n], ["ptr", 0n]]);
    backend.free(logits);
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("startSample queues the sampling and reads nothing back until its result is asked for, then frees its blocks", () => {
    const { device, backend } = recordingBackend();
    const rows = 4, logits = backend.zeros([rows, 50]);
    const inUse = () => device.pool.stats().inUseBytes;
    const held = inUse();
    let downloads = 0;
    const download = device.download.bind(device);
    device.download = (source, target, offset) => {
      downloads++;
      download(source, target, offset);
    };
    const result = backend.startSample(logits, { temperature: new Float32Array(rows), topP: new Float32Array(rows).fill(1),
      topK: new Int32Array(rows), uniforms: new Float32Array(rows), numTopLogprobs: 2 });
    expect(device.launches.filter((l) => l.name === "sample").length).toBe(1);
    expect(downloads).toBe(0); // a download waits for the stream: the host would wait for the whole pass here
    expect(inUse()).toBeGreaterThan(held); // its parameters and results, until read
    expect(result().ids.length).toBe(rows);
    expect(downloads).toBe(1);
    expect(inUse()).toBe(held);
    backend.free(logits);
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("sampling sends an allowed-token mask with the row parameters (a null pointer without one); an empty row is refused", () => {
    const { device, backend } = recordingBackend();
    const vocab = 70, logits = backend.zeros([3, vocab]);
    const params = (allowedTokens?: Uint32Array): SamplingParams => ({
      temperature: new Float32Array(3).fill(1), topP: new Float32Array(3).fill(1), topK: new Int32Array(3), uniforms: new Float32Array(3).fill(0.5),
      numTopLogprobs: 2, allowedTokens,
    });
    backend.sample(logits, params());
    backend.sample(logits, params(allowedTokenMask(vocab, [null, [69], [1, 2]])));
    const [plain, masked] = device.launches.filter((l) => l.name === "sample").map((l) => l.args);
    expect(plain[6]).toEqual(["ptr", 0n]);
    expect(masked[6][1]).toBe(BigInt(masked[2][1]) + BigInt(3 * 16)); // after [temperature | topP | topK | uniforms]
    const launches = device.launches.length;
    expect(() => backend.sample(logits, params(allowedTokenMask(vocab, [null, [], [3]]))))
      .toThrowError("cuda backend: row 1's allowed-token mask allows no token; allow at least one, or give the row no constraint (every bit set)");
    expect(device.launches.length).toBe(launches);
    backend.free(logits);
    backend.dispose();
    expect(device.outstandingBytes).toBe(0);
  });

  it("reports as available the device's free memory and the pool's cached blocks", () => {
    const { device, backend } = recordingBackend();
    device.limitBytes = 1 << 30;
    const x = backend.zeros([1024, 256]); // 1 MiB
    expect(backend.availableMemory()).toBe((1 << 30) - device.outstandingBytes);
    backend.free(x); // cached by the pool: still the backend's to hand out
    expect(backend.availableMemory()).toBe((1 << 30) - device.outstandingBytes + (1 << 20));
    backend.dispose();
  });

  it("a norm weight's gradient over more rows than 64 × the grid's 65,535 blocks takes more rows per block", () => {
    const { device, backend } = recordingBackend();
    for (const rows of [130, 64 * 65535 + 1]) {
      const x = backend.zeros([rows, 4]), weight = backend.zeros([4]), rstd = backend.zeros([rows]), dWeight = backend.zeros([4]);
      const before = device.launches.length;
      backend.rmsNormBackward(x, weight, rstd, x, x, dWeight);
      const partial = device.launches.slice(before).find((l) => l.name === "column_sums_partial")!;
      // grid y = blocks of rows; the last argument, rows per block
      const [blocks, rowsPerBlock] = [partial.grid[1]!, partial.args.at(-1)![1] as number];
      expect(blocks).toBeLessThanOrEqual(65535);
      expect(blocks * rowsPerBlock).toBeGreaterThanOrEqual(rows);
      expect(rowsPerBlock).toBe(rows === 130 ? 64 : 65);
      for (const t of [x, weight, rstd, dWeight]) backend.free(t);
    }
    backend.dispose();
  });

  it("names wrong shapes, foreign tensors, bad token ids and too many query heads per kv head", () => {
    const { backend } = recordingBackend();
    const x = backend.zeros([2, 8]), w = backend.upload(new Float32Array(6 * 8), [6, 8], "bf16"), out = backend.zeros([2, 5]);
    expect(() => backend.linear(x, w, null, out)).toThrowError("cuda backend: linear out has 10 elements ([2,5]), expected 12");
    expect(() => backend.linear(new CpuBackend().zeros([2, 8]), w, null, out)).toThrowError("a tensor from another backend was passed to the CUDA backend");
    expect(() => backend.linear(w, w, null, out)).toThrowError("cuda backend: linear input must be f32 (activations), got bf16");
    expect(() => backend.embedding(w, Int32Array.from([0, 6]), x)).toThrowError("token id 6 is outside the vocabulary (0..5)");
    const cache = backend.createKvCache({ numLayers: 1, numKvHeads: 1, headDim: 8, numSlots: 1, maxPositions: 4 });
    const q = backend.zeros([1, 32 * 8]), kv = backend.zeros([1, 8]), o = backend.zeros([1, 32 * 8]);
    expect(() => backend.attention(q, kv, kv, cache, 0, { slots: Int32Array.from([0]), positions: Int32Array.from([4]) }, o))
      .toThrowError("row 0 names slot 0 position 4; the KV cache has 1 slots of 4 positions");
    expect(() => backend.attention(q, kv, kv, cache, 0, { slots: Int32Array.from([0]), positions: Int32Array.from([1]) }, o))
      .toThrowError("cuda attention: 32 query heads over 1 kv heads (at most 16 per kv head)");
    backend.free(x);
    expect(() => backend.free(x)).toThrowError("a freed tensor was used");
    backend.dispose();
  });
});
