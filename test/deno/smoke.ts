// Smoke test of both public entries under Deno: `art-ts` and `art-ts/engine` resolve through deno.json's import map
// to lib/mod.ts and lib/engine.ts. The engine entry loads the embedded model on the CPU and generates with it.
import * as art from "art-ts";
import * as engine from "art-ts/engine";

const t = new art.Trajectory({ messagesAndChoices: [{ role: "user", content: "hi" }], reward: 1 });
if (t.messages().length !== 1 || t.reward !== 1) throw new Error("Trajectory does not work under Deno");
const lm = await engine.loadCausalLM(new URL("../../models/tictactoe-tiny", import.meta.url).pathname, { device: "cpu", log: () => {} });
const [out] = await lm.generate([{ messages: [{ role: "user", content: "x__\n___\n___" }], temperature: 0, maxTokens: 9 }]);
if (!/^<move>[ABC][123]<\/move>$/.test(out.text)) throw new Error(`art-ts/engine under Deno: the embedded model answered ${JSON.stringify(out.text)}`);
lm.free();
console.log(`deno smoke: ok (art-ts: ${Object.keys(art).length} names, art-ts/engine: ${Object.keys(engine).length}; the embedded model answers ${out.text})`);
