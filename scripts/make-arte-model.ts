/**
 * Makes models/arte-tiny: a small Qwen2-shaped transformer taught ART·E's tool protocol (search_emails → read_email →
 * return_final_answer, Hermes tool calls) by SFT on scripted episodes over synthetic inboxes other than the
 * cookbook's (seeds 2 to 9; the notebook asks about seed 1's).
 *
 * The scripted agent is imperfect on purpose, so that GRPO has something to learn: it searches with the question's
 * project alone, or three times in ten with a second keyword from the question as well, reads the first hit, and
 * answers from it when it holds the answer, else says it could not find it. Both keywords put the email that holds
 * the answer first for each of the notebook's 40 held-out questions; the project alone for 60% of them.
 *
 * What makes a 64-wide, 2-layer network learn this on a CPU in about 20 minutes:
 * - its own tokenizer, 1,024 tokens learned from the episodes (names, JSON keys and words become single tokens), and
 *   a chat template listing each tool by its signature: an episode is ~600 tokens instead of ~2,400;
 * - a rotary base of 10,000: a 16-wide head has 8 rotary pairs, and at Qwen's 1,000,000 most barely turn over an episode;
 * - copying first: a message id, an amount or a code is copied token by token from earlier in the context, which
 *   whole episodes never taught (no read call named a real hit); short copying conversations, then each step of the
 *   episode on its own, then whole episodes.
 *
 * Usage: node scripts/make-arte-model.ts [out-dir, default models/arte-tiny]
 */
import { pick, randomInt, seededRandom, type Rng } from "../lib/core/random.ts";
import type { Message } from "../lib/core/trajectory.ts";
import type { SftConversation } from "../lib/trainable/model.ts";
import { EmailDatabase } from "../lib/envs/arte/database.ts";
import { generateInbox, type InboxQuestion } from "../lib/envs/arte/inbox.ts";
import { arteSystemPrompt } from "../lib/envs/arte/rollout.ts";
import { ARTE_TOOLS, InboxTools } from "../lib/envs/arte/tools.ts";
import { generate } from "../lib/model/generate.ts";
import { parseToolCalls } from "../lib/model/tool-calls.ts";
import { TINY_CHAT_TEMPLATE } from "../lib/model/tokenizer-tiny.ts";
import { TINY_TASK_SHAPE, runTaskModelScript, type Task, type TaskModelOptions } from "./task-model.ts";

const TOOLS_IN_FULL = `    {{- '# Tools\\n\\nThese functions are available. Their JSON signatures are inside <tools></tools>:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}`;
const TOOLS_AS_SIGNATURES = `    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}
        {%- if tool.function is defined %}
            {{- '\\n' + tool.function.name + '(' }}
            {%- for name, schema in tool.function.parameters.properties.items() %}{{- (', ' if not loop.first else '') + name }}{%- endfor %}
            {{- ')' }}
        {%- endif %}
    {%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}`;
/**
 * The tiny template with each tool as its signature (name and parameter names) instead of its JSON schema: ART·E's
 * three schemas are 1,300 of the tiny tokenizer's tokens, more context than the episode itself.
 */
export const SIGNATURES_CHAT_TEMPLATE = (() => {
  if (!TINY_CHAT_TEMPLATE.includes(TOOLS_IN_FULL)) throw new Error("make-arte-model: the tiny chat template's tools section has changed");
  return TINY_CHAT_TEMPLATE.replace(TOOLS_IN_FULL, TOOLS_AS_SIGNATURES);
})();

export const ARTE_MODEL_OPTIONS: Omit<TaskModelOptions, "log"> = {
  seed: 23,
  shape: { ...TINY_TASK_SHAPE, rope_theta: 10_000 },
  sftSteps: 600,
  batchSize: 4,
  learningRate: 5e-3,
  warmupSteps: 10,
  maxLength: 4096,
  checkAnswers: 64,
  tokenizer: { chatTemplate: SIGNATURES_CHAT_TEMPLATE, vocabSize: 1024, corpusConversations: 300 },
};

/** Hits the scripted agent asks for: three keep the conversation short enough for the tiny model's context. */
const MAX_RESULTS = 3;
/** Share of scripted searches with the specific keyword beside the project. */
const SPECIFIC_SEARCH = 0.3;
const NOT_FOUND = "I could not find the answer in the inbox.";

