/**
 * Judges: anything that turns a prompt into an answer text. The usual one is an OpenAI-compatible chat
 * endpoint reached through the `openai` package — a hosted provider named "provider/model", an explicit
 * { model, baseURL, apiKey }, or an in-process art-ts model given as { client, model } (its OpenAI client
 * runs on a custom fetch, so no port is involved). Transient HTTP failures and timeouts are retried here with
 * backoff; anything else becomes an ArtError that names the judge and what to check.
 */
import process from "node:process";
import OpenAI from "openai";
import { retry } from "../core/concurrency.ts";
import { ArtError } from "../core/errors.ts";
import { errorMessage, type Message } from "../core/trajectory.ts";

export interface JudgeRequest {
  messages: Message[];
  /** The answer's JSON schema, for judges that can enforce it. */
  schema: Record<string, unknown>;
  timeoutSeconds: number;
}

export interface Judge {
  /** Shown in metrics and logs. */
  readonly name: string;
  /** Identifies the judge in the cache key: the same cacheKey must mean the same model behind it. */
  readonly cacheKey: string;
  complete(request: JudgeRequest): Promise<string>;
}

/** How to ask for structured output: "auto" tries json_schema and falls back to plain text if the endpoint refuses. */
export type StructuredOutputMode = "auto" | "json_schema" | "json_object" | "none";

export interface JudgeEndpoint {
  model: string;
  /** An OpenAI client to use as is: e.g. an in-process art-ts model's client. Overrides baseURL and apiKey. */
  client?: OpenAI;
  baseURL?: string;
  apiKey?: string;
  /** Label in metrics and logs; default: the model name (with its provider prefix when named by a string). */
  name?: string;
  structuredOutput?: StructuredOutputMode;
  /** Sampling temperature; left to the endpoint's default when unset (some reasoning models accept no other). */
  temperature?: number;
  /** Extra body fields for the endpoint (e.g. { reasoning_effort: "low" }). */
  extraBody?: Record<string, unknown>;
}

/** A judge by name ("openai/o4-mini", "openrouter/qwen/qwen3-32b"), by endpoint, or any object implementing Judge. */
export type JudgeSpec = string | JudgeEndpoint | Judge;

export interface TransportRetryOptions {
  /** Attempts per request, the first included. Default 3. */
  maxAttempts?: number;
  /** First wait, in seconds. Default 1. */
  delaySeconds?: number;
  /** Default 2. */
  backoff?: number;
}

/** Provider prefixes: base URL and the environment variable holding the key (none needed for local servers). */
export const JUDGE_PROVIDERS: Record<string, { baseURL: string; apiKeyEnv: string | null }> = {
  openai: { baseURL: "https://api.openai.com/v1", apiKeyEnv: "OPENAI_API_KEY" },
  openrouter: { baseURL: "https://openrouter.ai/api/v1", apiKeyEnv: "OPENROUTER_API_KEY" },
  anthropic: { baseURL: "https://api.anthropic.com/v1", apiKeyEnv: "ANTHROPIC_API_KEY" },
  gemini: { baseURL: "https://generativelanguage.googleapis.com/v1beta/openai", apiKeyEnv: "GEMINI_API_KEY" },
  groq: { baseURL: "https://api.groq.com/openai/v1", apiKeyEnv: "GROQ_API_KEY" },
  together: { baseURL: "https://api.together.xyz/v1", apiKeyEnv: "TOGETHER_API_KEY" },
  fireworks: { baseURL: "https://api.fireworks.ai/inference/v1", apiKeyEnv: "FIREWORKS_API_KEY" },
  deepseek: { baseURL: "https://api.deepseek.com/v1", apiKeyEnv: "DEEPSEEK_API_KEY" },
  ollama: { baseURL: "http://127.0.0.1:11434/v1", apiKeyEnv: null },
  vllm: { baseURL: "http://127.0.0.1:8000/v1", apiKeyEnv: null },
};

