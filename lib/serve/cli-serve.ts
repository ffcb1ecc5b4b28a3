/**
 * `art-ts serve`: a checkpoint behind the OpenAI-compatible API over HTTP, for agents in other processes.
 *
 *   art-ts serve --model <dir|hf-id> [--adapter <dir>] [--name <id>] [--host 127.0.0.1] [--port 8000]
 *                [--api-key K | --api-key-file F] [--device auto|cpu|cuda] [--dtype f32|bf16] [--slots N] [--kv-memory 0.5]
 *                [--context 4096] [--max-request-mb 8]
 *                [--allow-runtime-lora]
 */
import * as fs from "node:fs";
import process from "node:process";
import { ArtError } from "../core/errors.ts";
import { loadCausalLM, type Device } from "../load/causal-lm.ts";
import type { DType } from "../model/backend.ts";
import { ModelServer } from "./model-server.ts";
import type { HttpServerHandle } from "./http.ts";

export interface ServeArgs {
  model: string;
  adapter: string | null;
  /** The model id clients ask for; default the --model argument. */
  name: string;
  host: string;
  port: number;
  apiKey: string | null;
  device: Device;
  /** How the weights are stored; null: the device's default (bf16 on CUDA, f32 on the CPU). */
  dtype: DType | null;
  /** KV-cache slots; null sizes the cache from free memory (batcher.kvCacheMemory). */
  slots: number | null;
  /** The share of available memory a cache sized from it may take. */
  kvMemory: number;
  context: number;
  /** Largest request body in MiB. */
  maxRequestMb: number;
  /** Serve vLLM's runtime LoRA endpoints (load_lora_adapter / unload_lora_adapter). */
  allowRuntimeLora: boolean;
}

export const SERVE_USAGE = `usage: art-ts serve --model <dir|hf-id> [options]

Serves the model over an OpenAI-compatible API (GET /v1/models, POST /v1/chat/completions).

options:
  --model <dir|id>     checkpoint directory or a Hugging Face id in the local cache (required)
  --adapter <dir>      a PEFT LoRA adapter to apply
  --name <id>          the model id clients use (default: the --model argument; with --adapter, the adapter
                       directory, while the base model answers under the --model argument)
  --host <addr>        interface to listen on (default 127.0.0.1, loopback only)
  --port <n>           port (default 8000; 0 picks a free one)
  --api-key <key>      require "Authorization: Bearer <key>" on every request (visible in ps: prefer
                       --api-key-file <path>, the key on the file's first line, or the ART_API_KEY variable)
  --device <d>         auto | cpu | cuda (default auto)
  --dtype <t>          how the weights are stored: f32 | bf16 (default bf16 on CUDA, f32 on the CPU; bf16 on the CPU
                       rounds them as a GPU does and decodes a little faster, reading half the
                       bytes)
  --slots <n>          sequences decoded at once (default: on CUDA, as many as --kv-memory of the free GPU memory
                       holds, at most 256; on the CPU, 32)
  --kv-memory <f>      the share of free memory (after the weights) the KV cache takes when --slots is not given
                       (default 0.5)
  --context <n>        longest prompt + completion in tokens (default 4096, at most the model's)
  --max-request-mb <n> largest request body in MiB (default 8; larger ones get 413 before they are read)
  --allow-runtime-lora serve vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter, which load PEFT
                       adapters from paths on this machine (a trainer elsewhere pushes each checkpoint)`;

const FLAGS = new Set(["--model", "--adapter", "--name", "--host", "--port", "--api-key", "--api-key-file", "--device", "--dtype", "--slots", "--kv-memory", "--context", "--max-request-mb"]);

export function parseServeArgs(argv: string[], env: Record<string, string | undefined> = process.env): ServeArgs {
  const values = new Map<string, string>();
  let allowRuntimeLora = false;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--allow-runtime-lora") {
      allowRuntimeLora = true;
      continue;
    }
    const [flag, inline] = arg.includes("=") ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)] : [arg, undefined];
    if (!FLAGS.has(flag)) throw new ArtError("bad_arguments", `art-ts serve: unknown argument ${JSON.stringify(arg)}\n\n${SERVE_USAGE}`);
    const value = inline ?? argv[++i];
    if (value === undefined || value.startsWith("--")) throw new ArtError("bad_arguments", `art-ts serve: ${flag} needs a value\n\n${SERVE_USAGE}`);
    values.set(flag, value);
  }
  const model = values.get("--model");
  if (!model) throw new ArtError("bad_arguments", `art-ts serve: --model is required\n\n${SERVE_USAGE}`);
  const device = values.get("--device") ?? "auto";
  if (device !== "auto" && device !== "cpu" && device !== "cuda") throw new ArtError("bad_arguments", `art-ts serve: --device must be auto, cpu or cuda, got ${JSON.stringify(device)}`);
  const dtype = values.get("--dtype") ?? null;
  if (dtype !== null && dtype !== "f32" && dtype !== "bf16") throw new ArtError("bad_arguments", `art-ts serve: --dtype must be f32 or bf16, got ${JSON.stringify(dtype)}`);
  return {
    model,
    adapter: values.get("--adapter") ?? null,
    name: values.get("--name") ?? values.get("--adapter") ?? model,
    host: values.get("--host") ?? "127.0.0.1",
    port: integer(values, "--port", 8000, 0, 65535),
    apiKey: apiKeyFrom(values, env),
    device,
    dtype,
    slots: values.has("--slots") ? integer(values, "--slots", 32, 1) : null,
    kvMemory: share(values, "--kv-memory", 0.5),
    context: integer(values, "--context", 4096, 2),
    maxRequestMb: integer(values, "--max-request-mb", 8, 1),
    allowRuntimeLora,
  };
}

