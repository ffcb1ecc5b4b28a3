// vLLM's runtime LoRA endpoints on the model server: a PEFT adapter loaded over HTTP serves exactly what the same
// adapter added in-process serves, load_inplace replaces the weights for new requests, unload stops serving it, and
// every wrong request gets the status vLLM gives with a message that names the problem. Off unless enabled.
import OpenAI from "openai";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadCausalLM, type CausalLM } from "../../lib/load/causal-lm.ts";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { loadAdapter } from "../../lib/model/peft.ts";
import { DifferentiableTransformer } from "../../lib/model/training.ts";
import { loadTransformer } from "../../lib/model/transformer.ts";
import { parseServeArgs } from "../../lib/serve/cli-serve.ts";
import { IN_PROCESS_BASE_URL, ModelServer } from "../../lib/serve/model-server.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../../scripts/serve-small-tokenizer.ts";

let dir: string;
let lm: CausalLM;
const adapters: string[] = [];

/** A PEFT adapter directory whose B weights are a sine of the given phase (so two adapters answer differently). */
function writeAdapter(phase: number): string {
  const lora = new DifferentiableTransformer(loadTransformer(dir, new CpuBackend({ blas: "portable" })),
    { lora: { rank: 2, alpha: 4, targetModules: ["q_proj", "down_proj"], useRslora: false }, seed: 1 });
  for (const p of lora.loras) lora.backend.write(p.b.tensor, Float32Array.from({ length: p.b.tensor.size }, (_, i) => 0.5 * Math.sin(i + phase)));
  const out = mkdtempSync(join(tmpdir(), "art-ts-runtime-lora-"));
  lora.saveAdapter(out);
  return out;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "art-ts-runtime-lora-base-"));
  writeSmallQwenTokenizer(dir);
  writeTinyCheckpoint(dir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
  lm = await loadCausalLM(dir, { device: "cpu", log: () => {} });
  adapters.push(writeAdapter(0), writeAdapter(1));
});
afterAll(() => lm.free());

function serverWith(options: { runtimeAdapters?: boolean } = { runtimeAdapters: true }): ModelServer {
  const server = new ModelServer({ ...options, batcher: { numSlots: 4, maxPositions: 256 } });
  server.addBaseModel("base", lm);
  return server;
}

const post = (server: ModelServer, path: string, body: unknown) =>
  server.fetch(`${IN_PROCESS_BASE_URL}/${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

/** The first answer token's logprob, greedy: it tells the adapters apart. */
async function firstLogprob(server: ModelServer, model: string): Promise<number> {
  const client = new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: "local", fetch: server.fetch, maxRetries: 0 });
  const completion = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 1, temperature: 0, logprobs: true });
  return completion.choices[0]!.logprobs!.content![0]!.logprob;
}

describe("runtime LoRA endpoints (vLLM's load_lora_adapter / unload_lora_adapter)", () => {
  it("load serves the adapter as the in-process one would; load_inplace replaces it; unload stops it", async () => {
    const server = serverWith();
    const reference = serverWith({});
    reference.addAdapter("first", "base", loadAdapter(adapters[0]!, lm.model));
    reference.addAdapter("second", "base", loadAdapter(adapters[1]!, lm.model));
    try {
      const loaded = await post(server, "load_lora_adapter", { lora_name: "trained", lora_path: adapters[0] });
      expect([loaded.status, await loaded.text()]).toEqual([200, "Success: LoRA adapter 'trained' added successfully."]);
      expect(await firstLogprob(server, "trained")).toBe(await firstLogprob(reference, "first"));
      expect(await firstLogprob(server, "trained")).not.toBeCloseTo(await firstLogprob(server, "base"), 4);
      const models = await (await server.fetch(`${IN_PROCESS_BASE_URL}/models`)).json() as { data: { id: string }[] };
      expect(models.data.map((m) => m.id).sort()).toEqual(["base", "trained"]);

      const again = await post(server, "load_lora_adapter", { lora_name: "trained", lora_path: adapters[1] });
      expect(again.status).toBe(400);
      expect(await again.text()).toContain("The LoRA adapter 'trained' has already been loaded (send load_inplace: true to replace its weights)");
      expect((await post(server, "load_lora_adapter", { lora_name: "trained", lora_path: adapters[1], load_inplace: true })).status).toBe(200);
      expect(await firstLogprob(server, "trained")).toBe(await firstLogprob(reference, "second"));

      const unloaded = await post(server, "unload_lora_adapter", { lora_name: "trained" });
      expect([unloaded.status, await unloaded.text()]).toEqual([200, "Success: LoRA adapter 'trained' removed successfully."]);
      await expect(firstLogprob(server, "trained")).rejects.toMatchObject({ status: 404 });
      const twice = await post(server, "unload_lora_adapter", { lora_name: "trained" });
      expect(twice.status).toBe(404);
      expect(await twice.text()).toContain("The LoRA adapter 'trained' cannot be found.");
    } finally {
      await server.close();
      await reference.close();
    }
  });

  it("refuses what it cannot load, naming the field, the path or the base", async () => {
    const server = serverWith();
    try {
      const expectError = async (body: unknown, status: number, message: string) => {
        const response = await post(server, "load_lora_adapter", body);
        expect(response.status).toBe(status);
        expect(((await response.json()) as { error: { message: string } }).error.message).toContain(message);
      };
      await expectError({ lora_name: "x" }, 400, "lora_path must be a non-empty string.");
      await expectError({ lora_path: adapters[0] }, 400, "lora_name must be a non-empty string.");
      await expectError({ lora_name: "x", lora_path: join(dir, "no-such-adapter") }, 400, "no-such-adapter");
      await expectError({ lora_name: "x", lora_path: adapters[0], base_model_name: "other" }, 404, 'No base model "other" is served (served: base).');
      await expectError({ lora_name: "base", lora_path: adapters[0] }, 400, '"base" is a base model, not an adapter.');
      await expectError({ lora_name: "x", lora_path: adapters[0], load_inplace: "yes" }, 400, "load_inplace must be a boolean.");
      server.addBaseModel("base-2", lm);
      await expectError({ lora_name: "x", lora_path: adapters[0] }, 400, "Say which base model the adapter is for with base_model_name (served: base, base-2).");
      expect((await post(server, "load_lora_adapter", { lora_name: "x", lora_path: adapters[0], base_model_name: "base-2" })).status).toBe(200);
    } finally {
      await server.close();
    }
  });

  it("is off unless enabled (404 saying how), and art-ts serve enables it with --allow-runtime-lora", async () => {
    const server = serverWith({});
    try {
      const response = await post(server, "load_lora_adapter", { lora_name: "x", lora_path: adapters[0] });
      expect(response.status).toBe(404);
      expect(await response.text()).toContain("art-ts serve --allow-runtime-lora, or new ModelServer({ runtimeAdapters: true })");
    } finally {
      await server.close();
    }
    expect(parseServeArgs(["--model", dir]).allowRuntimeLora).toBe(false);
    expect(parseServeArgs(["--model", dir, "--allow-runtime-lora", "--port", "0"]).allowRuntimeLora).toBe(true);
  });
});
