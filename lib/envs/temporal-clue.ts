/**
 * Temporal Clue, after ART's example: a murder mystery in the style of the board game Clue, extended with time.
 * On one evening there were `times` visits to a mansion, one on each hour: each visit was one suspect, alone in one
 * room, with one weapon (and, when the puzzle has motives, driven by one motive); no suspect, weapon, room or motive
 * is part of two visits (some may be part of none), and one of the visits was the murder. The clues (eliminations,
 * links across categories, orderings in time) determine the answers to the questions asked, and only those: the
 * generator adds true clues until the solver finds exactly one answer to every question, then drops every clue the
 * answers do not need.
 *
 * The model answers one line per question, `Q1: Mrs. White` (after any reasoning; the last line for a question
 * counts, as in ART's grader). Reward: the share of questions answered right; a reply with no answer line scores 0.
 */
import { ArtError } from "../core/errors.ts";
import { freshSeed, pick, randomInt, seededRandom, shuffleInPlace, type Rng } from "../core/random.ts";
import { Trajectory, type Message } from "../core/trajectory.ts";
import { replyItem, replyText, withoutThinking, type GamePolicy } from "./policy.ts";

export type ClueCategory = "suspect" | "weapon" | "room" | "motive";
const CATEGORIES: readonly ClueCategory[] = ["suspect", "weapon", "room", "motive"];

const POOLS: Record<ClueCategory, readonly string[]> = {
  suspect: ["Miss Scarlet", "Colonel Mustard", "Mrs. White", "Mr. Green", "Mrs. Peacock", "Professor Plum", "Madame Rose", "Sergeant Gray", "Miss Peach"],
  weapon: ["candlestick", "knife", "lead pipe", "revolver", "rope", "wrench", "horseshoe", "poison", "axe"],
  room: ["kitchen", "ballroom", "conservatory", "dining room", "billiard room", "library", "lounge", "hall", "study"],
  motive: ["jealousy", "revenge", "greed", "blackmail", "fear", "ambition", "inheritance", "betrayal", "pride"],
};
const MAX_TIMES = 8;

/** Who and what a puzzle is about: the names in each category (motives may be empty) and the hours (0–23) of the visits. */
export interface TemporalClueCast {
  suspect: string[];
  weapon: string[];
  room: string[];
  motive: string[];
  hours: number[];
}

/** One evening: per category, the index (in the cast) of each visit's item, visits in time order; and which visit was the murder. */
export interface ClueWorld {
  suspect: number[];
  weapon: number[];
  room: number[];
  motive: number[];
  murder: number;
}

/** What a clue talks about: an item of the cast, the visit at an hour (by its slot), or the murder. */
export type ClueRef = { kind: "item"; category: ClueCategory; item: number } | { kind: "hour"; slot: number } | { kind: "murder" };

/**
 * same: a and b are the same visit; different: they are not; before: b came after a (exactly `gap` hours after when
 * given); present / absent: the item is (not) part of any visit.
 */
export type ClueStatement =
  | { kind: "same" | "different"; a: ClueRef; b: ClueRef }
  | { kind: "before"; a: ClueRef; b: ClueRef; gap?: number }
  | { kind: "present" | "absent"; a: ClueRef & { kind: "item" } };

export type ClueQuestion = { kind: "murder"; attribute: ClueCategory | "time" } | { kind: "visit"; slot: number; attribute: ClueCategory };

export interface TemporalCluePuzzle {
  seed: number;
  cast: TemporalClueCast;
  /** The hidden evening the clues were drawn from. */
  solution: ClueWorld;
  clues: ClueStatement[];
  questions: ClueQuestion[];
  /** The answer to each question, as the cast writes it (a name, or a time like "9 pm"). */
  answers: string[];
}

export interface TemporalClueOptions {
  /** Seed of the cast, the hidden evening and the clues; default a fresh one. */
  seed?: number;
  /** Visits, one per hour (2–8); default 4. */
  times?: number;
  /** Suspects, weapons, rooms (each from `times` to 9); default `times`. More than `times` leaves some out of every visit. */
  suspects?: number;
  weapons?: number;
  rooms?: number;
  /** Motives: 0 (none, the default) or from `times` to 9. */
  motives?: number;
  /** Questions asked: who, with what, where, when (and why) of the murder first, then about single visits; default 4. */
  questions?: number;
}

