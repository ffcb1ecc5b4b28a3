/**
 * A byte-level pushdown automaton that accepts exactly the JSON texts matching a compiled schema
 * (lib/serve/json-schema.ts), and knows the fewest bytes that still complete the text from any state.
 *
 * Why bytes: tokens are byte strings (byte-level BPE), and a token may end inside a UTF-8 character.
 * Why a set of stacks: `anyOf` (and literal enums sharing prefixes) make the language nondeterministic; each
 * alternative is its own immutable stack, so branching is a pointer copy. Frames are immutable values; a
 * transition returns new stack nodes and shares the rest.
 *
 * Output is compact-ish JSON: whitespace is allowed between tokens of the structure, at most MAX_WHITESPACE bytes
 * in a row (so a model cannot stall in whitespace); free object keys (additionalProperties) are printable ASCII
 * without escapes. Both restrictions keep every accepted text valid JSON that validates against the schema. A `\u`
 * escape never names a surrogate (D800–DFFF): alone, half a pair parses to a string that is not Unicode, which a UTF-8
 * writer refuses (nbconvert saving a notebook that shows it), and an astral character can be written as itself.
 */
import { childNodes, type SchemaNode } from "./json-schema.ts";
import { bytesToMatch, stepPattern, type CompiledPattern } from "./regex.ts";

type ObjectNode = Extract<SchemaNode, { kind: "object" }>;

const MAX_WHITESPACE = 16;
const MAX_INT_DIGITS = 15; // keeps integers exact in a JS number
const MAX_FRACTION_DIGITS = 15;
const MAX_EXPONENT_DIGITS = 2;
const END = -1; // end of text (the model's end-of-sequence token)

const QUOTE = 0x22, BACKSLASH = 0x5c, COMMA = 0x2c, COLON = 0x3a;
const OPEN_BRACE = 0x7b, CLOSE_BRACE = 0x7d, OPEN_BRACKET = 0x5b, CLOSE_BRACKET = 0x5d;
const MINUS = 0x2d, PLUS = 0x2b, DOT = 0x2e, ZERO = 0x30;

const ANY: SchemaNode = { kind: "any" };
const ANY_OBJECT: ObjectNode = { kind: "object", properties: new Map(), required: new Set(), additional: ANY };
const ANY_ARRAY: SchemaNode = { kind: "array", items: ANY, minItems: 0, maxItems: Number.POSITIVE_INFINITY };
const ANY_STRING: SchemaNode = { kind: "string", minLength: 0, maxLength: Number.POSITIVE_INFINITY };

type NumberPhase = "minus" | "zero" | "int" | "dot" | "fraction" | "e" | "exponentSign" | "exponent";

type Frame =
  /** Below everything: the top-level value is done; only the end of text may follow. */
  | { t: "root" }
  /** A value of `node` is expected next. */
  | { t: "value"; node: SchemaNode }
  /** Inside an object; `phase` says what may come next (a key frame sits on top while phase is "key"). */
  | { t: "object"; node: ObjectNode; used: readonly string[]; phase: "open" | "key" | "colon" | "after" | "comma"; key: string }
  /** Inside a key's quotes; `text` holds the key's bytes so far (one char per byte). */
  | { t: "key"; text: string }
  | { t: "array"; node: Extract<SchemaNode, { kind: "array" }>; count: number; phase: "open" | "after" | "comma" }
  /**
   * Inside a string: `length` counts code points; `escape` is the hex digits of a `\u` escape left, or "d" after its
   * first digit was d (three left, the next 0–7: no surrogate); `utf8Left` bytes of a UTF-8 character remain.
   */
  | { t: "string"; minLength: number; maxLength: number; length: number; escape: "none" | "start" | "d" | number; utf8Left: number; utf8Low: number; utf8High: number }
  | { t: "number"; integer: boolean; phase: NumberPhase; digits: number }
  /** Inside a string under a pattern: the pattern's live NFA states; `escape` after a backslash (\" or \\ next). */
  | { t: "pattern"; pattern: CompiledPattern; states: readonly number[]; escape: boolean }
  /** Matching one of `texts` (compact JSON, one char per byte); `offset` bytes matched so far. */
  | { t: "literal"; texts: readonly string[]; offset: number };

