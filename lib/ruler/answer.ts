/**
 * Reading a judge's answer leniently: reasoning blocks, code fences and prose around the JSON are tolerated,
 * ids may be numbers or strings, scores outside [0, 1] are clamped (and flagged). What cannot be used raises
 * InvalidAnswer, whose reason is sent back to the judge when it is asked again.
 */

export class InvalidAnswer extends Error {
  override name = "InvalidAnswer";
}

export interface JudgedEntry {
  score: number;
  explanation: string;
  subScores: Record<string, number>;
  /** How many of this entry's numbers (score and sub-scores) were outside [0, 1] and clamped. */
  clamped: number;
}

/** The longest answer read: a ranking with explanations, even after long reasoning, is far shorter. */
export const MAX_ANSWER_CHARS = 1_000_000;

export function parseJudgeAnswer(text: string, count: number, subScoreNames: readonly string[]): JudgedEntry[] {
  if (text.length > MAX_ANSWER_CHARS) {
    throw new InvalidAnswer(`the answer is ${text.length} characters, over the ${MAX_ANSWER_CHARS} read; answer with the JSON only`);
  }
  const entries = findScoreList(text);
  const parsed = entries.map((entry, position) => parseEntry(entry, position, subScoreNames));
  const ids = parsed.map((p) => p.id);
  const matchesById = ids.length === count && [...ids].sort((a, b) => (a ?? 0) - (b ?? 0)).every((id, i) => id === i + 1);
  if (matchesById) {
    const byId = new Array<JudgedEntry>(count);
    for (const p of parsed) byId[p.id! - 1] = p.entry;
    return byId;
  }
  if (parsed.length === count) return parsed.map((p) => p.entry);
  throw new InvalidAnswer(`expected exactly ${count} scores (trajectory_id 1 to ${count}), got ${parsed.length}`);
}

/** JSON.parse work allowed per answer, as a multiple of its length: reading stays linear however brackets nest. */
const PARSE_BUDGET = 4;
/** Fresh bracket scans after an opening bracket that never closes (each is linear; a few cover real answers). */
const RESCANS = 8;

interface Candidate { json: string; start: number; end: number }

/** The `scores` array of the first JSON value in the text that has one (or a bare array of entries). */
function findScoreList(text: string): unknown[] {
  const withoutReasoning = text.replace(/<think>[\s\S]*?<\/think>/g, "").trim();
  if (withoutReasoning === "") throw new InvalidAnswer("the answer was empty");
  let budget = PARSE_BUDGET * withoutReasoning.length;
  // Spans inside a span that parsed are values of it, already searched: they are skipped, not parsed again.
  const searched: Candidate[] = [];
  for (const candidate of jsonCandidates(withoutReasoning)) {
    if (searched.some((s) => s.start <= candidate.start && candidate.end <= s.end)) continue;
    if (candidate.json.length > budget) break;
    budget -= candidate.json.length;
    let value: unknown;
    try {
      value = JSON.parse(candidate.json);
    } catch {
      continue;
    }
    const list = scoreListIn(value);
    if (list !== null) return list;
    searched.push(candidate);
    if (searched.length > 2) searched.splice(1, 1); // the whole text, and the latest span (spans come in order)
  }
  throw new InvalidAnswer('no JSON object with a "scores" array was found in the answer');
}

/** The first bare array of entries or `scores` array inside a parsed value, in document order. */
function scoreListIn(root: unknown): unknown[] | null {
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const value = stack.pop();
    if (Array.isArray(value)) {
      if (value.length > 0 && value.every(isRecord)) return value;
      for (let i = value.length - 1; i >= 0; i--) stack.push(value[i]);
    } else if (isRecord(value)) {
      if (Array.isArray(value.scores)) return value.scores;
      stack.push(...Object.values(value).reverse());
    }
  }
  return null;
}

/** The whole text, then each fenced block, then each balanced {...} or [...] span, in order of appearance. */
function* jsonCandidates(text: string): Generator<Candidate> {
  yield { json: text, start: 0, end: text.length };
  for (const match of text.matchAll(/```(?:json)?\s*([\s\S]*?)```/g)) {
    const start = match.index! + match[0].indexOf(match[1]!);
    yield { json: match[1]!, start, end: start + match[1]!.length };
  }
  for (const [start, end] of balancedSpans(text)) yield { json: text.slice(start, end), start, end };
}

/**
 * Every balanced {...} or [...] span as [start, end), sorted by start, in linear time: one scan with a stack of
 * open brackets, quotes counted as strings only inside brackets. An opening bracket that never closes (prose
 * like "[see below") would hide what follows it, so the scan restarts just after it, a bounded number of times.
 */
function balancedSpans(text: string): [number, number][] {
  const spans: [number, number][] = [];
  let from = 0;
  for (let scan = 0; scan <= RESCANS && from < text.length; scan++) {
    const open: number[] = [];
    let inString = false;
    for (let i = from; i < text.length; i++) {
      const c = text[i];
      if (inString) {
        if (c === "\\") i++;
        else if (c === '"') inString = false;
      } else if (c === "{" || c === "[") open.push(i);
      else if (open.length === 0) continue;
      else if (c === '"') inString = true;
      else if (c === "}" || c === "]") spans.push([open.pop()!, i + 1]);
    }
    if (open.length === 0) break;
    from = open[0]! + 1;
  }
  return [...new Map(spans.map((s) => [`${s[0]}:${s[1]}`, s])).values()].sort((a, b) => a[0] - b[0] || b[1] - a[1]);
}

function parseEntry(value: unknown, position: number, subScoreNames: readonly string[]): { id: number | null; entry: JudgedEntry } {
  const where = `score entry ${position + 1}`;
  if (!isRecord(value)) throw new InvalidAnswer(`${where} is not an object`);
  let clamped = 0;
  const readScore = (raw: unknown, what: string): number => {
    const number = typeof raw === "string" && raw.trim() !== "" ? Number(raw) : raw;
    if (typeof number !== "number" || Number.isNaN(number)) throw new InvalidAnswer(`${where} has no numeric ${what}`);
    if (number >= 0 && number <= 1) return number;
    clamped++;
    return number > 1 ? 1 : 0;
  };
  const score = readScore(value.score, '"score"');
  const subScores: Record<string, number> = {};
  const rawSubScores = isRecord(value.sub_scores) ? value.sub_scores : {};
  for (const name of subScoreNames) subScores[name] = readScore(rawSubScores[name], `sub-score "${name}"`);
  const explanation = value.explanation === undefined ? "" : typeof value.explanation === "string" ? value.explanation : JSON.stringify(value.explanation);
  return { id: parseId(value.trajectory_id ?? value.id), entry: { score, explanation, subScores, clamped } };
}

/** 3, "3" and "trajectory 3" all name trajectory 3. */
function parseId(raw: unknown): number | null {
  if (typeof raw === "number" && Number.isInteger(raw)) return raw;
  if (typeof raw === "string") {
    const digits = raw.match(/\d+/);
    if (digits) return Number(digits[0]);
  }
  return null;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
