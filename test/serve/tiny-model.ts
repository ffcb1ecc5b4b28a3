/**
 * A random tiny Qwen2-shaped model behind the small Qwen-style tokenizer of scripts/serve-small-tokenizer.ts, for
 * the serving tests (token masks over the full 151k vocabulary are tested in token-mask.test.ts). The model is noise:
 * it never writes JSON by itself and rarely ends a turn; tests that need it not to stop use seeds they check.
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CpuBackend } from "../../lib/model/cpu/backend.ts";
import { parseConfig } from "../../lib/model/config.ts";
import { openSafetensors } from "../../lib/model/safetensors.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { loadWeights, Transformer } from "../../lib/model/transformer.ts";
import type { ServableModel } from "../../lib/serve/model-server.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../../scripts/serve-small-tokenizer.ts";

const FINAL_NORM_SCALE = 0.2;

export async function tinyServableModel(seed = 1): Promise<ServableModel> {
  const dir = mkdtempSync(join(tmpdir(), "art-ts-serve-"));
  writeSmallQwenTokenizer(dir);
  const tokenizer = await loadTokenizer(dir);
  writeTinyCheckpoint(dir, { arch: "qwen2", seed, configOverrides: { vocab_size: tokenizer.vocabSize, eos_token_id: tokenizer.eosTokenIds[0] } });
  const config = parseConfig(JSON.parse(readFileSync(join(dir, "config.json"), "utf8")), join(dir, "config.json"));
  const store = openSafetensors(dir);
  // Portable products: the serving tests check that a sequence's tokens do not depend on its batch-mates, which holds
  // bit for bit only there (a system BLAS picks its kernels by the batch's shape, so batch-mates move the rounding).
  const backend = new CpuBackend({ blas: "portable" });
  const weights = loadWeights(backend, config, store);
  store.close();
  // Random weights give logits with a spread of ~6 nats: nearly greedy. A smaller final norm (spread ~1.2) makes
  // sampling really depend on the seed, and keeps the end token (1 of ~680) unlikely, as the tests assume.
  const norm = backend.download(weights.finalNorm).map((w) => w * FINAL_NORM_SCALE);
  backend.free(weights.finalNorm);
  weights.finalNorm = backend.upload(norm, [config.hiddenSize]);
  const transformer = new Transformer(backend, config, weights);
  return { model: transformer, tokenizer };
}