/** One alternative: a linked stack of frames plus the run of whitespace just seen. */
export interface Stack {
  readonly frame: Frame;
  readonly parent: Stack | null;
  readonly whitespace: number;
}

/** The automaton's state: the alternatives still alive (empty = dead). */
export type GrammarState = readonly Stack[];

const MAX_ALTERNATIVES = 32; // dropping extra alternatives only narrows the language, never admits invalid text

export class JsonGrammar {
  readonly root: SchemaNode;
  private readonly minLengthCache = new Map<SchemaNode, number>();
  private readonly keyBytesCache = new Map<ObjectNode, Map<string, string>>();
  private readonly nodeIds = new Map<SchemaNode, number>();
  private readonly patternIds = new Map<CompiledPattern, number>();

  private readonly prefix: string;
  private readonly suffix: string;
  private readonly textCost: (bytes: string) => number;

  /**
   * `prefix` and `suffix`: exact text around the JSON value (e.g. the tags of a forced tool call).
   * `textCost`: what writing a fixed text (keys, literals, the prefix and suffix; one char per byte) costs; the
   * default counts bytes. Token masks pass the number of tokens of a greedy longest-match over the vocabulary:
   * still an achievable count, and following that segmentation lowers the cost by exactly one per token.
   */
  constructor(root: SchemaNode, options: { prefix?: string; suffix?: string; textCost?: (bytes: string) => number } = {}) {
    this.root = root;
    this.textCost = options.textCost ?? ((bytes) => bytes.length);
    this.prefix = toByteString(options.prefix ?? "");
    this.suffix = toByteString(options.suffix ?? "");
  }

  initial(): GrammarState {
    let stack: Stack = { frame: { t: "root" }, parent: null, whitespace: 0 };
    if (this.suffix) stack = { frame: { t: "literal", texts: [this.suffix], offset: 0 }, parent: stack, whitespace: 0 };
    stack = { frame: { t: "value", node: this.root }, parent: stack, whitespace: 0 };
    if (this.prefix) stack = { frame: { t: "literal", texts: [this.prefix], offset: 0 }, parent: stack, whitespace: 0 };
    return [stack];
  }

  /** Advances every alternative by the bytes; an empty result means the bytes are not allowed here. */
  advance(state: GrammarState, bytes: Uint8Array): GrammarState {
    let current = state;
    for (let i = 0; i < bytes.length && current.length > 0; i++) current = this.feedAll(current, bytes[i]);
    return current;
  }

  feedAll(state: GrammarState, byte: number): GrammarState {
    const next: Stack[] = [];
    for (const stack of state) {
      for (const s of this.feed(stack, byte)) {
        if (next.length < MAX_ALTERNATIVES) next.push(s);
      }
    }
    return next;
  }

  /** True when the text so far is a complete value (the end-of-sequence token may come now). */
  isComplete(state: GrammarState): boolean {
    return state.some((stack) => this.feed(stack, END).length > 0);
  }

  /** The fewest bytes that complete the text from this state (Infinity when dead). */
  bytesToComplete(state: GrammarState): number {
    let best = Number.POSITIVE_INFINITY;
    for (const stack of state) best = Math.min(best, this.stackCost(stack));
    return best;
  }

  /**
   * When the state is inside a string's plain text (one alternative, no escape or UTF-8 character half done),
   * tokens of plain characters only lengthen the string: `room` more characters fit, the first `stillNeeded`
   * of them shorten the completion, which now costs `cost` bytes. Token masks use this to skip the trie walk
   * for the bulk of the vocabulary. Null in any other state.
   */
  plainStringContext(state: GrammarState): { room: number; stillNeeded: number; cost: number } | null {
    if (state.length !== 1) return null;
    const frame = state[0].frame;
    if (frame.t !== "string" || frame.escape !== "none" || frame.utf8Left > 0) return null;
    return { room: frame.maxLength - frame.length, stillNeeded: Math.max(0, frame.minLength - frame.length), cost: this.stackCost(state[0]) };
  }

