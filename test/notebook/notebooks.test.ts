import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import process from "node:process";
import { pathToFileURL } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { checkExecuted, type Cell, type Output } from "../../scripts/notebook-run.ts";

const PLOTLY = "application/vnd.plotly.v1+json";
const plotOutput = (html = "<svg viewBox=\"0 0 1 1\"></svg>"): Output => ({
  output_type: "display_data",
  data: { [PLOTLY]: { data: [], layout: {} }, "text/html": html, "text/plain": "summary" },
});
const cell = (source: string, outputs: Output[], ran = true): Cell => ({
  cell_type: "code", source, outputs, execution_count: ran ? 1 : null, metadata: ran ? { execution: { "shell.execute_reply": "t" } } : {},
});
const exported = `<svg viewBox="0 0 1 1"></svg> <svg viewBox="0 0 1 1"></svg>`;

describe("executed-notebook checks", () => {
  it("accepts a notebook whose plots and displays all landed", () => {
    const nb = { cells: [cell("await display(a)", [plotOutput()]), cell("await display(b)", [plotOutput()])] };
    expect(checkExecuted(nb, exported, true, 200_000)).toEqual([]);
  });

  it("reports errors, cells that did not run, lost displays, missing or scripted plots and a heavy file", () => {
    expect(checkExecuted({ cells: [cell("x", [{ output_type: "error", ename: "TypeError", evalue: "boom" }])] }, "")).toEqual([
      "code cell 1 raised TypeError: boom",
      "no plot bundle (application/vnd.plotly.v1+json) was produced",
    ]);
    const problems = checkExecuted({ cells: [cell("await display(a)", [plotOutput()]), cell("await display(b)", []), cell("y", [], false), cell("await display(c)", [plotOutput("<script>Plotly.newPlot(el)</script>")])] }, exported, true, 4_800_000);
    expect(problems).toEqual([
      "code cell 2 calls display() but has no display output",
      "code cell 3 did not run",
      "a plot bundle has no text/html SVG",
      "a plot's HTML has a script (it would vanish on reload)",
      "the executed notebook is 4.8 MB (a saved run must stay under 1 MB)",
    ]);
    expect(checkExecuted({ cells: [cell("await display(a)", [plotOutput()])] }, "")).toEqual(["the HTML export lost the plots' SVGs"]);
  });
});

