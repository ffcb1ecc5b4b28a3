import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ArtError, type Message, type Tool, Trajectory, TrajectoryGroup } from "../../lib/core/mod.ts";
import { DEFAULT_RUBRIC, ruler, type RulerGroupOptions, rulerScoreGroup } from "../../lib/ruler/mod.ts";
import { answer, type ChatRequestBody, JudgeServer, trajectoryBlocks } from "./judge-server.ts";
import { MAX_ANSWER_CHARS } from "../../lib/ruler/answer.ts";

let server: JudgeServer;
let cacheDir: string;

beforeEach(async () => {
  server = await JudgeServer.start(() => ({ content: answer([0.5, 0.5]) }));
  cacheDir = mkdtempSync(join(tmpdir(), "ruler-cache-"));
});

afterEach(async () => {
  await server.close();
  rmSync(cacheDir, { recursive: true, force: true });
});

/** Options for a judge on the test server, fast retries, no cache unless a test asks for it. */
function options(extra: Partial<RulerGroupOptions> = {}): RulerGroupOptions {
  return { judge: server.endpoint(), cache: false, retries: { delaySeconds: 0.01 }, timeoutSeconds: 5, ...extra };
}

const system: Message = { role: "system", content: "You play tic-tac-toe." };
const task: Message = { role: "user", content: "Board: empty. Your move." };
const conversation = (...replies: string[]): Message[] => [system, task, ...replies.map((content) => ({ role: "assistant" as const, content }))];

const tools: Tool[] = [
  { type: "function", function: { name: "place_mark", description: "Place a mark", parameters: { type: "object", properties: { cell: { type: "string" } } } } },
];

/** A judge that scores each trajectory by the number in its last message, so tests can see which got which. */
const scoreFromContent = (body: ChatRequestBody) => {
  const blocks = trajectoryBlocks(body);
  const scores = [...blocks.values()].map((messages) => Number((messages.at(-1) as { content: string }).content) / 10);
  return { content: answer(scores) };
};

describe("the judge prompt", () => {
  it("sends the shared prefix once as context, numbered trajectories from 1, the tools and the rubric", async () => {
    server.script = scoreFromContent;
    const lists = [conversation("3"), conversation("9"), conversation("5")];
    const result = await ruler(lists, options({ tools, rubric: "Winning is all that counts." }));
    expect(result.scores.map((s) => s.score)).toEqual([0.3, 0.9, 0.5]);
    expect(result.scores.map((s) => s.trajectoryId)).toEqual([1, 2, 3]);

    const body = server.requests[0].body;
    const user = body.messages.find((m) => m.role === "user")!.content;
    expect(user.match(/<context>/g)).toHaveLength(1);
    expect(user).toContain(`<context>\n${JSON.stringify([system, task])}\n</context>`);
    expect(user.split("You play tic-tac-toe.")).toHaveLength(2); // the shared system prompt appears once
    expect([...trajectoryBlocks(body).entries()]).toEqual([
      [1, [{ role: "assistant", content: "3" }]],
      [2, [{ role: "assistant", content: "9" }]],
      [3, [{ role: "assistant", content: "5" }]],
    ]);
    expect(user).toContain(`<tools>\n${JSON.stringify(tools)}\n</tools>`);
    expect(user).toContain("Winning is all that counts.");
    expect(user).not.toContain(DEFAULT_RUBRIC);
    expect(body.messages[0].role).toBe("system");
    expect(body.messages[0].content).toContain("exactly 3 entries");
    expect(body.response_format?.type).toBe("json_schema");
    const schema = body.response_format?.json_schema?.schema as { properties: { scores: Record<string, unknown> } };
    expect(schema.properties.scores).toMatchObject({ minItems: 3, maxItems: 3, items: { required: ["trajectory_id", "explanation", "score"] } });
    expect(JSON.stringify(schema)).toContain('"trajectory_id":{"type":"string","enum":["1","2","3"]}');
  });

  it("uses the default rubric and no context block when the trajectories share nothing", async () => {
    server.script = () => ({ content: answer([1, 0]) });
    await ruler([[{ role: "user", content: "a" }], [{ role: "user", content: "b" }]], options());
    const user = server.requests[0].body.messages[1].content;
    expect(user).toContain(DEFAULT_RUBRIC);
    expect(user).not.toContain("<context>");
    expect(user).not.toContain("<tools>");
  });

  it("judges identical trajectories once and gives the copies the same score", async () => {
    server.script = scoreFromContent;
    const result = await ruler([conversation("2"), conversation("7"), conversation("2"), conversation("7")], options());
    expect(trajectoryBlocks(server.requests[0].body).size).toBe(2);
    expect(result.scores.map((s) => [s.trajectoryId, s.score])).toEqual([[1, 0.2], [2, 0.7], [1, 0.2], [2, 0.7]]);
  });
});