export const SYSTEM_PROMPT_TEMPORAL_CLUE =
  "You solve murder mysteries by deduction. Read the story and the clues: together they determine every answer. " +
  "You may reason first; then end your reply with one line per question, in the form Q1: <answer>, answering with a " +
  "name exactly as the puzzle lists it, or a time like 9 pm.";

export function hourLabel(hour: number): string {
  return `${hour % 12 === 0 ? 12 : hour % 12} ${hour < 12 ? "am" : "pm"}`;
}

/** The hour (0–23) an answer names: "9 pm", "9pm", "9:00 p.m.", "21:00"; undefined when it names none. */
function answerHour(text: string): number | undefined {
  const match = /^(\d{1,2})(?::00)?\s*(?:([ap])\.?\s*m\.?)?$/i.exec(text.trim());
  if (!match) return undefined;
  const hour = Number(match[1]);
  const half = match[2]?.toLowerCase();
  if (half === undefined) return match[0].includes(":") && hour < 24 ? hour : undefined; // a bare "9" could be either half
  if (hour < 1 || hour > 12) return undefined;
  return (hour % 12) + (half === "p" ? 12 : 0);
}

/** Lower case, a leading "the" and punctuation dropped: "The Lead-Pipe" matches "lead pipe", "Mrs White" "Mrs. White". */
function normalizedName(text: string): string {
  return text.toLowerCase().replace(/[^a-z0-9]+/g, " ").trim().replace(/^the /, "");
}

/** Whether an answer names the expected one: times by the hour they name, names ignoring case, "the" and punctuation. */
export function temporalClueAnswerMatches(answer: string, expected: string): boolean {
  const expectedHour = answerHour(expected);
  if (expectedHour !== undefined) return answerHour(answer) === expectedHour;
  const name = normalizedName(answer);
  return name !== "" && name === normalizedName(expected);
}

// ---------------------------------------------------------------------------------------------------------------
// Clues on an evening

function activeCategories(cast: TemporalClueCast): ClueCategory[] {
  return CATEGORIES.filter((category) => cast[category].length > 0);
}

/** The visit (slot) `ref` is part of in a complete evening; undefined for an item in no visit. */
function slotIn(ref: ClueRef, world: ClueWorld): number | undefined {
  if (ref.kind === "hour") return ref.slot;
  if (ref.kind === "murder") return world.murder;
  const slot = world[ref.category].indexOf(ref.item);
  return slot < 0 ? undefined : slot;
}

/** Whether a clue holds when its refs are in visits `a` and `b` (undefined: in none). The solver's constraints too. */
function holdsBetween(clue: ClueStatement, a: number | undefined, b: number | undefined): boolean {
  switch (clue.kind) {
    case "present":
      return a !== undefined;
    case "absent":
      return a === undefined;
    case "same":
      return a !== undefined && a === b;
    case "different":
      return a === undefined || a !== b;
    case "before":
      return a !== undefined && b !== undefined && (clue.gap === undefined ? b > a : b - a === clue.gap);
  }
}

/** Whether the clue is true of a complete evening. */
export function clueHolds(clue: ClueStatement, world: ClueWorld): boolean {
  return holdsBetween(clue, slotIn(clue.a, world), "b" in clue ? slotIn(clue.b, world) : undefined);
}

// ---------------------------------------------------------------------------------------------------------------
// The solver

function answerIn(question: ClueQuestion, world: ClueWorld, cast: TemporalClueCast): string {
  if (question.kind === "visit") return cast[question.attribute][world[question.attribute][question.slot]!]!;
  if (question.attribute === "time") return hourLabel(cast.hours[world.murder]!);
  return cast[question.attribute][world[question.attribute][world.murder]!]!;
}

