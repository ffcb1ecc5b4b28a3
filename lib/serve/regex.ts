/**
 * JSON Schema's `pattern` (and the `format`s written as patterns) for constrained decoding: an ECMA-262 subset
 * compiled to a Thompson NFA over printable ASCII, which the grammar steps character by character.
 *
 * Supported: literal characters and escapes (\. \- \\ \/ …), `.`, classes `[a-z0-9_]` and `[^…]`, \d \w \s and their
 * negations, groups `( )` and `(?: )`, alternation, quantifiers `* + ?` and `{n}` `{n,}` `{n,m}` (m ≤ 256), and
 * the anchors `^` at the start and `$` at the end (a pattern matches anywhere unless anchored, as JSON Schema says).
 * Refused with the construct named: backreferences, lookaround, anchors elsewhere, flags, Unicode classes.
 * Strings under a pattern are written in printable ASCII (0x20-0x7E): a narrowing, never a widening.
 */
import { ArtError } from "../core/errors.ts";

/** Which of the 128 ASCII codes a transition takes, as four 32-bit words. */
type CharSet = Uint32Array;

interface NfaState {
  /** code → next state, for one character class */
  edges: { chars: CharSet; to: number }[];
  epsilon: number[];
}

export interface CompiledPattern {
  readonly source: string;
  readonly states: readonly NfaState[];
  /** The start state's epsilon closure, sorted. */
  readonly start: readonly number[];
  readonly accept: number;
  /** Per state, the fewest bytes of JSON string content that reach acceptance (Infinity when none). */
  readonly distance: Float64Array;
}

const PRINTABLE_FIRST = 0x20, PRINTABLE_LAST = 0x7e;
const MAX_REPEAT = 256;
/** NFA states a pattern may compile to (a {0,256} of a long group multiplies): beyond it, a 400. */
const MAX_STATES = 20_000;

export function patternError(path: string, message: string): ArtError {
  return new ArtError("invalid_schema", `response_format schema at ${path}: ${message}`);
}

function charSet(test: (code: number) => boolean): CharSet {
  const set = new Uint32Array(4);
  for (let code = PRINTABLE_FIRST; code <= PRINTABLE_LAST; code++) if (test(code)) set[code >> 5] |= 1 << (code & 31);
  return set;
}

export function hasChar(set: CharSet, code: number): boolean {
  return code < 128 && (set[code >> 5] & (1 << (code & 31))) !== 0;
}

const isDigit = (c: number) => c >= 0x30 && c <= 0x39;
const isWord = (c: number) => isDigit(c) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || c === 0x5f;
const isSpace = (c: number) => c === 0x20; // the only printable whitespace
const CLASS_ESCAPES: Record<string, (c: number) => boolean> = {
  d: isDigit, D: (c) => !isDigit(c), w: isWord, W: (c) => !isWord(c), s: isSpace, S: (c) => !isSpace(c),
};

/** A parsed pattern: the regex's syntax tree. */
type Node =
  | { t: "chars"; set: CharSet }
  | { t: "seq"; items: Node[] }
  | { t: "alt"; options: Node[] }
  | { t: "repeat"; item: Node; min: number; max: number };

class Parser {
  private at = 0;
  private readonly source: string;
  private readonly path: string;
  constructor(source: string, path: string) {
    this.source = source;
    this.path = path;
  }

  parse(): { node: Node; anchoredStart: boolean; anchoredEnd: boolean } {
    let anchoredStart = false, anchoredEnd = false;
    if (this.source.startsWith("^")) {
      anchoredStart = true;
      this.at = 1;
    }
    let end = this.source.length;
    if (this.source.endsWith("$") && !this.source.endsWith("\\$")) {
      anchoredEnd = true;
      end--;
    }
    const node = this.alternation(end);
    if (this.at !== end) this.fail(`unexpected ${JSON.stringify(this.source[this.at])}`);
    return { node, anchoredStart, anchoredEnd };
  }

  private fail(message: string): never {
    throw patternError(this.path, `pattern ${JSON.stringify(this.source)} at ${this.at}: ${message} (supported: literals, ., classes, \\d \\w \\s, groups, |, * + ? {n,m}, ^ at the start and $ at the end)`);
  }

  private alternation(end: number): Node {
    const options = [this.sequence(end)];
    while (this.at < end && this.source[this.at] === "|") {
      this.at++;
      options.push(this.sequence(end));
    }
    return options.length === 1 ? options[0]! : { t: "alt", options };
  }

  private sequence(end: number): Node {
    const items: Node[] = [];
    while (this.at < end && this.source[this.at] !== "|" && this.source[this.at] !== ")") items.push(this.quantified(end));
    return { t: "seq", items };
  }

