/**
 * The cookbook's notebooks, read without running them (the runner executes them: ART_TEST_NOTEBOOKS=1):
 * every ART_NB_* parameter a notebook reads is documented in its first markdown cell (with the same default
 * where the code's default is a number) and in docs/cookbook.md, notebooks import only what both kernels load,
 * and docs/cookbook.md lists every notebook.
 */
import { readdirSync, readFileSync } from "node:fs";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

interface NotebookCell { cell_type: string; source: string | string[]; outputs?: unknown[]; execution_count?: number | null }

const NOTEBOOKS = join(import.meta.dirname, "..", "..", "notebooks");
const COOKBOOK_DOC = readFileSync(join(import.meta.dirname, "..", "..", "docs", "cookbook.md"), "utf8");
const text = (source: string | string[]) => (Array.isArray(source) ? source.join("") : source);

function readNotebook(file: string): { intro: string; code: string; ran: number } {
  const cells = (JSON.parse(readFileSync(join(NOTEBOOKS, file), "utf8")) as { cells: NotebookCell[] }).cells;
  const codeCells = cells.filter((c) => c.cell_type === "code");
  return {
    intro: cells[0]?.cell_type === "markdown" ? text(cells[0].source) : "",
    code: codeCells.map((c) => text(c.source)).join("\n"),
    ran: codeCells.filter((c) => (c.outputs?.length ?? 0) > 0 || (c.execution_count ?? null) !== null).length,
  };
}

/** The parameters a notebook reads: name → the default as written in the code. */
function parametersRead(code: string): Map<string, string> {
  return new Map([...code.matchAll(/env(?:Number|String)\(\s*"(ART_NB_\w+)"\s*,\s*([^)]*?)\s*\)/g)].map((m) => [m[1]!, m[2]!]));
}

/** Problems with how a notebook's first markdown cell documents the parameters it reads. */
function parameterProblems(intro: string, code: string): string[] {
  const problems: string[] = [];
  for (const [name, codeDefault] of parametersRead(code)) {
    const row = new RegExp(`^\\|\\s*\`${name}\`\\s*\\|\\s*([^|]*)\\|`, "m").exec(intro);
    if (row === null) {
      problems.push(`${name} is read but not in the first cell's table`);
      continue;
    }
    const documented = /`([^`]*)`/.exec(row[1]!)?.[1];
    if (/^-?[\d.e_-]+$/i.test(codeDefault) && Number(documented) !== Number(codeDefault.replaceAll("_", ""))) {
      problems.push(`${name}: the table says ${row[1]!.trim()} but the code's default is ${codeDefault}`);
    }
  }
  return problems;
}

const notebooks = readdirSync(NOTEBOOKS).filter((f) => f.endsWith(".ipynb")).sort();

/**
 * Packages a notebook may import besides art-ts, openai and node: builtins: exactly these, each checked to load in both
 * kernels (a notebook importing them, run by scripts/notebook-run.ts under Deno and tslab). Deno resolves them through
 * the root node_modules; tslab type-checks with TypeScript 5.0's node10 resolution, which ignores package exports, so
 * only subpaths a package mirrors at its top level load there: `@langchain/core/*` do, `@langchain/langgraph/prebuilt`
 * does not (and a stub beside the notebooks would fix tslab but break Deno, which takes it for the package).
 */
const EXTRA_IMPORTS: Record<string, string[]> = {
  "art-e-langgraph.ipynb": ["@langchain/langgraph", "@langchain/openai", "@langchain/core/errors", "@langchain/core/messages", "@langchain/core/tools"],
};

describe("parameter documentation check", () => {
  it("finds undocumented parameters and wrong defaults, and accepts expressions as defaults", () => {
    const code = 'const A = envNumber("ART_NB_A", 10);\nconst B = envString("ART_NB_B", "x");\nconst C = envNumber("ART_NB_C", 1_000);\nconst D = envNumber("ART_NB_D", big ? 1 : 2);';
    const intro = "| variable | default |\n| --- | --- |\n| `ART_NB_A` | `20` | steps |\n| `ART_NB_C` | `1000` | n |\n| `ART_NB_D` | depends | d |";
    expect(parameterProblems(intro, code)).toEqual([
      "ART_NB_A: the table says `20` but the code's default is 10",
      "ART_NB_B is read but not in the first cell's table",
    ]);
  });
});

it("git ignores Jupyter's checkpoint folders and the runner's executed copies", () => {
  for (const file of ["notebooks/.ipynb_checkpoints/2048-checkpoint.ipynb", ".ipynb_checkpoints/x.ipynb", "notebooks/.executed/2048.ipynb"]) {
    const ignored = spawnSync("git", ["check-ignore", "--quiet", "--no-index", file], { cwd: join(NOTEBOOKS, "..") }).status;
    expect(ignored, file).toBe(0);
  }
});

describe.each(notebooks)("notebooks/%s", (file) => {
  const { intro, code, ran } = readNotebook(file);

  it("is committed without outputs (a saved run carries megabytes of plots; clear them before committing)", () => {
    expect(ran, "code cells with outputs or an execution count").toBe(0);
  });

  it("documents every parameter it reads in its first markdown cell, with the code's default", () => {
    expect(intro).not.toBe("");
    expect(parameterProblems(intro, code)).toEqual([]);
  });

  it("imports only art-ts, openai and node: builtins (what both kernels load)", () => {
    const sources = [...code.matchAll(/^import\s[\s\S]*?\sfrom\s+"([^"]+)";/gm)].map((m) => m[1]!);
    expect(sources).toContain("art-ts");
    const extra = EXTRA_IMPORTS[file] ?? [];
    expect(sources.filter((s) => s !== "art-ts" && s !== "openai" && !s.startsWith("node:") && !extra.includes(s))).toEqual([]);
  });

  it("is listed in docs/cookbook.md with its parameters", () => {
    expect(COOKBOOK_DOC).toContain(`\`${file}\``);
    for (const name of parametersRead(code).keys()) expect(COOKBOOK_DOC, name).toContain(`\`${name}\``);
  });
});