function checkQuestions(cast: TemporalClueCast, questions: readonly ClueQuestion[]): void {
  for (const question of questions) {
    const attribute = question.attribute;
    if (attribute !== "time" && cast[attribute].length === 0) {
      throw new ArtError("temporal_clue.question", `a question asks for the ${attribute}, but the cast has no ${attribute}s; give the cast some or drop the question`);
    }
    if (question.kind === "visit" && !(Number.isInteger(question.slot) && question.slot >= 0 && question.slot < cast.hours.length)) {
      throw new ArtError("temporal_clue.question", `a question asks about visit ${question.slot}, but there are ${cast.hours.length} visits (slots 0 to ${cast.hours.length - 1})`);
    }
  }
}

function bitCount(mask: number): number {
  let count = 0;
  for (let m = mask; m !== 0; m &= m - 1) count++;
  return count;
}

function bitValues(mask: number): number[] {
  const values: number[] = [];
  for (let v = 0; mask >> v !== 0; v++) if ((mask >> v) & 1) values.push(v);
  return values;
}

/**
 * Solves a puzzle from its clues alone: the distinct answers to `questions` of every evening the clues allow, at most
 * `limit` of them (each as one answer per question). 0 answers: the clues contradict each other; 1: the puzzle is
 * sound; `limit` (default 2): the clues leave a question open.
 *
 * A constraint solver: every item, the murder and every hour has a domain of visits (a bit mask; for items one more
 * bit for "in no visit"); each clue is a constraint between two domains, revised to a fixed point together with each
 * category's rules (one item per visit, no item in two). The search branches on the murder, then on the cells the
 * questions read, then (smallest domain first) on anything left until one complete evening proves those answers.
 */
