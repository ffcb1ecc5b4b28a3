/**
 * The JSON-Schema subset that constrained decoding enforces, compiled to a small tree the grammar
 * automaton walks, and a validator for the same tree (tests and callers check outputs with it).
 *
 * Supported: type (one or a list), object with properties / required / additionalProperties (boolean or a
 * schema), array with items / minItems / maxItems, string with enum / minLength / maxLength, number, integer,
 * boolean, null, enum and const (with or without a type they must match), integer bounds (enforced as the list of
 * values, up to 1,000), number bounds (a decimal grid of up to 1,000 values), string pattern and format (regex.ts), anyOf, oneOf of a discriminated union, $ref to "#" or anywhere within the schema ($defs,
 * definitions), recursion included (a reference compiles once, so recursion is a cycle in the node graph),
 * number bounds at ±2^53 (which every written number meets). Annotations (title, description, default, examples,
 * $schema, $id, $comment) are ignored. Everything else (allOf, bounds too wide for a list, ...) is
 * refused with an error naming the keyword, so a schema is never silently weakened.
 */
import { ArtError } from "../core/errors.ts";
import { clipText } from "../core/text.ts";
import { compilePattern, FORMAT_PATTERNS, type CompiledPattern } from "./regex.ts";

export type SchemaNode =
  | { kind: "any" }
  | { kind: "object"; properties: Map<string, SchemaNode>; required: Set<string>; additional: SchemaNode | null }
  | { kind: "array"; items: SchemaNode; minItems: number; maxItems: number }
  /** `pattern`: a pattern (or format) the string must match; such strings are printable ASCII (regex.ts). */
  | { kind: "string"; minLength: number; maxLength: number; pattern?: CompiledPattern; patternSource?: string }
  | { kind: "number"; integer: boolean }
  | { kind: "boolean" }
  | { kind: "null" }
  /** enum / const: the value must be one of these, written as compact JSON text. */
  | { kind: "literal"; texts: string[] }
  | { kind: "anyOf"; options: SchemaNode[] };

// `$defs` / `definitions` hold schemas for `$ref`: read when referenced, ignored where they sit.
const ANNOTATIONS = new Set(["title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs", "definitions"]);

