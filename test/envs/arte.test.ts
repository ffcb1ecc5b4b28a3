import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import type { Choice } from "../../lib/core/trajectory.ts";
import { answerMatches, ARTE_TOOLS, EmailDatabase, generateInbox, InboxTools, loadEnronQuestions, rolloutArte, type Email } from "../../lib/envs/arte/mod.ts";
import type { GamePolicy } from "../../lib/envs/mod.ts";
import { TrainableModel } from "../../lib/trainable/mod.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";

describe("synthetic inbox", () => {
  it("is deterministic from its seed and differs across seeds", () => {
    const a = generateInbox({ seed: 42, emails: 500 });
    const b = generateInbox({ seed: 42, emails: 500 });
    expect(b).toEqual(a);
    expect(generateInbox({ seed: 43, emails: 500 }).emails[0]).not.toEqual(a.emails[0]);
  });

  it("has thousands of emails over several users, threads and dates, and answerable questions", () => {
    const inbox = generateInbox({ seed: 1 });
    expect(inbox.emails.length).toBe(3000);
    expect(inbox.users.length).toBe(6);
    expect(new Set(inbox.emails.map((e) => e.threadId)).size).toBeGreaterThan(500);
    expect(new Set(inbox.emails.map((e) => e.from)).size).toBeGreaterThan(20);
    expect(new Set(inbox.emails.map((e) => e.messageId)).size).toBe(3000);
    const years = new Set(inbox.emails.map((e) => e.date.slice(0, 4)));
    expect([...years].sort()).toEqual(["2000", "2001"]);
    expect(inbox.questions.length).toBeGreaterThan(100);
    expect(new Set(inbox.questions.map((q) => q.question)).size).toBe(inbox.questions.length);
    const byId = new Map(inbox.emails.map((e) => [e.messageId, e]));
    for (const q of inbox.questions) {
      const source = byId.get(q.messageIds[0]!)!;
      expect(source.body).toContain(q.answer);
      expect(source.date < q.queryDate).toBe(true);
      expect([source.from, ...source.to, ...source.cc]).toContain(q.inboxAddress);
      expect(inbox.users).toContain(q.inboxAddress);
    }
  });
});

function email(id: string, date: string, from: string, to: string[], subject: string, body: string): Email {
  return { messageId: id, threadId: id, date, subject, from, to, cc: [], body };
}

const ALICE = "alice@corp.com";
const BOB = "bob@corp.com";
const CAROL = "carol@other.com";

function smallDb(): EmailDatabase {
  const db = new EmailDatabase();
  db.insert([
    email("m1", "2001-01-10T10:00:00Z", BOB, [ALICE], "Pipeline capacity", "The Falcon pipeline capacity is 300 MMcf/d."),
    email("m2", "2001-02-10T10:00:00Z", CAROL, [BOB], "Falcon pipeline", "Falcon pipeline expansion approved."),
    email("m3", "2001-03-10T10:00:00Z", ALICE, [CAROL], "Re: Pipeline capacity", "Capacity on Falcon rises in April."),
    email("m4", "2001-04-10T10:00:00Z", CAROL, [ALICE], "Lunch", "Pizza on Friday? \"quoted\" words AND OR NOT."),
  ]);
  return db;
}