export function solveTemporalClue(puzzle: Pick<TemporalCluePuzzle, "cast" | "clues" | "questions">, limit = 2): string[][] {
  const { cast, clues, questions } = puzzle;
  checkQuestions(cast, questions);
  const times = cast.hours.length;
  // A domain is a 16-bit set: the hours and "absent".
  if (times > MAX_TIMES) throw new ArtError("temporal_clue.cast", `solveTemporalClue: a cast of ${times} hours; at most ${MAX_TIMES}`);
  const absent = 1 << times;
  const slotsMask = absent - 1;
  const categories = activeCategories(cast);
  // Variables: the items, category by category; then the murder; then one per hour (fixed, so clues on hours prune).
  const offset = {} as Record<ClueCategory, number>;
  let count = 0;
  for (const category of categories) {
    offset[category] = count;
    count += cast[category].length;
  }
  const murderVar = count;
  const variable = (ref: ClueRef) => (ref.kind === "item" ? offset[ref.category] + ref.item : ref.kind === "murder" ? murderVar : murderVar + 1 + ref.slot);
  const initial = new Uint16Array(murderVar + 1 + times);
  initial.fill(slotsMask | absent, 0, murderVar);
  initial[murderVar] = slotsMask;
  for (let slot = 0; slot < times; slot++) initial[murderVar + 1 + slot] = 1 << slot;
  const visit = (value: number) => (value === times ? undefined : value);
  const constraints = clues.map((clue) => ({ clue, a: variable(clue.a), b: "b" in clue ? variable(clue.b) : -1 }));

  /** The values of `x` with a supporting value of `y` (every value when the clue is on one ref only). */
  const supported = (clue: ClueStatement, xMask: number, yMask: number, xFirst: boolean): number => {
    let kept = 0;
    for (const vx of bitValues(xMask)) {
      const ok = yMask < 0
        ? holdsBetween(clue, visit(vx), undefined)
        : bitValues(yMask).some((vy) => (xFirst ? holdsBetween(clue, visit(vx), visit(vy)) : holdsBetween(clue, visit(vy), visit(vx))));
      if (ok) kept |= 1 << vx;
    }
    return kept;
  };

  /** Narrows the domains to a fixed point; false when some domain empties (no evening fits). */
  const propagate = (d: Uint16Array): boolean => {
    for (let changed = true; changed;) {
      changed = false;
      const narrow = (v: number, mask: number) => {
        if (mask !== d[v]) {
          d[v] = mask;
          changed = true;
        }
        return mask !== 0;
      };
      for (const { clue, a, b } of constraints) {
        if (!narrow(a, supported(clue, d[a]!, b < 0 ? -1 : d[b]!, true))) return false;
        if (b >= 0 && !narrow(b, supported(clue, d[b]!, d[a]!, false))) return false;
      }
      for (const category of categories) {
        const items = Array.from({ length: cast[category].length }, (_, item) => offset[category] + item);
        for (let slot = 0; slot < times; slot++) {
          const bit = 1 << slot;
          const holders = items.filter((v) => d[v]! & bit);
          if (holders.length === 0) return false; // every visit has an item of every category
          if (holders.length === 1 && !narrow(holders[0]!, bit)) return false;
          const owner = holders.find((v) => d[v] === bit);
          if (owner !== undefined) for (const v of holders) if (v !== owner && !narrow(v, d[v]! & ~bit)) return false;
        }
        const mustAppear = items.filter((v) => !(d[v]! & absent)).length;
        const canAppear = items.filter((v) => d[v]! & slotsMask).length;
        if (mustAppear > times || canAppear < times) return false;
        for (const v of items) {
          if (mustAppear === times && d[v]! & absent && !narrow(v, absent)) return false; // the visits are full
          if (canAppear === times && d[v]! & slotsMask && !narrow(v, d[v]! & slotsMask)) return false; // no item to spare
        }
      }
    }
    return true;
  };

  /** Tries `search` on a copy of the domains with each choice (a variable set to one value) in turn; true once one returns true. */
  const anyChoice = (d: Uint16Array, choices: [variable: number, value: number][], search: (next: Uint16Array) => boolean) =>
    choices.some(([v, value]) => {
      const next = d.slice();
      next[v] = 1 << value;
      return search(next);
    });

  /** Whether some complete evening fits the domains: branch on the smallest undecided domain. */
  const completes = (d: Uint16Array): boolean => {
    if (!propagate(d)) return false;
    let pick = -1;
    for (let v = 0; v < d.length; v++) if (bitCount(d[v]!) > 1 && (pick < 0 || bitCount(d[v]!) < bitCount(d[pick]!))) pick = v;
    return pick < 0 || anyChoice(d, bitValues(d[pick]!).map((value) => [pick, value]), completes);
  };

  const answers = new Map<string, string[]>(); // keyed by their text: two evenings can give the same answers
  /** The item of `category` in `slot`, once the domains decide it. */
  const itemAt = (d: Uint16Array, category: ClueCategory, slot: number) => cast[category].findIndex((_, item) => d[offset[category] + item] === 1 << slot);
  /** Branches until the murder and every cell a question reads are decided, then checks one evening completes them; true to stop. */
  const explore = (d: Uint16Array): boolean => {
    if (!propagate(d)) return false;
    if (bitCount(d[murderVar]!) > 1) return anyChoice(d, bitValues(d[murderVar]!).map((slot) => [murderVar, slot]), explore);
    const murder = bitValues(d[murderVar]!)[0]!;
    const found: string[] = [];
    for (const question of questions) {
      if (question.attribute === "time") {
        found.push(hourLabel(cast.hours[murder]!));
        continue;
      }
      const category = question.attribute;
      const slot = question.kind === "visit" ? question.slot : murder;
      const item = itemAt(d, category, slot);
      if (item < 0) {
        const holders = cast[category].map((_, i) => offset[category] + i).filter((v) => d[v]! & (1 << slot));
        return anyChoice(d, holders.map((v) => [v, slot]), explore);
      }
      found.push(cast[category][item]!);
    }
    const key = found.join("\n");
    if (!answers.has(key) && completes(d.slice())) answers.set(key, found);
    return answers.size >= limit;
  };
  explore(initial.slice());
  return [...answers.values()];
}

// ---------------------------------------------------------------------------------------------------------------
// The generator