function share(values: Map<string, string>, flag: string, fallback: number): number {
  const raw = values.get(flag);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!(value > 0 && value <= 1)) throw new ArtError("bad_arguments", `art-ts serve: ${flag} must be a number in (0, 1], got ${JSON.stringify(raw)}`);
  return value;
}

function integer(values: Map<string, string>, flag: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const raw = values.get(flag);
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new ArtError("bad_arguments", `art-ts serve: ${flag} must be an integer >= ${min}${max === Number.MAX_SAFE_INTEGER ? "" : ` and <= ${max}`}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** --api-key, else the first line of --api-key-file, else ART_API_KEY; null for none. */
function apiKeyFrom(values: Map<string, string>, env: Record<string, string | undefined>): string | null {
  const file = values.get("--api-key-file");
  if (values.has("--api-key") && file !== undefined) throw new ArtError("bad_arguments", "art-ts serve: give --api-key or --api-key-file, not both");
  if (file !== undefined) {
    let key: string;
    try {
      key = fs.readFileSync(file, "utf8").split(/\r?\n/, 1)[0]!.trim();
    } catch (error) {
      throw new ArtError("bad_arguments", `art-ts serve: --api-key-file ${file} cannot be read (${(error as NodeJS.ErrnoException).code ?? String(error)})`);
    }
    if (key === "") throw new ArtError("bad_arguments", `art-ts serve: --api-key-file ${file} is empty; put the key on its first line`);
    return key;
  }
  return values.get("--api-key") ?? (env.ART_API_KEY || null);
}

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost)$/;

/** Loads the model and serves it until the returned handle is closed. */
export async function runServe(args: ServeArgs, log: (line: string) => void = console.log): Promise<{ server: ModelServer; http: HttpServerHandle }> {
  const lm = await loadCausalLM(args.model, { device: args.device, dtype: args.dtype ?? undefined, adapter: args.adapter ?? undefined, log });
  const server = new ModelServer({ apiKey: args.apiKey, maxRequestBytes: args.maxRequestMb * 1024 * 1024, batcher: {
    ...(args.slots === null ? {} : { numSlots: args.slots }), kvCacheMemory: args.kvMemory, maxPositions: args.context },
    runtimeAdapters: args.allowRuntimeLora });
  if (lm.adapter) {
    server.addBaseModel(args.model, lm);
    server.addAdapter(args.name, args.model, lm.adapter);
  } else {
    server.addBaseModel(args.name, lm);
  }
  let http: HttpServerHandle;
  try {
    http = await server.listen({ host: args.host, port: args.port });
  } catch (error) {
    await server.close();
    const code = (error as NodeJS.ErrnoException).code;
    const hint = code === "EADDRINUSE" ? "the port is in use: pick another with --port, or --port 0 for a free one"
      : code === "EACCES" ? "ports below 1024 need privileges: pick a higher --port"
      : code === "EADDRNOTAVAIL" || code === "ENOTFOUND" ? "this machine has no such address: check --host"
      : String((error as Error).message ?? error);
    throw new ArtError("listen_failed", `art-ts serve: cannot listen on ${args.host}:${args.port} (${code ?? "error"}): ${hint}`);
  }
  if (args.apiKey === null && !LOOPBACK.test(args.host)) {
    log(`art-ts serve: WARNING: listening on ${args.host} without an api key: anyone who can reach this port can use the model. Set --api-key-file or ART_API_KEY.`);
  }
  log(`art-ts serve: ${args.name} on ${lm.backend.name} at ${http.baseURL}`);
  log(`  new OpenAI({ baseURL: "${http.baseURL}", apiKey: "${args.apiKey === null ? "local" : "<your key>"}" })`);
  return { server, http };
}