  /**
   * When the state is inside a free object key (an object with no declared properties, e.g. json_object), every
   * token of printable ASCII without quote or backslash extends the key; the completion then costs `cost` bytes,
   * or one more when the key would equal one already used, given by its remaining text in `usedRests`.
   * Null in any other state.
   */
  freeKeyContext(state: GrammarState): { cost: number; usedRests: Set<string> } | null {
    if (state.length !== 1 || state[0].frame.t !== "key") return null;
    const object = state[0].parent!.frame as Extract<Frame, { t: "object" }>;
    if (object.node.properties.size > 0 || object.node.additional === null) return null;
    const text = state[0].frame.text;
    const cost = 2 + this.minLength(object.node.additional) + this.objectRemaining(object.node, object.used, false) + this.stackCost(state[0].parent!.parent!);
    const usedRests = new Set(object.used.filter((k) => k.startsWith(text) && k.length > text.length).map((k) => k.slice(text.length)));
    return { cost, usedRests };
  }

  /** A string naming the state exactly, for caching token masks per state. */
  stateKey(state: GrammarState): string {
    return state.map((stack) => this.stackKey(stack)).join("|");
  }

  /**
   * The minimal JSON value of `node`, in bytes (what budget forcing plans with). A recursive schema ($ref) makes the
   * nodes a graph with cycles, so the lengths of every node reachable from `node` are found together as the least
   * fixed point of their equations: all start at Infinity and each round recomputes them from the others' current
   * values until none shrinks (each round settles at least one more node, so there are at most as many rounds as
   * nodes). Without cycles this is the plain recursive length.
   */
  minLength(node: SchemaNode): number {
    const cached = this.minLengthCache.get(node);
    if (cached !== undefined) return cached;
    const nodes: SchemaNode[] = [];
    const collect = (n: SchemaNode) => {
      if (this.minLengthCache.has(n)) return;
      this.minLengthCache.set(n, Number.POSITIVE_INFINITY);
      nodes.push(n);
      childNodes(n).forEach(collect);
    };
    collect(node);
    for (let round = 0, changed = true; changed && round <= nodes.length; round++) {
      changed = false;
      for (const n of nodes) {
        const length = this.lengthFromParts(n);
        if (length < this.minLengthCache.get(n)!) {
          this.minLengthCache.set(n, length);
          changed = true;
        }
      }
    }
    return this.minLengthCache.get(node)!;
  }

  /** `node`'s minimal length from its parts' current minimal lengths (minLength's equations). */
  private lengthFromParts(node: SchemaNode): number {
    let length: number;
    switch (node.kind) {
      case "any": case "number": length = 1; break; // 0
      case "boolean": length = Math.min(this.textCost("true"), this.textCost("false")); break;
      case "null": length = this.textCost("null"); break;
      case "string": length = 2 + (node.pattern ? bytesToMatch(node.pattern, node.pattern.start) : node.minLength); break;
      case "literal": length = Math.min(...node.texts.map((t) => this.textCost(toByteString(t)))); break;
      case "anyOf": length = Math.min(...node.options.map((o) => this.minLength(o))); break;
      case "array": length = 2 + node.minItems * this.minLength(node.items) + Math.max(0, node.minItems - 1); break;
      case "object": length = 1 + this.objectRemaining(node, [], true); break;
    }
    return length;
  }

  // ---- transitions -------------------------------------------------------------------------------

  private feed(stack: Stack, byte: number): Stack[] {
    const frame = stack.frame;
    const isSpace = byte === 0x20 || byte === 0x0a;
    switch (frame.t) {
      case "root":
        return byte === END ? [stack] : [];
      case "value":
        if (isSpace) return this.whitespace(stack);
        return this.startValue(frame.node, stack.parent!, byte);
      case "object":
        return this.feedObject(stack, frame, byte, isSpace);
      case "key":
        return this.feedKey(stack, frame, byte);
      case "array":
        return this.feedArray(stack, frame, byte, isSpace);
      case "string":
        return this.feedString(stack, frame, byte);
      case "pattern":
        return this.feedPattern(stack, frame, byte);
      case "number":
        return this.feedNumber(stack, frame, byte);
      case "literal":
        return this.feedLiteral(stack, frame, byte);
    }
  }

  private whitespace(stack: Stack): Stack[] {
    return stack.whitespace < MAX_WHITESPACE ? [{ frame: stack.frame, parent: stack.parent, whitespace: stack.whitespace + 1 }] : [];
  }