describe("email search (SQLite FTS5)", () => {
  it("requires every keyword and scopes to the inbox (sender or recipient)", () => {
    const db = smallDb();
    const ids = (keywords: string[], inbox = ALICE, extra = {}) => db.search({ inbox, keywords, ...extra }).map((h) => h.messageId).sort();
    expect(ids(["falcon"])).toEqual(["m1", "m3"]);
    expect(ids(["falcon"], BOB)).toEqual(["m1", "m2"]);
    expect(ids(["falcon", "april"])).toEqual(["m3"]);
    expect(ids(["falcon", "pizza"])).toEqual([]);
    expect(ids(["pipeline capacity"])).toEqual(["m1", "m3"]);
  });

  it("filters by date (sent_before exclusive), sender and recipient", () => {
    const db = smallDb();
    const ids = (extra: object) => db.search({ inbox: ALICE, keywords: ["capacity"], ...extra }).map((h) => h.messageId).sort();
    expect(ids({ sentBefore: "2001-03-10" })).toEqual(["m1"]);
    expect(ids({ sentBefore: "2001-03-10T10:00:01Z" })).toEqual(["m1", "m3"]);
    expect(ids({ sentAfter: "2001-02-01" })).toEqual(["m3"]);
    expect(ids({ from: ALICE })).toEqual(["m3"]);
    expect(ids({ to: ALICE })).toEqual(["m1"]);
  });

  it("treats query syntax in keywords as plain text and returns at most 10 hits with snippets", () => {
    const db = smallDb();
    expect(db.search({ inbox: ALICE, keywords: ['"quoted"', "AND", "NOT"] }).map((h) => h.messageId)).toEqual(["m4"]);
    const many = new EmailDatabase();
    many.insert(Array.from({ length: 25 }, (_, i) => email(`n${i}`, `2001-01-${String(i + 1).padStart(2, "0")}T00:00:00Z`, BOB, [ALICE], "report", `weekly report ${i}`)));
    const hits = many.search({ inbox: ALICE, keywords: ["report"], maxResults: 50 });
    expect(hits.length).toBe(10);
    expect(hits[0]!.snippet).toContain("[report]");
  });

  it("round-trips an email with recipients", () => {
    const db = smallDb();
    expect(db.get("m2")).toEqual(email("m2", "2001-02-10T10:00:00Z", CAROL, [BOB], "Falcon pipeline", "Falcon pipeline expansion approved."));
    expect(db.get("nope")).toBeUndefined();
  });

  it("finds the source email of generated questions by their answer-bearing words", () => {
    const inbox = generateInbox({ seed: 3, emails: 1500 });
    const db = new EmailDatabase();
    db.insert(inbox.emails);
    expect(db.count()).toBe(1500);
    const q = inbox.questions.find((x) => /confirmation number/.test(x.question))!;
    const hits = db.search({ inbox: q.inboxAddress, keywords: [q.answer], sentBefore: q.queryDate });
    expect(hits.map((h) => h.messageId)).toContain(q.messageIds[0]);
  });
});

describe("ART·E tools", () => {
  const tools = () => new InboxTools(smallDb(), ALICE, "2001-03-31");

  it("searches, reads and answers through JSON arguments like a model sends them", () => {
    const t = tools();
    const hits = JSON.parse(t.call("search_emails", JSON.stringify({ keywords: ["falcon"] })));
    expect(hits.map((h: { messageId: string }) => h.messageId).sort()).toEqual(["m1", "m3"]);
    const read = JSON.parse(t.call("read_email", '{"message_id":"m1"}'));
    expect(read).toMatchObject({ message_id: "m1", from: BOB, to: [ALICE] });
    expect(t.call("return_final_answer", '{"answer":"300 MMcf/d","sources":["m1"]}')).toBe("Final answer recorded.");
    expect(t.finalAnswer).toEqual({ answer: "300 MMcf/d", sources: ["m1"] });
  });

  it("hides mail after the question date and outside the inbox", () => {
    const t = tools();
    expect(JSON.parse(t.call("search_emails", '{"keywords":["pizza"]}'))).toEqual([]);
    expect(JSON.parse(t.call("search_emails", '{"keywords":["capacity"],"sent_before":"2001-12-31"}')).length).toBe(2);
    expect(t.call("read_email", '{"message_id":"m4"}')).toBe('Error: no email with message id "m4" in this inbox.');
    expect(t.call("read_email", '{"message_id":"m2"}')).toBe('Error: no email with message id "m2" in this inbox.');
  });

  it("returns an error message for bad arguments instead of throwing", () => {
    const t = tools();
    expect(t.call("search_emails", "{not json")).toMatch(/^Error: the arguments of search_emails are not valid JSON/);
    expect(t.call("search_emails", "[1]")).toBe("Error: the arguments of search_emails must be a JSON object.");
    expect(t.call("search_emails", "{}")).toBe('Error: search_emails needs "keywords": a non-empty list of non-empty strings.');
    expect(t.call("search_emails", '{"keywords":[""]}')).toMatch(/non-empty list/);
    expect(t.call("search_emails", '{"keywords":["a"],"sent_before":"last week"}')).toBe('Error: search_emails: "sent_before" must be a date like 2001-05-31, got "last week".');
    expect(t.call("search_emails", '{"keywords":["a"],"max_results":0}')).toMatch(/max_results/);
    expect(t.call("search_emails", '{"keywords":["a"],"folder":"inbox"}')).toMatch(/no argument\(s\) folder/);
    expect(t.call("read_email", '{"id":"m1"}')).toMatch(/read_email needs "message_id"/);
    expect(t.call("return_final_answer", '{"answer":3}')).toMatch(/needs "answer"/);
    expect(t.call("return_final_answer", '{"answer":"x","sources":"m1"}')).toMatch(/"sources" must be a list/);
    expect(t.call("delete_email", "{}")).toMatch(/^Error: unknown tool "delete_email"/);
    expect(t.finalAnswer).toBeUndefined();
  });

  it("accepts a single keyword string (a common model slip)", () => {
    expect(JSON.parse(tools().call("search_emails", '{"keywords":"falcon"}')).length).toBe(2);
  });
});