// Executes every notebook under both kernels (minutes): needs Debian's Jupyter (jupyter-nbconvert,
// python3-nbclient, jupyter-client) and the kernels, which this test registers itself.
describe.skipIf(!process.env.ART_TEST_NOTEBOOKS)("notebooks, headless under the Deno and tslab kernels (ART_TEST_NOTEBOOKS=1)", () => {
  const run = (args: string[]) => spawnSync(process.execPath, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  beforeAll(() => {
    const build = spawnSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.build.json"], { encoding: "utf8" });
    expect(build.status, build.stdout + build.stderr).toBe(0);
    const kernels = run(["scripts/notebook-kernels.ts"]);
    expect(kernels.status, kernels.stderr).toBe(0);
  }, 300_000);

  it("run without errors and produce their plots", () => {
    const notebooks = run(["scripts/notebook-run.ts"]);
    expect(notebooks.status, notebooks.stdout + notebooks.stderr).toBe(0);
    expect(notebooks.stdout).toMatch(/all \d+ run\(s\) passed/);
    // art-ts and art-ts/engine load in both kernels (tslab type-checks the subpath through package.json's typesVersions)
    const entries = run(["scripts/notebook-run.ts", "test/notebook/entries.ipynb"]);
    expect(entries.status, entries.stdout + entries.stderr).toBe(0);
    expect(entries.stdout).toMatch(/all 2 run\(s\) passed/);
  }, 900_000);

  // The executed notebooks' HTML in a real browser (Debian's chromium, driven by puppeteer-core; ART_TEST_BROWSER=1,
  // which CI sets): every plot renders as a sized SVG, transcripts toggle, the progress bars' last state is there.
  // Full-page screenshots go to test/.tmp/browser/ as artifacts. Needs the run above (same file, so it runs first).
  it.runIf(process.env.ART_TEST_BROWSER === "1")("render in headless Chromium: plots drawn, transcripts toggle, progress shown", async () => {
    const { default: puppeteer } = await import("puppeteer-core");
    const executablePath = ["/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"].find((p) => existsSync(p));
    expect(executablePath, "no Chromium: apt-get install chromium (Debian)").toBeDefined();
    const shots = join("test", ".tmp", "browser");
    mkdirSync(shots, { recursive: true });
    const browser = await puppeteer.launch({ executablePath, args: ["--no-sandbox", "--headless=new"] });
    try {
      for (const name of ["tic-tac-toe", "2048", "art-e", "auto-rl"]) {
        for (const kernel of ["deno", "tslab"]) {
          const executed = join("notebooks", ".executed", `${name}.${kernel}`);
          const plots = JSON.stringify(JSON.parse(readFileSync(`${executed}.ipynb`, "utf8"))).split('"application/vnd.plotly.v1+json"').length - 1;
          const page = await browser.newPage();
          // Offline: the page gets its own file and nothing from the network (nbconvert's template asks for CDNs).
          await page.setRequestInterception(true);
          page.on("request", (request) => (/^(file|data):/.test(request.url()) ? request.continue() : request.abort()));
          await page.setViewport({ width: 1100, height: 900 });
          await page.goto(pathToFileURL(resolve(`${executed}.html`)).href, { waitUntil: "load" });
          // In-page code as text: this project compiles without the DOM's types.
          const seen = await page.evaluate(`({
            plots: [...document.querySelectorAll("svg")].filter((svg) => {
              const box = svg.getBoundingClientRect();
              return box.width > 200 && box.height > 100 && svg.querySelectorAll("path, rect, circle, line").length > 3;
            }).length,
            transcripts: document.querySelectorAll("details").length,
            progress: /\\b(\\d+)\\/\\1 ·/.test(document.body.innerText),
          })`) as { plots: number; transcripts: number; progress: boolean };
          expect(seen.plots, `${name}.${kernel}: drawn plots`).toBeGreaterThanOrEqual(plots);
          expect(plots, `${name}.${kernel}: plot bundles`).toBeGreaterThan(0);
          expect(seen.progress, `${name}.${kernel}: a finished progress bar ("n/n · …")`).toBe(true);
          if (seen.transcripts > 0) {
            // A transcript folds and unfolds on a click on its summary.
            const toggled = await page.evaluate(`(() => {
              const details = document.querySelector("details");
              const before = details.open;
              details.querySelector("summary").click();
              return details.open !== before;
            })()`);
            expect(toggled, `${name}.${kernel}: a transcript toggles on a click`).toBe(true);
          }
          await page.screenshot({ path: join(shots, `${name}.${kernel}.png`), fullPage: true });
          await page.close();
        }
      }
    } finally {
      await browser.close();
    }
  }, 300_000);

  // Deno's kernel used to die on an interrupt; tslab ended the cell but the loop trained on in the background.
  it.each(["deno", "tslab"])("stop a GRPO loop between steps on Kernel > Interrupt under %s, the model and engine still usable", (kernel) => {
    const driver = spawnSync("/usr/bin/python3", ["scripts/notebook-interrupt.py", kernel], { encoding: "utf8", timeout: 300_000 });
    expect(driver.status, driver.stderr).toBe(0);
    const result = JSON.parse(driver.stdout.trim().split("\n").at(-1)!);
    expect(result.setup.errors).toEqual([]);
    expect(result.loop).toMatchObject({ interrupted: true, alive: true });
    expect(result.loop.seconds_to_stop).toBeLessThan(60);
    expect(result.loop.output).toContain("art-ts: interrupted; the running loop stops at its next step boundary");
    // The loop stopped for good: two reads three seconds apart agree, and every step it took was saved.
    const [first, later] = result.states;
    expect(first.step).toBeGreaterThanOrEqual(2);
    expect(later).toEqual(first);
    expect(first.checkpoints.at(-1)).toBe(first.step);
    expect(result.completion).toEqual({ choices: 1 });
  }, 300_000);
});
