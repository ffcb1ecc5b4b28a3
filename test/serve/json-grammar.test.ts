import { describe, expect, it } from "vitest";
import { z } from "zod";
import { seededRandom } from "../../lib/core/random.ts";
import { compileSchema, validateAgainstSchema, type SchemaNode } from "../../lib/serve/json-schema.ts";
import { JsonGrammar, type GrammarState } from "../../lib/serve/json-grammar.ts";

const encoder = new TextEncoder();

function accepts(grammar: JsonGrammar, text: string): boolean {
  const state = grammar.advance(grammar.initial(), encoder.encode(text));
  return state.length > 0 && grammar.isComplete(state);
}

/**
 * Plays a random "model" byte by byte under the grammar and a byte budget, the way token masking does with a
 * byte-level vocabulary: any byte that keeps the grammar alive and the completion within budget may be drawn.
 */
function randomText(grammar: JsonGrammar, budget: number, random: () => number): string {
  let state: GrammarState = grammar.initial();
  const bytes: number[] = [];
  for (let left = budget; ; left--) {
    const options: { byte: number; next: GrammarState }[] = [];
    for (let byte = 0; byte < 256; byte++) {
      const next = grammar.feedAll(state, byte);
      if (next.length > 0 && grammar.bytesToComplete(next) <= left - 1) options.push({ byte, next });
    }
    const complete = grammar.isComplete(state);
    if (complete && (options.length === 0 || random() < 0.05)) break;
    expect(options.length, `dead end after ${JSON.stringify(new TextDecoder().decode(Uint8Array.from(bytes)))}`).toBeGreaterThan(0);
    // Favour structure bytes a little so random texts are not all one long string.
    const pick = options[Math.floor(random() * options.length)];
    bytes.push(pick.byte);
    state = pick.next;
  }
  expect(bytes.length).toBeLessThanOrEqual(budget);
  return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(bytes));
}

const personSchema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer" },
    tags: { type: "array", items: { enum: ["a", "b", "ça"] }, minItems: 1, maxItems: 3 },
    pet: { anyOf: [{ type: "null" }, { type: "object", properties: { kind: { const: "cat" } }, required: ["kind"], additionalProperties: false }] },
    score: { type: ["number", "boolean"] },
  },
  required: ["name", "age", "tags"],
  additionalProperties: false,
};