  /** Starts a value of `node` with its first byte, on top of `below`. */
  private startValue(node: SchemaNode, below: Stack, byte: number): Stack[] {
    const push = (frame: Frame): Stack[] => [{ frame, parent: below, whitespace: 0 }];
    switch (node.kind) {
      case "any":
        if (byte === OPEN_BRACE) return push(objectFrame(ANY_OBJECT));
        if (byte === OPEN_BRACKET) return this.startValue(ANY_ARRAY, below, byte);
        if (byte === QUOTE) return this.startValue(ANY_STRING, below, byte);
        if (byte === MINUS || isDigit(byte)) return this.startValue({ kind: "number", integer: false }, below, byte);
        return this.startLiteral(["true", "false", "null"], below, byte);
      case "object":
        return byte === OPEN_BRACE ? push(objectFrame(node)) : [];
      case "array":
        return byte === OPEN_BRACKET ? push({ t: "array", node, count: 0, phase: "open" }) : [];
      case "string":
        if (node.pattern) return byte === QUOTE ? push({ t: "pattern", pattern: node.pattern, states: node.pattern.start, escape: false }) : [];
        return byte === QUOTE
          ? push({ t: "string", minLength: node.minLength, maxLength: node.maxLength, length: 0, escape: "none", utf8Left: 0, utf8Low: 0, utf8High: 0 })
          : [];
      case "number":
        if (byte === MINUS) return push({ t: "number", integer: node.integer, phase: "minus", digits: 0 });
        if (byte === ZERO) return push({ t: "number", integer: node.integer, phase: "zero", digits: 1 });
        if (isDigit(byte)) return push({ t: "number", integer: node.integer, phase: "int", digits: 1 });
        return [];
      case "boolean":
        return this.startLiteral(["true", "false"], below, byte);
      case "null":
        return this.startLiteral(["null"], below, byte);
      case "literal":
        return this.startLiteral(node.texts.map(toByteString), below, byte);
      case "anyOf":
        return node.options.flatMap((option) => this.startValue(option, below, byte));
    }
  }

  private startLiteral(texts: readonly string[], below: Stack, byte: number): Stack[] {
    const matching = texts.filter((t) => t.charCodeAt(0) === byte);
    return matching.length > 0 ? [{ frame: { t: "literal", texts: matching, offset: 1 }, parent: below, whitespace: 0 }] : [];
  }

  private feedObject(stack: Stack, frame: Extract<Frame, { t: "object" }>, byte: number, isSpace: boolean): Stack[] {
    if (isSpace && frame.phase !== "key") return this.whitespace(stack);
    const replace = (next: Frame): Stack[] => [{ frame: next, parent: stack.parent, whitespace: 0 }];
    switch (frame.phase) {
      case "open":
      case "comma":
        if (byte === QUOTE && this.canAddKey(frame.node, frame.used)) {
          const waiting: Stack = { frame: { ...frame, phase: "key" }, parent: stack.parent, whitespace: 0 };
          return [{ frame: { t: "key", text: "" }, parent: waiting, whitespace: 0 }];
        }
        if (byte === CLOSE_BRACE && frame.phase === "open" && this.requiredDone(frame.node, frame.used)) return [stack.parent!];
        return [];
      case "colon":
        if (byte !== COLON) return [];
        return [{ frame: { t: "value", node: this.propertySchema(frame.node, frame.key) }, parent: { frame: { ...frame, phase: "after" }, parent: stack.parent, whitespace: 0 }, whitespace: 0 }];
      case "after":
        if (byte === COMMA && this.canAddKey(frame.node, frame.used)) return replace({ ...frame, phase: "comma" });
        if (byte === CLOSE_BRACE && this.requiredDone(frame.node, frame.used)) return [stack.parent!];
        return [];
      case "key":
        return []; // unreachable: the key frame is on top while the object waits
    }
  }

  private feedKey(stack: Stack, frame: Extract<Frame, { t: "key" }>, byte: number): Stack[] {
    const objectStack = stack.parent!;
    const object = objectStack.frame as Extract<Frame, { t: "object" }>;
    const declared = this.keyBytes(object.node);
    if (byte === QUOTE) {
      const name = this.completedKey(object.node, object.used, frame.text);
      if (name === null) return [];
      return [{ frame: { ...object, phase: "colon", key: name, used: [...object.used, name] }, parent: objectStack.parent, whitespace: 0 }];
    }
    if (byte === END) return [];
    const text = frame.text + String.fromCharCode(byte);
    const declaredPrefix = [...declared].some(([name, bytes]) => !object.used.includes(name) && bytes.startsWith(text));
    const freePrefix = object.node.additional !== null && isFreeKeyByte(byte);
    return declaredPrefix || freePrefix ? [{ frame: { t: "key", text }, parent: objectStack, whitespace: 0 }] : [];
  }

