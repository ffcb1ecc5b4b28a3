// Run by deno.test.ts under Deno 2: loads a tiny checkpoint (path in argv) and prints logits and greedy tokens as JSON,
// which the test compares with the same run under Node.
import { loadCausalLM } from "../../lib/load/causal-lm.ts";

export async function engineSummary(dir: string): Promise<{ logits: number[]; tokenIds: number[]; text: string }> {
  const lm = await loadCausalLM(dir, { device: "cpu" });
  const logits = await lm.logits([1, 2, 3]);
  const [result] = await lm.generate([{ messages: [{ role: "user", content: "hi" }], temperature: 0, maxTokens: 8 }]);
  return { logits: Array.from(logits.subarray(0, 16)), tokenIds: result.tokenIds, text: result.text };
}

const dir = (globalThis as { Deno?: { args: string[] } }).Deno?.args[0];
if (dir) engineSummary(dir).then((summary) => console.log(JSON.stringify(summary)));
