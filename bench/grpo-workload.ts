// The GRPO step bench's workloads (bench/grpo-workloads.json): their sizes, and the messages of their rollouts, every one
// digits (one token per digit in Qwen's tokenizers) sized so that each prompt has exactly the workload's length.
// Shared by bench/grpo-step.ts (rollouts through the server) and bench/chat-tokenize.ts (the same requests' tokenizing).
import { readFileSync } from "node:fs";
import { seededRandom } from "../lib/core/random.ts";
import type { Message, Tool } from "../lib/core/trajectory.ts";
import type { Tokenizer } from "../lib/model/tokenizer.ts";

/** A workload of bench/grpo-workloads.json (see its "about"), with this run's sizes. */
export interface Workload {
  groups: number;
  rolloutsPerGroup: number;
  turns: number;
  generatedTokens: number;
  promptTokens: number;
  userTokens: number;
  betweenTokens: number[];
  tools: boolean;
}

/** The named workloads (comma-separated), with groups, rollouts per group or turns overridden where given. */
export function readWorkloads(names: string, overrides: { groups?: string; rollouts?: string; turns?: string } = {}): Record<string, Workload> {
  const spec = JSON.parse(readFileSync(new URL("./grpo-workloads.json", import.meta.url), "utf8")) as Record<string, Workload>;
  const override = (value: string | undefined, fallback: number) => (value === undefined ? fallback : Number(value));
  return Object.fromEntries(names.split(",").map((name): [string, Workload] => {
    if (!(name in spec) || name === "about") throw new Error(`bench/grpo-workloads.json has no workload "${name}"; it has ${Object.keys(spec).filter((k) => k !== "about").join(", ")}`);
    const { about: _, ...w } = spec[name] as Workload & { about: string };
    return [name, { ...w, groups: override(overrides.groups, w.groups), rolloutsPerGroup: override(overrides.rollouts, w.rolloutsPerGroup), turns: override(overrides.turns, w.turns) }];
  }));
}

/** Tokens of the trajectories of the first groups, one per length the workload's groups have (group g: betweenTokens[g % length]). */
export function trajectoryTokens(w: Workload): number[] {
  return Array.from({ length: Math.min(w.groups, w.betweenTokens.length) }, (_, g) => promptTokensAt(w, g, w.turns - 1) + w.generatedTokens);
}
export function promptTokensAt(w: Workload, group: number, turn: number): number {
  return w.promptTokens + turn * (w.generatedTokens + w.betweenTokens[group % w.betweenTokens.length]);
}

// ART·E's tools, for the template to render into the system prompt (their text is part of promptTokens).
const string = (description: string) => ({ type: "string", description });
export const EMAIL_TOOLS: Tool[] = [
  { type: "function", function: { name: "search_inbox", description: "Search the user's inbox for emails matching all of the keywords, optionally from or to an address and within a date range; returns up to 10 matches with their message ids and snippets.", parameters: { type: "object", properties: { keywords: { type: "array", items: { type: "string" }, description: "Words that must all appear in the email." }, from: string("Sender address to filter by."), to: string("Recipient address to filter by."), sent_after: string("Only emails sent after this date, YYYY-MM-DD."), sent_before: string("Only emails sent before this date, YYYY-MM-DD.") }, required: ["keywords"] } } },
  { type: "function", function: { name: "read_email", description: "Read one email in full: sender, recipients, date, subject and body.", parameters: { type: "object", properties: { message_id: string("The id search_inbox returned.") }, required: ["message_id"] } } },
  { type: "function", function: { name: "return_final_answer", description: "Give the final answer to the user's question and the message ids of the emails it rests on. Call this once, at the end.", parameters: { type: "object", properties: { answer: string("The answer, or \"I don't know\"."), sources: { type: "array", items: { type: "string" }, description: "Message ids of the emails used." } }, required: ["answer", "sources"] } } },
];

/** `count` digits drawn from `seed`: one token each in Qwen's tokenizers, whose pre-tokenizer splits digits. */
export function digits(count: number, seed: number): string {
  const random = seededRandom(seed);
  return Array.from({ length: count }, () => Math.floor(random() * 10)).join("");
}

/** The observation after a turn: a user message (2048's board) or the tool's result (ART·E). */
export function observation(w: Workload, content: string, turn: number): Message {
  return w.tools ? { role: "tool", tool_call_id: `call_${turn}`, content } : { role: "user", content };
}

/** How many digits each message takes so that the prompts have the workload's exact lengths under this tokenizer's template. */
export function messageSizes(tokenizer: Tokenizer, w: Workload): { system: number; between: number[] } {
  const tools = w.tools ? EMAIL_TOOLS : undefined;
  const count = (messages: Message[]) => tokenizer.encode(tokenizer.applyChatTemplate(messages, { tools, addGenerationPrompt: true }), { addSpecialTokens: false }).length;
  const first: Message[] = [{ role: "system", content: "0" }, { role: "user", content: "0" }];
  const promptFraming = count(first) - 2;
  const betweenFraming = count([...first, { role: "assistant", content: "0" }, observation(w, "0", 1)]) - count(first) - 2;
  const system = w.promptTokens - promptFraming - w.userTokens;
  const between = w.betweenTokens.map((tokens) => tokens - betweenFraming);
  if (system < 1 || (w.turns > 1 && between.some((n) => n < 1))) {
    throw new Error(`the chat template alone takes ${promptFraming} tokens of the first prompt and ${betweenFraming} between turns, more than the workload's ${w.promptTokens} / ${w.betweenTokens}`);
  }
  return { system, between };
}

/** The first prompt's messages of rollout `index` of `group` at `step`: the task's system prompt, the group's question. */
export function firstMessages(w: Workload, sizes: { system: number }, step: number, group: number): Message[] {
  return [{ role: "system", content: digits(sizes.system, 1) }, { role: "user", content: digits(w.userTokens, groupSeed(step, group)) }];
}

/** The seed of a rollout's own messages (observations, and the bench's stand-in answers). */
export function rolloutSeed(step: number, group: number, index: number): number {
  return groupSeed(step, group) + (index + 1) * 100;
}

function groupSeed(step: number, group: number): number {
  return (step * 1000 + group) * 100_000;
}