/** Every true clue about `world`, by family: the generator draws families by weight, so positive links stay rarer. */
function trueClues(world: ClueWorld, cast: TemporalClueCast): Map<string, ClueStatement[]> {
  const times = cast.hours.length;
  const items: (ClueRef & { kind: "item" })[] = activeCategories(cast).flatMap((category) => cast[category].map((_, item) => ({ kind: "item" as const, category, item })));
  const slotOf = (ref: ClueRef) => slotIn(ref, world);
  const present: ClueRef[] = [
    ...items.filter((ref) => slotOf(ref) !== undefined),
    ...cast.hours.map((_, slot) => ({ kind: "hour" as const, slot })),
    { kind: "murder" },
  ];
  const family = (ref: ClueRef) => (ref.kind === "item" ? ref.category : ref.kind);
  const families = new Map<string, ClueStatement[]>([["different", []], ["before", []], ["gap", []], ["same", []], ["murder same", []], ["presence", []]]);
  for (const a of present) {
    for (const b of present) {
      if (a === b || (a.kind === "hour" && b.kind === "hour")) continue;
      const slotA = slotOf(a)!, slotB = slotOf(b)!;
      if (slotA < slotB) {
        families.get("before")!.push({ kind: "before", a, b });
        if (a.kind !== "hour" && b.kind !== "hour") families.get("gap")!.push({ kind: "before", a, b, gap: slotB - slotA });
      }
      // Links pair different categories, each pair once (a before b in the list).
      if (family(a) === family(b) || present.indexOf(a) > present.indexOf(b)) continue;
      if (slotA !== slotB) families.get("different")!.push({ kind: "different", a, b });
      else families.get(a.kind === "murder" || b.kind === "murder" ? "murder same" : "same")!.push({ kind: "same", a, b });
    }
  }
  // Only where a category has more items than visits: elsewhere every item is in some visit anyway.
  for (const a of items.filter((ref) => cast[ref.category].length > times)) {
    families.get("presence")!.push({ kind: slotOf(a) === undefined ? "absent" : "present", a });
  }
  return families;
}

const FAMILY_WEIGHTS: Record<string, number> = { different: 3, before: 3, gap: 1.5, same: 2, "murder same": 0.5, presence: 1 };

/** Draws a clue not drawn yet: a family by weight among those with clues left, then a clue of it uniformly. */
function drawClue(families: Map<string, ClueStatement[]>, rng: Rng): ClueStatement {
  const open = [...families].filter(([, clues]) => clues.length > 0);
  // Every true clue together determines the answers, so the generator stops before this; a change to the families that
  // broke that would otherwise end in a TypeError.
  if (open.length === 0) throw new ArtError("temporal_clue.clues", "generateTemporalClue: every true clue is drawn and the answers are still not unique");
  let r = rng() * open.reduce((sum, [name]) => sum + FAMILY_WEIGHTS[name]!, 0);
  const [, clues] = open.find(([name]) => (r -= FAMILY_WEIGHTS[name]!) < 0) ?? open.at(-1)!;
  return clues.splice(randomInt(rng, clues.length), 1)[0]!;
}

function checkCount(name: string, value: number, min: number, max: number, what: string): void {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new ArtError("temporal_clue.options", `generateTemporalClue: ${name} must be a whole number from ${min} to ${max} (${what}); got ${JSON.stringify(value)}`);
  }
}

