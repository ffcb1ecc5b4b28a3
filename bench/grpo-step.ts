// One GRPO step as a user of art-ts waits for it, through the public path: a TrainableModel on a random-weight
// checkpoint of a real shape, concurrent multi-turn rollouts through `model.openai()` (gatherTrajectoryGroups), then
// `model.train(groups)`; beside the ART-equivalent Python peer (bench/peers/hf_grpo_step.py: transformers generate,
// a PEFT LoRA step, the adapter saved and reloaded) measured on the same machine and given with --peer.
//
// Usage: node bench/grpo-step.ts [--peer hf-grpo.json] [--out grpo.json] [--device cuda|cpu]
//        [--shapes qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b] [--workloads 2048,arte] [--steps 2]
//        (memory check: --shapes qwen2.5-7b,qwen2.5-14b --workloads memory --steps 0)
//        [--groups N] [--rollouts N] [--turns N]   (smaller workloads than bench/grpo-workloads.json's, for tests)
// Shapes are bench/cuda-shapes.json's, or "tiny-qwen2" (make-tiny-checkpoint.ts's qwen2 preset behind a cut-down Qwen
// tokenizer, for tests); the others get Qwen's full tokenizer (Qwen3's files: Qwen2.5's vocabulary and four more tokens,
// Qwen3's chat template). The workloads (bench/grpo-workloads.json) are fixed token counts, so both sides do the same
// work: every message is digits, one token per digit, sized so each prompt has exactly the workload's length (checked on
// every turn against the prompt ids the server reports); every turn samples exactly `generatedTokens` (vLLM's
// `ignore_eos`, which the server takes as vLLM does). The checkpoint samples digits only (writeRandomCheckpoint): a
// trained model's text re-tokenizes to the ids it sampled, random tokens rarely do, and training would then see each
// turn as a sequence of its own; every trajectory is checked to train as one sequence.
//
// Per workload: 1 warm-up step, then `steps` measured ones (with --steps 0, the warm-up alone: the "memory" workload's
// check that 32 rollouts of 4k tokens and their LoRA step fit, reported with its peak memory and no times), each:
//   rolloutSeconds            all the step's rollouts, gathered concurrently (sampling at temperature 1)
//   trainingSeconds           train()'s own "time/step_trainer_s": tokenizing the groups, forward, backward, AdamW
//   adapterSwapMs             the rest of train(), until rollouts can sample from the new adapter: the engine samples
//                             from the very tensors AdamW updates, so nothing is loaded; what is left is writing the
//                             trajectories, the checkpoint (PEFT adapter + AdamW moments, fsynced) and the history row,
//                             and resuming the server. The peer's is save_pretrained + loading the adapter back.
//   stepSeconds               rolloutSeconds + train()'s wall time (= trainingSeconds + adapterSwapMs)
//   generatedTokensPerSecond  sampled tokens / rolloutSeconds
//   batcher                   where rolloutSeconds went: the engine's forward passes (passes, rowsPerPass, promptRows:
//                             prefilled rows), passMs (a pass's mean milliseconds in flight: admitting, forward,
//                             sampling, until the sampled ids are back, the host's work while the GPU computes
//                             included), busyShare (the passes' seconds over rolloutSeconds; the rest is host work no
//                             pass overlapped: requests rendered and tokenized, responses built, rollouts' code)
// and over the workload's steps (warm-up included) peakGpuMemoryBytes: the CUDA pool's peak reserved bytes (null on the
// CPU), and peakGpuInUseBytes, its peak of bytes in use (what torch's max_memory_allocated counts: the peer's
// peakMemoryBytes), the KV cache included (per shape, `kvCache`: as many slots and positions as the largest workload run needs). With --peer, the peer's means beside ours and
// stepTimeRatio = peer stepSeconds / art-ts stepSeconds (> 1: art-ts is faster), when both ran the same workload.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import type OpenAI from "openai";
import type { ChatCompletionCreateParamsNonStreaming } from "openai/resources/chat/completions";
import { gatherTrajectoryGroups } from "../lib/core/gather.ts";
import { seededRandom } from "../lib/core/random.ts";
import { choiceToMessage, type Choice, type Message, type MessageOrChoice, type Tool, Trajectory } from "../lib/core/trajectory.ts";
import { cudaAvailability } from "../lib/cuda/availability.ts";
import type { CudaBackend } from "../lib/cuda/backend.ts";
import type { Backend } from "../lib/model/backend.ts";
import type { Tokenizer } from "../lib/model/tokenizer.ts";
import { TrainableModel } from "../lib/trainable/model.ts";
import { writeBenchCheckpoint } from "./cuda-random-model.ts";
import { digits, EMAIL_TOOLS, firstMessages, messageSizes, observation, promptTokensAt, readWorkloads, rolloutSeed, trajectoryTokens, type Workload } from "./grpo-workload.ts";

