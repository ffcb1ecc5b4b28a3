/**
 * Executes notebooks headless under both kernels and checks what they produced (npm run notebooks).
 *
 *   node scripts/notebook-run.ts [notebooks/x.ipynb ...] [--kernel deno|tslab|node] [--defaults] [--cuda-emulator]
 *
 * `--kernel node` runs a notebook's code cells, in order, as one Node module in its folder, without Jupyter (plots
 * and transcripts print as text): what a machine without Jupyter can run of the cookbook, such as the GPU check's.
 * Its output goes to notebooks/.executed/<name>.node.txt; a non-zero exit fails the run. With `--cuda-emulator` the
 * module finds the CUDA kernel emulator where it looks for a GPU (test/cuda/emulated-cuda-hooks.ts) and runs with
 * ART_NB_DEVICE=cuda: the notebook's GPU path, host logic and kernels, without a GPU (minutes: the emulator runs a
 * CUDA thread as a fiber); its output goes to <name>.node-cuda-emulator.txt.
 *
 * Each notebook runs with Jupyter's nbconvert (Debian's jupyter-nbconvert); a cell error fails the run.
 * The executed copy goes to notebooks/.executed/<name>.<kernel>.ipynb (and .html), then is checked:
 * every code cell ran, no error outputs, and for the cookbook's notebooks at least one plot bundle (plotly JSON
 * object + SVG as HTML, no script + text), the HTML export keeps the plots' SVGs, and the file stays under 1 MB.
 * A notebook from elsewhere (test/notebook/entries.ipynb) runs from a copy in notebooks/.executed, so both kernels
 * resolve `art-ts` from there as they do for the cookbook.
 * Notebook parameters come from the environment (ART_NB_*), which the kernels inherit; CI's small sizes apply
 * when unset (ART_NB_STEPS=3, ART_NB_GROUPS=2, ART_NB_GROUP_SIZE=4), or with `--defaults` each notebook's own defaults:
 * the run a workshop participant gets. Needs the kernels registered (npm run kernels) and dist/ built.
 */
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const KERNELS = ["deno", "tslab"] as const;
const RUNNERS = [...KERNELS, "node"] as const;
const PLOTLY_MIME = "application/vnd.plotly.v1+json";
/** A saved run of a notebook stays under this size (plots are SVG, a few kB each). */
const MAX_SAVED_BYTES = 1_000_000;

/** Small sizes for CI unless the caller set them. */
const CI_DEFAULTS: Record<string, string> = { ART_NB_STEPS: "3", ART_NB_GROUP_SIZE: "4", ART_NB_GROUPS: "2" };

export interface Output {
  output_type: string;
  data?: Record<string, unknown>;
  ename?: string;
  evalue?: string;
  text?: string | string[];
}
export interface Cell {
  cell_type: string;
  execution_count?: number | null;
  /** nbclient's timing record; tslab sends no execute_input, so its cells have no execution_count, only this. */
  metadata?: { execution?: Record<string, string> };
  outputs?: Output[];
  source: string | string[];
}

function text(value: unknown): string {
  return Array.isArray(value) ? value.join("") : typeof value === "string" ? value : "";
}

/**
 * Problems found in an executed notebook; empty when it is good. `html`: its nbconvert HTML export; `plots`: it must
 * show plots (the cookbook's do); `savedBytes`: the executed file's size.
 */