export function resolveJudge(spec: JudgeSpec, retryOptions: TransportRetryOptions = {}): Judge {
  if (typeof spec === "string") return new OpenAICompatibleJudge(endpointFromName(spec), retryOptions);
  if (typeof spec === "object" && spec !== null && typeof (spec as Judge).complete === "function") return spec as Judge;
  if (typeof spec !== "object" || spec === null || typeof (spec as JudgeEndpoint).model !== "string" || (spec as JudgeEndpoint).model === "") {
    throw new ArtError(
      "ruler_judge_config",
      `RULER: a judge must be a name like "openai/o4-mini", an endpoint { model, baseURL?, apiKey?, client? }, or an object with complete(); got ${JSON.stringify(spec)}.`,
    );
  }
  return new OpenAICompatibleJudge(spec as JudgeEndpoint, retryOptions);
}

/**
 * "provider/model" → the provider's base URL and key variable. `<PROVIDER>_BASE_URL` overrides the URL
 * (e.g. OPENAI_BASE_URL for a proxy).
 */
function endpointFromName(name: string): JudgeEndpoint & { apiKeyEnv: string | null } {
  const slash = name.indexOf("/");
  const provider = slash > 0 ? name.slice(0, slash) : "";
  const known = JUDGE_PROVIDERS[provider];
  if (!known) {
    throw new ArtError(
      "ruler_judge_config",
      `"${name}" has no known provider prefix (${Object.keys(JUDGE_PROVIDERS).join(", ")}). ` +
        `Name it like "openai/o4-mini", or pass { model, baseURL, apiKey } for any other OpenAI-compatible endpoint.`,
    );
  }
  return {
    model: name.slice(slash + 1),
    name,
    baseURL: process.env[`${provider.toUpperCase()}_BASE_URL`] ?? known.baseURL,
    apiKey: known.apiKeyEnv ? process.env[known.apiKeyEnv] : "none",
    apiKeyEnv: known.apiKeyEnv,
  };
}

/**
 * "provider/model" (a provider of JUDGE_PROVIDERS) → an OpenAI client for that endpoint and the model's id there: what
 * a notebook needs to play a prompted baseline, a teacher or a generator behind an endpoint, named as judges are.
 */
export function endpointClient(name: string): { client: OpenAI; model: string } {
  const endpoint = endpointFromName(name);
  if (endpoint.apiKey === undefined) {
    throw new ArtError("endpoint_key_missing", `${name}: set ${endpoint.apiKeyEnv} to the provider's API key (or ${name.slice(0, name.indexOf("/")).toUpperCase()}_BASE_URL to a server that needs none)`);
  }
  return { client: new OpenAI({ baseURL: endpoint.baseURL, apiKey: endpoint.apiKey }), model: endpoint.model };
}

class OpenAICompatibleJudge implements Judge {
  readonly name: string;
  readonly cacheKey: string;
  private readonly endpoint: JudgeEndpoint & { apiKeyEnv?: string | null };
  private client: OpenAI | null;
  private structuredOutput: StructuredOutputMode;
  private readonly send: (request: JudgeRequest) => Promise<string>;

  constructor(endpoint: JudgeEndpoint & { apiKeyEnv?: string | null }, retryOptions: TransportRetryOptions) {
    this.endpoint = endpoint;
    this.name = endpoint.name ?? endpoint.model;
    this.client = endpoint.client ?? null;
    const baseURL = endpoint.client?.baseURL ?? endpoint.baseURL ?? JUDGE_PROVIDERS.openai.baseURL;
    this.cacheKey = JSON.stringify([this.name, baseURL, endpoint.model, endpoint.temperature ?? null, endpoint.extraBody ?? null]);
    this.structuredOutput = endpoint.structuredOutput ?? "auto";
    this.send = retry((request: JudgeRequest) => this.sendOnce(request), {
      maxAttempts: retryOptions.maxAttempts ?? 3,
      delaySeconds: retryOptions.delaySeconds ?? 1,
      backoff: retryOptions.backoff ?? 2,
      retryOn: isTransient,
    });
  }