/** The root being compiled and its `$ref`s compiled so far (one node per reference: recursion makes a cycle). */
interface CompileContext {
  root: unknown;
  refs: Map<string, SchemaNode>;
}
const KEYWORDS_BY_TYPE: Record<string, Set<string>> = {
  object: new Set(["properties", "required", "additionalProperties"]),
  array: new Set(["items", "minItems", "maxItems"]),
  string: new Set(["minLength", "maxLength", "pattern", "format"]),
  number: new Set(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
  integer: new Set(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
  boolean: new Set(),
  null: new Set(),
};
const TYPES = Object.keys(KEYWORDS_BY_TYPE);

/** Thrown for schemas outside the subset; the server answers it with 400 `invalid_schema`. */
export function schemaError(path: string, message: string): ArtError {
  return new ArtError("invalid_schema", `response_format schema at ${path}: ${message}`);
}

/**
 * Enum and const values a schema may hold in all: OpenAI's limit for structured outputs. Constrained decoding
 * follows every value that fits what was written so far, so the cost of a step grows with them (10,000 values
 * took seconds of CPU per request, stalling every other request of the server).
 */
export const MAX_ENUM_VALUES = 1000;

/** Compiles a JSON Schema (already parsed JSON) into a SchemaNode, or throws ArtError("invalid_schema"). */
export function compileSchema(schema: unknown): SchemaNode {
  const node = compileNode(schema, "#", 0, { root: schema, refs: new Map() });
  checkProductiveCycles(node);
  const values = literalValues(node, new Set());
  if (values > MAX_ENUM_VALUES) {
    throw schemaError("#", `the schema holds ${values} enum/const values in all; constrained decoding here takes at most ${MAX_ENUM_VALUES} (OpenAI's limit for structured outputs): use a string with a description instead of the longest enum`);
  }
  return node;
}

/** The nodes a node's values are made of: anyOf options, array items, object properties and additional. */
export function childNodes(node: SchemaNode): SchemaNode[] {
  switch (node.kind) {
    case "anyOf": return node.options;
    case "array": return [node.items];
    case "object": return [...node.properties.values(), ...(node.additional ? [node.additional] : [])];
    default: return [];
  }
}

/** Enum/const values in the schema, each node counted once (a recursive schema's are not multiplied). */
function literalValues(node: SchemaNode, seen: Set<SchemaNode>): number {
  if (seen.has(node)) return 0;
  seen.add(node);
  return node.kind === "literal" ? node.texts.length : childNodes(node).reduce((n, child) => n + literalValues(child, seen), 0);
}

/**
 * A recursive schema must write something on each way round: an anyOf reaching itself through anyOfs alone would
 * let decoding loop without a byte. Every other cycle passes through an object or array.
 */
function checkProductiveCycles(root: SchemaNode): void {
  const state = new Map<SchemaNode, "open" | "done">();
  const walk = (node: SchemaNode, viaAnyOf: boolean) => {
    if (state.get(node) === "open" && viaAnyOf) throw schemaError("#", "a $ref cycle runs through anyOf/oneOf alone, so a value could nest without end before writing anything");
    if (state.has(node)) return;
    state.set(node, "open");
    if (node.kind === "anyOf") for (const option of node.options) walk(option, true);
    state.set(node, "done");
  };
  const all = new Set<SchemaNode>();
  const collect = (node: SchemaNode) => {
    if (all.has(node)) return;
    all.add(node);
    childNodes(node).forEach(collect);
  };
  collect(root);
  for (const node of all) {
    state.clear();
    walk(node, false);
  }
}

/** The schema a local reference ("#", "#/$defs/Name", any "#/..." JSON pointer) points at in `root`. */
function resolvePointer(root: unknown, ref: string, path: string): unknown {
  if (ref !== "#" && !ref.startsWith("#/")) throw schemaError(path, `$ref ${JSON.stringify(ref)} is not a reference within this schema ("#/$defs/Name"); other documents are not fetched`);
  let target: unknown = root;
  for (const raw of ref === "#" ? [] : ref.slice(2).split("/")) {
    const key = decodeURIComponent(raw).replace(/~1/g, "/").replace(/~0/g, "~");
    if (!isPlainObject(target) && !Array.isArray(target)) target = undefined;
    target = target === undefined ? undefined : (target as Record<string, unknown>)[key];
    if (target === undefined) throw schemaError(path, `$ref ${JSON.stringify(ref)} points at nothing in this schema`);
  }
  return target;
}

/** Nesting a schema may have; deeper ones are refused (a 5,000-deep schema overflowed the stack: a 500). */
const MAX_SCHEMA_DEPTH = 64;

function compileNode(schema: unknown, path: string, depth: number, context: CompileContext): SchemaNode {
  if (depth > MAX_SCHEMA_DEPTH) throw schemaError(clipText(path, 120), `nests deeper than ${MAX_SCHEMA_DEPTH} levels`);
  if (schema === true || (isPlainObject(schema) && Object.keys(schema).every((k) => ANNOTATIONS.has(k)))) return { kind: "any" };
  if (!isPlainObject(schema)) throw schemaError(path, "a schema must be an object (or true)");

  if ("$ref" in schema) {
    checkKeywords(schema, new Set(["$ref"]), path);
    const ref = schema.$ref;
    if (typeof ref !== "string") throw schemaError(path, "$ref must be a string");
    const known = context.refs.get(ref);
    if (known) return known;
    // The node exists before its body is compiled, so a reference inside the body (recursion) gets this node.
    const node = {} as SchemaNode;
    context.refs.set(ref, node);
    Object.assign(node, compileNode(resolvePointer(context.root, ref, path), ref, depth + 1, context));
    if (!("kind" in node)) throw schemaError(path, `$ref ${JSON.stringify(ref)} leads only to other references, never to a schema`);
    return node;
  }

  // zod and openai's zodResponseFormat write every literal as {type, const}.
  if ("const" in schema) return literalNode([schema.const], path, schema, ["const", "type"]);
  if ("enum" in schema) {
    if (!Array.isArray(schema.enum) || schema.enum.length === 0) throw schemaError(path, "enum must be a non-empty array");
    return literalNode(schema.enum, path, schema, ["enum", "type"]);
  }
  for (const keyword of ["anyOf", "oneOf"] as const) {
    if (!(keyword in schema)) continue;
    checkKeywords(schema, new Set([keyword]), path);
    const list = schema[keyword];
    if (!Array.isArray(list) || list.length === 0) throw schemaError(path, `${keyword} must be a non-empty array`);
    const options = list.map((option, i) => compileNode(option, `${path}/${keyword}/${i}`, depth + 1, context));
    // oneOf means exactly one option matches; decoding can promise that only when no value matches two of them.
    if (keyword === "oneOf" && !discriminated(options)) {
      throw schemaError(path, "oneOf is enforced only when its options are objects told apart by a required property with different const/enum values (a discriminated union); use anyOf if a value may match several");
    }
    return { kind: "anyOf", options };
  }

  const type = schema.type;
  if (type === undefined) checkKeywords(schema, new Set(), path);
  if (type === undefined) throw schemaError(path, "say which type the value has (type, enum, const or anyOf)");
  const types = Array.isArray(type) ? type : [type];
  if (types.length === 0) throw schemaError(path, "type must not be an empty list");
  for (const t of types) {
    if (typeof t !== "string" || !TYPES.includes(t)) throw schemaError(path, `unknown type ${JSON.stringify(t)} (supported: ${TYPES.join(", ")})`);
  }
  const allowed = new Set(["type"]);
  for (const t of types) for (const k of KEYWORDS_BY_TYPE[t]) allowed.add(k);
  checkKeywords(schema, allowed, path);
  if (types.length === 1 && types[0] === "integer") {
    const range = integerRange(schema, path);
    if (range) return range;
  }
  if (types.length === 1 && types[0] === "number") {
    const grid = numberGrid(schema, path);
    if (grid) return grid;
  }
  if (types.includes("number") || types.includes("integer")) checkUnboundingLimits(schema, path);
  const nodes = types.map((t) => typeNode(t as string, schema, path, depth, context));
  return nodes.length === 1 ? nodes[0] : { kind: "anyOf", options: nodes };
}

function typeNode(type: string, schema: Record<string, unknown>, path: string, depth: number, context: CompileContext): SchemaNode {
  switch (type) {
    case "object": {
      const properties = new Map<string, SchemaNode>();
      const props = schema.properties ?? {};
      if (!isPlainObject(props)) throw schemaError(path, "properties must be an object");
      for (const [name, sub] of Object.entries(props)) properties.set(name, compileNode(sub, `${path}/properties/${name}`, depth + 1, context));
      const required = new Set<string>();
      const req = schema.required ?? [];
      if (!Array.isArray(req) || !req.every((r) => typeof r === "string")) throw schemaError(path, "required must be an array of strings");
      for (const name of req as string[]) required.add(name);
      const extra = schema.additionalProperties;
      let additional: SchemaNode | null;
      if (extra === false) additional = null;
      else if (extra === undefined || extra === true) additional = { kind: "any" };
      else additional = compileNode(extra, `${path}/additionalProperties`, depth + 1, context);
      if (additional === null) {
        for (const name of required) {
          if (!properties.has(name)) throw schemaError(path, `required property "${name}" is not in properties and additionalProperties is false`);
        }
      }
      return { kind: "object", properties, required, additional };
    }
    case "array": {
      const minItems = count(schema.minItems, 0, path, "minItems");
      const maxItems = count(schema.maxItems, Number.POSITIVE_INFINITY, path, "maxItems");
      if (minItems > maxItems) throw schemaError(path, `minItems ${minItems} is larger than maxItems ${maxItems}`);
      const items = schema.items === undefined ? { kind: "any" as const } : compileNode(schema.items, `${path}/items`, depth + 1, context);
      return { kind: "array", items, minItems, maxItems };
    }
    case "string": {
      const minLength = count(schema.minLength, 0, path, "minLength");
      const maxLength = count(schema.maxLength, Number.POSITIVE_INFINITY, path, "maxLength");
      if (minLength > maxLength) throw schemaError(path, `minLength ${minLength} is larger than maxLength ${maxLength}`);
      const source = stringPattern(schema, path);
      if (source === null) return { kind: "string", minLength, maxLength };
      if (schema.minLength !== undefined || schema.maxLength !== undefined) {
        throw schemaError(path, "a pattern or format with minLength/maxLength is not enforced here: put the length into the pattern (e.g. ^[a-z]{2,8}$)");
      }
      return { kind: "string", minLength, maxLength, pattern: compilePattern(source, path), patternSource: source };
    }
    case "number":
    case "integer":
      return { kind: "number", integer: type === "integer" };
    case "boolean":
      return { kind: "boolean" };
    default:
      return { kind: "null" };
  }
}

/**
 * The pattern a string must match: its `pattern`, or the pattern of its `format`; null without either. `format` is
 * an annotation in JSON Schema 2020-12: alone it is enforced (as OpenAI's structured outputs do), beside a pattern
 * (zod writes both, its pattern being the format's definition) the pattern is what is enforced.
 */
function stringPattern(schema: Record<string, unknown>, path: string): string | null {
  const { pattern, format } = schema;
  if (pattern !== undefined) {
    if (typeof pattern !== "string") throw schemaError(path, "pattern must be a string");
    return pattern;
  }
  if (format === undefined) return null;
  if (typeof format !== "string" || !(format in FORMAT_PATTERNS)) {
    throw schemaError(path, `format ${JSON.stringify(format)} is not enforced here (supported: ${Object.keys(FORMAT_PATTERNS).join(", ")})`);
  }
  return FORMAT_PATTERNS[format]!;
}

function literalNode(values: unknown[], path: string, schema: Record<string, unknown>, keywords: string[]): SchemaNode {
  checkKeywords(schema, new Set(keywords), path);
  const texts = values.map((v) => JSON.stringify(v));
  if (texts.some((t) => t === undefined)) throw schemaError(path, "enum/const values must be JSON values");
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    for (const value of values) {
      if (!types.some((t) => jsonTypeMatches(value, t))) throw schemaError(path, `the value ${JSON.stringify(value)} is not of type ${JSON.stringify(schema.type)}`);
    }
  }
  return { kind: "literal", texts: [...new Set(texts)] };
}

function jsonTypeMatches(value: unknown, type: unknown): boolean {
  switch (type) {
    case "string": return typeof value === "string";
    case "number": return typeof value === "number";
    case "integer": return Number.isInteger(value);
    case "boolean": return typeof value === "boolean";
    case "null": return value === null;
    case "array": return Array.isArray(value);
    case "object": return isPlainObject(value);
    default: return false;
  }
}

/**
 * An integer with bounds that bind (zod's .int().min(1).max(7)) is enforced exactly as the list of its values, when
 * there are at most MAX_ENUM_VALUES of them (they count toward the schema's enum budget); null when no bound binds.
 */
function integerRange(schema: Record<string, unknown>, path: string): SchemaNode | null {
  const bounds = bindingBounds(schema, path);
  if (!bounds) return null;
  const low = bounds.lowOpen ? Math.floor(bounds.low) + 1 : Math.ceil(bounds.low);
  const high = bounds.highOpen ? Math.ceil(bounds.high) - 1 : Math.floor(bounds.high);
  if (low > high) throw schemaError(path, `no integer lies within the bounds (${low} > ${high})`);
  if (high - low + 1 > MAX_ENUM_VALUES) {
    throw schemaError(path, `an integer range of ${high - low + 1} values is too wide to enforce here (bounds that bind are enforced as a list of at most ${MAX_ENUM_VALUES} values; bounds at ±(2^53 - 1) are accepted as they are)`);
  }
  return { kind: "literal", texts: Array.from({ length: high - low + 1 }, (_, i) => String(low + i)) };
}

/** The bounds of a number as [low, high] with their exclusivity; null when none binds (all at or past ±(2^53 - 1)). */
function bindingBounds(schema: Record<string, unknown>, path: string): { low: number; high: number; lowOpen: boolean; highOpen: boolean } | null {
  const reach = 2 ** 53 - 1;
  let low = -reach, high = reach, lowOpen = false, highOpen = false;
  for (const key of ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] as const) {
    const bound = schema[key];
    if (bound === undefined) continue;
    if (typeof bound !== "number" || !Number.isFinite(bound)) throw schemaError(path, `keyword "${key}" must be a number`);
    if ((key === "minimum" || key === "exclusiveMinimum") && (bound > low || (bound === low && key === "exclusiveMinimum"))) [low, lowOpen] = [bound, key === "exclusiveMinimum"];
    if ((key === "maximum" || key === "exclusiveMaximum") && (bound < high || (bound === high && key === "exclusiveMaximum"))) [high, highOpen] = [bound, key === "exclusiveMaximum"];
  }
  return low <= -reach && high >= reach ? null : { low, high, lowOpen, highOpen };
}

