import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { readConfig } from "../../lib/model/config.ts";
import { huggingFaceHubCache, resolveModelDir } from "../../lib/model/resolve.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { tempDir, tinyCheckpoint } from "./helpers.ts";

describe("model resolution", () => {
  it("honours HF_HUB_CACHE, then HF_HOME/hub", () => {
    expect(huggingFaceHubCache({ HF_HUB_CACHE: "/a", HF_HOME: "/b" })).toBe("/a");
    expect(huggingFaceHubCache({ HF_HOME: "/b" })).toBe(path.join("/b", "hub"));
  });

  it("finds an id in the cache layout through refs/main", () => {
    const home = tempDir();
    const repo = path.join(home, "hub", "models--Qwen--Tiny-Test");
    writeTinyCheckpoint(path.join(repo, "snapshots", "abc123"), { arch: "qwen2" });
    fs.mkdirSync(path.join(repo, "snapshots", "old999"));
    fs.mkdirSync(path.join(repo, "refs"), { recursive: true });
    fs.writeFileSync(path.join(repo, "refs", "main"), "abc123\n");
    expect(resolveModelDir("Qwen/Tiny-Test", { HF_HOME: home })).toBe(path.join(repo, "snapshots", "abc123"));
  });

  it("a local directory is used as is", () => {
    const dir = tinyCheckpoint({ arch: "llama" });
    expect(resolveModelDir(dir)).toBe(dir);
  });

  it("a model not found says how to download it", () => {
    const home = tempDir();
    expect(() => resolveModelDir("Qwen/Qwen2.5-0.5B-Instruct", { HF_HOME: home })).toThrow(
      `model "Qwen/Qwen2.5-0.5B-Instruct" not found: not a local directory and not in the Hugging Face cache at ${path.join(home, "hub", "models--Qwen--Qwen2.5-0.5B-Instruct")}. ` +
        "Download it on a machine with network access: huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct",
    );
    expect(() => resolveModelDir("./no/such/dir/here")).toThrow('model "./no/such/dir/here" not found: no such directory');
    expect(() => resolveModelDir(tempDir())).toThrow(/no config.json here/);
  });

  it("config errors and missing tensors name the file", () => {
    const dir = tinyCheckpoint({ arch: "qwen2" });
    fs.writeFileSync(path.join(dir, "config.json"), "{ not json");
    expect(() => readConfig(dir)).toThrow(`${path.join(dir, "config.json")}: not valid JSON`);
    const untied = tinyCheckpoint({ arch: "qwen2" }); // written tied: no lm_head.weight in the file
    const tied = JSON.parse(fs.readFileSync(path.join(untied, "config.json"), "utf8"));
    fs.writeFileSync(path.join(untied, "config.json"), JSON.stringify({ ...tied, tie_word_embeddings: false }));
    expect(() => loadTransformer(untied, new CpuBackend())).toThrow(`${path.join(untied, "model.safetensors")}: missing tensor "lm_head.weight"`);
    const wider = tinyCheckpoint({ arch: "qwen2" });
    const config = JSON.parse(fs.readFileSync(path.join(wider, "config.json"), "utf8"));
    fs.writeFileSync(path.join(wider, "config.json"), JSON.stringify({ ...config, intermediate_size: 96 }));
    expect(() => loadTransformer(wider, new CpuBackend())).toThrow(
      `${path.join(wider, "model.safetensors")}: tensor "model.layers.0.mlp.gate_proj.weight" has shape [64,32], expected [96,32]`,
    );
  });
});