  async complete(request: JudgeRequest): Promise<string> {
    try {
      return await this.send(request);
    } catch (error) {
      throw this.explain(error);
    }
  }

  private async sendOnce(request: JudgeRequest): Promise<string> {
    const mode = this.structuredOutput;
    const responseFormat =
      mode === "none"
        ? undefined
        : mode === "json_object"
          ? ({ type: "json_object" } as const)
          : ({ type: "json_schema", json_schema: { name: "ruler_scores", strict: true, schema: request.schema } } as const);
    // openai's own timeout stops at the response headers; a judge that then trickles its body would hold the run
    // for as long as it liked. This signal lasts until the body is read.
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), request.timeoutSeconds * 1000);
    try {
      const completion = await this.getClient().chat.completions.create(
        {
          model: this.endpoint.model,
          messages: request.messages,
          ...(responseFormat ? { response_format: responseFormat } : {}),
          ...(this.endpoint.temperature === undefined ? {} : { temperature: this.endpoint.temperature }),
          ...this.endpoint.extraBody,
        },
        { timeout: request.timeoutSeconds * 1000, maxRetries: 0, signal: deadline.signal },
      );
      // No content (a refusal, a reasoning model cut at its token limit) reads as an empty answer: the judge is asked again.
      const content = completion?.choices?.[0]?.message?.content;
      return typeof content === "string" ? content : "";
    } catch (error) {
      if (deadline.signal.aborted) throw new OpenAI.APIConnectionTimeoutError({ message: `no complete answer within ${request.timeoutSeconds} s` });
      // An endpoint that rejects response_format is asked again without it; lenient parsing takes over.
      if (mode === "auto" && error instanceof OpenAI.APIError && (error.status === 400 || error.status === 422)) {
        this.structuredOutput = "none";
        return this.sendOnce(request);
      }
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  private getClient(): OpenAI {
    if (this.client) return this.client;
    const { apiKey, apiKeyEnv, baseURL } = this.endpoint;
    if (!apiKey) {
      throw new ArtError(
        "ruler_judge_config",
        `RULER: judge ${this.name} needs an API key: set ${apiKeyEnv ?? "the provider's key variable"} or pass { apiKey } in the judge options.`,
      );
    }
    this.client = new OpenAI({ apiKey, baseURL, maxRetries: 0 });
    return this.client;
  }

  private explain(error: unknown): unknown {
    if (error instanceof ArtError) return error;
    if (error instanceof OpenAI.APIConnectionTimeoutError) {
      return new ArtError("ruler_judge_failed", `RULER: judge ${this.name} timed out on every attempt; raise timeoutSeconds or check the endpoint.`, { cause: error });
    }
    if (error instanceof OpenAI.APIError) {
      const status = error.status === undefined ? "a connection error" : `HTTP ${error.status}`;
      const hint =
        error.status === 401 || error.status === 403
          ? "Check the API key."
          : error.status === 404
            ? "Check the model name and base URL."
            : error.status === undefined
              ? "Check that the endpoint is running and reachable."
              : "Check the request the endpoint refused, and the endpoint's logs.";
      return new ArtError("ruler_judge_failed", `RULER: judge ${this.name} failed with ${status}: ${error.message}. ${hint}`, { cause: error });
    }
    return new ArtError(
      "ruler_judge_failed",
      `RULER: judge ${this.name} sent a response that could not be read (${errorMessage(error)}). Check that the base URL points at an OpenAI-compatible API.`,
      { cause: error },
    );
  }
}

/** Timeouts, connection failures, 408, 409, 429 and 5xx are worth another attempt; other errors are not. */
function isTransient(error: unknown): boolean {
  if (error instanceof OpenAI.APIUserAbortError) return false;
  if (error instanceof OpenAI.APIConnectionError) return true;
  if (error instanceof OpenAI.APIError && error.status !== undefined) {
    return error.status === 408 || error.status === 409 || error.status === 429 || error.status >= 500;
  }
  return false;
}