describe("reading the judge's answer", () => {
  const lists = () => [conversation("a"), conversation("b"), conversation("c")];

  it("matches scores by trajectory_id, whatever their order", async () => {
    server.script = () => ({
      content: JSON.stringify({ scores: [{ trajectory_id: "3", explanation: "c", score: 0.3 }, { trajectory_id: 1, explanation: "a", score: 0.1 }, { trajectory_id: "trajectory 2", explanation: "b", score: 0.2 }] }),
    });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => [s.score, s.explanation])).toEqual([[0.1, "a"], [0.2, "b"], [0.3, "c"]]);
  });

  it("falls back to position when ids are missing or do not name 1..n", async () => {
    server.script = () => ({ content: JSON.stringify({ scores: [{ score: 0.9 }, { trajectory_id: "7", score: 0.8 }, { trajectory_id: "7", score: 0.7 }] }) });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.9, 0.8, 0.7]);
    expect(result.scores[0].explanation).toBe("");
  });

  it("finds the JSON inside reasoning, prose and code fences", async () => {
    server.script = () => ({ content: `<think>{"scores": "not yet"}</think>\nHere you go:\n\`\`\`json\n${answer([0.1, 0.2, 0.3])}\n\`\`\`\nHope that helps.` });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.1, 0.2, 0.3]);
    expect(server.requests).toHaveLength(1);
  });

  it("asks again after a non-JSON answer, saying what was wrong", async () => {
    server.script = (_body, i) => ({ content: i === 0 ? "I think the second one is best." : answer([0.2, 0.8, 0.5]) });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.2, 0.8, 0.5]);
    const retry = server.requests[1].body.messages;
    expect(retry.at(-2)).toMatchObject({ role: "assistant", content: "I think the second one is best." });
    expect(retry.at(-1)!.content).toMatch(/could not be used: no JSON object with a "scores" array.*exactly 3 entries/);
  });

  it("asks again after a wrong count, and gives up with a clear error after maxAnswerAttempts", async () => {
    server.script = () => ({ content: answer([0.5, 0.5]) });
    const run = ruler(lists(), options({ maxAnswerAttempts: 2 }));
    await expect(run).rejects.toThrow(ArtError);
    await expect(run).rejects.toThrow(/judge judge-model gave no usable answer in 2 attempts \(last problem: expected exactly 3 scores \(trajectory_id 1 to 3\), got 2/);
    expect(server.requests).toHaveLength(2);
  });

  it("clamps scores outside [0, 1] and counts them", async () => {
    server.script = () => ({ content: '{"scores": [{"trajectory_id": "1", "explanation": "x", "score": 7}, {"trajectory_id": "2", "explanation": "y", "score": -1}, {"trajectory_id": "3", "explanation": "z", "score": 1e999}]}' });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => [s.score, s.clamped])).toEqual([[1, 1], [0, 1], [1, 1]]);
  });

  it("accepts numeric strings and re-asks when a score is missing or not a number", async () => {
    const replies = [
      '{"scores": [{"trajectory_id": "1", "explanation": "x"}, {"trajectory_id": "2", "score": 0.1}, {"trajectory_id": "3", "score": 0.2}]}',
      '{"scores": [{"trajectory_id": "1", "score": "high"}, {"trajectory_id": "2", "score": 0.1}, {"trajectory_id": "3", "score": 0.2}]}',
      '{"scores": [{"trajectory_id": "1", "score": "0.9"}, {"trajectory_id": "2", "score": 0.1}, {"trajectory_id": "3", "score": 0.2}]}',
    ];
    server.script = (_body, i) => ({ content: replies[i] });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.9, 0.1, 0.2]);
    expect(server.requests[1].body.messages.at(-1)!.content).toContain('score entry 1 has no numeric "score"');
  });
});

