/**
 * Rollouts beyond one process: a fleet of inference servers of the OpenAI API (art-ts serve replicas started with
 * --allow-runtime-lora, or vLLM/SGLang with runtime LoRA updating) that a trainer keeps on its latest adapter.
 *
 * - `pushAdapter(name, path)` loads a PEFT directory on every replica through vLLM's `/v1/load_lora_adapter`
 *   (`load_inplace`, so the name keeps answering while its weights change). A replica that fails is marked as
 *   lagging: rollouts leave it alone until a later push reaches it. The checkpoint itself is already on disk, so
 *   a failed push loses nothing.
 * - `fetch` (and `openai()`) sends each request to the up-to-date replica with the fewest requests in flight, and
 *   when one cannot be reached or answers 5xx before any of its body, sends the request to the next one.
 *
 * The adapter path must be readable on the replicas' machines (the same machine, or a shared filesystem).
 */
import OpenAI from "openai";
import { ArtError } from "../core/errors.ts";
import { clipText } from "../core/text.ts";

export interface Replica {
  /** e.g. "http://10.0.0.2:8000/v1" */
  baseURL: string;
  apiKey?: string;
}

export interface ReplicaStatus {
  baseURL: string;
  /** requests sent and not yet answered */
  inFlight: number;
  served: number;
  failed: number;
  /** false after a push that did not reach it, until one does */
  upToDate: boolean;
  lastError: string | null;
}

export interface PushResult {
  baseURL: string;
  ok: boolean;
  error?: string;
}

interface ReplicaState extends ReplicaStatus {
  apiKey: string | null;
}

export class ReplicaFleet {
  readonly #replicas: ReplicaState[];
  readonly #timeoutMs: number;

  constructor(replicas: readonly Replica[], options: { pushTimeoutMs?: number } = {}) {
    if (replicas.length === 0) throw new ArtError("bad_replicas", "ReplicaFleet: give at least one replica { baseURL }");
    this.#replicas = replicas.map((replica, i) => {
      let url: URL;
      try {
        url = new URL(replica.baseURL);
      } catch {
        throw new ArtError("bad_replicas", `ReplicaFleet: replica ${i} has baseURL ${JSON.stringify(replica.baseURL)}, not a URL like http://host:8000/v1`);
      }
      return { baseURL: url.href.replace(/\/+$/, ""), apiKey: replica.apiKey ?? null, inFlight: 0, served: 0, failed: 0, upToDate: true, lastError: null };
    });
    this.#timeoutMs = options.pushTimeoutMs ?? 120_000;
  }

  /** Each replica's counts and whether it serves the latest pushed adapter. */
  get status(): ReplicaStatus[] {
    return this.#replicas.map(({ apiKey: _apiKey, ...status }) => ({ ...status }));
  }

  /** Loads (or replaces) adapter `name` from `path` on every replica; never throws for a replica that fails. */
  async pushAdapter(name: string, path: string): Promise<PushResult[]> {
    return Promise.all(this.#replicas.map(async (replica) => {
      try {
        const response = await fetch(`${replica.baseURL}/load_lora_adapter`, {
          method: "POST", headers: this.#headers(replica), signal: AbortSignal.timeout(this.#timeoutMs),
          body: JSON.stringify({ lora_name: name, lora_path: path, load_inplace: true }),
        });
        if (!response.ok) throw new Error(`HTTP ${response.status}: ${clipText(await response.text(), 500)}`);
        await response.body?.cancel();
        Object.assign(replica, { upToDate: true, lastError: null });
        return { baseURL: replica.baseURL, ok: true };
      } catch (error) {
        const message = (error as Error).message ?? String(error);
        Object.assign(replica, { upToDate: false, lastError: `push of ${name}: ${message}` });
        return { baseURL: replica.baseURL, ok: false, error: message };
      }
    }));
  }

  /**
   * A fetch for clients of the fleet: the path after the client's base URL goes to a replica (up to date, fewest in
   * flight), and to the next one when a replica cannot be reached or answers 5xx.
   */
  readonly fetch = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    const body = init?.body ?? (input instanceof Request ? await input.text() : undefined);
    const candidates = this.#replicas.filter((r) => r.upToDate);
    if (candidates.length === 0) {
      throw new ArtError("no_replica", `ReplicaFleet: no replica serves the latest adapter (${this.#replicas.map((r) => `${r.baseURL}: ${r.lastError}`).join("; ")})`);
    }
    candidates.sort((a, b) => a.inFlight - b.inFlight);
    const errors: string[] = [];
    for (const replica of candidates) {
      replica.inFlight++;
      try {
        const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined));
        if (replica.apiKey !== null) headers.set("authorization", `Bearer ${replica.apiKey}`);
        const response = await fetch(`${replica.baseURL}${url.pathname.replace(/^\/v1/, "")}${url.search}`, { ...init, body, headers });
        if (response.status >= 500) {
          errors.push(`${replica.baseURL}: HTTP ${response.status}`);
          replica.failed++;
          await response.body?.cancel();
          continue;
        }
        replica.served++;
        return response;
      } catch (error) {
        if ((error as Error).name === "AbortError") throw error; // the caller gave up: no other replica either
        errors.push(`${replica.baseURL}: ${(error as Error).message}`);
        replica.failed++;
        replica.lastError = (error as Error).message;
      } finally {
        replica.inFlight--;
      }
    }
    throw new ArtError("no_replica", `ReplicaFleet: every replica failed this request (${errors.join("; ")})`);
  };

  /** The `openai` client over the fleet. */
  openai(options: { maxRetries?: number; timeout?: number } = {}): OpenAI {
    return new OpenAI({ baseURL: "http://art-ts.fleet/v1", apiKey: "fleet", fetch: this.fetch, ...options });
  }

  #headers(replica: ReplicaState): Record<string, string> {
    return { "content-type": "application/json", ...(replica.apiKey === null ? {} : { authorization: `Bearer ${replica.apiKey}` }) };
  }
}