const { values } = parseArgs({ options: {
  peer: { type: "string" }, out: { type: "string" }, device: { type: "string", default: "cuda" },
  shapes: { type: "string", default: "qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b" }, workloads: { type: "string", default: "2048,arte" },
  steps: { type: "string", default: "2" }, groups: { type: "string" }, rollouts: { type: "string" }, turns: { type: "string" },
} });
const workloads = readWorkloads(values.workloads!, values);
const device = values.device as "cuda" | "cpu";
if (device !== "cuda" && device !== "cpu") throw new Error(`--device is cuda or cpu, got ${device}`);
// Before writing gigabytes of checkpoint for nothing.
if (device === "cuda" && !cudaAvailability().ok) throw new Error(`no usable GPU: ${cudaAvailability().reason}`);
const measuredSteps = Number(values.steps);

/** One rollout: `turns` chat completions, each exactly `generatedTokens` long, after prompts of the workload's lengths. */
async function rollout(client: OpenAI, model: string, w: Workload, sizes: { system: number; between: number[] }, step: number, group: number, index: number): Promise<Trajectory> {
  const tools = w.tools ? EMAIL_TOOLS : undefined;
  const seed = rolloutSeed(step, group, index);
  // The system prompt is the task's, the first user message the group's (so a group shares its prompt), the rest the rollout's.
  const messages: Message[] = firstMessages(w, sizes, step, group);
  const items: MessageOrChoice[] = [...messages];
  for (let turn = 0; turn < w.turns; turn++) {
    if (turn > 0) {
      const next = observation(w, digits(sizes.between[group % sizes.between.length], seed + turn), turn);
      messages.push(next);
      items.push(next);
    }
    // ignore_eos is vLLM's request extra (Python clients send it in extra_body); the openai package sends unknown fields as they are.
    const body: ChatCompletionCreateParamsNonStreaming & { ignore_eos: boolean } = {
      model, messages, tools, max_tokens: w.generatedTokens, temperature: 1, seed: seed + turn, ignore_eos: true,
    };
    const choice = (await client.chat.completions.create(body)).choices[0] as Choice;
    const promptLength = choice.prompt_token_ids?.length, expected = promptTokensAt(w, group, turn);
    if (promptLength !== expected || choice.token_ids?.length !== w.generatedTokens) {
      throw new Error(`group ${group}, rollout ${index}, turn ${turn}: a prompt of ${promptLength} tokens and ${choice.token_ids?.length} sampled, where the workload has ${expected} and ${w.generatedTokens}; the sampled text must re-tokenize to its ids (writeRandomCheckpoint samples digits)`);
    }
    items.push(choice);
    messages.push(choiceToMessage(choice));
  }
  // Distinct rewards within the group: every trajectory has a non-zero advantage and is trained.
  return new Trajectory({ messagesAndChoices: items, tools, reward: index });
}

/** The CUDA pool's peak counters, or null on a backend without them (the CPU). */
function gpuMemory(backend: Backend): { resetPeak(): void; peaks(): { peakGpuMemoryBytes: number; peakGpuInUseBytes: number }; device: string } | null {
  const cuda = backend as Partial<CudaBackend>;
  if (!cuda.memoryStats || !cuda.context) return null;
  const context = cuda.context;
  const peaks = () => {
    const { peakReservedBytes, peakInUseBytes } = cuda.memoryStats!().pool;
    return { peakGpuMemoryBytes: peakReservedBytes, peakGpuInUseBytes: peakInUseBytes };
  };
  return { resetPeak: () => context.pool.resetPeak(), peaks, device: context.device.name };
}