  private quantified(end: number): Node {
    const item = this.atom(end);
    if (this.at >= end) return item;
    const c = this.source[this.at];
    let min: number, max: number;
    if (c === "*") [min, max] = [0, Infinity];
    else if (c === "+") [min, max] = [1, Infinity];
    else if (c === "?") [min, max] = [0, 1];
    else if (c === "{" && /^\{\d+(,\d*)?\}/.test(this.source.slice(this.at))) {
      const match = /^\{(\d+)(,(\d*))?\}/.exec(this.source.slice(this.at))!;
      min = Number(match[1]);
      max = match[2] === undefined ? min : match[3] === "" ? Infinity : Number(match[3]);
      if (max < min) this.fail(`the repeat {${min},${max}} has its bounds reversed`);
      if (min > MAX_REPEAT || (max !== Infinity && max > MAX_REPEAT)) this.fail(`repeats up to ${MAX_REPEAT} are supported`);
      this.at += match[0].length - 1;
    } else return item;
    this.at++;
    if (this.source[this.at] === "?") this.at++; // lazy or greedy: the same language
    if ("*+?{".includes(this.source[this.at] ?? "") && this.at < end) this.fail("a quantifier cannot follow another");
    return { t: "repeat", item, min, max };
  }

  private atom(end: number): Node {
    const c = this.source[this.at]!;
    if (c === "(") {
      this.at++;
      if (this.source.startsWith("?:", this.at)) this.at += 2;
      else if (this.source[this.at] === "?") this.fail("lookaround and named groups are not supported");
      const inner = this.alternation(end);
      if (this.source[this.at] !== ")") this.fail("a group is not closed");
      this.at++;
      return inner;
    }
    if (c === "[") return this.bracket();
    if (c === ".") {
      this.at++;
      return { t: "chars", set: charSet(() => true) };
    }
    if (c === "\\") return { t: "chars", set: this.escape(false) };
    if (c === "^" || c === "$") this.fail("anchors are supported only at the very start and end");
    if ("*+?{}".includes(c) && !(c === "{" || c === "}")) this.fail(`${c} has nothing to repeat`);
    this.at++;
    const code = c.charCodeAt(0);
    return { t: "chars", set: charSet((x) => x === code) };
  }

  /** After a backslash: a class escape or an escaped character, as a set. */
  private escape(inClass: boolean): CharSet {
    const c = this.source[this.at + 1];
    if (c === undefined) this.fail("a pattern cannot end with a backslash");
    this.at += 2;
    if (CLASS_ESCAPES[c]) return charSet(CLASS_ESCAPES[c]);
    if (/[1-9]/.test(c)) this.fail("backreferences are not supported");
    if (/[bBpPkcuxnrtfv0]/.test(c)) this.fail(`\\${c} is not supported`);
    if (inClass && c === "-") return charSet((x) => x === 0x2d);
    const code = c.charCodeAt(0);
    return charSet((x) => x === code);
  }

  private bracket(): Node {
    this.at++;
    const negated = this.source[this.at] === "^";
    if (negated) this.at++;
    const set = new Uint32Array(4);
    let first = true;
    while (this.at < this.source.length && (this.source[this.at] !== "]" || first)) {
      first = false;
      let low: number;
      if (this.source[this.at] === "\\") {
        const escaped = this.escape(true);
        const single = [...Array(128).keys()].filter((x) => hasChar(escaped, x));
        if (single.length !== 1 || this.source[this.at] !== "-" || this.source[this.at + 1] === "]") {
          for (let i = 0; i < 4; i++) set[i] |= escaped[i];
          continue;
        }
        low = single[0]!;
      } else {
        low = this.source.charCodeAt(this.at++);
      }
      if (this.source[this.at] === "-" && this.source[this.at + 1] !== "]" && this.at + 1 < this.source.length) {
        this.at++;
        const high = this.source[this.at] === "\\" ? [...Array(128).keys()].find((x) => hasChar(this.escape(true), x))! : this.source.charCodeAt(this.at++);
        if (high < low) this.fail("a class range runs backwards");
        for (let x = low; x <= high && x < 128; x++) set[x >> 5] |= 1 << (x & 31);
      } else if (low < 128) {
        set[low >> 5] |= 1 << (low & 31);
      }
    }
    if (this.source[this.at] !== "]") this.fail("a class is not closed");
    this.at++;
    return { t: "chars", set: negated ? charSet((x) => !hasChar(set, x)) : charSet((x) => hasChar(set, x)) };
  }
}