describe("JSON grammar", () => {
  it("accepts valid texts and rejects invalid ones", () => {
    const grammar = new JsonGrammar(compileSchema(personSchema));
    expect(accepts(grammar, '{"name":"Ann","age":3,"tags":["a"]}')).toBe(true);
    expect(accepts(grammar, '{ "tags": ["ça", "b"], "age": -12, "name": "x", "pet": {"kind":"cat"}, "score": 1.5e3 }')).toBe(true);
    expect(accepts(grammar, '{"name":"Ann","age":3}')).toBe(false); // tags missing
    expect(accepts(grammar, '{"name":"Ann","age":3.5,"tags":["a"]}')).toBe(false); // integer
    expect(accepts(grammar, '{"name":"Ann","age":3,"tags":[]}')).toBe(false); // minItems
    expect(accepts(grammar, '{"name":"Ann","age":3,"tags":["a"],"x":1}')).toBe(false); // additionalProperties
    expect(accepts(grammar, '{"name":"Ann","name":"B","age":3,"tags":["a"]}')).toBe(false); // duplicate key
    expect(accepts(grammar, '{"name":"0123456789abc","age":3,"tags":["a"]}')).toBe(false); // maxLength
    expect(accepts(grammar, '{"name":"Ann","age":03,"tags":["a"]}')).toBe(false); // leading zero
  });

  it("json_object accepts any object and nothing else", () => {
    const grammar = new JsonGrammar({ kind: "object", properties: new Map(), required: new Set(), additional: { kind: "any" } });
    expect(accepts(grammar, '{"a":[1,{"b":null}],"c":"\\u00e9\\n","d":true}')).toBe(true);
    expect(accepts(grammar, "[1]")).toBe(false);
    expect(accepts(grammar, '{"a":1,}')).toBe(false);
    expect(accepts(grammar, '{"a":"\x01"}')).toBe(false);
  });

  it("a \\u escape never names a surrogate: JSON.parse would make half a pair, which is not Unicode", () => {
    const grammar = new JsonGrammar({ kind: "object", properties: new Map(), required: new Set(), additional: { kind: "any" } });
    for (const escape of ["\\u0041", "\\uD7FF", "\\ud7ff", "\\uE000", "\\uFFFF", "\\uc800"]) expect(accepts(grammar, `{"a":"${escape}"}`), escape).toBe(true);
    for (const escape of ["\\uD800", "\\udb3a", "\\uDC00", "\\udfff", "\\ud83d\\ude00"]) expect(accepts(grammar, `{"a":"${escape}"}`), escape).toBe(false);
  });

  it("follows $ref: reused definitions, recursion, and a shortest completion through the cycle", () => {
    // A linked list as zod's z.lazy writes it: the value is null or a node whose next is the list again.
    const list = compileSchema({
      $ref: "#/$defs/list",
      $defs: { list: { anyOf: [{ type: "null" }, { type: "object", properties: { v: { type: "integer" }, next: { $ref: "#/$defs/list" } }, required: ["v", "next"], additionalProperties: false }] } },
    });
    const grammar = new JsonGrammar(list);
    expect(accepts(grammar, '{"v":1,"next":{"v":2,"next":null}}')).toBe(true);
    expect(accepts(grammar, '{"v":1,"next":{"v":"x","next":null}}')).toBe(false);
    expect(accepts(grammar, '{"v":1}')).toBe(false);
    expect(grammar.bytesToComplete(grammar.initial())).toBe("null".length);
    // Deep in the recursion the cheapest way out is to close every level: `null}}}`.
    const deep = grammar.advance(grammar.initial(), encoder.encode('{"v":1,"next":{"v":2,"next":{"v":3,"next":'));
    expect(grammar.bytesToComplete(deep)).toBe("null}}}".length);
    expect(validateAgainstSchema(JSON.parse('{"v":1,"next":{"v":2,"next":null}}'), list)).toBeNull();
    expect(validateAgainstSchema(JSON.parse('{"v":1,"next":{"v":2}}'), list)).not.toBeNull();
  });

  it("knows the shortest completion from the start", () => {
    const grammar = new JsonGrammar(compileSchema(personSchema));
    const shortest = '{"name":"","age":0,"tags":["a"]}';
    expect(grammar.bytesToComplete(grammar.initial())).toBe(shortest.length);
  });

  it("the completion cost is exact: it falls by one per byte along the cheapest path", () => {
    const grammar = new JsonGrammar(compileSchema(personSchema));
    let state = grammar.advance(grammar.initial(), encoder.encode('{"tags":["ç'));
    for (let cost = grammar.bytesToComplete(state); cost > 0; cost--) {
      let best: GrammarState | null = null;
      for (let byte = 0; byte < 256 && !best; byte++) {
        const next = grammar.feedAll(state, byte);
        if (next.length > 0 && grammar.bytesToComplete(next) === cost - 1) best = next;
      }
      expect(best, `no byte lowers the cost ${cost}`).not.toBeNull();
      state = best!;
    }
    expect(grammar.isComplete(state)).toBe(true);
  });

  const schemas: Record<string, unknown> = {
    person: personSchema,
    anything: { type: "object" },
    array: { type: "array", items: { type: ["integer", "string", "null"] }, maxItems: 4 },
    nested: { type: "object", properties: { a: { type: "object", properties: { b: { type: "array", items: { type: "number" }, minItems: 2 } }, required: ["b"] } }, required: ["a"] },
    literals: { enum: [1, 12, "x", { k: [true] }] },
    // A tree by $ref: children are trees (recursion), a reused definition (what zodResponseFormat extracts).
    tree: {
      type: "object", properties: { label: { $ref: "#/$defs/label" }, children: { type: "array", items: { $ref: "#" }, maxItems: 2 } },
      required: ["label", "children"], additionalProperties: false, $defs: { label: { type: "string", maxLength: 3 } },
    },
    // Patterns: anchored with repeats and classes; unanchored (anything around a match), with a quote to escape.
    code: { type: "string", pattern: "^[a-z]{2,4}-\\d+(\\.[A-Z])?$" },
    unanchored: { type: "string", pattern: 'ab|c"d' },
    formats: {
      type: "object", additionalProperties: false, required: ["when", "who", "id", "ip"],
      properties: { when: { type: "string", format: "date-time" }, who: { type: "string", format: "email" }, id: { type: "string", format: "uuid" }, ip: { type: "string", format: "ipv4" } },
    },
  };

  for (const [name, schema] of Object.entries(schemas)) {
    it(`random walks within the budget always parse and validate (${name})`, () => {
      const node: SchemaNode = compileSchema(schema);
      const grammar = new JsonGrammar(node);
      const random = seededRandom(name.length * 7919);
      const minimum = grammar.bytesToComplete(grammar.initial());
      for (let trial = 0; trial < 40; trial++) {
        const budget = minimum + Math.floor(random() * 60);
        const text = randomText(grammar, budget, random);
        const value = JSON.parse(text);
        expect(validateAgainstSchema(value, node), text).toBeNull();
      }
    });
  }
});