/** A puzzle whose clues determine exactly one answer to each question; the same seed and options give the same puzzle. */
export function generateTemporalClue(options: TemporalClueOptions = {}): TemporalCluePuzzle {
  const seed = options.seed ?? freshSeed();
  const times = options.times ?? 4;
  checkCount("times", times, 2, MAX_TIMES, "one visit per hour");
  const counts: Record<ClueCategory, number> = {
    suspect: options.suspects ?? times, weapon: options.weapons ?? times, room: options.rooms ?? times, motive: options.motives ?? 0,
  };
  for (const category of CATEGORIES) {
    if (category === "motive" && counts.motive === 0) continue;
    checkCount(`${category}s`, counts[category], times, POOLS[category].length, `at least one per visit, at most the ${POOLS[category].length} names it has${category === "motive" ? "; or 0 for none" : ""}`);
  }
  const rng = seededRandom(seed);
  const cast: TemporalClueCast = {
    suspect: shuffleInPlace([...POOLS.suspect], rng).slice(0, counts.suspect),
    weapon: shuffleInPlace([...POOLS.weapon], rng).slice(0, counts.weapon),
    room: shuffleInPlace([...POOLS.room], rng).slice(0, counts.room),
    motive: shuffleInPlace([...POOLS.motive], rng).slice(0, counts.motive),
    hours: Array.from({ length: times }, (_, slot) => 24 - times + slot), // the last visit at 11 pm
  };
  const pickVisitItems = (category: ClueCategory) => (counts[category] === 0 ? [] : shuffleInPlace(cast[category].map((_, item) => item), rng).slice(0, times));
  const solution: ClueWorld = {
    suspect: pickVisitItems("suspect"), weapon: pickVisitItems("weapon"), room: pickVisitItems("room"), motive: pickVisitItems("motive"),
    murder: randomInt(rng, times),
  };

  const murderQuestions: ClueQuestion[] = (["suspect", "weapon", "room", "time", "motive"] as const)
    .filter((attribute) => attribute !== "motive" || counts.motive > 0)
    .map((attribute) => ({ kind: "murder", attribute }));
  const visitQuestions: ClueQuestion[] = shuffleInPlace(
    cast.hours.flatMap((_, slot) => activeCategories(cast).map((attribute) => ({ kind: "visit" as const, slot, attribute }))), rng,
  );
  const available = [...murderQuestions, ...visitQuestions];
  const questionCount = options.questions ?? 4;
  checkCount("questions", questionCount, 1, available.length, "the murder's who, weapon, room, time (and motive), then single visits");
  const questions = available.slice(0, questionCount);

  // Add true clues until the answers are unique, then drop each clue the answers do not need (latest first).
  const families = trueClues(solution, cast);
  const clues: ClueStatement[] = [];
  const unique = (set: ClueStatement[]) => solveTemporalClue({ cast, clues: set, questions }).length === 1;
  while (!unique(clues)) clues.push(drawClue(families, rng));
  for (let i = clues.length - 1; i >= 0; i--) {
    const without = clues.filter((_, j) => j !== i);
    if (unique(without)) clues.splice(i, 1);
  }
  shuffleInPlace(clues, rng);
  return { seed, cast, solution, clues, questions, answers: questions.map((q) => answerIn(q, solution, cast)) };
}

// ---------------------------------------------------------------------------------------------------------------
// Text