/**
 * A number with bounds that bind is written on a decimal grid, as the list of its values: the finest of steps 0.01,
 * 0.1 and 1 that keeps at most MAX_ENUM_VALUES values within the bounds (a probability in [0, 1] gets 0, 0.01, ...,
 * 1). A narrowing, never a widening: every value written lies within the bounds. Null when no bound binds.
 */
function numberGrid(schema: Record<string, unknown>, path: string): SchemaNode | null {
  const bounds = bindingBounds(schema, path);
  if (!bounds) return null;
  const { low, high, lowOpen, highOpen } = bounds;
  const inside = (x: number) => (lowOpen ? x > low : x >= low) && (highOpen ? x < high : x <= high);
  for (const decimals of [2, 1, 0]) {
    const scale = 10 ** decimals;
    const first = Math.floor(low * scale) - 1, last = Math.ceil(high * scale) + 1;
    if (last - first + 1 > MAX_ENUM_VALUES + 2) continue;
    const texts: string[] = [];
    for (let k = first; k <= last; k++) {
      const text = String(Number((k / scale).toFixed(decimals)));
      if (inside(Number(text)) && texts.at(-1) !== text) texts.push(text);
    }
    if (texts.length === 0) throw schemaError(path, `no number on a 0.01 grid lies within the bounds (${lowOpen ? "(" : "["}${low}, ${high}${highOpen ? ")" : "]"})`);
    if (texts.length <= MAX_ENUM_VALUES) return { kind: "literal", texts };
  }
  throw schemaError(path, `number bounds ${lowOpen ? "(" : "["}${low}, ${high}${highOpen ? ")" : "]"} hold more than ${MAX_ENUM_VALUES} whole numbers, too many to enforce here (bounds that bind are enforced as a list of at most ${MAX_ENUM_VALUES} values on a 0.01, 0.1 or 1 grid; bounds at ±(2^53 - 1) are accepted as they are)`);
}