describe("Enron question set loader", () => {
  const row = { id: 7, question: "When is the meeting?", answer: "Tuesday", message_ids: ["<1.JavaMail@enron>"], how_realistic: 0.9,
    inbox_address: "jeff.dasovich@enron.com", query_date: "2001-05-01", split: "train" };

  it("reads JSON and JSONL, filters by realism and split", () => {
    const dir = mkdtempSync(join(tmpdir(), "arte-"));
    writeFileSync(join(dir, "q.jsonl"), [JSON.stringify(row), "", JSON.stringify({ ...row, id: 8, how_realistic: 0.3, split: "test" })].join("\n"));
    writeFileSync(join(dir, "q.json"), JSON.stringify([row]));
    const all = loadEnronQuestions(join(dir, "q.jsonl"));
    expect(all.length).toBe(2);
    expect(all[0]).toEqual({ id: "7", question: row.question, answer: "Tuesday", messageIds: row.message_ids, inboxAddress: row.inbox_address,
      queryDate: "2001-05-01", howRealistic: 0.9, split: "train" });
    expect(loadEnronQuestions(join(dir, "q.jsonl"), { minRealism: 0.5 }).map((q) => q.id)).toEqual(["7"]);
    expect(loadEnronQuestions(join(dir, "q.jsonl"), { split: "test" }).map((q) => q.id)).toEqual(["8"]);
    expect(loadEnronQuestions(join(dir, "q.json")).length).toBe(1);
  });

  it("names the file, row and field when the format is wrong", () => {
    const dir = mkdtempSync(join(tmpdir(), "arte-"));
    const file = join(dir, "bad.jsonl");
    writeFileSync(file, `${JSON.stringify(row)}\n${JSON.stringify({ ...row, message_ids: "m1" })}\n`);
    expect(() => loadEnronQuestions(file)).toThrow(`${file}: line 2: field "message_ids" must be a list of strings.`);
    writeFileSync(file, "{oops\n");
    expect(() => loadEnronQuestions(file)).toThrow(/line 1 is not valid JSON/);
    expect(() => loadEnronQuestions(join(dir, "missing.json"))).toThrow(/cannot read the question set/);
  });
});

