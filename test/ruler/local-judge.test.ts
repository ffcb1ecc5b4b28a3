/**
 * The local judge end to end: an art-ts model served in-process (its OpenAI client runs on a custom fetch, no
 * port) judges a group with its answer constrained to RULER's JSON schema. Even a random tiny model must produce a
 * valid score for every trajectory: the schema fixes the entry count and the ids, and scores are clamped.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup } from "../../lib/core/mod.ts";
import { loadCausalLM } from "../../lib/load/mod.ts";
import { rulerScoreGroup } from "../../lib/ruler/mod.ts";
import { ModelServer } from "../../lib/serve/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

describe("local judge (in-process art-ts model)", () => {
  it("scores every trajectory of a group with a valid score", async () => {
    const dir = mkdtempSync(join(tmpdir(), "art-ts-judge-"));
    writeTinyCheckpoint(dir, { arch: "qwen2", tokenizer: true });
    const server = new ModelServer();
    server.addBaseModel("judge", await loadCausalLM(dir, { device: "cpu", log: () => {} }));
    const client = server.openai({ maxRetries: 0 });
    const group = new TrajectoryGroup(
      ["A1", "B2", "C3", "A1"].map(
        (move, i) =>
          new Trajectory({
            messagesAndChoices: [
              { role: "system", content: "Play tic-tac-toe. Answer with <move>cell</move>." },
              { role: "user", content: "Board: empty. Your move." },
              { role: "assistant", content: `<move>${move}</move>` },
            ],
            reward: i,
          }),
      ),
    );
    try {
      const judged = await rulerScoreGroup(group, {
        judge: { client, model: "judge", structuredOutput: "json_schema", extraBody: { max_tokens: 400, seed: 1 } },
        cache: false,
      });
      expect(judged).not.toBeNull();
      for (const trajectory of judged!.trajectories) {
        expect(trajectory.reward).toBeGreaterThanOrEqual(0);
        expect(trajectory.reward).toBeLessThanOrEqual(1);
        expect(trajectory.metrics.ruler_score).toBe(trajectory.reward);
        expect(trajectory.metrics.independent_reward).toBe(group.trajectories[judged!.trajectories.indexOf(trajectory)].reward);
      }
      expect(judged!.trajectories[0].reward).toBe(judged!.trajectories[3].reward); // identical trajectories, judged once
    } finally {
      await server.close();
    }
  });
});