/**
 * Number bounds the output cannot break are accepted: the grammar writes at most 15 integer digits, so bounds at
 * or beyond ±2^53 (zod's .int(), JavaScript's safe integers) hold anyway. Bounds that would bind are refused: they
 * are not enforced here, and a schema is never silently weakened.
 */
function checkUnboundingLimits(schema: Record<string, unknown>, path: string): void {
  const reach = 2 ** 53 - 1;
  for (const [key, holds] of [["minimum", (b: number) => b <= -reach], ["exclusiveMinimum", (b: number) => b < -reach], ["maximum", (b: number) => b >= reach], ["exclusiveMaximum", (b: number) => b > reach]] as const) {
    const bound = schema[key];
    if (bound === undefined) continue;
    if (typeof bound !== "number" || !holds(bound)) {
      throw schemaError(path, `keyword "${key}" ${JSON.stringify(bound)} is not enforced by constrained decoding here (only bounds at or beyond ±(2^53 - 1), which every written number meets, are accepted)`);
    }
  }
}

/** Whether the options are objects with a required property whose literal values no two options share. */
function discriminated(options: SchemaNode[]): boolean {
  if (!options.every((o) => o.kind === "object")) return false;
  const objects = options as Extract<SchemaNode, { kind: "object" }>[];
  return [...objects[0]!.required].some((key) => {
    const seen = new Set<string>();
    return objects.every((o) => {
      const property = o.properties.get(key);
      if (!o.required.has(key) || property?.kind !== "literal") return false;
      if (property.texts.some((t) => seen.has(t))) return false;
      for (const t of property.texts) seen.add(t);
      return true;
    });
  });
}

