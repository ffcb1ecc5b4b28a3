/**
 * Property-based fuzzing (fast-check, fixed seeds, bounded runs) of the parsers that read what users, models and
 * judges send: a judge's answer, generated tool calls, JSON schemas with the constrained-decoding grammar, and
 * safetensors files. Each property says what must hold for every input: a clear error of the documented kind or a
 * correct result, never a TypeError, a RangeError or a hang.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it, vi } from "vitest";
import { ArtError } from "../../lib/core/errors.ts";
import { openSafetensors, writeSafetensors } from "../../lib/model/safetensors.ts";
import { parseToolCalls, TOOL_CALL_CLOSE, TOOL_CALL_OPEN } from "../../lib/model/tool-calls.ts";
import { InvalidAnswer, parseJudgeAnswer } from "../../lib/ruler/answer.ts";
import { JsonGrammar } from "../../lib/serve/json-grammar.ts";
import { compileSchema, validateAgainstSchema, type SchemaNode } from "../../lib/serve/json-schema.ts";

const RUNS = { seed: 20261125, numRuns: 300 };
const root = fs.mkdtempSync(path.join(os.tmpdir(), "art-ts-fuzz-"));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

/** Text built from the characters parsers care about, so brackets, quotes and tags meet often. */
const markup = fc.array(fc.constantFrom("{", "}", "[", "]", '"', "\\", ":", ",", " ", "\n", "a", "1", "score", '"scores"', "```", "<think>", "</think>", TOOL_CALL_OPEN, TOOL_CALL_CLOSE, '{"name": "f", "arguments": {}}'), { maxLength: 200 }).map((parts) => parts.join(""));
const text = fc.oneof(fc.string({ maxLength: 300 }), markup);

