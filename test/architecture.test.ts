// The folder layout is the architecture, and imports point down (docs/architecture.md). This reads every import of
// lib/ (static, type-only, re-exports and dynamic, through TypeScript's own pre-parser) and fails on a file cycle, a
// folder cycle, an import from a lower area into a higher one or within one layer, and a lib/ folder the layer table
// below does not place.
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative } from "node:path";
import ts from "typescript";
import { describe, expect, it } from "vitest";

const LIB = join(import.meta.dirname, "..", "lib");

/**
 * The areas of lib/, bottom layer first; an area may import only areas of lower layers. `mod` and `engine` are the
 * two public entries (lib/mod.ts and lib/engine.ts), `cli` the command.
 */
export const LAYERS: readonly (readonly string[])[] = [
  ["core"],
  ["model", "envs", "notebook", "ruler"],
  ["cuda", "grpo"],
  ["load"],
  ["serve"],
  ["trainable"],
  ["demo"],
  ["cli", "mod", "engine"],
];

export type ImportGraph = Map<string, string[]>;

/** Every .ts file under `dir`, relative to lib/. */
function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sources(path);
    return entry.name.endsWith(".ts") ? [relative(LIB, path)] : [];
  });
}

/** file → the lib/ files it imports (relative to lib/). */
export function libImports(): ImportGraph {
  const graph: ImportGraph = new Map();
  for (const file of sources(LIB)) {
    const { importedFiles } = ts.preProcessFile(readFileSync(join(LIB, file), "utf8"), true, true);
    graph.set(file, importedFiles.filter((i) => i.fileName.startsWith(".")).map((i) => normalize(join(dirname(file), i.fileName))));
  }
  return graph;
}

/** The area of a lib/ file: its top folder, or its stem for a file at the top (mod.ts → "mod"). */
export function areaOf(file: string): string {
  const parts = file.split("/");
  return parts.length > 1 ? parts[0] : parts[0].replace(/\.ts$/, "");
}

/** Imports that break the layering: into an unplaced area, sideways within a layer, or up. */
export function layeringViolations(graph: ImportGraph, layers: readonly (readonly string[])[] = LAYERS): string[] {
  const layer = new Map(layers.flatMap((areas, i) => areas.map((area) => [area, i] as const)));
  const problems = new Set<string>();
  for (const [file, imports] of graph) {
    const from = areaOf(file);
    if (!layer.has(from)) problems.add(`lib/${from} is not placed in the layer table of test/architecture.test.ts`);
    for (const target of imports) {
      const to = areaOf(target);
      if (from === to || !layer.has(from) || !layer.has(to)) continue;
      if (layer.get(to)! >= layer.get(from)!) problems.add(`lib/${file} imports lib/${target}: ${from} may not depend on ${to}`);
    }
  }
  return [...problems];
}

/** The cycles of a directed graph, each as the path that closes it (one per strongly connected part). */
export function cycles(graph: ImportGraph): string[][] {
  const state = new Map<string, "open" | "done">();
  const found: string[][] = [];
  const stack: string[] = [];
  const visit = (node: string) => {
    state.set(node, "open");
    stack.push(node);
    for (const next of graph.get(node) ?? []) {
      if (state.get(next) === "open") found.push([...stack.slice(stack.indexOf(next)), next]);
      else if (!state.has(next)) visit(next);
    }
    stack.pop();
    state.set(node, "done");
  };
  for (const node of [...graph.keys()].sort()) if (!state.has(node)) visit(node);
  return found;
}

/** The folder graph: a folder imports another when one of its files imports a file of the other. */
export function folderGraph(graph: ImportGraph): ImportGraph {
  const folders: ImportGraph = new Map();
  for (const [file, imports] of graph) {
    const from = dirname(file);
    const targets = new Set(folders.get(from) ?? []);
    for (const target of imports) if (dirname(target) !== from) targets.add(dirname(target));
    folders.set(from, [...targets]);
  }
  return folders;
}

describe("lib/'s imports point down", () => {
  const graph = libImports();

  it("reads the imports of every lib/ file", () => {
    expect(graph.get("model/training.ts")).toContain("model/transformer.ts");
    expect(graph.get("engine.ts")).toContain("model/mod.ts");
    // type-only imports count: a cycle of types is still a cycle
    expect(graph.get("model/lora.ts")).toContain("model/backend.ts");
  });

  it("has no file cycles", () => {
    expect(cycles(graph).map((cycle) => cycle.join(" → "))).toEqual([]);
  });

  it("has no folder cycles (subfolders included)", () => {
    expect(cycles(folderGraph(graph)).map((cycle) => cycle.join(" → "))).toEqual([]);
  });

  it("imports only areas of lower layers: the engine knows no device choice and no algorithm, CUDA no algorithm", () => {
    expect(layeringViolations(graph)).toEqual([]);
  });

  it("catches what it is meant to catch", () => {
    const bad: ImportGraph = new Map([
      ["model/transformer.ts", ["cuda/backend.ts", "model/backend.ts"]],
      ["cuda/backend.ts", ["grpo/train.ts"]],
      ["grpo/train.ts", ["grpo/loss.ts"]],
      ["grpo/loss.ts", ["grpo/train.ts"]],
      ["newarea/x.ts", ["core/errors.ts"]],
      ["model/backend.ts", []],
    ]);
    expect(layeringViolations(bad)).toEqual([
      "lib/model/transformer.ts imports lib/cuda/backend.ts: model may not depend on cuda",
      "lib/cuda/backend.ts imports lib/grpo/train.ts: cuda may not depend on grpo",
      "lib/newarea is not placed in the layer table of test/architecture.test.ts",
    ]);
    expect(cycles(bad)).toEqual([["grpo/train.ts", "grpo/loss.ts", "grpo/train.ts"]]);
    expect(cycles(folderGraph(new Map([["model/a.ts", ["model/cpu/b.ts"]], ["model/cpu/b.ts", ["model/c.ts"]]])))).toEqual([["model", "model/cpu", "model"]]);
  });
});