/** A random-weight checkpoint of `shape` with its tokenizer in a new directory; returns the directory. */
type Numbers = { rolloutSeconds: number; trainingSeconds: number; adapterSwapMs: number; stepSeconds: number; generatedTokensPerSecond: number };
type PeerResult = { mean?: Numbers; peakMemoryBytes?: number; peakReservedBytes?: number; generation?: string; error?: string };
interface PeerFile { device?: string; workloads?: Record<string, Workload>; results: Record<string, Record<string, PeerResult>> }
const peer = values.peer ? JSON.parse(readFileSync(values.peer, "utf8")) as PeerFile : null;

const round = (value: number, digits = 3) => +value.toFixed(digits);
const mean = (rows: Numbers[], key: keyof Numbers) => rows.reduce((sum, row) => sum + row[key], 0) / rows.length;
const sameWork = (a: Workload, b: Workload | undefined) => b !== undefined && (Object.keys(a) as (keyof Workload)[]).every((key) => JSON.stringify(a[key]) === JSON.stringify(b[key]));

/** The peer's numbers beside ours, and the step-time ratio, when it ran the same workload at this shape. */
function besidePeer(shape: string, name: string, ours: Numbers): Record<string, unknown> {
  const theirs = peer?.results[shape]?.[name];
  if (!peer || !theirs) return {};
  if (theirs.error) return { peer: { error: theirs.error } };
  if (!sameWork(workloads[name], peer.workloads?.[name])) return { peer: { error: `the peer ran other sizes of "${name}" (${JSON.stringify(peer.workloads?.[name])}); no ratio` } };
  const { mean: numbers, ...rest } = theirs;
  return { peer: { ...numbers, ...rest }, stepTimeRatio: round(numbers!.stepSeconds / ours.stepSeconds, 2) };
}

function gitCommit(): string | null {
  const head = spawnSync("git", ["rev-parse", "--short", "HEAD"], { encoding: "utf8" });
  if (head.status !== 0) return null;
  const dirty = spawnSync("git", ["status", "--porcelain", "--untracked-files=no"], { encoding: "utf8" }).stdout.trim() !== "";
  return `${head.stdout.trim()}${dirty ? " (with uncommitted changes)" : ""}`;
}

const results: Record<string, Record<string, unknown>> = {};
let deviceName = `cpu: ${os.cpus()[0]?.model ?? "unknown"} × ${os.cpus().length}`;
const report = () => ({
  benchmark: "grpo-step",
  device: deviceName,
  machine: { host: os.hostname(), cpu: `${os.cpus()[0]?.model ?? "unknown"} × ${os.cpus().length}`, memoryBytes: os.totalmem(), node: process.version },
  commit: gitCommit(),
  command: `node bench/grpo-step.ts ${process.argv.slice(2).join(" ")}`.trim(),
  settings: {
    warmupSteps: 1, measuredSteps, sampling: "temperature 1, ignore_eos, max_tokens = generatedTokens", rewards: "a rollout's index in its group (all distinct)",
    train: "TrainableModel.train defaults (ART's: CISPO, lr 5e-6, LoRA r 8 / alpha 16 on all 7 projections, a packed row per AdamW step, shared prompts)",
    adapterSwapMs: "train() wall time minus its trainer time: trajectories, checkpoint and history written, server resumed (no weights loaded)",
  },
  workloads: Object.fromEntries(Object.entries(workloads).map(([name, w]) => [name, {
    ...w, trajectoryTokens: trajectoryTokens(w),
    generatedTokensPerStep: w.groups * w.rolloutsPerGroup * w.turns * w.generatedTokens,
  }])),
  ...(peer ? { peer: { file: values.peer, device: peer.device } } : {}),
  results,
});
/** Rewrites --out after each workload, so a run cut short keeps what it measured. */
function save(): void {
  if (!values.out) return;
  writeFileSync(`${values.out}.tmp`, JSON.stringify(report(), null, 2) + "\n");
  renameSync(`${values.out}.tmp`, values.out);
}

