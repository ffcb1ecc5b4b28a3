/** Tiny checkpoints from the PyTorch reference fixtures, loaded through the engine's real path (safetensors → Transformer). */
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { writeSafetensors } from "../../lib/model/safetensors.ts";
import { loadTransformer, type Transformer } from "../../lib/model/transformer.ts";
import { loadFixture } from "./check.ts";

export interface ModelFixture {
  config: Record<string, unknown>; rank: number; alpha: number;
  tokens: number[]; positions: number[]; segments: [number, number][]; targets: number[]; upstream: number[];
  weights: Record<string, { shape: number[]; data: number[] }>;
  lora: Record<string, { shape: number[]; data: number[] }>;
  logprobsLora: number[]; logprobsBase: number[];
  loraGrads: Record<string, number[]>; fullGrads: Record<string, number[]>;
}

export const ARCHITECTURES = ["qwen2", "qwen3", "llama"] as const;

export function tmpDir(prefix: string): string {
  const root = new URL("../.tmp/", import.meta.url).pathname;
  mkdirSync(root, { recursive: true });
  return mkdtempSync(join(root, prefix));
}

/** Writes the fixture's weights as a Hugging Face checkpoint directory (config.json + model.safetensors). */
export function writeCheckpoint(fixture: ModelFixture, dir: string): void {
  writeFileSync(join(dir, "config.json"), JSON.stringify(fixture.config));
  const tensors = Object.fromEntries(Object.entries(fixture.weights).map(([name, t]) =>
    [name, { dtype: "F32" as const, shape: t.shape, data: Float32Array.from(t.data) }]));
  writeSafetensors(join(dir, "model.safetensors"), tensors);
}

/** The fixture's checkpoint, written to a temporary directory and loaded (f32) on a CPU backend. */
export function loadTinyModel(arch: (typeof ARCHITECTURES)[number]): { fixture: ModelFixture; transformer: Transformer; dir: string } {
  const fixture = loadFixture<ModelFixture>(`training/model-${arch}.json`);
  const dir = tmpDir(`${arch}-`);
  writeCheckpoint(fixture, dir);
  return { fixture, transformer: loadTransformer(dir, new CpuBackend()), dir };
}

export function fixtureBatch(fixture: ModelFixture) {
  return {
    tokens: Int32Array.from(fixture.tokens),
    positions: Int32Array.from(fixture.positions),
    segments: fixture.segments.map(([start, length]) => ({ start, length })),
    targets: Int32Array.from(fixture.targets),
  };
}