  private feedArray(stack: Stack, frame: Extract<Frame, { t: "array" }>, byte: number, isSpace: boolean): Stack[] {
    if (isSpace) return this.whitespace(stack);
    const { node, count } = frame;
    switch (frame.phase) {
      case "open":
        if (byte === CLOSE_BRACKET) return node.minItems === 0 ? [stack.parent!] : [];
        if (node.maxItems === 0) return [];
        return this.startValue(node.items, { frame: { ...frame, phase: "after", count: count + 1 }, parent: stack.parent, whitespace: 0 }, byte);
      case "comma":
        return this.startValue(node.items, { frame: { ...frame, phase: "after", count: count + 1 }, parent: stack.parent, whitespace: 0 }, byte);
      case "after":
        if (byte === COMMA && count < node.maxItems) return [{ frame: { ...frame, phase: "comma" }, parent: stack.parent, whitespace: 0 }];
        if (byte === CLOSE_BRACKET && count >= node.minItems) return [stack.parent!];
        return [];
    }
  }

  private feedString(stack: Stack, frame: Extract<Frame, { t: "string" }>, byte: number): Stack[] {
    if (byte === END) return [];
    const replace = (next: Partial<Extract<Frame, { t: "string" }>>): Stack[] => [{ frame: { ...frame, ...next }, parent: stack.parent, whitespace: 0 }];
    if (frame.utf8Left > 0) {
      if (byte < frame.utf8Low || byte > frame.utf8High) return [];
      return replace({ utf8Left: frame.utf8Left - 1, utf8Low: 0x80, utf8High: 0xbf });
    }
    if (frame.escape === "start") {
      if (byte === 0x75) return replace({ escape: 4 }); // \uXXXX
      return '"\\/bfnrt'.includes(String.fromCharCode(byte)) ? replace({ escape: "none" }) : [];
    }
    if (frame.escape === "d") return byte >= 0x30 && byte <= 0x37 ? replace({ escape: 2 }) : [];
    if (typeof frame.escape === "number") {
      if (!isHexDigit(byte)) return [];
      if (frame.escape === 4 && (byte === 0x64 || byte === 0x44)) return replace({ escape: "d" });
      return replace({ escape: frame.escape === 1 ? "none" : frame.escape - 1 });
    }
    if (byte === QUOTE) return frame.length >= frame.minLength ? [stack.parent!] : [];
    if (frame.length >= frame.maxLength) return [];
    if (byte === BACKSLASH) return replace({ escape: "start", length: frame.length + 1 });
    if (byte < 0x20 || byte === 0x7f) return [];
    if (byte < 0x80) return replace({ length: frame.length + 1 });
    // UTF-8 lead byte: how many continuation bytes follow and the range of the first (no overlongs, no surrogates).
    if (byte >= 0xc2 && byte <= 0xdf) return replace({ length: frame.length + 1, utf8Left: 1, utf8Low: 0x80, utf8High: 0xbf });
    if (byte >= 0xe0 && byte <= 0xef) {
      const [low, high] = byte === 0xe0 ? [0xa0, 0xbf] : byte === 0xed ? [0x80, 0x9f] : [0x80, 0xbf];
      return replace({ length: frame.length + 1, utf8Left: 2, utf8Low: low, utf8High: high });
    }
    if (byte >= 0xf0 && byte <= 0xf4) {
      const [low, high] = byte === 0xf0 ? [0x90, 0xbf] : byte === 0xf4 ? [0x80, 0x8f] : [0x80, 0xbf];
      // A 4-byte character is two UTF-16 units; maxLength counts code points, as JSON Schema says.
      return replace({ length: frame.length + 1, utf8Left: 3, utf8Low: low, utf8High: high });
    }
    return [];
  }

