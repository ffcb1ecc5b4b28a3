/**
 * Generate from a checkpoint on the command line, streaming the text: the engine's end-to-end demo.
 *
 * usage: node scripts/engine-generate.ts <checkpoint-dir | ORG/NAME> "<user message>" [--max-tokens N] [--temperature T] [--seed S]
 * e.g.   node scripts/make-tiny-checkpoint.ts /tmp/tiny-qwen3 --arch qwen3 && node scripts/engine-generate.ts /tmp/tiny-qwen3 "Hello"
 * (a tiny random checkpoint produces random text; the point is the whole path: load, chat template, prefill, decode).
 */
import { loadCausalLM } from "../lib/load/causal-lm.ts";

async function main(argv: string[]): Promise<void> {
  const [model, message, ...rest] = argv;
  if (!model || message === undefined) {
    console.error('usage: engine-generate.ts <checkpoint-dir | ORG/NAME> "<user message>" [--max-tokens N] [--temperature T] [--seed S]');
    process.exit(2);
  }
  const flag = (name: string, fallback: number) => {
    const at = rest.indexOf(`--${name}`);
    return at >= 0 ? Number(rest[at + 1]) : fallback;
  };
  const lm = await loadCausalLM(model, { log: (note) => console.error(note) });
  const start = performance.now();
  let count = 0;
  for await (const token of lm.stream({
    messages: [{ role: "user", content: message }],
    maxTokens: flag("max-tokens", 64), temperature: flag("temperature", 0.8), seed: flag("seed", 0),
  })) {
    process.stdout.write(token.text);
    count++;
  }
  const seconds = (performance.now() - start) / 1000;
  console.error(`\n${count} tokens in ${seconds.toFixed(2)} s (${(count / seconds).toFixed(1)} tokens/s, prefill included) on ${lm.backend.name}`);
}

main(process.argv.slice(2)).catch((error) => {
  console.error(error instanceof Error ? error.message : error);
  process.exit(1);
});