describe("transport failures", () => {
  const lists = () => [conversation("a"), conversation("b")];

  it("retries HTTP 500s with backoff and then succeeds", async () => {
    server.script = (_body, i) => (i < 2 ? { status: 500, error: "overloaded" } : { content: answer([0.4, 0.6]) });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.4, 0.6]);
    expect(server.requests).toHaveLength(3);
  });

  it("gives up after the retry budget with an error naming the status", async () => {
    server.script = () => ({ status: 503, error: "down" });
    await expect(ruler(lists(), options({ retries: { maxAttempts: 2, delaySeconds: 0.01 } }))).rejects.toThrow(/judge judge-model failed with HTTP 503: 503 down\. Check the request/);
    expect(server.requests).toHaveLength(2);
  });

  it("does not retry an authentication error", async () => {
    server.script = () => ({ status: 401, error: "bad key" });
    await expect(ruler(lists(), options())).rejects.toThrow(/failed with HTTP 401: 401 bad key\. Check the API key\./);
    expect(server.requests).toHaveLength(1);
  });

  it("times out a request that never answers, retries, and succeeds", async () => {
    server.script = (_body, i) => (i === 0 ? { hang: true } : { content: answer([0.3, 0.7]) });
    const result = await ruler(lists(), options({ timeoutSeconds: 0.3 }));
    expect(result.scores.map((s) => s.score)).toEqual([0.3, 0.7]);
    expect(server.requests).toHaveLength(2);
  });

  it("ends a judge that never answers with a timeout error, not a hang", async () => {
    server.script = () => ({ hang: true });
    await expect(ruler(lists(), options({ timeoutSeconds: 0.2, retries: { maxAttempts: 2, delaySeconds: 0.01 } }))).rejects.toThrow(/judge judge-model timed out on every attempt/);
  });

  it("times out a judge that sends its headers and then trickles the body, on every attempt", async () => {
    server.script = () => ({ trickle: true });
    const started = Date.now();
    await expect(ruler(lists(), options({ timeoutSeconds: 0.3, retries: { maxAttempts: 2, delaySeconds: 0.01 } }))).rejects.toThrow(/judge judge-model timed out on every attempt/);
    expect(Date.now() - started).toBeLessThan(3000);
    expect(server.requests).toHaveLength(2);
  });

  it("asks again after an answer over the size it reads", async () => {
    server.script = (_body, i) => ({ content: i === 0 ? `${"x".repeat(MAX_ANSWER_CHARS)} ${answer([0.3, 0.7])}` : answer([0.3, 0.7]) });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.3, 0.7]);
    expect(server.requests[1].body.messages.at(-1)!.content).toMatch(/the answer is 1000\d{3} characters, over the 1000000 read; answer with the JSON only/);
  });

  it("asks again when the answer has no content", async () => {
    server.script = (_body, i) => ({ content: i === 0 ? null : answer([0.3, 0.7]) });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.3, 0.7]);
    expect(server.requests[1].body.messages.at(-1)!.content).toContain("the answer was empty");
  });

  it("turns a response body that is not JSON into a clear error", async () => {
    server.script = () => ({ raw: "<html>gateway</html>" });
    await expect(ruler(lists(), options())).rejects.toThrow(/judge judge-model sent a response that could not be read .*OpenAI-compatible API/);
  });

  it("drops response_format when the endpoint rejects it, and parses plain text", async () => {
    server.script = (body) => (body.response_format ? { status: 400, error: "response_format is not supported" } : { content: `Scores: ${answer([0.1, 0.9])}` });
    const result = await ruler(lists(), options());
    expect(result.scores.map((s) => s.score)).toEqual([0.1, 0.9]);
    expect(server.requests.map((r) => r.body.response_format?.type ?? "none")).toEqual(["json_schema", "none"]);
  });

  it("sends the requested structured output mode and extra body fields", async () => {
    server.script = () => ({ content: answer([0.1, 0.9]) });
    await ruler(lists(), { ...options(), judge: { ...server.endpoint(), structuredOutput: "json_object", temperature: 0, extraBody: { reasoning_effort: "low" } } });
    expect(server.requests[0].body).toMatchObject({ response_format: { type: "json_object" }, temperature: 0, reasoning_effort: "low" });
  });
});