const concurrency = Math.max(...Object.values(workloads).map((w) => w.groups * w.rolloutsPerGroup));
const longest = Math.max(...Object.values(workloads).flatMap(trajectoryTokens));
for (const shape of values.shapes!.split(",")) {
  const artDir = mkdtempSync(join(os.tmpdir(), "art-grpo-runs-"));
  results[shape] = {};
  let checkpoint: string | null = null, model: TrainableModel | null = null;
  try {
    checkpoint = await writeBenchCheckpoint(shape);
    model = await TrainableModel.load({
      name: "grpo-bench", project: "bench", baseModel: checkpoint, device, artDir, log: (m) => console.error(m),
      batcher: { numSlots: concurrency, maxPositions: longest },
    });
    const memory = gpuMemory(model.lm.backend);
    if (memory) deviceName = memory.device;
    const { numLayers, numKvHeads, headDim } = model.lm.config;
    // Sized for the largest workload run; in the peak memory of each.
    results[shape].kvCache = { slots: concurrency, positions: longest, bytes: model.lm.backend.kvCacheBytes({ numLayers, numKvHeads, headDim, numSlots: concurrency, maxPositions: longest }) };
    const client = model.openai({ maxRetries: 0 });
    for (const [name, w] of Object.entries(workloads)) {
      const sizes = messageSizes(model.lm.tokenizer, w);
      memory?.resetPeak();
      const steps: (Numbers & { generatedTokens: number; trainedTokens: number; sequences: number; gradientSteps: number; batcher: Record<string, number> })[] = [];
      const batcher = model.server.batcherFor(model.name);
      for (let step = 0; step <= measuredSteps; step++) {
        const before = { ...batcher.stats };
        const started = performance.now();
        const groups = await gatherTrajectoryGroups(Array.from({ length: w.groups }, (_, g) => Array.from({ length: w.rolloutsPerGroup },
          (_, r) => () => rollout(client, model!.name, w, sizes, step, g, r))), { progress: false });
        const rolloutSeconds = (performance.now() - started) / 1000;
        const passes = batcher.stats.passes - before.passes, passSeconds = batcher.stats.passSeconds - before.passSeconds;
        const batcherNumbers = {
          passes, rowsPerPass: round((batcher.stats.rows - before.rows) / passes, 1), promptRows: batcher.stats.promptRows - before.promptRows,
          passMs: round((passSeconds / passes) * 1000, 2), busyShare: round(passSeconds / rolloutSeconds),
        };
        const trainStarted = performance.now();
        const result = await model.train(groups);
        const trainSeconds = (performance.now() - trainStarted) / 1000;
        const trainingSeconds = result.metrics["time/step_trainer_s"] as number;
        const trajectories = w.groups * w.rolloutsPerGroup, generatedTokens = trajectories * w.turns * w.generatedTokens;
        if (result.sequences !== trajectories || result.trainedTokens !== generatedTokens) {
          throw new Error(`step ${step}: trained ${result.sequences} sequences and ${result.trainedTokens} tokens, where the workload has ${trajectories} and ${generatedTokens}`);
        }
        if (step === 0) continue; // warm-up: first shapes, CUDA graphs, allocations
        steps.push({
          rolloutSeconds: round(rolloutSeconds), trainingSeconds: round(trainingSeconds), adapterSwapMs: round((trainSeconds - trainingSeconds) * 1000, 1),
          stepSeconds: round(rolloutSeconds + trainSeconds), generatedTokensPerSecond: round(generatedTokens / rolloutSeconds, 1),
          generatedTokens, trainedTokens: result.trainedTokens, sequences: result.sequences, gradientSteps: result.gradientSteps,
          batcher: batcherNumbers,
        });
      }
      const means = Object.fromEntries((["rolloutSeconds", "trainingSeconds", "adapterSwapMs", "stepSeconds", "generatedTokensPerSecond"] as const)
        .map((key) => [key, round(mean(steps, key), key === "adapterSwapMs" || key === "generatedTokensPerSecond" ? 1 : 3)])) as Numbers;
      // --steps 0 (the memory workload): the warm-up step alone, to see that it fits and what it took.
      const peaks = memory ? memory.peaks() : { peakGpuMemoryBytes: null, peakGpuInUseBytes: null };
      results[shape][name] = steps.length === 0 ? { steps, mean: null, ...peaks } : { steps, mean: means, ...peaks, ...besidePeer(shape, name, means) };
      save();
    }
  } catch (error) {
    results[shape].error = (error as Error).stack ?? String(error);
    process.exitCode = 1;
    save();
    console.error(`${shape}: ${(error as Error).stack ?? error}`);
  } finally {
    await model?.close();
    if (checkpoint) rmSync(checkpoint, { recursive: true, force: true });
    rmSync(artDir, { recursive: true, force: true });
  }
}
if (values.out) console.error(`wrote ${values.out}`);
else console.log(JSON.stringify(report(), null, 2));
