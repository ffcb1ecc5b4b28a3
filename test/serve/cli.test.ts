import OpenAI from "openai";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { parseServeArgs, runServe } from "../../lib/serve/cli-serve.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../../scripts/serve-small-tokenizer.ts";

describe("art-ts serve", () => {
  it("parses its flags with loopback defaults and refuses bad ones by name", () => {
    expect(parseServeArgs(["--model", "m"])).toMatchObject({ model: "m", name: "m", host: "127.0.0.1", port: 8000, apiKey: null, device: "auto", adapter: null });
    expect(parseServeArgs(["--model=m", "--port=0", "--api-key", "k", "--name", "agent"])).toMatchObject({ port: 0, apiKey: "k", name: "agent", maxRequestMb: 8 });
    expect(parseServeArgs(["--model", "m", "--max-request-mb", "2"]).maxRequestMb).toBe(2);
    expect(parseServeArgs(["--model", "m"]).dtype).toBeNull(); // the device's default
    expect(parseServeArgs(["--model", "m", "--dtype", "bf16"]).dtype).toBe("bf16");
    expect(() => parseServeArgs(["--model", "m", "--dtype", "fp16"])).toThrow(/--dtype must be f32 or bf16, got "fp16"/);
    // No --slots: the KV cache is sized from free memory (on CUDA), half of it unless --kv-memory says otherwise.
    expect(parseServeArgs(["--model", "m"])).toMatchObject({ slots: null, kvMemory: 0.5 });
    expect(parseServeArgs(["--model", "m", "--slots", "8", "--kv-memory", "0.3"])).toMatchObject({ slots: 8, kvMemory: 0.3 });
    expect(() => parseServeArgs(["--model", "m", "--kv-memory", "1.5"])).toThrow(/--kv-memory must be a number in \(0, 1\], got "1.5"/);
    expect(() => parseServeArgs(["--model", "m", "--max-request-mb", "0"])).toThrow(/--max-request-mb must be an integer >= 1, got "0"/);
    expect(() => parseServeArgs([])).toThrow(/--model is required/);
    expect(() => parseServeArgs(["--model", "m", "--port", "x"])).toThrow(/--port must be an integer/);
    expect(() => parseServeArgs(["--model", "m", "--bogus", "1"])).toThrow(/unknown argument "--bogus"/);
    expect(() => parseServeArgs(["--model"])).toThrow(/--model needs a value/);
    expect(() => parseServeArgs(["--model", "m", "--port", "70000"])).toThrow(/--port must be an integer >= 0 and <= 65535, got "70000"/);
  });

  it("takes the key from a file or ART_API_KEY, so it need not show in ps", () => {
    const dir = mkdtempSync(join(tmpdir(), "art-ts-key-"));
    writeFileSync(join(dir, "key"), "s3cret\nignored\n");
    writeFileSync(join(dir, "empty"), "\n");
    expect(parseServeArgs(["--model", "m", "--api-key-file", join(dir, "key")], {}).apiKey).toBe("s3cret");
    expect(parseServeArgs(["--model", "m"], { ART_API_KEY: "from-env" }).apiKey).toBe("from-env");
    expect(parseServeArgs(["--model", "m", "--api-key", "flag"], { ART_API_KEY: "from-env" }).apiKey).toBe("flag");
    expect(parseServeArgs(["--model", "m"], {}).apiKey).toBeNull();
    expect(() => parseServeArgs(["--model", "m", "--api-key-file", join(dir, "empty")], {})).toThrow(/is empty; put the key on its first line/);
    expect(() => parseServeArgs(["--model", "m", "--api-key-file", join(dir, "missing")], {})).toThrow(/cannot be read \(ENOENT\)/);
    expect(() => parseServeArgs(["--model", "m", "--api-key", "k", "--api-key-file", join(dir, "key")], {})).toThrow(/not both/);
  });

  it("says in one line why it cannot listen, and warns when it listens beyond loopback without a key", async () => {
    const dir = mkdtempSync(join(tmpdir(), "art-ts-cli-"));
    writeSmallQwenTokenizer(dir);
    writeTinyCheckpoint(dir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
    const lines: string[] = [];
    const open = await runServe(parseServeArgs(["--model", dir, "--port", "0", "--host", "0.0.0.0", "--device", "cpu"], {}), (l) => lines.push(l));
    try {
      expect(lines[0]).toMatch(/WARNING: listening on 0\.0\.0\.0 without an api key: anyone who can reach this port can use the model/);
      await expect(runServe(parseServeArgs(["--model", dir, "--port", String(open.http.port), "--host", "0.0.0.0", "--device", "cpu"], {}), () => {}))
        .rejects.toThrow(new RegExp(`^art-ts serve: cannot listen on 0\\.0\\.0\\.0:${open.http.port} \\(EADDRINUSE\\): the port is in use: pick another with --port, or --port 0 for a free one$`));
    } finally {
      await open.server.close();
    }
  });

  it("serves a checkpoint directory over loopback HTTP with an api key (bf16 weights: decoding on their bf16 copy)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "art-ts-cli-"));
    writeSmallQwenTokenizer(dir);
    writeTinyCheckpoint(dir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
    const lines: string[] = [];
    const { server, http } = await runServe(parseServeArgs(["--model", dir, "--name", "tiny", "--port", "0", "--api-key", "k", "--device", "cpu", "--dtype", "bf16"]), (l) => lines.push(l));
    try {
      expect(http.host).toBe("127.0.0.1");
      expect(lines.join("\n")).toContain(http.baseURL);
      const client = new OpenAI({ baseURL: http.baseURL, apiKey: "k", maxRetries: 0 });
      const completion = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 3 });
      expect(completion.choices[0].message.role).toBe("assistant");
      await expect(new OpenAI({ baseURL: http.baseURL, apiKey: "wrong", maxRetries: 0 }).models.list()).rejects.toMatchObject({ status: 401 });
    } finally {
      await server.close();
    }
  });

  it("serves a PEFT adapter under --name beside its base model under --model", async () => {
    const dir = mkdtempSync(join(tmpdir(), "art-ts-cli-"));
    writeSmallQwenTokenizer(dir);
    writeTinyCheckpoint(dir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
    const lora = new DifferentiableTransformer(loadTransformer(dir, new CpuBackend()), { lora: { rank: 2, alpha: 4, targetModules: ["q_proj", "down_proj"], useRslora: false }, seed: 1 });
    for (const p of lora.loras) lora.backend.write(p.b.tensor, Float32Array.from({ length: p.b.tensor.size }, (_, i) => 0.5 * Math.sin(i)));
    const adapterDir = mkdtempSync(join(tmpdir(), "art-ts-adapter-"));
    lora.saveAdapter(adapterDir);
    const { server, http } = await runServe(parseServeArgs(["--model", dir, "--adapter", adapterDir, "--name", "trained", "--port", "0", "--device", "cpu"]), () => {});
    try {
      const client = new OpenAI({ baseURL: http.baseURL, apiKey: "local", maxRetries: 0 });
      expect((await client.models.list()).data.map((m) => m.id).sort()).toEqual([dir, "trained"].sort());
      const ask = (model: string) =>
        client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 1, temperature: 0, logprobs: true });
      const [base, trained] = await Promise.all([ask(dir), ask("trained")]);
      expect(trained.choices[0].logprobs!.content![0].logprob).not.toBeCloseTo(base.choices[0].logprobs!.content![0].logprob, 4);
    } finally {
      await server.close();
    }
  });
});