function capitalized(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** How a clue names a visit: "Mrs. White", "the person with the rope", "the murderer", … */
function subject(ref: ClueRef, cast: TemporalClueCast): string {
  if (ref.kind === "murder") return "the murderer";
  if (ref.kind === "hour") return `the person who came at ${hourLabel(cast.hours[ref.slot]!)}`;
  const name = cast[ref.category][ref.item]!;
  return { suspect: name, weapon: `the person with the ${name}`, room: `the person in the ${name}`, motive: `the person driven by ${name}` }[ref.category];
}

/** What a clue says of a visit: "was in the library", "did not have the rope", … */
function predicate(ref: ClueRef, cast: TemporalClueCast, negated: boolean): string {
  const not = negated ? " not" : "";
  if (ref.kind === "murder") return `was${not} the murderer`;
  if (ref.kind === "hour") return `${negated ? "did not come" : "came"} at ${hourLabel(cast.hours[ref.slot]!)}`;
  const name = cast[ref.category][ref.item]!;
  return { suspect: `was${not} ${name}`, weapon: negated ? `did not have the ${name}` : `had the ${name}`, room: `was${not} in the ${name}`, motive: `was${not} driven by ${name}` }[ref.category];
}

/** Suspects make the best subjects, times the worst: "Mrs. White was in the library", not "the person in the library was Mrs. White". */
const SUBJECT_RANK = { suspect: 0, murder: 1, weapon: 2, room: 3, motive: 4, hour: 5 } as const;
function subjectRank(ref: ClueRef): number {
  return SUBJECT_RANK[ref.kind === "item" ? ref.category : ref.kind];
}

export function renderClue(clue: ClueStatement, cast: TemporalClueCast): string {
  switch (clue.kind) {
    case "present":
    case "absent": {
      const name = cast[clue.a.category][clue.a.item]!;
      const present = clue.kind === "present";
      if (clue.a.category === "suspect") return `${name} ${present ? "came that night" : "never came"}.`;
      return `${present ? "Someone" : "Nobody"} ${predicate(clue.a, cast, false)}.`;
    }
    case "same":
    case "different": {
      const [first, second] = subjectRank(clue.a) <= subjectRank(clue.b) ? [clue.a, clue.b] : [clue.b, clue.a];
      return `${capitalized(subject(first, cast))} ${predicate(second, cast, clue.kind === "different")}.`;
    }
    case "before": {
      if (clue.a.kind === "hour") return `${capitalized(subject(clue.b, cast))} came after ${hourLabel(cast.hours[clue.a.slot]!)}.`;
      const later = clue.b.kind === "hour" ? hourLabel(cast.hours[clue.b.slot]!) : subject(clue.b, cast);
      const when = clue.gap === undefined ? "before" : `exactly ${clue.gap === 1 ? "one hour" : `${clue.gap} hours`} before`;
      return `${capitalized(subject(clue.a, cast))} came ${when} ${later}.`;
    }
  }
}

const CATEGORY_PLURALS: Record<ClueCategory, string> = { suspect: "Suspects", weapon: "Weapons", room: "Rooms", motive: "Motives" };

export function questionText(question: ClueQuestion, cast: TemporalClueCast): string {
  if (question.kind === "murder") {
    return {
      suspect: "Who is the murderer?", weapon: "With which weapon was the murder committed?", room: "In which room was the murder committed?",
      time: "At what time was the murder committed?", motive: "What was the murderer's motive?",
    }[question.attribute];
  }
  const at = hourLabel(cast.hours[question.slot]!);
  return { suspect: `Who came at ${at}?`, weapon: `Which weapon did the person who came at ${at} have?`, room: `Which room was the person who came at ${at} in?`, motive: `What drove the person who came at ${at}?` }[question.attribute];
}

/** The puzzle as the model reads it: the story, the cast, the numbered clues, the questions and the answer format. */
export function renderTemporalClue(puzzle: TemporalCluePuzzle): string {
  const { cast } = puzzle;
  const times = cast.hours.length;
  const categories = activeCategories(cast);
  const motives = cast.motive.length > 0;
  const some = categories.some((c) => cast[c].length > times) ? " Some may be part of none." : "";
  return [
    `Someone was murdered at Tudor Mansion last night. Between ${hourLabel(cast.hours[0]!)} and ${hourLabel(cast.hours[times - 1]!)} there were ` +
      `${times} visits, one on each hour: each visit was one suspect, alone in one room, with one weapon${motives ? ", driven by one motive" : ""}. ` +
      `No suspect, weapon${motives ? ", room or motive" : " or room"} was part of more than one visit.${some} One of the visits was the murder.`,
    "",
    ...categories.map((c) => `${CATEGORY_PLURALS[c]}: ${cast[c].join(", ")}`),
    `Times: ${cast.hours.map(hourLabel).join(", ")}`,
    "",
    "Clues:",
    ...puzzle.clues.map((clue, i) => `${i + 1}. ${renderClue(clue, cast)}`),
    "",
    "Questions:",
    ...puzzle.questions.map((q, i) => `Q${i + 1}: ${questionText(q, cast)}`),
    "",
    `End your reply with one line per question: ${puzzle.questions.map((_, i) => `Q${i + 1}: <answer>`).join(", then ")}.`,
  ].join("\n");
}

// ---------------------------------------------------------------------------------------------------------------
// Answers, score, rollout

export type ParsedClueAnswers = { ok: true; answers: (string | undefined)[] } | { ok: false; error: string };

/**
 * Reads the answer lines `Q1: …` of a reply (after any <think> block; markdown bold and list marks around the label are
 * allowed, "Q1." and "Q1)" too). The last line for a question counts, so reasoning may state a guess before the answer.
 * A question with no line is undefined; a reply with no line for any question does not parse.
 */
export function parseTemporalClueAnswers(text: string, questionCount: number): ParsedClueAnswers {
  const answers = new Array<string | undefined>(questionCount).fill(undefined);
  let found = false;
  for (const match of withoutThinking(text).matchAll(/^[ \t>*_-]*Q(\d+)[*_]*[ \t]*[:.)][*_]*[ \t]*(.*)$/gim)) {
    const index = Number(match[1]) - 1;
    const answer = match[2]!.replace(/[*_`]/g, "").replace(/\.$/, "").trim();
    if (index < 0 || index >= questionCount || answer === "") continue;
    answers[index] = answer;
    found = true;
  }
  return found ? { ok: true, answers } : { ok: false, error: `no answer line for any of the ${questionCount} questions (expected lines like "Q1: <answer>")` };
}

/** Reward = the share of questions answered right (0 when nothing parses); metrics accuracy, correct, answered (share), parse_failure. */
export function scoreTemporalClue(puzzle: TemporalCluePuzzle, text: string): { reward: number; metrics: Record<string, number | boolean>; parsed: ParsedClueAnswers } {
  const parsed = parseTemporalClueAnswers(text, puzzle.answers.length);
  const given = parsed.ok ? parsed.answers : [];
  const correct = puzzle.answers.filter((expected, i) => given[i] !== undefined && temporalClueAnswerMatches(given[i]!, expected)).length;
  const accuracy = correct / puzzle.answers.length;
  return {
    reward: accuracy,
    metrics: { accuracy, correct, answered: given.filter((a) => a !== undefined).length / puzzle.answers.length, parse_failure: !parsed.ok },
    parsed,
  };
}

/** The conversation a rollout starts from: the system prompt and the puzzle. */
export function temporalClueMessages(puzzle: TemporalCluePuzzle): Message[] {
  return [{ role: "system", content: SYSTEM_PROMPT_TEMPORAL_CLUE }, { role: "user", content: renderTemporalClue(puzzle) }];
}

/** One attempt at a puzzle: one reply, scored. Metrics: accuracy, correct, answered, parse_failure (and the Trajectory's own). */
export async function rolloutTemporalClue(policy: GamePolicy<TemporalCluePuzzle>, puzzle: TemporalCluePuzzle): Promise<Trajectory> {
  const messages = temporalClueMessages(puzzle);
  const trajectory = new Trajectory({
    messagesAndChoices: [...messages],
    metadata: { env: "temporal-clue", seed: puzzle.seed, clues: puzzle.clues.length, questions: puzzle.questions.length, answers: puzzle.answers.join(" | ") },
  });
  const reply = await policy(messages, puzzle);
  trajectory.messagesAndChoices.push(replyItem(reply));
  const { reward, metrics, parsed } = scoreTemporalClue(puzzle, replyText(reply));
  trajectory.reward = reward;
  Object.assign(trajectory.metrics, metrics);
  trajectory.log(parsed.ok ? `answers: ${parsed.answers.map((a) => a ?? "-").join(" | ")}; expected: ${puzzle.answers.join(" | ")}` : `unparseable: ${parsed.error}`);
  return trajectory.finish();
}

/** A scripted player that deduces the answers with the solver, from the clues alone (never the hidden solution). */
export function solverPolicyTemporalClue(_messages: unknown, puzzle: TemporalCluePuzzle): string {
  const solutions = solveTemporalClue(puzzle);
  if (solutions.length !== 1) {
    throw new ArtError("temporal_clue.unsolvable", `solverPolicyTemporalClue: the clues allow ${solutions.length === 0 ? "no answer (they contradict each other)" : "more than one answer"}; it needs a puzzle from generateTemporalClue or clues that determine the answers`);
  }
  return solutions[0]!.map((answer, i) => `Q${i + 1}: ${answer}`).join("\n");
}

/** A guessing player, the chance baseline: for each question a random name from the cast (or time) of the kind it asks. */
export function guessPolicyTemporalClue(rng: Rng): GamePolicy<TemporalCluePuzzle> {
  return (_messages, puzzle) =>
    puzzle.questions.map((q, i) => {
      const attribute = q.attribute;
      const options = attribute === "time" ? puzzle.cast.hours.map(hourLabel) : puzzle.cast[attribute];
      return `Q${i + 1}: ${pick(rng, options)}`;
    }).join("\n");
}