describe("the cache", () => {
  const lists = () => [conversation("a"), conversation("b")];

  it("serves a repeated judgement from disk without a request, and misses when the rubric changes", async () => {
    server.script = () => ({ content: answer([0.25, 0.75]) });
    const cached = options({ cache: { dir: cacheDir } });
    const first = await ruler(lists(), cached);
    expect(first.cacheHits).toBe(0);
    expect(server.requests).toHaveLength(1);
    expect(readdirSync(cacheDir)).toHaveLength(1);

    const second = await ruler(lists(), cached);
    expect(server.requests).toHaveLength(1);
    expect(second.cacheHits).toBe(1);
    expect(second.scores).toEqual(first.scores);

    await ruler(lists(), { ...cached, rubric: "Shorter is better." });
    expect(server.requests).toHaveLength(2);
    await ruler([conversation("a"), conversation("c")], cached);
    expect(server.requests).toHaveLength(3);
    await ruler(lists(), { ...cached, judge: server.endpoint("other-judge") });
    expect(server.requests).toHaveLength(4);
    await ruler(lists(), { ...cached, judge: { ...server.endpoint(), name: "judge-after-step-2" } });
    expect(server.requests).toHaveLength(5);
  });

  it("ignores a corrupt entry, asks the judge, and overwrites it", async () => {
    server.script = () => ({ content: answer([0.25, 0.75]) });
    const cached = options({ cache: { dir: cacheDir } });
    await ruler(lists(), cached);
    const [shard] = readdirSync(cacheDir);
    const [file] = readdirSync(join(cacheDir, shard));
    for (const garbage of ["{not json", JSON.stringify({ entries: [{ score: 5 }, { score: 0.1 }] })]) {
      writeFileSync(join(cacheDir, shard, file), garbage);
      const result = await ruler(lists(), cached);
      expect(result.cacheHits).toBe(0);
      expect(result.scores.map((s) => s.score)).toEqual([0.25, 0.75]);
    }
    expect(server.requests).toHaveLength(3);
    expect((await ruler(lists(), cached)).cacheHits).toBe(1);
  });

  it("is skipped with cache: false, and never stores an answer that failed", async () => {
    server.script = () => ({ content: answer([0.25, 0.75]) });
    await ruler(lists(), options());
    await ruler(lists(), options());
    expect(server.requests).toHaveLength(2);

    server.script = () => ({ content: "no" });
    await expect(ruler([conversation("x"), conversation("y")], options({ cache: { dir: cacheDir }, maxAnswerAttempts: 1 }))).rejects.toThrow(/no usable answer/);
    expect(readdirSync(cacheDir)).toHaveLength(0);
  });
});

describe("rulerScoreGroup", () => {
  const group = () =>
    new TrajectoryGroup([
      new Trajectory({ messagesAndChoices: conversation("1"), reward: 10, tools }),
      new Trajectory({ messagesAndChoices: conversation("8"), reward: 20, tools }),
    ]);

  it("returns a judged copy: reward from the judge, old reward and score in metrics, explanation in logs", async () => {
    server.script = scoreFromContent;
    const original = group();
    const judged = (await rulerScoreGroup(original, options()))!;
    expect(judged.rewards).toEqual([0.1, 0.8]);
    expect(judged.trajectories.map((t) => t.metrics)).toEqual([
      { independent_reward: 10, ruler_score: 0.1, ruler_clamped: 0 },
      { independent_reward: 20, ruler_score: 0.8, ruler_clamped: 0 },
    ]);
    expect(judged.trajectories[1].logs).toEqual(["RULER explanation: reason 2"]);
    expect(original.rewards).toEqual([10, 20]);
    expect(original.trajectories[0].metrics).toEqual({});
    expect(server.requests[0].body.messages[1].content).toContain('"name":"place_mark"');
  });

  it("with swallowExceptions returns null instead of throwing", async () => {
    server.script = () => ({ status: 401, error: "bad key" });
    await expect(rulerScoreGroup(group(), options())).rejects.toThrow(/HTTP 401/);
    await expect(rulerScoreGroup(group(), options({ swallowExceptions: true }))).resolves.toBeNull();
  });
});

