/**
 * One ART·E episode: the agent gets a question about an inbox and answers it with the three tools,
 * at most `maxTurns` assistant turns (ART·E uses 10), in the shared tool-calling loop (../tool-episode.ts).
 *
 * The reward here is deterministic: 1 when the final answer contains the reference answer (ignoring case
 * and punctuation), else 0. The synthetic answers are short exact strings (a room, a code, an amount), so
 * this is a fair check; ART·E itself asks an LLM judge, which a RULER or judge step can replace it with.
 * Containment alone would reward pasting whole emails, so answers longer than `maxAnswerWords` do not count.
 */
import { Trajectory } from "../../core/trajectory.ts";
import type { GamePolicy } from "../policy.ts";
import { playToolEpisode } from "../tool-episode.ts";
import type { EmailDatabase } from "./database.ts";
import type { InboxQuestion } from "./inbox.ts";
import { ARTE_TOOLS, InboxTools, type FinalAnswer } from "./tools.ts";

export function arteSystemPrompt(inbox: string, queryDate: string): string {
  return (
    `You are an email research agent. Answer the user's question by searching their inbox with the tools. ` +
    `The user's address is ${inbox} and today is ${queryDate.slice(0, 10)}. Search with a few specific keywords, ` +
    `read the emails that look relevant, then call return_final_answer with the answer and the message ids it comes ` +
    `from. If the inbox does not hold the answer, say so in return_final_answer.`
  );
}

/** Lower case, words separated by single spaces; a decimal point between digits is kept as part of the number. */
function normalized(text: string): string {
  return text.toLowerCase().replace(/(\d)\.(?=\d)/g, "$1point").replace(/[^a-z0-9$]+/g, " ").trim();
}

/** Whether an answer states the reference answer as whole words (case, spacing and punctuation ignored). */
export function answerMatches(answer: string, reference: string): boolean {
  const expected = normalized(reference);
  return expected !== "" && ` ${normalized(answer)} `.includes(` ${expected} `);
}

export interface ArteRolloutOptions {
  /** Assistant turns before the episode stops unanswered; default 10 (ART·E's). */
  maxTurns?: number;
  /** Longer final answers are not counted as correct (containment must not reward dumping text); default 50. */
  maxAnswerWords?: number;
}

/**
 * How a final answer scores against the question: correct when it states the reference answer in at most
 * `maxAnswerWords` words (default 50), and whether it cites a source message. Any agent's answer (a LangGraph agent's
 * too) is scored the same way.
 */
export function scoreArteAnswer(final: FinalAnswer | undefined, question: InboxQuestion, maxAnswerWords = 50): { answered: boolean; correct: boolean; cited_source: boolean; answer_words: number } {
  const answerWords = final === undefined ? 0 : final.answer.split(/\s+/).filter((w) => w !== "").length;
  return {
    answered: final !== undefined,
    correct: final !== undefined && answerWords <= maxAnswerWords && answerMatches(final.answer, question.answer),
    cited_source: final !== undefined && final.sources.some((s) => question.messageIds.includes(s)),
    answer_words: answerWords,
  };
}

/** Plays one question; metrics: turns, answered, correct, cited_source, answer_words, out_of_turns. */
export async function rolloutArte(policy: GamePolicy<InboxTools>, question: InboxQuestion, db: EmailDatabase, options: ArteRolloutOptions = {}): Promise<Trajectory> {
  const maxTurns = options.maxTurns ?? 10;
  const tools = new InboxTools(db, question.inboxAddress, question.queryDate);
  const trajectory = new Trajectory({
    messagesAndChoices: [
      { role: "system", content: arteSystemPrompt(question.inboxAddress, question.queryDate) },
      { role: "user", content: question.question },
    ],
    tools: ARTE_TOOLS,
    metadata: { env: "art-e", question_id: question.id, inbox: question.inboxAddress, reference_answer: question.answer },
  });
  const { turns, repliedWithoutCall, contextExceeded } = await playToolEpisode(policy, trajectory, {
    maxTurns, state: tools, call: (name, args) => tools.call(name, args), done: () => tools.finalAnswer !== undefined,
  });
  const final = tools.finalAnswer;
  const score = scoreArteAnswer(final, question, options.maxAnswerWords);
  trajectory.reward = score.correct ? 1 : 0;
  Object.assign(trajectory.metrics, {
    turns, ...score, out_of_turns: final === undefined && !repliedWithoutCall && turns >= maxTurns, context_exceeded: contextExceeded,
  });
  if (final) trajectory.log(`final answer: ${final.answer} (sources: ${final.sources.join(", ") || "none"})`);
  return trajectory.finish();
}
