// Smoke test of both public entries under Deno: `art-ts` and `art-ts/engine` resolve through deno.json's import map
// to lib/mod.ts and lib/engine.ts. The engine entry loads the embedded model on the CPU and generates with it. The
// portable matmul's worker threads run under Deno too, with the same bits as one thread (and, for the float64-summed
// products, as the JavaScript reference), and let the process exit.
import * as art from "art-ts";
import * as engine from "art-ts/engine";
import { matmulNT } from "../../lib/model/cpu/matmul.ts";
import { WasmMatmul } from "../../lib/model/cpu/wasm-matmul.ts";

const t = new art.Trajectory({ messagesAndChoices: [{ role: "user", content: "hi" }], reward: 1 });
if (t.messages().length !== 1 || t.reward !== 1) throw new Error("Trajectory does not work under Deno");
const lm = await engine.loadCausalLM(new URL("../../models/tictactoe-tiny", import.meta.url).pathname, { device: "cpu", log: () => {} });
const [out] = await lm.generate([{ messages: [{ role: "user", content: "x__\n___\n___" }], temperature: 0, maxTokens: 9 }]);
if (!/^<move>[ABC][123]<\/move>$/.test(out.text)) throw new Error(`art-ts/engine under Deno: the embedded model answered ${JSON.stringify(out.text)}`);
lm.free();

const [n, k, m] = [64, 256, 512];
const outputs = await Promise.all([1, 2].map(async (threads) => {
  const kernel = WasmMatmul.create(threads)!;
  if (await kernel.startWorkers() !== threads - 1) throw new Error(`WASM matmul under Deno: ${threads - 1} worker(s) did not start`);
  kernel.ensureBytes((n * k + m * k + n * m) * 4);
  kernel.heap.set(Float32Array.from({ length: n * k + m * k }, (_, i) => Math.sin(i)));
  kernel.matmulNT(0, n * k * 4, (n * k + m * k) * 4, n, k, m);
  if (kernel.blocksOnWorkers !== threads - 1) throw new Error(`WASM matmul under Deno: ${kernel.blocksOnWorkers} blocks on workers`);
  const f32 = new Uint32Array(kernel.heap.slice(n * k + m * k, n * k + m * k + n * m).buffer);
  const x = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i)), w = Float32Array.from({ length: m * k }, (_, i) => Math.sin(3 * i));
  const f64 = new Float32Array(n * m), reference = new Float32Array(n * m);
  kernel.ntArrays(x, w, n, k, m, f64, { alpha: 1 / Math.sqrt(k + 1) });
  matmulNT(x, w, n, k, m, reference, { alpha: 1 / Math.sqrt(k + 1) });
  if (f64.some((value, i) => !Object.is(value, reference[i]))) throw new Error(`WASM float64 products under Deno on ${threads} thread(s) differ from matmul.ts`);
  return f32;
}));
if (outputs[0]!.some((bits, i) => bits !== outputs[1]![i])) throw new Error("WASM matmul under Deno: 2 threads differ from 1");
console.log(`deno smoke: ok (art-ts: ${Object.keys(art).length} names, art-ts/engine: ${Object.keys(engine).length}; the embedded model answers ${out.text}; the WASM matmul on 2 threads)`);
