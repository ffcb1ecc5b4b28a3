// Rollouts on a fleet: a trainer with two `art-ts serve --allow-runtime-lora` replicas as separate processes on
// loopback. Rollouts go through model.replicas.openai() (spread over both), each train() step pushes its checkpoint,
// and after each step both replicas answer with the new adapter exactly as the trainer's own server does. A replica
// that dies is skipped by rollouts and reported by the next push; the steps go on.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { TrainableModel } from "../../lib/trainable/model.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { writeSmallQwenTokenizer } from "../../scripts/serve-small-tokenizer.ts";

const root = mkdtempSync(join(tmpdir(), "art-ts-replicas-"));
const baseDir = join(root, "base");
const replicas: { process: ChildProcess; baseURL: string }[] = [];
const notes: string[] = [];
let model: TrainableModel;

/** Starts `art-ts serve` in its own process on a free port and resolves with its base URL. */
function startReplica(): Promise<{ process: ChildProcess; baseURL: string }> {
  const cli = resolve(import.meta.dirname, "../../lib/cli.ts");
  const child = spawn(process.execPath, [cli, "serve", "--model", baseDir, "--port", "0", "--device", "cpu", "--slots", "4", "--context", "512", "--allow-runtime-lora"],
    { stdio: ["ignore", "pipe", "pipe"] });
  return new Promise((done, fail) => {
    let output = "";
    const timer = setTimeout(() => fail(new Error(`replica did not start: ${output}`)), 30_000);
    const read = (chunk: Buffer) => {
      output += chunk.toString();
      const match = /at (http:\/\/127\.0\.0\.1:\d+\/v1)/.exec(output);
      if (match) {
        clearTimeout(timer);
        done({ process: child, baseURL: match[1]! });
      }
    };
    child.stdout!.on("data", read);
    child.stderr!.on("data", read);
    child.on("exit", (code) => fail(new Error(`replica exited (${code}): ${output}`)));
  });
}

beforeAll(async () => {
  writeSmallQwenTokenizer(baseDir);
  writeTinyCheckpoint(baseDir, { arch: "qwen2", configOverrides: { vocab_size: 682 } });
  replicas.push(...(await Promise.all([startReplica(), startReplica()])));
  model = await TrainableModel.load({
    name: "agent", project: "fleet", baseModel: baseDir, artDir: join(root, ".art"), device: "cpu",
    lora: { rank: 4, alpha: 8 }, replicas: replicas.map((r) => ({ baseURL: r.baseURL })), log: (line) => notes.push(line),
  });
}, 60_000);

afterAll(async () => {
  await model?.close();
  for (const replica of replicas) replica.process.kill();
  rmSync(root, { recursive: true, force: true });
});

const question = [{ role: "user" as const, content: "Hi" }];

/** The greedy first token's logprob for `agent`: it tells adapters apart. */
async function firstLogprob(client: OpenAI): Promise<number> {
  const completion = await client.chat.completions.create({ model: "agent", messages: question, max_tokens: 1, temperature: 0, logprobs: true });
  return completion.choices[0]!.logprobs!.content![0]!.logprob;
}

/**
 * Eight rollouts on the fleet, rewarded by their place in the group, so every group has signal whatever the answers
 * (the tiny model soon answers alike, and a group of equal rewards trains nothing).
 */
async function rollouts(client: OpenAI, seed: number): Promise<TrajectoryGroup> {
  const trajectories = await Promise.all(Array.from({ length: 8 }, async (_, i) => {
    const completion = await client.chat.completions.create({ model: "agent", messages: question, max_tokens: 6, seed: seed * 100 + i, logprobs: true });
    const choice = completion.choices[0] as Choice;
    return new Trajectory({ messagesAndChoices: [...question, choice], reward: i / 10 });
  }));
  return new TrajectoryGroup(trajectories);
}

describe("TrainableModel with replicas in other processes", () => {
  it("pushes every step's adapter to both replicas, which then answer as the trainer does; a dead replica is skipped", async () => {
    const fleet = model.replicas!;
    const own = model.openai();
    const replicaClient = (i: number) => new OpenAI({ baseURL: replicas[i]!.baseURL, apiKey: "local", maxRetries: 0 });
    // Step 0: the new adapter (answers like the base model) is on both.
    for (const i of [0, 1]) expect(await firstLogprob(replicaClient(i))).toBeCloseTo(await firstLogprob(own), 5);

    let previous = await firstLogprob(own);
    for (const step of [1, 2]) {
      const group = await rollouts(fleet.openai({ maxRetries: 0 }), step);
      await model.train([group], { learningRate: 0.05 });
      const now = await firstLogprob(own);
      expect(now).not.toBeCloseTo(previous, 4); // the step changed the adapter
      for (const i of [0, 1]) expect(await firstLogprob(replicaClient(i))).toBeCloseTo(now, 5);
      previous = now;
    }
    const status = fleet.status;
    expect(status.every((r) => r.served > 0 && r.upToDate)).toBe(true); // both took rollouts

    // One replica dies: rollouts go to the other, and the next push says which one it could not reach.
    replicas[0]!.process.kill();
    await new Promise((done) => replicas[0]!.process.once("exit", done));
    const group = await rollouts(fleet.openai({ maxRetries: 0 }), 3);
    await model.train([group], { learningRate: 0.05 });
    expect(await firstLogprob(replicaClient(1))).toBeCloseTo(await firstLogprob(own), 5);
    expect(fleet.status.map((r) => r.upToDate)).toEqual([false, true]);
    expect(notes.some((line) => line.includes(`replica ${replicas[0]!.baseURL} did not take step 3's adapter`))).toBe(true);
    expect(model.step).toBe(3);
  }, 120_000);
});