describe("several judges", () => {
  const lists = () => [conversation("a"), conversation("b"), conversation("c")];
  const byModel: Record<string, number[]> = { alpha: [0.2, 0.6, 0.9], beta: [0.1, 0.8, 0.7], gamma: [0.3, 0.4, 1.0] };

  it("combines scores by mean or median, reports each judge's score and their agreement", async () => {
    server.script = (body) => ({ content: answer(byModel[body.model]) });
    const judges = ["alpha", "beta", "gamma"].map((m) => server.endpoint(m));
    const result = await ruler(lists(), options({ judge: judges }));
    expect(result.scores.map((s) => +s.score.toFixed(6))).toEqual([0.2, 0.6, 0.866667]);
    expect(result.scores[1].judgeScores).toEqual({ alpha: 0.6, beta: 0.8, gamma: 0.4 });
    // ranks: alpha 1,2,3; beta 1,3,2; gamma 1,2,3 → rho(alpha,beta)=0.5, rho(alpha,gamma)=1, rho(beta,gamma)=0.5
    expect(result.agreement).toBeCloseTo(2 / 3, 12);
    expect(result.scores[0].explanation).toBe("alpha: reason 1\nbeta: reason 1\ngamma: reason 1");

    const medians = await ruler(lists(), options({ judge: judges, aggregate: "median" }));
    expect(medians.scores.map((s) => s.score)).toEqual([0.2, 0.6, 0.9]);
  });

  it("puts per-judge scores and the agreement into the group's metrics", async () => {
    server.script = (body) => ({ content: answer(byModel[body.model].slice(0, 2)) });
    const group = new TrajectoryGroup([new Trajectory({ messagesAndChoices: conversation("a") }), new Trajectory({ messagesAndChoices: conversation("b") })]);
    const judged = (await rulerScoreGroup(group, options({ judge: [server.endpoint("alpha"), server.endpoint("beta")] })))!;
    expect(judged.trajectories[1].metrics).toMatchObject({ "ruler_score/alpha": 0.6, "ruler_score/beta": 0.8, ruler_score: 0.7, ruler_judge_agreement: 1 });
  });

  it("keeps going when one judge fails, and reports it", async () => {
    server.script = (body) => (body.model === "beta" ? { status: 401, error: "no" } : { content: answer(byModel[body.model]) });
    const result = await ruler(lists(), options({ judge: [server.endpoint("alpha"), server.endpoint("beta")] }));
    expect(result.scores.map((s) => s.score)).toEqual([0.2, 0.6, 0.9]);
    expect(result.judgeFailures).toEqual([{ judge: "beta", message: expect.stringMatching(/HTTP 401/) }]);
    expect(result.agreement).toBeNull();
  });

  it("fails with every judge's error when all fail", async () => {
    server.script = () => ({ status: 401, error: "no" });
    await expect(ruler(lists(), options({ judge: [server.endpoint("alpha"), server.endpoint("alpha")] }))).rejects.toThrow(/every judge failed:\n {2}- alpha: .*HTTP 401.*\n {2}- alpha#2: /);
  });
});

describe("sub-scores", () => {
  it("asks for named sub-scores in the prompt and schema and returns them separately", async () => {
    server.script = () => ({
      content: JSON.stringify({
        scores: [
          { trajectory_id: "1", explanation: "a", score: 0.5, sub_scores: { legality: 1, speed: 0.25 } },
          { trajectory_id: "2", explanation: "b", score: 0.7, sub_scores: { legality: 3, speed: 0.5 } },
        ],
      }),
    });
    const subScores = [{ name: "legality", description: "Every move is legal." }, { name: "speed", description: "Wins quickly." }];
    const group = new TrajectoryGroup([new Trajectory({ messagesAndChoices: conversation("a") }), new Trajectory({ messagesAndChoices: conversation("b") })]);
    const judged = (await rulerScoreGroup(group, options({ subScores })))!;
    expect(judged.trajectories.map((t) => [t.metrics["ruler_sub_score/legality"], t.metrics["ruler_sub_score/speed"], t.metrics.ruler_clamped])).toEqual([
      [1, 0.25, 0],
      [1, 0.5, 1],
    ]);
    const body = server.requests[0].body;
    expect(body.messages[1].content).toContain("- legality: Every move is legal.");
    expect(JSON.stringify(body.response_format?.json_schema?.schema)).toContain('"sub_scores":{"type":"object","properties":{"legality":{"type":"number"},"speed":{"type":"number"}}');
  });

  it("re-asks when a named sub-score is missing", async () => {
    server.script = (_b, i) => ({ content: JSON.stringify({ scores: [{ trajectory_id: "1", score: 0.5, sub_scores: i === 0 ? {} : { legality: 0.5 } }] }) });
    const result = await ruler([conversation("a")], options({ subScores: [{ name: "legality", description: "legal" }] }));
    expect(result.scores[0].subScores).toEqual({ legality: 0.5 });
    expect(server.requests[1].body.messages.at(-1)!.content).toContain('no numeric sub-score "legality"');
  });
});

describe("Trajectory.clone (what rulerScoreGroup returns instead of changing its input)", () => {
  it("copies deeply and keeps the timing", () => {
    const original = new Trajectory({ messagesAndChoices: conversation("x"), reward: 1, metrics: { a: 1 }, logs: ["l"], tools }).finish();
    const copy = original.clone();
    expect(copy).toBeInstanceOf(Trajectory);
    expect(copy.toJSON()).toEqual(original.toJSON());
    expect(copy.startTime).toBe(original.startTime);
    copy.metrics.a = 2;
    copy.logs.push("m");
    (copy.messagesAndChoices[0] as { content: string }).content = "changed";
    expect(original.metrics.a).toBe(1);
    expect(original.logs).toEqual(["l"]);
    expect(original.messagesAndChoices[0]).toEqual(system);
  });
});