export function checkExecuted(notebook: { cells: Cell[] }, html: string, plots = true, savedBytes = 0): string[] {
  const problems: string[] = [];
  const code = notebook.cells.filter((c) => c.cell_type === "code" && text(c.source).trim() !== "");
  code.forEach((cell, i) => {
    const replied = cell.metadata?.execution?.["shell.execute_reply"] !== undefined;
    if (!replied && (cell.execution_count === null || cell.execution_count === undefined)) problems.push(`code cell ${i + 1} did not run`);
    for (const out of cell.outputs ?? []) {
      if (out.output_type === "error") problems.push(`code cell ${i + 1} raised ${out.ename}: ${out.evalue}`);
    }
    // A display that went missing or landed in another cell (a kernel timing problem) shows up here.
    if (/\bdisplay\(/.test(text(cell.source)) && !(cell.outputs ?? []).some((o) => o.output_type === "display_data")) {
      problems.push(`code cell ${i + 1} calls display() but has no display output`);
    }
  });
  const bundles = code.flatMap((c) => c.outputs ?? []).filter((o) => o.data?.[PLOTLY_MIME] !== undefined).map((o) => o.data!);
  if (plots && bundles.length === 0) problems.push("no plot bundle (application/vnd.plotly.v1+json) was produced");
  for (const bundle of bundles) {
    const figure = bundle[PLOTLY_MIME] as { data?: unknown } | string;
    if (typeof figure !== "object" || !Array.isArray(figure.data)) problems.push("a plotly bundle is not a JSON object with a data array");
    if (!text(bundle["text/html"]).includes("<svg ")) problems.push("a plot bundle has no text/html SVG");
    if (text(bundle["text/html"]).includes("<script")) problems.push("a plot's HTML has a script (it would vanish on reload)");
    if (text(bundle["text/plain"]).trim() === "") problems.push("a plot bundle has no text/plain summary");
  }
  if (bundles.length > 0 && html.split("<svg ").length - 1 < bundles.length) problems.push("the HTML export lost the plots' SVGs");
  if (savedBytes > MAX_SAVED_BYTES) problems.push(`the executed notebook is ${(savedBytes / 1e6).toFixed(1)} MB (a saved run must stay under 1 MB)`);
  return problems;
}

/**
 * Runs the notebook's code cells, in order, as one ES module beside it (so relative paths and the art-ts import
 * resolve as in a kernel); stdout and stderr go to `<out>.txt`. Returns the problems: empty when it exited 0.
 */
function runAsModule(notebook: string, out: string, env: NodeJS.ProcessEnv, nodeOptions: string[] = []): string[] {
  const cells = (JSON.parse(readFileSync(notebook, "utf8")) as { cells: Cell[] }).cells;
  const module = join(dirname(notebook), `.${basename(notebook, ".ipynb")}.notebook-run.ts`);
  writeFileSync(module, cells.filter((c) => c.cell_type === "code").map((c) => text(c.source)).join("\n;\n") + "\n");
  try {
    const run = spawnSync(process.execPath, [...nodeOptions, module], { cwd: dirname(notebook), env, encoding: "utf8", maxBuffer: 256 * 1024 * 1024 });
    writeFileSync(`${out}.txt`, `${run.stdout ?? ""}${run.stderr ?? ""}`);
    if (run.status === 0) return [];
    return [`exit ${run.status ?? run.signal}:\n${(run.stderr || run.error?.message || "").split("\n").slice(-25).join("\n")}`];
  } finally {
    rmSync(module, { force: true });
  }
}

function jupyter(): string {
  return process.env.JUPYTER ?? (existsSync("/usr/bin/jupyter") ? "/usr/bin/jupyter" : "jupyter");
}

function main(): void {
  const args = process.argv.slice(2);
  const kernelIndex = args.indexOf("--kernel");
  const kernels = kernelIndex >= 0 ? [args.splice(kernelIndex, 2)[1] as (typeof RUNNERS)[number]] : [...KERNELS];
  const ownDefaults = args.includes("--defaults");
  if (ownDefaults) args.splice(args.indexOf("--defaults"), 1);
  const cudaEmulator = args.includes("--cuda-emulator");
  if (cudaEmulator) args.splice(args.indexOf("--cuda-emulator"), 1);
  if (cudaEmulator && kernels.some((k) => k !== "node")) throw new Error("--cuda-emulator runs with --kernel node only");
  if (kernels.some((k) => !RUNNERS.includes(k))) throw new Error(`--kernel must be one of ${RUNNERS.join(", ")}`);
  const notebooks = args.length > 0 ? args.map((a) => resolve(a)) :
    readdirSync(join(root, "notebooks")).filter((f) => f.endsWith(".ipynb")).sort().map((f) => join(root, "notebooks", f));
  if (!existsSync(join(root, "dist", "lib", "mod.js"))) {
    console.error("notebook-run: dist/ is not built (the notebooks import art-ts from it): run npm run build first.");
    process.exit(1);
  }
  if (kernels.some((k) => k !== "node")) {
    if (!existsSync(join(root, ".jupyter", "kernels", "deno")) || !existsSync(join(root, ".jupyter", "kernels", "tslab"))) {
      console.error("notebook-run: the kernels are not registered: run npm run kernels first.");
      process.exit(1);
    }
    const probe = spawnSync(jupyter(), ["nbconvert", "--version"], { encoding: "utf8" });
    if (probe.status !== 0) {
      console.error(`notebook-run: ${jupyter()} nbconvert does not run (${probe.error?.message ?? probe.stderr.trim().split("\n").at(-1)}). ` +
        "Install Debian's jupyter-nbconvert python3-nbclient jupyter-client, or point JUPYTER at a jupyter that has nbconvert.");
      process.exit(1);
    }
  }
  const outDir = join(root, "notebooks", ".executed");
  mkdirSync(outDir, { recursive: true });
  const env = {
    ...(ownDefaults ? {} : CI_DEFAULTS),
    ...process.env,
    JUPYTER_PATH: join(root, ".jupyter"),
    JUPYTER_RUNTIME_DIR: join(root, ".jupyter", "runtime"),
    DENO_NO_UPDATE_CHECK: "1",
    NO_COLOR: "1",
  };
  const failures: string[] = [];
  for (const notebook of notebooks) {
    const cookbook = dirname(notebook) === join(root, "notebooks");
    // A kernel runs in its notebook's folder: other notebooks run from a copy beside the executed ones.
    const source = cookbook ? notebook : join(outDir, `${basename(notebook, ".ipynb")}.input.ipynb`);
    if (!cookbook) copyFileSync(notebook, source);
    for (const kernel of kernels) {
      const name = `${basename(notebook, ".ipynb")}.${kernel}`;
      const started = Date.now();
      if (kernel === "node") {
        const problems = cudaEmulator
          ? runAsModule(notebook, join(outDir, `${name}-cuda-emulator`), { ...env, ART_NB_DEVICE: "cuda" },
            ["--import", join(root, "test", "cuda", "emulated-cuda-hooks.ts")])
          : runAsModule(notebook, join(outDir, name), env);
        console.log(`${problems.length === 0 ? "ok  " : "FAIL"} ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
        for (const p of problems) console.log(`     ${p}`);
        if (problems.length > 0) failures.push(name);
        continue;
      }
      const run = spawnSync(jupyter(), ["nbconvert", "--to", "notebook", "--execute", `--ExecutePreprocessor.kernel_name=${kernel}`,
        "--ExecutePreprocessor.timeout=900", "--output-dir", outDir, "--output", `${name}.ipynb`, source], { env, encoding: "utf8" });
      let problems: string[];
      if (run.status !== 0) {
        problems = [`nbconvert failed (exit ${run.status}):\n${(run.stderr || run.error?.message || "").split("\n").slice(-25).join("\n")}`];
      } else {
        const executed = join(outDir, `${name}.ipynb`);
        const html = spawnSync(jupyter(), ["nbconvert", "--to", "html", "--output-dir", outDir, executed], { env, encoding: "utf8" });
        problems = html.status !== 0 ? [`HTML export failed: ${html.stderr}`] :
          checkExecuted(JSON.parse(readFileSync(executed, "utf8")), readFileSync(join(outDir, `${name}.html`), "utf8"), cookbook, statSync(executed).size);
      }
      const seconds = ((Date.now() - started) / 1000).toFixed(1);
      console.log(`${problems.length === 0 ? "ok  " : "FAIL"} ${name} (${seconds} s)`);
      for (const p of problems) console.log(`     ${p}`);
      if (problems.length > 0) failures.push(name);
    }
  }
  if (failures.length > 0) {
    console.error(`notebook-run: ${failures.length} run(s) failed: ${failures.join(", ")}. Executed copies are in ${outDir}.`);
    process.exit(1);
  }
  console.log(`notebook-run: all ${notebooks.length * kernels.length} run(s) passed; executed copies in ${outDir}.`);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