function checkKeywords(schema: Record<string, unknown>, allowed: Set<string>, path: string): void {
  for (const key of Object.keys(schema)) {
    if (!allowed.has(key) && !ANNOTATIONS.has(key)) {
      throw schemaError(path, `keyword "${key}" is not supported by constrained decoding here (supported: type, properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, pattern, format, enum, const, anyOf, oneOf of a discriminated union, $ref, minimum/maximum leaving at most 1,000 integers or grid values, minimum/maximum at ±2^53)`);
    }
  }
}

function count(value: unknown, fallback: number, path: string, name: string): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) throw schemaError(path, `${name} must be a non-negative integer`);
  return value;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Returns null when `value` matches `node`, else a message naming the first mismatch by its JSON path. */
export function validateAgainstSchema(value: unknown, node: SchemaNode, path = "$"): string | null {
  switch (node.kind) {
    case "any":
      return null;
    case "literal": {
      const text = JSON.stringify(value);
      return node.texts.includes(text) ? null : `${path}: ${text} is not one of ${node.texts.join(", ")}`;
    }
    case "anyOf": {
      const errors = node.options.map((option) => validateAgainstSchema(value, option, path));
      return errors.includes(null) ? null : `${path}: matches no anyOf option (${errors.join("; ")})`;
    }
    case "null":
      return value === null ? null : `${path}: expected null`;
    case "boolean":
      return typeof value === "boolean" ? null : `${path}: expected a boolean`;
    case "number":
      if (typeof value !== "number") return `${path}: expected a number`;
      return node.integer && !Number.isInteger(value) ? `${path}: expected an integer` : null;
    case "string": {
      if (typeof value !== "string") return `${path}: expected a string`;
      const length = [...value].length;
      if (length < node.minLength || length > node.maxLength) return `${path}: string length ${length} outside [${node.minLength}, ${node.maxLength}]`;
      if (node.patternSource !== undefined && !new RegExp(node.patternSource, "u").test(value)) return `${path}: string does not match ${node.patternSource}`;
      return null;
    }
    case "array": {
      if (!Array.isArray(value)) return `${path}: expected an array`;
      if (value.length < node.minItems || value.length > node.maxItems) return `${path}: ${value.length} items outside [${node.minItems}, ${node.maxItems}]`;
      for (let i = 0; i < value.length; i++) {
        const error = validateAgainstSchema(value[i], node.items, `${path}[${i}]`);
        if (error) return error;
      }
      return null;
    }
    case "object": {
      if (!isPlainObject(value)) return `${path}: expected an object`;
      for (const name of node.required) if (!(name in value)) return `${path}: missing required property "${name}"`;
      for (const [name, item] of Object.entries(value)) {
        const sub = node.properties.get(name) ?? node.additional;
        if (!sub) return `${path}: property "${name}" is not allowed`;
        const error = validateAgainstSchema(item, sub, `${path}.${name}`);
        if (error) return error;
      }
      return null;
    }
  }
}