/** The question's project and a second keyword that its source message states, read from the question's wording. */
export function questionKeywords(question: string): { project: string; specific: string } {
  const patterns: RegExp[] = [
    /^Where is the (.+?) (budget review|risk committee|trading desk sync|regulatory update|credit review|offsite planning) on /,
    /^What is the total value of the renewed (.+?) contract with (.+)\?$/,
    /^When is the (.+?) (quarterly risk report|capacity study|variance analysis|FERC filing draft) due\?$/,
    /^What is the confirmation number for the (.+) trip for (.+)\?$/,
    /^Who is taking over as (project lead) on (.+)\?$/,
  ];
  for (const [i, pattern] of patterns.entries()) {
    const m = pattern.exec(question);
    if (!m) continue;
    // The travel and staffing questions name the project second.
    return i >= 3 ? { project: m[2]!, specific: m[1]! } : { project: m[1]!, specific: m[2]! };
  }
  throw new Error(`make-arte-model: no keyword pattern matches the question ${JSON.stringify(question)}`);
}

interface Inbox {
  db: EmailDatabase;
  questions: InboxQuestion[];
}

function call(id: string, name: string, args: Record<string, unknown>): Message {
  return { role: "assistant", content: "", tool_calls: [{ id, type: "function", function: { name, arguments: JSON.stringify(args) } }] };
}

/** One scripted episode on a random question of a random inbox. */
function scriptedEpisodeAsIs(rng: Rng, inboxes: Inbox[]): Message[] {
  const inbox = pick(rng, inboxes);
  const question = pick(rng, inbox.questions);
  const tools = new InboxTools(inbox.db, question.inboxAddress, question.queryDate);
  const { project, specific } = questionKeywords(question.question);
  const search = { keywords: rng() < SPECIFIC_SEARCH ? [project, specific] : [project], max_results: MAX_RESULTS };
  const messages: Message[] = [
    { role: "system", content: arteSystemPrompt(question.inboxAddress, question.queryDate) },
    { role: "user", content: question.question },
    call("call_1", "search_emails", search),
  ];
  const found = tools.call("search_emails", JSON.stringify(search));
  messages.push({ role: "tool", tool_call_id: "call_1", content: found });
  const hits = JSON.parse(found) as { messageId: string }[];
  if (hits.length === 0) {
    messages.push(call("call_2", "return_final_answer", { answer: NOT_FOUND, sources: [] }));
    return messages;
  }
  const read = hits[0]!.messageId;
  messages.push(call("call_2", "read_email", { message_id: read }));
  messages.push({ role: "tool", tool_call_id: "call_2", content: tools.call("read_email", JSON.stringify({ message_id: read })) });
  const holds = question.messageIds.includes(read);
  messages.push(call("call_3", "return_final_answer", holds ? { answer: question.answer, sources: [read] } : { answer: NOT_FOUND, sources: [] }));
  return messages;
}

/** An episode with every message id re-prefixed by one random digit: the training inboxes' ids start <2. to <9., the notebook's <1. */
export function scriptedEpisode(rng: Rng, inboxes: Inbox[]): Message[] {
  const messages = scriptedEpisodeAsIs(rng, inboxes);
  const prefix = `<${1 + randomInt(rng, 9)}.`;
  const reprefixed = (text: string) => text.replace(/<\d+\./g, prefix);
  return messages.map((m) => m.role === "tool" ? { ...m, content: reprefixed(m.content as string) }
    : m.role === "assistant" && m.tool_calls ? { ...m, tool_calls: m.tool_calls.map((c) => c.type === "function" ? { ...c, function: { ...c.function, arguments: reprefixed(c.function.arguments) } } : c) } : m);
}

const CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789";

/** A string of the kinds ART·E's episodes copy: a message id, a confirmation code, an amount, a name, a project. */
function copyable(rng: Rng, inboxes: Inbox[]): string {
  switch (randomInt(rng, 5)) {
    case 0: return `<${1 + randomInt(rng, 9)}.${1 + randomInt(rng, 3000)}.t${1 + randomInt(rng, 1200)}@northwind-energy.com>`;
    case 1: return Array.from({ length: 6 }, () => CODE_LETTERS[randomInt(rng, CODE_LETTERS.length)]).join("");
    case 2: return `$${randomInt(rng, 50)}.${randomInt(rng, 10)} million`;
    case 3: return questionKeywords(pick(rng, pick(rng, inboxes).questions).question).project;
    default: return pick(rng, pick(rng, inboxes).questions).answer;
  }
}

