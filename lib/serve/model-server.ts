/**
 * ModelServer: the OpenAI-compatible front of one or more loaded models, the object a TrainableModel owns.
 *
 * It maps model ids to weights: a base model answers under its own id, and an adapter id (a trained model's
 * `name`) answers with the LoRA its provider returns at request time — the latest one, with no reload. Each
 * base model has one Batcher; adapters of that base share it (and its KV cache). Adapter sources serve ids
 * that are only known when asked for, such as a trained model's past checkpoints (`name@step`): an id no route
 * holds is offered to each source, and the adapter it returns is served from then on.
 *
 * Transports: `fetch` answers in-process (no network, no port: give it to `new OpenAI({ fetch })`), `listen`
 * serves the same handler over node:http. `pause()` stops new decode passes (training needs the device) and
 * `resume()` goes on; requests arriving meanwhile wait.
 */
import OpenAI from "openai";
import type { Tokenizer } from "../model/tokenizer.ts";
import type { LayerLoras } from "../model/lora.ts";
import { loadAdapter } from "../model/peft.ts";
import type { Transformer } from "../model/transformer.ts";
import { ApiError } from "./api-error.ts";
import { Batcher, type BatcherOptions } from "./batcher.ts";
import type { ModelRoute, ServeMetrics } from "./chat.ts";
import { createHandler, type Handler } from "./handler.ts";
import { listen, type HttpServerHandle, type HttpServerOptions } from "./http.ts";

/** A loaded model: a CausalLM from the engine's loadCausalLM has both. */
export interface ServableModel {
  model: Transformer;
  tokenizer: Tokenizer;
}

export interface ModelServerOptions {
  /** When set, requests must carry `Authorization: Bearer <apiKey>` (401 otherwise). */
  apiKey?: string | null;
  /** Largest request body accepted (413 beyond it, before it is read). Default 8 MiB. */
  maxRequestBytes?: number;
  /** Slots, context length, queue bound, prefill chunk of each base model's batcher. */
  batcher?: BatcherOptions;
  /**
   * Serve vLLM's runtime LoRA endpoints, POST /v1/load_lora_adapter and /v1/unload_lora_adapter, which load PEFT
   * adapters from paths on this machine (what a trainer elsewhere calls after each step). Off by default: 404.
   */
  runtimeAdapters?: boolean;
}

/**
 * Ids served on demand: `resolve` returns the base id and LoRA for an id it knows, null for one it does not
 * (or throws an ApiError that says why, e.g. which checkpoints exist); `ids` lists the ones it would serve.
 */
export interface AdapterSource {
  resolve(id: string): { baseId: string; loras: LayerLoras[] | null } | null;
  ids(): string[];
}

/** A runtime adapter load: vLLM's `lora_name`, `lora_path`, `base_model_name` and `load_inplace`. */
export interface RuntimeAdapterRequest {
  name: string;
  path: string;
  baseModel?: string;
  replace?: boolean;
}

/** 8 MiB: a 32k-token conversation with tools is a few hundred kB of JSON. */
export const DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024;

/** The base URL the in-process fetch answers; any host works, this one says where requests go. */
export const IN_PROCESS_BASE_URL = "http://art-ts.local/v1";

export class ModelServer {
  readonly metrics: ServeMetrics = { requests: 0, promptTokens: 0, completionTokens: 0, malformedToolCalls: 0, aborted: 0 };
  readonly handler: Handler;
  private readonly routes = new Map<string, ModelRoute>();
  private readonly sources: AdapterSource[] = [];
  private readonly batchers = new Map<string, Batcher>();
  /** The loaded base models, by id: runtime adapters load onto them. */
  private readonly baseModels = new Map<string, ServableModel>();
  private readonly batcherOptions: BatcherOptions;
  private readonly servers: HttpServerHandle[] = [];
  private readonly apiKey: string | null;
  /** set by close(): requests then get an error that says so, not "does not exist" */
  private closed = false;

  constructor(options: ModelServerOptions = {}) {
    this.batcherOptions = options.batcher ?? {};
    this.apiKey = options.apiKey ?? null;
    const created = Math.floor(Date.now() / 1000);
    this.handler = createHandler({
      apiKey: this.apiKey,
      maxRequestBytes: options.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES,
      modelIds: () => this.modelIds,
      route: (id) => this.routeFor(id),
      metrics: this.metrics,
      created,
      adapters: options.runtimeAdapters ? { load: (request) => this.loadAdapter(request), unload: (name) => this.unloadAdapter(name) } : null,
    });
  }

  /** Serves a loaded base model under `id`; returns its batcher (pass counts, load). */
  addBaseModel(id: string, model: ServableModel): Batcher {
    this.checkFree(id);
    this.baseModels.set(id, model);
    const batcher = new Batcher(model.model, this.batcherOptions);
    this.batchers.set(id, batcher);
    // Generation ends at the tokenizer's end tokens and the checkpoint's (generation_config / config.json).
    const stopTokenIds = [...new Set([...model.tokenizer.eosTokenIds, ...model.model.config.eosTokenIds])];
    this.routes.set(id, { tokenizer: model.tokenizer, batcher, stopTokenIds, loras: () => null });
    return batcher;
  }

