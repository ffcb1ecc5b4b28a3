import { execFileSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { readConfig } from "../../lib/model/config.ts";
import { openSafetensors } from "../../lib/model/safetensors.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { tempDir } from "./helpers.ts";

describe("make-tiny-checkpoint", () => {
  it("is deterministic from the seed", () => {
    const [a, b, c] = [tempDir(), tempDir(), tempDir()];
    writeTinyCheckpoint(a, { arch: "llama", seed: 5 });
    writeTinyCheckpoint(b, { arch: "llama", seed: 5 });
    writeTinyCheckpoint(c, { arch: "llama", seed: 6 });
    const bytes = (dir: string) => fs.readFileSync(path.join(dir, "model.safetensors"));
    expect(bytes(a).equals(bytes(b))).toBe(true);
    expect(bytes(a).equals(bytes(c))).toBe(false);
  });

  it("each preset has the tensors of its architecture", () => {
    const names = (arch: "qwen2" | "qwen3" | "llama") => {
      const dir = tempDir();
      writeTinyCheckpoint(dir, { arch });
      return openSafetensors(dir).names();
    };
    const qwen2 = names("qwen2"), qwen3 = names("qwen3"), llama = names("llama");
    expect(qwen2).toContain("model.layers.1.self_attn.k_proj.bias");
    expect(qwen2).not.toContain("lm_head.weight");
    expect(qwen3).toContain("model.layers.0.self_attn.q_norm.weight");
    expect(qwen3).toContain("lm_head.weight");
    expect(llama.some((n) => n.endsWith(".bias"))).toBe(false);
  });

  it("the command line writes a checkpoint with the tiny tokenizer", () => {
    const dir = tempDir();
    const root = path.join(import.meta.dirname, "..", "..");
    const out = execFileSync(process.execPath, ["scripts/make-tiny-checkpoint.ts", dir, "--arch", "qwen3", "--dtype", "BF16", "--shards", "2"], {
      cwd: root, encoding: "utf8",
    });
    expect(out).toContain(`wrote qwen3 checkpoint to ${dir}`);
    expect(fs.readdirSync(dir).sort()).toEqual([
      "config.json", "generation_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
      "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
    ]);
    expect(readConfig(dir)).toMatchObject({ modelType: "qwen3", vocabSize: 512 });
  });
});