/** Compiles `source` (a JSON Schema pattern) for the grammar; throws invalid_schema naming what it cannot take. */
export function compilePattern(source: string, path: string): CompiledPattern {
  // What JavaScript's Unicode-mode RegExp refuses (a lone ] or {, a bad escape) is not a pattern here either.
  try {
    new RegExp(source, "u");
  } catch (error) {
    throw patternError(path, `pattern ${JSON.stringify(source)} is not a valid regular expression (${(error as Error).message})`);
  }
  const { node, anchoredStart, anchoredEnd } = new Parser(source, path).parse();
  const states: NfaState[] = [];
  const add = (): number => {
    if (states.length >= MAX_STATES) throw patternError(path, `pattern ${JSON.stringify(source)} is too large for constrained decoding here (over ${MAX_STATES} states)`);
    states.push({ edges: [], epsilon: [] });
    return states.length - 1;
  };
  const any = charSet(() => true);
  /** Builds `node` from state `from`; returns the state it ends in. */
  const build = (n: Node, from: number): number => {
    switch (n.t) {
      case "chars": {
        const to = add();
        states[from]!.edges.push({ chars: n.set, to });
        return to;
      }
      case "seq":
        return n.items.reduce((at, item) => build(item, at), from);
      case "alt": {
        const end = add();
        for (const option of n.options) {
          const start = add();
          states[from]!.epsilon.push(start);
          states[build(option, start)]!.epsilon.push(end);
        }
        return end;
      }
      case "repeat": {
        let at = from;
        for (let i = 0; i < n.min; i++) at = build(n.item, at);
        if (n.max === Infinity) {
          const loop = add();
          states[at]!.epsilon.push(loop);
          states[build(n.item, loop)]!.epsilon.push(loop);
          return loop;
        }
        const end = add();
        for (let i = n.min; i < n.max; i++) {
          states[at]!.epsilon.push(end);
          at = build(n.item, at);
        }
        states[at]!.epsilon.push(end);
        return end;
      }
    }
  };
  const start = add();
  let at = start;
  if (!anchoredStart) {
    states[at]!.edges.push({ chars: any, to: at }); // anything before the match
  }
  at = build(node, at);
  if (!anchoredEnd) states[at]!.edges.push({ chars: any, to: at }); // anything after it
  const accept = at;

  // Fewest bytes to acceptance: a character costs 2 bytes when JSON escapes it (" and \), else 1.
  const distance = new Float64Array(states.length).fill(Number.POSITIVE_INFINITY);
  distance[accept] = 0;
  const cheapest = (set: CharSet) => ([...Array(128).keys()].some((x) => hasChar(set, x) && x !== 0x22 && x !== 0x5c) ? 1 : 2);
  for (let changed = true; changed;) {
    changed = false;
    for (let s = states.length - 1; s >= 0; s--) {
      let best = distance[s]!;
      for (const e of states[s]!.epsilon) best = Math.min(best, distance[e]!);
      for (const edge of states[s]!.edges) best = Math.min(best, cheapest(edge.chars) + distance[edge.to]!);
      if (best < distance[s]!) {
        distance[s] = best;
        changed = true;
      }
    }
  }
  return { source, states, start: closure(states, [start]), accept, distance };
}

/** The states reachable from `set` by epsilon moves, sorted (a canonical state of the simulation). */
function closure(states: readonly NfaState[], set: readonly number[]): number[] {
  const seen = new Set(set);
  const stack = [...set];
  while (stack.length > 0) {
    for (const next of states[stack.pop()!]!.epsilon) {
      if (!seen.has(next)) {
        seen.add(next);
        stack.push(next);
      }
    }
  }
  return [...seen].sort((a, b) => a - b);
}

/** The states after reading `code` (printable ASCII), closed; empty when the pattern cannot continue. */
export function stepPattern(pattern: CompiledPattern, set: readonly number[], code: number): number[] {
  const next: number[] = [];
  for (const s of set) for (const edge of pattern.states[s]!.edges) if (hasChar(edge.chars, code)) next.push(edge.to);
  return next.length === 0 ? next : closure(pattern.states, next);
}

/** Fewest content bytes from `set` to a match (Infinity: none). */
export function bytesToMatch(pattern: CompiledPattern, set: readonly number[]): number {
  let best = Number.POSITIVE_INFINITY;
  for (const s of set) best = Math.min(best, pattern.distance[s]!);
  return best;
}

/** JSON Schema formats, as patterns over printable ASCII, each narrowed where needed so all it admits are valid. */
export const FORMAT_PATTERNS: Record<string, string> = {
  // Days 01-28 only, so every date it writes exists in every month and year.
  date: "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])$",
  time: "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  "date-time": "^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])T([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)$",
  // Dot-separated atoms (no leading, trailing or doubled dot) of at most 62 characters in all, at a dotted domain.
  email: "^[A-Za-z0-9_+-]{1,20}(\\.[A-Za-z0-9_+-]{1,20}){0,2}@[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?)*\\.[A-Za-z]{2,12}$",
  // With an RFC 9562 version (1-8) and variant (8, 9, a, b), which strict validators require.
  uuid: "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}$",
  hostname: "^[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,30}[A-Za-z0-9])?)*$",
  ipv4: "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$",
  // The full form of eight groups (no :: shortening).
  ipv6: "^([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}$",
};