  /**
   * Serves `id` as base model `baseId` plus a LoRA. `loras` is read at every request, so a provider that returns
   * the trainer's live adapter makes new requests use each training step's weights at once.
   */
  addAdapter(id: string, baseId: string, loras: LayerLoras[] | (() => LayerLoras[] | null)): void {
    this.checkFree(id);
    const base = this.routes.get(baseId);
    const batcher = this.batchers.get(baseId);
    if (!base || !batcher) throw new ApiError(404, `addAdapter: no base model "${baseId}" is served (served: ${[...this.batchers.keys()].join(", ") || "none"})`, "invalid_request_error", "model", "model_not_found");
    this.routes.set(id, { tokenizer: base.tokenizer, batcher, stopTokenIds: base.stopTokenIds, loras: typeof loras === "function" ? loras : () => loras });
  }

  /**
   * Loads the PEFT adapter at `path` onto a base model and serves it as `name` (POST /v1/load_lora_adapter). The base
   * is `baseModel`, or the only one served. A name already served is refused unless `replace` (vLLM's
   * `load_inplace`): then new requests use the new weights, requests in flight finish on the old ones.
   */
  loadAdapter({ name, path, baseModel, replace = false }: RuntimeAdapterRequest): void {
    const bases = [...this.baseModels.keys()];
    const baseId = baseModel ?? (bases.length === 1 ? bases[0] : undefined);
    if (baseId === undefined) throw ApiError.invalid("base_model_name", `Say which base model the adapter is for with base_model_name (served: ${bases.join(", ") || "none"}).`);
    const base = this.baseModels.get(baseId);
    if (!base) throw new ApiError(404, `No base model "${baseId}" is served (served: ${bases.join(", ") || "none"}).`, "invalid_request_error", "base_model_name", "model_not_found");
    if (this.baseModels.has(name)) throw ApiError.invalid("lora_name", `"${name}" is a base model, not an adapter.`);
    const existing = this.routes.has(name) || this.routeFor(name) !== undefined;
    if (existing && !replace) throw ApiError.invalid("lora_name", `The LoRA adapter '${name}' has already been loaded (send load_inplace: true to replace its weights).`);
    const loras = loadAdapter(path, base.model);
    this.routes.delete(name);
    this.addAdapter(name, baseId, loras);
  }

  /** Stops serving an adapter (POST /v1/unload_lora_adapter); requests in flight finish. */
  unloadAdapter(name: string): void {
    if (this.baseModels.has(name)) throw ApiError.invalid("lora_name", `"${name}" is a base model, not an adapter.`);
    if (!this.routes.has(name)) throw new ApiError(404, `The LoRA adapter '${name}' cannot be found.`, "invalid_request_error", "lora_name", "model_not_found");
    this.routes.delete(name);
  }

  /** Serves the ids `source` resolves, each loaded at its first request (see AdapterSource). */
  addAdapterSource(source: AdapterSource): void {
    this.sources.push(source);
  }

  /** Stops serving an id (requests in flight finish). */
  removeModel(id: string): void {
    this.routes.delete(id);
    this.baseModels.delete(id);
  }

  /** The ids served now, and those the adapter sources would serve on request. */
  get modelIds(): string[] {
    return [...new Set([...this.routes.keys(), ...this.sources.flatMap((s) => s.ids())])];
  }

  /** The batcher behind a model id (for statistics and tests). */
  batcherFor(id: string): Batcher {
    const route = this.routeFor(id);
    if (!route) throw new ApiError(404, `no model "${id}" is served`, "invalid_request_error", "model", "model_not_found");
    return route.batcher;
  }

  /** A fetch for the `openai` client that never touches the network: `new OpenAI({ baseURL, apiKey, fetch })`. */
  readonly fetch = (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    return this.handler(new Request(input, init));
  };

  /** The unmodified `openai` client wired to `fetch`: what `TrainableModel.openai()` hands to rollouts. */
  openai(options: { apiKey?: string; maxRetries?: number } = {}): OpenAI {
    return new OpenAI({ baseURL: IN_PROCESS_BASE_URL, apiKey: options.apiKey ?? this.apiKey ?? "local", fetch: this.fetch, maxRetries: options.maxRetries });
  }

  /** Serves over HTTP, loopback by default. */
  async listen(options: HttpServerOptions = {}): Promise<HttpServerHandle> {
    const server = await listen(this.handler, options);
    this.servers.push(server);
    return server;
  }

  /** Stops new forward passes on every model (e.g. while training); resolves when the passes in flight end. */
  async pause(): Promise<void> {
    await Promise.all([...this.batchers.values()].map((b) => b.pause()));
  }

  resume(): void {
    for (const batcher of this.batchers.values()) batcher.resume();
  }

  /** Closes HTTP servers, fails pending requests, frees KV caches. */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.servers.splice(0).map((s) => s.close()));
    await Promise.all([...this.batchers.values()].map((b) => b.close()));
    this.batchers.clear();
    this.routes.clear();
  }

  private routeFor(id: string): ModelRoute | undefined {
    if (this.closed) {
      // A notebook's last cell closes the model; re-running an earlier cell then lands here.
      throw new ApiError(404, `The model \`${id}\` is no longer served: its server was closed (model.close()). Load the model again (in a notebook, re-run the cell that loads it) and create the client from it.`, "invalid_request_error", "model", "model_closed");
    }
    const route = this.routes.get(id);
    if (route) return route;
    for (const source of this.sources) {
      const found = source.resolve(id);
      if (found) {
        this.addAdapter(id, found.baseId, found.loras === null ? () => null : found.loras);
        return this.routes.get(id);
      }
    }
    return undefined;
  }

  private checkFree(id: string): void {
    if (this.routes.has(id)) throw new ApiError(400, `model id "${id}" is already served; pick another or removeModel() first`, "invalid_request_error", "model", "model_exists");
  }
}
