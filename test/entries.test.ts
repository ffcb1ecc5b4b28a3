// The two public entries: `art-ts` (lib/mod.ts), small enough to read in one sitting and holding everything the
// cookbook imports, and `art-ts/engine` (lib/engine.ts), the engine's low-level API. Both are wired the same way in
// package.json (Node, tslab), deno.json (Deno) and the build; Node imports both from a build of lib/ here (Deno in
// test/deno/smoke.ts, tslab when the notebooks run: ART_TEST_NOTEBOOKS=1).
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import ts from "typescript";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = join(import.meta.dirname, "..");
const readJson = (file: string) => JSON.parse(readFileSync(join(ROOT, file), "utf8"));

/** The names a module exports, values and types alike, as the TypeScript checker sees them. */
function exportedNames(file: string): string[] {
  const program = ts.createProgram([join(ROOT, file)], {
    allowImportingTsExtensions: true, noEmit: true, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2023, types: ["node"], skipLibCheck: true,
  });
  const checker = program.getTypeChecker();
  const symbol = checker.getSymbolAtLocation(program.getSourceFile(join(ROOT, file))!)!;
  return checker.getExportsOfModule(symbol).map((s) => s.name).sort();
}

/** The names the cookbook's notebooks import from `art-ts`. */
function cookbookImports(): string[] {
  const names = new Set<string>();
  for (const file of readdirSync(join(ROOT, "notebooks")).filter((f) => f.endsWith(".ipynb"))) {
    const cells = (readJson(join("notebooks", file)) as { cells: { cell_type: string; source: string | string[] }[] }).cells;
    const code = cells.filter((c) => c.cell_type === "code").map((c) => (Array.isArray(c.source) ? c.source.join("") : c.source)).join("\n");
    for (const [, list] of code.matchAll(/import\s*\{([^}]*)\}\s*from\s*"art-ts"/g)) {
      for (const name of list.split(",").map((n) => n.trim().replace(/^type\s+/, "")).filter(Boolean)) names.add(name);
    }
  }
  return [...names].sort();
}

describe("art-ts: the entry notebooks and agents import", () => {
  const names = exportedNames("lib/mod.ts");

  // About a hundred: the core API, and of each environment only what its notebook uses; the environments' whole API
  // is `envs` (ART·E's: `arte`).
  it("exports about a hundred names at most (values and types)", () => {
    expect(names.length).toBeLessThanOrEqual(110);
    expect(names).toContain("envs");
    expect(names).toContain("TrainableModel");
  });

  it("exports everything the cookbook imports", () => {
    const used = cookbookImports();
    expect(used.length).toBeGreaterThan(30);
    expect(used.filter((name) => !names.includes(name))).toEqual([]);
  });

  it("keeps the engine's low-level API out: it is art-ts/engine's", () => {
    for (const name of ["loadCausalLM", "CpuBackend", "Transformer", "Trainer", "openSafetensors", "readAdapter"]) expect(names).not.toContain(name);
    const engine = exportedNames("lib/engine.ts");
    for (const name of ["loadCausalLM", "CpuBackend", "CudaBackend", "Transformer", "DifferentiableTransformer", "Trainer", "loadTokenizer",
      "openSafetensors", "readAdapter", "writeAdapter", "ModelServer", "cudaAvailability"]) expect(engine).toContain(name);
  });
});

describe("the entries are wired alike for every runtime", () => {
  it("package.json (Node, and tslab through typesVersions) and deno.json name both", () => {
    const pkg = readJson("package.json");
    expect(pkg.exports["."]).toEqual({ types: "./dist/lib/mod.d.ts", default: "./dist/lib/mod.js" });
    expect(pkg.exports["./engine"]).toEqual({ types: "./dist/lib/engine.d.ts", default: "./dist/lib/engine.js" });
    expect(pkg.typesVersions["*"].engine).toEqual(["./dist/lib/engine.d.ts"]);
    expect(readJson("deno.json").imports).toEqual({ "art-ts": "./lib/mod.ts", "art-ts/engine": "./lib/engine.ts" });
  });

  const work = join(ROOT, "test", ".tmp");
  mkdirSync(work, { recursive: true });
  const pkgDir = mkdtempSync(join(work, "entries-"));
  afterAll(() => rmSync(pkgDir, { recursive: true, force: true }));

  it("Node imports art-ts and art-ts/engine by name from a build of lib/, and the engine runs the embedded model", () => {
    const build = spawnSync(process.execPath, [join(ROOT, "node_modules/typescript/bin/tsc"), "-p", join(ROOT, "tsconfig.build.json"), "--outDir", join(pkgDir, "dist")],
      { encoding: "utf8" });
    expect(build.status, build.stdout + build.stderr).toBe(0);
    // The package as npm installs it: its package.json's exports, resolved by Node's self-reference of the package name.
    const { name, type, exports } = readJson("package.json");
    writeFileSync(join(pkgDir, "package.json"), JSON.stringify({ name, type, exports }));
    writeFileSync(join(pkgDir, "probe.mjs"), `
      import * as art from "art-ts";
      import * as engine from "art-ts/engine";
      const lm = await engine.loadCausalLM(${JSON.stringify(join(ROOT, "models", "tictactoe-tiny"))}, { device: "cpu", log: () => {} });
      const [out] = await lm.generate([{ messages: [{ role: "user", content: "x__\\n___\\n___" }], temperature: 0, maxTokens: 9 }]);
      lm.free();
      console.log(JSON.stringify({ art: typeof art.TrainableModel, engine: typeof engine.Trainer, text: out.text }));
    `);
    const probe = spawnSync(process.execPath, [join(pkgDir, "probe.mjs")], { encoding: "utf8", cwd: pkgDir });
    expect(probe.status, probe.stderr).toBe(0);
    const result = JSON.parse(probe.stdout);
    expect(result).toMatchObject({ art: "function", engine: "function" });
    expect(result.text).toMatch(/^<move>[ABC][123]<\/move>$/);
  }, 120_000);
});