describe("a judge's answer", () => {
  it("reads into scores or an InvalidAnswer, with JSON.parse work at most four times its length", () => {
    const parse = vi.spyOn(JSON, "parse");
    fc.assert(fc.property(text, fc.integer({ min: 1, max: 4 }), (answer, count) => {
      parse.mockClear();
      try {
        const entries = parseJudgeAnswer(answer, count, []);
        expect(entries).toHaveLength(count);
        for (const e of entries) expect(e.score >= 0 && e.score <= 1).toBe(true);
      } catch (error) {
        expect(error).toBeInstanceOf(InvalidAnswer);
      }
      const work = parse.mock.calls.reduce((sum, [json]) => sum + String(json).length, 0);
      expect(work).toBeLessThanOrEqual(4 * Math.max(answer.trim().length, 1));
    }), RUNS);
    parse.mockRestore();
  });

  it("finds a well-formed answer in prose that has no brackets or quotes of its own", () => {
    const prose = fc.string({ maxLength: 80 }).map((s) => s.replace(/[[\]{}"`<>\\]/g, ""));
    const scores = fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { minLength: 1, maxLength: 5 });
    fc.assert(fc.property(prose, scores, prose, (before, values, after) => {
      const json = JSON.stringify({ scores: values.map((score, i) => ({ trajectory_id: String(i + 1), explanation: "ok", score })) });
      expect(parseJudgeAnswer(`${before}${json}${after}`, values.length, []).map((e) => e.score)).toEqual(values);
    }), RUNS);
  });
});

describe("generated tool calls", () => {
  it("never throw: malformed blocks become errors, and the text outside them is kept", () => {
    fc.assert(fc.property(text, (generated) => {
      const parsed = parseToolCalls(generated);
      expect(typeof parsed.content).toBe("string");
      for (const call of parsed.toolCalls) expect(() => JSON.parse(call.function.arguments)).not.toThrow();
    }), RUNS);
  });

  it("round-trip: a call written in the Hermes format parses back to its name and arguments", () => {
    const name = fc.stringMatching(/^[A-Za-z0-9_-]{1,64}$/);
    fc.assert(fc.property(name, fc.dictionary(fc.string({ maxLength: 8 }), fc.jsonValue({ maxDepth: 3 })), (fn, args) => {
      const parsed = parseToolCalls(`${TOOL_CALL_OPEN}\n${JSON.stringify({ name: fn, arguments: args })}\n${TOOL_CALL_CLOSE}`);
      expect(parsed.errors).toEqual([]);
      expect(parsed.toolCalls).toHaveLength(1);
      expect(parsed.toolCalls[0]!.function.name).toBe(fn);
      expect(JSON.parse(parsed.toolCalls[0]!.function.arguments)).toEqual(JSON.parse(JSON.stringify(args)));
    }), RUNS);
  });
});

/** Whether the grammar of `node` takes `json` whole. */
const accepts = (node: SchemaNode, json: string) => {
  const grammar = new JsonGrammar(node);
  const state = grammar.advance(grammar.initial(), new TextEncoder().encode(json));
  return state.length > 0 && grammar.isComplete(state);
};

describe("JSON schemas and the constrained-decoding grammar", () => {
  /** Schemas inside the supported subset. */
  const schema: fc.Arbitrary<Record<string, unknown>> = fc.letrec((tie) => ({
    node: fc.oneof({ depthSize: "small", withCrossShrink: true },
      fc.constantFrom({ type: "string" }, { type: "number" }, { type: "integer" }, { type: "boolean" }, { type: "null" }, { type: "string", maxLength: 3 }),
      fc.array(fc.oneof(fc.string({ maxLength: 4 }), fc.integer(), fc.boolean()), { minLength: 1, maxLength: 4 }).map((values) => ({ enum: values })),
      fc.record({ type: fc.constant("array"), items: tie("node"), maxItems: fc.integer({ min: 0, max: 3 }) }),
      fc.dictionary(fc.stringMatching(/^[a-z]{1,4}$/), tie("node"), { maxKeys: 3 }).map((properties) => ({ type: "object", properties, required: Object.keys(properties), additionalProperties: false })),
      fc.array(tie("node"), { minLength: 1, maxLength: 3 }).map((options) => ({ anyOf: options })),
    ),
  })).node as fc.Arbitrary<Record<string, unknown>>;

  it("compile, or are refused with invalid_schema, whatever JSON they are", () => {
    fc.assert(fc.property(fc.jsonValue({ maxDepth: 4 }), (value) => {
      try {
        compileSchema(value);
      } catch (error) {
        expect(error).toBeInstanceOf(ArtError);
        expect((error as ArtError).code).toBe("invalid_schema");
      }
    }), RUNS);
  });

  /** Values a schema of the arbitrary above accepts. */
  function valueOf(raw: Record<string, unknown>): fc.Arbitrary<unknown> {
    if (Array.isArray(raw.enum)) return fc.constantFrom(...raw.enum);
    if (Array.isArray(raw.anyOf)) return fc.oneof(...(raw.anyOf as Record<string, unknown>[]).map(valueOf));
    switch (raw.type) {
      case "string": return fc.string({ maxLength: typeof raw.maxLength === "number" ? raw.maxLength : 6 });
      case "number": return fc.integer({ min: -1e6, max: 1e6 }).map((n) => n / 8);
      case "integer": return fc.integer({ min: -1e9, max: 1e9 });
      case "boolean": return fc.boolean();
      case "null": return fc.constant(null);
      case "array": return fc.array(valueOf(raw.items as Record<string, unknown>), { maxLength: raw.maxItems as number });
      default: return fc.record(Object.fromEntries(Object.entries(raw.properties as Record<string, Record<string, unknown>>).map(([k, v]) => [k, valueOf(v)])));
    }
  }

  it("the grammar accepts every value the schema allows, written compactly", () => {
    fc.assert(fc.property(schema.chain((raw) => fc.tuple(fc.constant(raw), valueOf(raw))), ([raw, value]) => {
      const node = compileSchema(raw);
      const json = JSON.stringify(value);
      expect(validateAgainstSchema(value, node), json).toBeNull();
      expect(accepts(node, json), json).toBe(true);
    }), { ...RUNS, numRuns: 500 });
  });

  /** The value with its `k`-th part (depth first) changed just past what a schema may allow. */
  function nearMiss(value: unknown, k: number): unknown {
    let seen = 0;
    const walk = (v: unknown): unknown => {
      const mine = seen++ === k;
      if (typeof v === "string") return mine ? `${v}x` : v;
      if (typeof v === "number") return mine ? v + 0.5 : v;
      if (Array.isArray(v)) return mine ? [...v, v[0] ?? null] : v.map(walk);
      if (v !== null && typeof v === "object") return mine ? { ...v, zz: 1 } : Object.fromEntries(Object.entries(v).map(([key, x]) => [key, walk(x)]));
      return mine ? "x" : v;
    };
    return walk(value);
  }

  it("the grammar accepts exactly the compact JSON the validator accepts", () => {
    const candidate = schema.chain((raw) => fc.tuple(fc.constant(raw), fc.oneof(fc.jsonValue({ maxDepth: 3 }), fc.tuple(valueOf(raw), fc.nat({ max: 20 })).map(([v, k]) => nearMiss(v, k)))));
    fc.assert(fc.property(candidate, ([raw, value]) => {
      const node = compileSchema(raw);
      const json = JSON.stringify(value);
      // Numbers the grammar bounds (15 integer and 15 fraction digits) are left to the validator's own tests.
      fc.pre(!/\d{16}|e/i.test(json));
      expect(accepts(node, json), json).toBe(validateAgainstSchema(JSON.parse(json), node) === null);
    }), { ...RUNS, numRuns: 500 });
  });
});

describe("string patterns", () => {
  /** Patterns built from regex syntax, so classes, groups, quantifiers and anchors meet often. */
  const pattern = fc.array(fc.constantFrom("a", "b", "-", ".", "\\d", "\\w", "\\.", "[a-c]", "[^a]", "(", ")", "(?:", "|", "*", "+", "?", "{2}", "{1,3}", "^", "$", "\\", "]", "{"), { maxLength: 12 }).map((parts) => parts.join(""));

  it("compile, or are refused with invalid_schema, whatever they are", () => {
    fc.assert(fc.property(fc.oneof(pattern, fc.string({ maxLength: 20 })), (source) => {
      try {
        compileSchema({ type: "string", pattern: source });
      } catch (error) {
        expect(error).toBeInstanceOf(ArtError);
        expect((error as ArtError).code).toBe("invalid_schema");
      }
    }), RUNS);
  });

  it("the grammar accepts a string only when JavaScript's RegExp matches it (and every printable match it can write)", () => {
    const ascii = fc.string({ unit: fc.constantFrom(..."ab-.1_ c".split("")), maxLength: 8 });
    fc.assert(fc.property(pattern, ascii, (source, value) => {
      let node: SchemaNode;
      try {
        node = compileSchema({ type: "string", pattern: source });
      } catch {
        return; // refused: the property above
      }
      const regex = new RegExp(source, "u");
      // Anchors apply to the whole pattern here (^a|b$ reads as ^(a|b)$): a narrowing, so only the implication holds
      // for alternations; without a top-level | the two agree exactly.
      const accepted = accepts(node, JSON.stringify(value));
      if (accepted) expect(regex.test(value), `${source} on ${JSON.stringify(value)}`).toBe(true);
      if (!/\|/.test(source) || !/^\^|\$$/.test(source)) expect(accepted, `${source} on ${JSON.stringify(value)}`).toBe(regex.test(value));
    }), { ...RUNS, numRuns: 1000 });
  });
});

describe("safetensors files", () => {
  const valid = path.join(root, "valid.safetensors");
  writeSafetensors(valid, {
    a: { dtype: "F32", shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) },
    b: { dtype: "BF16", shape: [4], data: Float32Array.from([0.5, -1, 2, 8]) },
  });
  const bytes = fs.readFileSync(valid);

  it("open and read, or fail with an ArtError naming the file, however their bytes are damaged", () => {
    const damage = fc.array(fc.record({ at: fc.nat({ max: bytes.length - 1 }), value: fc.integer({ min: 0, max: 255 }) }), { minLength: 1, maxLength: 8 });
    let file = 0;
    fc.assert(fc.property(damage, fc.nat({ max: bytes.length }), (edits, cut) => {
      const damaged = Buffer.from(bytes.subarray(0, cut));
      for (const { at, value } of edits) if (at < damaged.length) damaged[at] = value;
      const target = path.join(root, `damaged-${file++}.safetensors`);
      fs.writeFileSync(target, damaged);
      try {
        const store = openSafetensors(target);
        for (const name of store.names()) expect(store.readF32(name).length).toBe(store.info(name)!.shape.reduce((a, b) => a * b, 1));
        store.close();
      } catch (error) {
        expect(error, String(error)).toBeInstanceOf(ArtError);
        expect((error as Error).message).toContain(target);
      } finally {
        fs.rmSync(target);
      }
    }), RUNS);
  });
});