/** A short conversation that copies a string of the kinds episodes copy: the first of a few, plain or as search hits. */
function copyConversation(rng: Rng, inboxes: Inbox[]): { messages: Message[] } {
  const items = Array.from({ length: 1 + randomInt(rng, 3) }, () => copyable(rng, inboxes));
  const content = rng() < 0.5 ? items.join("\n") : JSON.stringify(items.map((item) => ({ messageId: item, subject: copyable(rng, inboxes) })));
  return { messages: [{ role: "user", content }, { role: "assistant", content: items[0]! }] };
}

/**
 * One step of the episode on its own: the read call in the episode's own context (everything up to it), the final
 * answer in context (a whole episode whose email holds the answer), the question's keywords, or the answer from the
 * email that holds it.
 */
function stepConversation(rng: Rng, inboxes: Inbox[]): SftConversation {
  const skill = randomInt(rng, 8);
  if (skill <= 5) {
    const episode = scriptedEpisode(rng, inboxes);
    const last = episode.at(-1)!;
    const final = last.role === "assistant" ? last.tool_calls?.[0] : undefined;
    const answered = final?.type === "function" && !final.function.arguments.includes(NOT_FOUND);
    if (skill >= 4 && answered) return { messages: episode, tools: ARTE_TOOLS };
    const read = episode.findIndex((m) => m.role === "assistant" && m.tool_calls?.some((c) => c.type === "function" && c.function.name === "read_email"));
    if (read > 0) return { messages: episode.slice(0, read + 1), tools: ARTE_TOOLS };
  }
  const inbox = pick(rng, inboxes);
  const question = pick(rng, inbox.questions);
  if (skill === 6) {
    const { project, specific } = questionKeywords(question.question);
    return { messages: [{ role: "user", content: question.question }, { role: "assistant", content: JSON.stringify([project, specific]) }] };
  }
  const tools = new InboxTools(inbox.db, question.inboxAddress, question.queryDate);
  const email = tools.call("read_email", JSON.stringify({ message_id: question.messageIds[0] }));
  return { messages: [{ role: "user", content: `${email}\n${question.question}` }, { role: "assistant", content: question.answer }] };
}

let cached: Inbox[] | undefined;
/** The training inboxes: seeds 2 to 9 of the synthetic inbox at the cookbook's size. */
function trainingInboxes(): Inbox[] {
  cached ??= Array.from({ length: 8 }, (_, i) => {
    const generated = generateInbox({ seed: 2 + i, emails: 3000 });
    const db = new EmailDatabase();
    db.insert(generated.emails);
    return { db, questions: generated.questions };
  });
  return cached;
}

export const TASK_ARTE: Task = {
  conversations: (rng, count) => Array.from({ length: count }, () => ({ messages: scriptedEpisode(rng, trainingInboxes()), tools: ARTE_TOOLS })),
  /** Replies at the assistant turns of fresh scripted episodes that call the tool the protocol calls there. */
  answerRate: async (model, tokenizer, count, seed) => {
    const rng = seededRandom(seed);
    const prompts: { messages: Message[]; tool: string }[] = [];
    while (prompts.length < count) {
      const episode = scriptedEpisode(rng, trainingInboxes());
      episode.forEach((message, i) => {
        const call = message.role === "assistant" ? message.tool_calls?.[0] : undefined;
        if (call?.type === "function" && prompts.length < count) prompts.push({ messages: episode.slice(0, i), tool: call.function.name });
      });
    }
    const results = await generate(model, prompts.map(({ messages }, i) => ({
      promptIds: tokenizer.encode(tokenizer.applyChatTemplate(messages, { tools: ARTE_TOOLS, addGenerationPrompt: true }), { addSpecialTokens: false }),
      maxTokens: 128, temperature: 1, seed: seed + i,
    })), { tokenizer, eosTokenIds: tokenizer.eosTokenIds });
    return results.filter((result, i) => {
      const { toolCalls, errors } = parseToolCalls(result.text);
      return errors.length === 0 && toolCalls.length === 1 && toolCalls[0]!.function.name === prompts[i]!.tool;
    }).length / count;
  },
  answers: "calls of the protocol's tool",
  warmUp: [
    { steps: 1000, batchSize: 16, conversations: (rng, count) => Array.from({ length: count }, () => copyConversation(rng, trainingInboxes())) },
    { steps: 1400, batchSize: 12, conversations: (rng, count) => Array.from({ length: count }, () => stepConversation(rng, trainingInboxes())) },
  ],
};

runTaskModelScript(import.meta.url, "models/arte-tiny", TASK_ARTE, ARTE_MODEL_OPTIONS);
