// Prints the node_modules folders the GPU checks need (and everything they load), resolved from
// package-lock.json for linux-x64 glibc, one per line; scripts/cuda-device-bundle.sh packs them.
import { readFileSync } from "node:fs";
import { QWEN3_TOKENIZER_DIR } from "./serve-small-tokenizer.ts";

interface LockEntry {
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  os?: string[];
  cpu?: string[];
  libc?: string[];
}
const lock = JSON.parse(readFileSync("package-lock.json", "utf8")).packages as Record<string, LockEntry>;
const needed = new Set<string>();

function visit(name: string, from: string): void {
  // Node's resolution: a copy nested under the requiring package wins over the top-level one.
  const nested = from ? `${from}/node_modules/${name}` : "";
  const key = nested && lock[nested] ? nested : `node_modules/${name}`;
  const entry = lock[key];
  if (!entry || needed.has(key)) return;
  if ((entry.os && !entry.os.includes("linux")) || (entry.cpu && !entry.cpu.includes("x64")) ||
      (entry.libc && !entry.libc.includes("glibc"))) return;
  needed.add(key);
  for (const dependency of Object.keys({ ...entry.dependencies, ...entry.optionalDependencies })) visit(dependency, key);
}

// The library's runtime dependencies (koffi, tokenizers, chat templates, the openai client the trainable model serves)
// and vitest for the GPU suites.
const manifest = JSON.parse(readFileSync("package.json", "utf8")) as { dependencies: Record<string, string> };
for (const root of [...Object.keys(manifest.dependencies), "vitest"]) visit(root, "");
// Qwen's tokenizer files (a dev dependency's, 1.4 MB packed) for bench/grpo-step.ts's checkpoints of real shapes.
needed.add(QWEN3_TOKENIZER_DIR);
console.log([...needed].sort().join("\n"));