describe("string patterns and formats", () => {
  it("accepts exactly the strings the pattern matches (checked against JavaScript's RegExp), in printable ASCII", () => {
    const grammar = new JsonGrammar(compileSchema({ type: "string", pattern: "^[a-z]{2,4}-\\d+$" }));
    for (const text of ["ab-1", "abcd-0042"]) expect(accepts(grammar, JSON.stringify(text)), text).toBe(true);
    for (const text of ["a-1", "abcde-1", "ab-", "AB-1", "ab-1x", "ab-１"]) expect(accepts(grammar, JSON.stringify(text)), text).toBe(false);
    const unanchored = new JsonGrammar(compileSchema({ type: "string", pattern: 'ab|c"d' }));
    expect(["xxaby", 'zc"d', "ab"].every((text) => accepts(unanchored, JSON.stringify(text)))).toBe(true);
    expect(["a", "xb", "c d"].some((text) => accepts(unanchored, JSON.stringify(text)))).toBe(false);
    // The shortest completion counts the pattern's shortest match and the quotes.
    const uuid = new JsonGrammar(compileSchema({ type: "string", format: "uuid" }));
    expect(uuid.bytesToComplete(uuid.initial())).toBe(36 + 2);
    expect(uuid.bytesToComplete(uuid.advance(uuid.initial(), encoder.encode('"0123')))).toBe(32 + 1);
  });

  it("every format's random strings pass an independent validator (zod's)", () => {
    const checks: Record<string, z.ZodType> = {
      "date-time": z.iso.datetime({ offset: true }), date: z.iso.date(), time: z.iso.time(), email: z.email(), uuid: z.uuid(),
      ipv4: z.ipv4(), ipv6: z.ipv6(), hostname: z.string().regex(/^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/),
    };
    for (const [format, check] of Object.entries(checks)) {
      const grammar = new JsonGrammar(compileSchema({ type: "string", format }));
      const random = seededRandom(format.length * 131);
      const minimum = grammar.bytesToComplete(grammar.initial());
      for (let trial = 0; trial < 25; trial++) {
        const text = JSON.parse(randomText(grammar, minimum + Math.floor(random() * 40), random)) as string;
        // time: zod's z.iso.time() takes no offset; the JSON Schema format requires one, so strip it for zod.
        const checked = format === "time" ? text.replace(/(Z|[+-]\d\d:\d\d)$/, "") : text;
        expect(check.safeParse(checked).success, `${format}: ${text}`).toBe(true);
      }
    }
  });

  it("refuses patterns and combinations it cannot enforce, naming the construct", () => {
    expect(() => compileSchema({ type: "string", pattern: "(a)\\1" })).toThrow(/backreferences are not supported/);
    expect(() => compileSchema({ type: "string", pattern: "a(?=b)" })).toThrow(/lookaround and named groups are not supported/);
    expect(() => compileSchema({ type: "string", pattern: "a^b" })).toThrow(/anchors are supported only at the very start and end/);
    expect(() => compileSchema({ type: "string", pattern: "(ab" })).toThrow(/pattern "\(ab" is not a valid regular expression \(.*Unterminated group/);
    expect(() => compileSchema({ type: "string", pattern: "a{300}" })).toThrow(/repeats up to 256 are supported/);
    expect(() => compileSchema({ type: "string", pattern: "^a$", maxLength: 3 })).toThrow(/pattern or format with minLength\/maxLength is not enforced here/);
    expect(() => compileSchema({ type: "string", format: "uri" })).toThrow(/format "uri" is not enforced here \(supported: date, time, date-time, email, uuid, hostname, ipv4, ipv6\)/);
  });
});

describe("JSON schema subset", () => {
  it("refuses keywords it cannot enforce, naming them", () => {
    // Beside a pattern, format is the annotation JSON Schema says it is (zod writes both): the pattern is enforced.
    expect(accepts(new JsonGrammar(compileSchema({ type: "string", pattern: "^a$", format: "date" })), '"a"')).toBe(true);
    expect(() => compileSchema({ $ref: "#/$defs/x" })).toThrow(/\$ref "#\/\$defs\/x" points at nothing in this schema/);
    expect(() => compileSchema({ $ref: "https://example.com/s.json" })).toThrow(/is not a reference within this schema/);
    expect(() => compileSchema({ $ref: "#/$defs/a", $defs: { a: { $ref: "#/$defs/b" }, b: { $ref: "#/$defs/a" } } })).toThrow(/leads only to other references/);
    expect(() => compileSchema({ $ref: "#/$defs/a", $defs: { a: { anyOf: [{ $ref: "#/$defs/a" }, { type: "null" }] } } })).toThrow(/cycle runs through anyOf\/oneOf alone/);
    expect(() => compileSchema({ type: "date" })).toThrow(/unknown type "date"/);
    expect(() => compileSchema({ type: "object", required: ["a"], additionalProperties: false })).toThrow(/required property "a"/);
    expect(() => compileSchema({ type: "array", minItems: 3, maxItems: 1 })).toThrow(/minItems 3 is larger than maxItems 1/);
  });

  it("takes what zod and zodResponseFormat write: literals as {type, const}, .int() as ±2^53 bounds, discriminated unions as oneOf", () => {
    expect(compileSchema({ type: "string", const: "done" })).toEqual({ kind: "literal", texts: ['"done"'] });
    expect(() => compileSchema({ type: "number", const: "done" })).toThrow(/the value "done" is not of type "number"/);
    expect(() => compileSchema({ type: "integer", enum: [1, 2.5] })).toThrow(/the value 2.5 is not of type "integer"/);
    const safeInt = compileSchema({ type: "integer", minimum: -9007199254740991, maximum: 9007199254740991 });
    expect(safeInt).toEqual({ kind: "number", integer: true });
    // Bounds that bind: the integers in range, exactly (zod's .int().min(1).max(7)), up to 1,000 of them.
    const day = new JsonGrammar(compileSchema({ type: "integer", minimum: 1, maximum: 7 }));
    expect(["1", "7", "4"].every((text) => accepts(day, text))).toBe(true);
    expect(["0", "8", "-1", "1.5", "17", "01"].some((text) => accepts(day, text))).toBe(false);
    expect(compileSchema({ type: "integer", exclusiveMinimum: -1.5, exclusiveMaximum: 2 })).toEqual({ kind: "literal", texts: ["-1", "0", "1"] });
    expect(() => compileSchema({ type: "integer", minimum: 0 })).toThrow(/an integer range of 9007199254740992 values is too wide to enforce here/);
    expect(() => compileSchema({ type: "integer", minimum: 3, maximum: 2 })).toThrow(/no integer lies within the bounds \(3 > 2\)/);
    // A number with bounds that bind: a decimal grid within them, as fine as 1,000 values allow.
    const probability = compileSchema({ type: "number", minimum: 0, maximum: 1 }) as { kind: "literal"; texts: string[] };
    expect([probability.texts.length, probability.texts[0], probability.texts[50], probability.texts.at(-1)]).toEqual([101, "0", "0.5", "1"]);
    const score = new JsonGrammar(compileSchema({ type: "number", exclusiveMinimum: 1, maximum: 10 }));
    expect(["1.01", "7.25", "10"].every((text) => accepts(score, text))).toBe(true);
    expect(["1", "10.01", "7.255", "-3"].some((text) => accepts(score, text))).toBe(false);
    expect((compileSchema({ type: "number", minimum: -50, maximum: 50 }) as { texts: string[] }).texts).toHaveLength(101); // a 1 grid
    expect(() => compileSchema({ type: "number", minimum: 0 })).toThrow(/number bounds \[0, 9007199254740991\] hold more than 1000 whole numbers/);
    expect(() => compileSchema({ type: ["number", "null"], minimum: 0 })).toThrow(/keyword "minimum" 0 is not enforced by constrained decoding here/);
    const shape = (kind: string, extra: Record<string, unknown>) => ({
      type: "object", properties: { kind: { type: "string", const: kind }, ...extra }, required: ["kind", ...Object.keys(extra)], additionalProperties: false,
    });
    const union = compileSchema({ oneOf: [shape("circle", { r: { type: "number" } }), shape("square", { side: { type: "number" } })] });
    const grammar = new JsonGrammar(union);
    expect(accepts(grammar, '{"kind":"circle","r":2}')).toBe(true);
    expect(accepts(grammar, '{"kind":"circle","side":2}')).toBe(false);
    expect(validateAgainstSchema({ kind: "square", side: 1 }, union)).toBeNull();
    expect(() => compileSchema({ oneOf: [{ type: "string" }, { type: "number" }] })).toThrow(/oneOf is enforced only when its options are objects told apart/);
    expect(() => compileSchema({ oneOf: [shape("a", {}), shape("a", { x: { type: "null" } })] })).toThrow(/oneOf is enforced only/);
  });

  it("validates values against the compiled schema", () => {
    const node = compileSchema(personSchema);
    expect(validateAgainstSchema({ name: "a", age: 1, tags: ["b"] }, node)).toBeNull();
    expect(validateAgainstSchema({ name: "a", age: 1.5, tags: ["b"] }, node)).toMatch(/\$\.age: expected an integer/);
    expect(validateAgainstSchema({ name: "a", age: 1, tags: ["z"] }, node)).toMatch(/\$\.tags\[0\]/);
  });
});
