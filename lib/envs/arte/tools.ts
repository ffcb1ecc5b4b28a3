/**
 * ART·E's three tools as OpenAI function schemas, with implementations bound to one question's inbox
 * and date. A tool call never throws: bad arguments come back to the agent as an "Error: ..." result it
 * can read and correct, which is what a training rollout needs.
 */
import type { Tool } from "../../core/trajectory.ts";
import { ArtError } from "../../core/errors.ts";
import { parseToolArguments } from "../tool-episode.ts";
import { MAX_SEARCH_RESULTS, type EmailDatabase } from "./database.ts";

export const ARTE_TOOLS: Tool[] = [
  {
    type: "function",
    function: {
      name: "search_emails",
      description: `Full-text search of the user's inbox. Every keyword must appear in the email. Returns at most ${MAX_SEARCH_RESULTS} matches with message ids and snippets.`,
      parameters: {
        type: "object",
        properties: {
          keywords: { type: "array", items: { type: "string" }, description: "Words or short phrases that must all occur." },
          from_addr: { type: "string", description: "Only emails sent by this address." },
          to_addr: { type: "string", description: "Only emails sent to this address." },
          sent_after: { type: "string", description: "Only emails sent on or after this date (YYYY-MM-DD)." },
          sent_before: { type: "string", description: "Only emails sent before this date (YYYY-MM-DD)." },
          max_results: { type: "integer", description: `How many matches to return, at most ${MAX_SEARCH_RESULTS}.` },
        },
        required: ["keywords"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "read_email",
      description: "Reads one email of the inbox in full, by its message id.",
      parameters: {
        type: "object",
        properties: { message_id: { type: "string", description: "A message id from search_emails." } },
        required: ["message_id"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "return_final_answer",
      description: "Ends the search with the answer to the user's question and the message ids that support it.",
      parameters: {
        type: "object",
        properties: {
          answer: { type: "string", description: "The answer; say you could not find it if so." },
          sources: { type: "array", items: { type: "string" }, description: "Message ids of the emails the answer comes from." },
        },
        required: ["answer", "sources"],
        additionalProperties: false,
      },
    },
  },
];

export interface FinalAnswer {
  answer: string;
  sources: string[];
}

const DATE = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?Z?)?$/;

/** Tools bound to one inbox and question date: the agent cannot see mail of other inboxes or from after that date. */
export class InboxTools {
  finalAnswer: FinalAnswer | undefined;
  readonly schemas = ARTE_TOOLS;

  readonly db: EmailDatabase;
  readonly inbox: string;
  readonly queryDate: string;

  constructor(db: EmailDatabase, inbox: string, queryDate: string) {
    this.db = db;
    this.inbox = inbox;
    this.queryDate = queryDate;
  }

  /** Runs a tool call from the model: `args` is the JSON string the model produced. Returns the tool result text. */
  call(name: string, args: string): string {
    const a = parseToolArguments(name, args);
    if (typeof a === "string") return a;
    try {
      switch (name) {
        case "search_emails":
          return JSON.stringify(this.search(a));
        case "read_email":
          return JSON.stringify(this.read(a));
        case "return_final_answer":
          return this.answer(a);
        default:
          return `Error: unknown tool ${JSON.stringify(name)}. The tools are ${ARTE_TOOLS.map((t) => t.type === "function" ? t.function.name : "").join(", ")}.`;
      }
    } catch (error) {
      if (error instanceof ArtError) return `Error: ${error.message}`;
      return `Error: ${name} failed: ${String(error)}`;
    }
  }

  private search(a: Record<string, unknown>) {
    const known = ["keywords", "from_addr", "to_addr", "sent_after", "sent_before", "max_results"];
    const unknown = Object.keys(a).filter((k) => !known.includes(k));
    if (unknown.length > 0) throw new ArtError("arte.args", `search_emails has no argument(s) ${unknown.join(", ")}; it takes ${known.join(", ")}.`);
    const keywords = typeof a.keywords === "string" ? [a.keywords] : a.keywords;
    if (!Array.isArray(keywords) || keywords.length === 0 || keywords.some((k) => typeof k !== "string" || k.trim() === "")) {
      throw new ArtError("arte.args", 'search_emails needs "keywords": a non-empty list of non-empty strings.');
    }
    const text = (key: string): string | undefined => {
      const v = a[key];
      if (v === undefined || v === null) return undefined;
      if (typeof v !== "string") throw new ArtError("arte.args", `search_emails: "${key}" must be a string.`);
      return v;
    };
    const date = (key: string): string | undefined => {
      const v = text(key);
      if (v !== undefined && !DATE.test(v)) throw new ArtError("arte.args", `search_emails: "${key}" must be a date like 2001-05-31, got ${JSON.stringify(v)}.`);
      return v;
    };
    const maxResults = a.max_results ?? MAX_SEARCH_RESULTS;
    if (typeof maxResults !== "number" || !Number.isInteger(maxResults) || maxResults < 1) {
      throw new ArtError("arte.args", `search_emails: "max_results" must be a positive integer (at most ${MAX_SEARCH_RESULTS}).`);
    }
    const sentBefore = date("sent_before");
    return this.db.search({
      inbox: this.inbox,
      keywords: keywords as string[],
      from: text("from_addr"),
      to: text("to_addr"),
      sentAfter: date("sent_after"),
      // Mail from after the question date does not exist yet for the agent.
      sentBefore: sentBefore !== undefined && sentBefore < this.queryDate ? sentBefore : this.queryDate,
      maxResults,
    });
  }

  private read(a: Record<string, unknown>) {
    if (typeof a.message_id !== "string") throw new ArtError("arte.args", 'read_email needs "message_id": a message id string from search_emails.');
    const email = this.db.get(a.message_id);
    const visible = email && email.date < this.queryDate && (email.from === this.inbox || email.to.includes(this.inbox) || email.cc.includes(this.inbox));
    if (!email || !visible) throw new ArtError("arte.notfound", `no email with message id ${JSON.stringify(a.message_id)} in this inbox.`);
    return { message_id: email.messageId, date: email.date, subject: email.subject, from: email.from, to: email.to, cc: email.cc, body: email.body };
  }

  private answer(a: Record<string, unknown>): string {
    if (typeof a.answer !== "string") throw new ArtError("arte.args", 'return_final_answer needs "answer": a string.');
    const sources = a.sources ?? [];
    if (!Array.isArray(sources) || sources.some((s) => typeof s !== "string")) {
      throw new ArtError("arte.args", 'return_final_answer: "sources" must be a list of message id strings.');
    }
    this.finalAnswer = { answer: a.answer, sources: sources as string[] };
    return "Final answer recorded.";
  }
}