  private feedNumber(stack: Stack, frame: Extract<Frame, { t: "number" }>, byte: number): Stack[] {
    const to = (phase: NumberPhase, digits: number): Stack[] => [{ frame: { ...frame, phase, digits }, parent: stack.parent, whitespace: 0 }];
    const digit = isDigit(byte);
    switch (frame.phase) {
      case "minus":
        if (byte === ZERO) return to("zero", 1);
        return digit ? to("int", 1) : [];
      case "int":
        if (digit && frame.digits < MAX_INT_DIGITS) return to("int", frame.digits + 1);
        break;
      case "dot":
        return digit ? to("fraction", 1) : [];
      case "fraction":
        if (digit && frame.digits < MAX_FRACTION_DIGITS) return to("fraction", frame.digits + 1);
        break;
      case "e":
        if (byte === MINUS || byte === PLUS) return to("exponentSign", 0);
        return digit ? to("exponent", 1) : [];
      case "exponentSign":
        return digit ? to("exponent", 1) : [];
      case "exponent":
        if (digit && frame.digits < MAX_EXPONENT_DIGITS) return to("exponent", frame.digits + 1);
        break;
      case "zero":
        break;
    }
    // The number may go on with a fraction or exponent, or it is done and the byte belongs to the parent.
    if (!frame.integer && (frame.phase === "zero" || frame.phase === "int")) {
      if (byte === DOT) return to("dot", 0);
      if (byte === 0x65 || byte === 0x45) return to("e", 0);
    }
    if (!frame.integer && frame.phase === "fraction" && (byte === 0x65 || byte === 0x45)) return to("e", 0);
    if (digit) return [];
    return this.feed(stack.parent!, byte);
  }

  /** A patterned string: printable ASCII, with \" and \\ the only escapes; it closes when the pattern matches. */
  private feedPattern(stack: Stack, frame: Extract<Frame, { t: "pattern" }>, byte: number): Stack[] {
    let code: number;
    if (frame.escape) {
      if (byte !== QUOTE && byte !== BACKSLASH) return [];
      code = byte;
    } else {
      if (byte === QUOTE) return bytesToMatch(frame.pattern, frame.states) === 0 ? [stack.parent!] : [];
      if (byte === BACKSLASH) return [{ frame: { ...frame, escape: true }, parent: stack.parent, whitespace: 0 }];
      if (byte < 0x20 || byte > 0x7e) return [];
      code = byte;
    }
    const states = stepPattern(frame.pattern, frame.states, code);
    return states.length > 0 && bytesToMatch(frame.pattern, states) < Number.POSITIVE_INFINITY
      ? [{ frame: { t: "pattern", pattern: frame.pattern, states, escape: false }, parent: stack.parent, whitespace: 0 }]
      : [];
  }

  private feedLiteral(stack: Stack, frame: Extract<Frame, { t: "literal" }>, byte: number): Stack[] {
    const results: Stack[] = [];
    const continuing = frame.texts.filter((t) => t.length > frame.offset && t.charCodeAt(frame.offset) === byte);
    if (continuing.length > 0) results.push({ frame: { t: "literal", texts: continuing, offset: frame.offset + 1 }, parent: stack.parent, whitespace: 0 });
    if (frame.texts.some((t) => t.length === frame.offset)) results.push(...this.feed(stack.parent!, byte));
    return results;
  }

  // ---- objects -----------------------------------------------------------------------------------

  private keyBytes(node: ObjectNode): Map<string, string> {
    let map = this.keyBytesCache.get(node);
    if (!map) {
      map = new Map([...node.properties.keys()].map((name) => [name, toByteString(JSON.stringify(name)).slice(1, -1)]));
      this.keyBytesCache.set(node, map);
    }
    return map;
  }

  private canAddKey(node: ObjectNode, used: readonly string[]): boolean {
    return node.additional !== null || [...node.properties.keys()].some((name) => !used.includes(name));
  }

  private requiredDone(node: ObjectNode, used: readonly string[]): boolean {
    for (const name of node.required) if (!used.includes(name)) return false;
    return true;
  }

  private propertySchema(node: ObjectNode, key: string): SchemaNode {
    return node.properties.get(key) ?? node.additional ?? ANY;
  }