describe("ART·E rollouts", () => {
  let calls = 0;
  const toolChoice = (name: string, args: unknown): Choice => ({
    index: 0, finish_reason: "tool_calls", logprobs: null,
    message: { role: "assistant", content: null, refusal: null, tool_calls: [{ id: `call_${++calls}`, type: "function", function: { name, arguments: JSON.stringify(args) } }] },
  });
  const inbox = generateInbox({ seed: 8, emails: 800 });
  const db = new EmailDatabase();
  db.insert(inbox.emails);
  const question = inbox.questions[0]!;

  // A scripted agent that searches for the words of the answer, reads the best hit and answers from it.
  const agent: GamePolicy<InboxTools> = (messages) => {
    const last = messages.at(-1)!;
    if (last.role === "user") return toolChoice("search_emails", { keywords: [question.answer] });
    const result = String(last.content);
    if (result.startsWith("[")) return toolChoice("read_email", { message_id: (JSON.parse(result) as { messageId: string }[])[0]!.messageId });
    const email = JSON.parse(result) as { message_id: string };
    return toolChoice("return_final_answer", { answer: `It is ${question.answer}.`, sources: [email.message_id] });
  };

  it("runs search → read → answer and rewards a correct, cited answer", async () => {
    const t = await rolloutArte(agent, question, db);
    expect(t.metrics).toMatchObject({ turns: 3, answered: true, correct: true, cited_source: true, out_of_turns: false });
    expect(t.reward).toBe(1);
    expect(t.tools).toBe(ARTE_TOOLS);
    expect(t.messagesAndChoices.filter((m) => "role" in m && m.role === "tool").length).toBe(3);
  });

  it("gives bad arguments back to the agent, stops at the turn limit, and scores no answer 0", async () => {
    const t = await rolloutArte(() => toolChoice("search_emails", { keywords: [] }), question, db, { maxTurns: 3 });
    expect(t.metrics).toMatchObject({ turns: 3, answered: false, correct: false, out_of_turns: true });
    expect(t.reward).toBe(0);
    const toolResults = t.messages().filter((m) => m.role === "tool").map((m) => m.content);
    expect(toolResults).toEqual(Array(3).fill('Error: search_emails needs "keywords": a non-empty list of non-empty strings.'));
    const chatty = await rolloutArte(() => "I think it is Tuesday.", question, db);
    expect(chatty.metrics).toMatchObject({ turns: 1, answered: false });
    expect(chatty.logs).toEqual(["the agent replied without a tool call: the episode ends"]);
  });

  it("stops where the conversation outgrows the model's context, scored as it stands (the server's real 400)", async () => {
    const root = mkdtempSync(join(tmpdir(), "arte-context-"));
    writeTinyCheckpoint(join(root, "base"), { arch: "qwen2", seed: 3, tokenizer: true });
    // 1,024 positions hold the system prompt and the question, not the search results and the email read after them.
    const model = await TrainableModel.load({ name: "ctx", project: "envs", baseModel: join(root, "base"), artDir: join(root, ".art"), batcher: { maxPositions: 1024 }, log: () => {} });
    try {
      const client = model.openai();
      // The request is the model's (it raises the context error); the turn is the scripted agent's.
      const policy: GamePolicy<InboxTools> = async (messages, tools) => {
        await client.chat.completions.create({ model: model.name, messages, max_tokens: 1 });
        return agent(messages, tools);
      };
      const t = await rolloutArte(policy, question, db);
      expect(t.metrics).toMatchObject({ context_exceeded: true, out_of_turns: false, answered: false, correct: false });
      expect(Number(t.metrics.turns)).toBeGreaterThan(0);
      expect(t.reward).toBe(0);
      expect(t.messages().at(-1)!.role).toBe("tool"); // the last turn's result is kept; no reply was appended
      expect(t.logs.at(-1)).toMatch(/stopped after [1-9]\d* turns: the conversation outgrew the model's context \(.*maximum context length is 1024 tokens/);
      // Any other failure of the policy still ends the rollout with it.
      await expect(rolloutArte(() => { throw new Error("network down"); }, question, db)).rejects.toThrow("network down");
    } finally {
      await model.close();
      rmSync(root, { recursive: true, force: true });
    }
  }, 60_000);

  it("does not count an answer that pastes a whole email", async () => {
    const dump = `${"filler ".repeat(60)}${question.answer}`;
    const t = await rolloutArte(() => toolChoice("return_final_answer", { answer: dump, sources: [] }), question, db);
    expect(t.metrics).toMatchObject({ answered: true, correct: false, answer_words: 60 + question.answer.split(" ").length });
    const short = await rolloutArte(() => toolChoice("return_final_answer", { answer: dump, sources: [] }), question, db, { maxAnswerWords: 1000 });
    expect(short.metrics.correct).toBe(true);
  });

  it("matches answers as whole words, ignoring case and punctuation", () => {
    expect(answerMatches("The value is $12.5 million.", "$12.5 million")).toBe(true);
    expect(answerMatches("room eb 32c2", "EB 32C2")).toBe(true);
    expect(answerMatches("$112.5 million", "$12.5 million")).toBe(false);
    expect(answerMatches("$12.55 million", "$12.5 million")).toBe(false);
    expect(answerMatches("anything", "")).toBe(false);
  });
});