  /** The key a closing quote completes, or null when the text names no allowed key. */
  private completedKey(node: ObjectNode, used: readonly string[], text: string): string | null {
    for (const [name, bytes] of this.keyBytes(node)) if (bytes === text) return used.includes(name) ? null : name;
    if (node.additional === null || text.length === 0) return null;
    return used.includes(text) ? null : text; // free keys are printable ASCII, so text is the key itself
  }

  /** Bytes still needed to finish an object whose keys so far are `used` (commas, missing required members, "}"). */
  private objectRemaining(node: ObjectNode, used: readonly string[], atOpen: boolean): number {
    let cost = 1;
    let missing = 0;
    for (const name of node.required) {
      if (used.includes(name)) continue;
      missing++;
      cost += this.memberCost(node, name);
    }
    return cost + (atOpen ? Math.max(0, missing - 1) : missing);
  }

  // ---- costs -------------------------------------------------------------------------------------

  private stackCost(stack: Stack): number {
    let cost = 0;
    for (let s: Stack | null = stack; s !== null; s = s.parent) {
      cost += s.frame.t === "key" ? this.keyCost(s.frame, s.parent!.frame as Extract<Frame, { t: "object" }>) : this.frameCost(s.frame);
    }
    return cost;
  }

  private frameCost(frame: Exclude<Frame, { t: "key" }>): number {
    switch (frame.t) {
      case "root": return 0;
      case "value": return this.minLength(frame.node);
      case "object":
        switch (frame.phase) {
          case "open": return this.objectRemaining(frame.node, frame.used, true);
          case "comma": return this.objectRemaining(frame.node, frame.used, true) + this.cheapestOptionalMember(frame.node, frame.used);
          case "colon": return 1 + this.minLength(this.propertySchema(frame.node, frame.key)) + this.objectRemaining(frame.node, frame.used, false);
          case "after": return this.objectRemaining(frame.node, frame.used, false);
          case "key": return 0; // the key frame on top accounts for the rest of the object
        }
        break;
      case "array": {
        const item = this.minLength(frame.node.items);
        const missing = Math.max(0, frame.node.minItems - frame.count);
        if (frame.phase === "open") return missing === 0 ? 1 : missing * item + (missing - 1) + 1;
        if (frame.phase === "after") return missing * (1 + item) + 1;
        const need = Math.max(1, missing);
        return need * item + (need - 1) + 1;
      }
      case "string": {
        const pending = frame.utf8Left + (frame.escape === "start" ? 1 : frame.escape === "d" ? 3 : typeof frame.escape === "number" ? frame.escape : 0);
        return pending + Math.max(0, frame.minLength - frame.length) + 1;
      }
      case "pattern": {
        if (!frame.escape) return bytesToMatch(frame.pattern, frame.states) + 1;
        // After a backslash: the escaped " or \ (1 byte here), then the rest of the match and the quote.
        const after = [QUOTE, BACKSLASH].map((c) => 1 + bytesToMatch(frame.pattern, stepPattern(frame.pattern, frame.states, c)));
        return Math.min(...after) + 1;
      }
      case "number":
        return frame.phase === "minus" || frame.phase === "dot" || frame.phase === "e" || frame.phase === "exponentSign" ? 1 : 0;
      case "literal":
        return Math.min(...frame.texts.map((t) => this.textCost(t.slice(frame.offset))));
    }
    return 0;
  }

  /**
   * After a comma a member must follow. When required members are missing, the cheapest finish adds exactly
   * those (objectRemaining counts them); otherwise it adds the cheapest optional or free member.
   */
  private cheapestOptionalMember(node: ObjectNode, used: readonly string[]): number {
    for (const name of node.required) if (!used.includes(name)) return 0;
    let best = Number.POSITIVE_INFINITY;
    for (const name of node.properties.keys()) {
      if (!used.includes(name)) best = Math.min(best, this.memberCost(node, name));
    }
    if (node.additional !== null) best = Math.min(best, 1 + this.shortestFreeKey(node, used) + this.textCost('":') + this.minLength(node.additional));
    return best;
  }

  /** `"name":` and the shortest value of a declared member. */
  private memberCost(node: ObjectNode, name: string): number {
    return this.textCost(`"${this.keyBytes(node).get(name)!}":`) + this.minLength(node.properties.get(name)!);
  }

  /** Length of the shortest printable-ASCII key that is neither declared nor used. */
  private shortestFreeKey(node: ObjectNode, used: readonly string[]): number {
    for (let length = 1; ; length++) {
      const taken = new Set([...node.properties.keys(), ...used].filter((k) => k.length === length)).size;
      if (taken < FREE_KEY_BYTES ** length) return length;
    }
  }

  /** Cost of a key in progress plus the rest of its object: finish the key, ":", its value, the members left. */
  private keyCost(frame: Extract<Frame, { t: "key" }>, object: Extract<Frame, { t: "object" }>): number {
    const { node, used } = object;
    let best = Number.POSITIVE_INFINITY;
    for (const [name, bytes] of this.keyBytes(node)) {
      if (used.includes(name) || !bytes.startsWith(frame.text)) continue;
      const rest = this.textCost(`${bytes.slice(frame.text.length)}":`) + this.minLength(node.properties.get(name)!);
      best = Math.min(best, rest + this.objectRemaining(node, [...used, name], false));
    }
    if (node.additional !== null && [...frame.text].every((c) => isFreeKeyByte(c.charCodeAt(0)))) {
      // One more byte turns an empty, declared or used text into a fresh free key.
      const extend = this.completedKey(node, used, frame.text) === null || node.properties.has(frame.text) ? 1 : 0;
      best = Math.min(best, extend + this.textCost('":') + this.minLength(node.additional) + this.objectRemaining(node, used, false));
    }
    return best;
  }

  private stackKey(stack: Stack): string {
    const parts: string[] = [];
    for (let s: Stack | null = stack; s !== null; s = s.parent) parts.push(this.frameKey(s.frame));
    return `${stack.whitespace}:${parts.join("/")}`;
  }

  private frameKey(frame: Frame): string {
    switch (frame.t) {
      case "root": return "R";
      case "value": return `V${this.nodeId(frame.node)}`;
      case "object": return `O${this.nodeId(frame.node)},${frame.phase},${JSON.stringify(frame.used)},${JSON.stringify(frame.key)}`;
      case "key": return `K${JSON.stringify(frame.text)}`;
      case "array": return `A${this.nodeId(frame.node)},${frame.phase},${frame.count}`;
      case "string": {
        // Without maxLength, lengths past minLength behave alike: one key for them keeps long strings cached.
        const length = frame.maxLength === Number.POSITIVE_INFINITY ? Math.min(frame.length, frame.minLength) : frame.length;
        return `S${frame.minLength},${frame.maxLength},${length},${frame.escape},${frame.utf8Left},${frame.utf8Low},${frame.utf8High}`;
      }
      case "number": return `N${frame.integer ? "i" : "f"},${frame.phase},${frame.digits}`;
      case "literal": return `L${frame.offset},${JSON.stringify(frame.texts)}`;
      case "pattern": return `P${this.patternId(frame.pattern)},${frame.states.join(".")},${frame.escape ? 1 : 0}`;
    }
  }

  private patternId(pattern: CompiledPattern): number {
    return idIn(this.patternIds, pattern);
  }

  private nodeId(node: SchemaNode): number {
    return idIn(this.nodeIds, node);
  }
}

const FREE_KEY_BYTES = 0x7e - 0x20 + 1 - 2; // printable ASCII without '"' and '\\'

function objectFrame(node: ObjectNode): Frame {
  return { t: "object", node, used: [], phase: "open", key: "" };
}

function isDigit(byte: number): boolean {
  return byte >= 0x30 && byte <= 0x39;
}

function isHexDigit(byte: number): boolean {
  return isDigit(byte) || (byte >= 0x41 && byte <= 0x46) || (byte >= 0x61 && byte <= 0x66);
}

function isFreeKeyByte(byte: number): boolean {
  return byte >= 0x20 && byte <= 0x7e && byte !== QUOTE && byte !== BACKSLASH;
}

/** Text → its UTF-8 bytes as a string of one char per byte (so byte matching is string indexing). */
function toByteString(text: string): string {
  return String.fromCharCode(...new TextEncoder().encode(text));
}

/** A small stable number for `key` (frame keys name nodes and patterns by these). */
function idIn<K>(ids: Map<K, number>, key: K): number {
  let id = ids.get(key);
  if (id === undefined) {
    id = ids.size;
    ids.set(key, id);
  }
  return id;
}
