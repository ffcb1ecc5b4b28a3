import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup } from "../../lib/core/trajectory.ts";
import {
  compareRewards, PLOTLY_MIME, resetPlotlyLibrary, rewardCurve, rewardDistribution, stepRecord, type StepRecord,
} from "../../lib/notebook/mod.ts";
import { PLOTLY_LIBRARY_ATTRIBUTE, titleLines } from "../../lib/notebook/plot.ts";
import { quantile, standardError, std } from "../../lib/notebook/stats.ts";

const group = (...rewards: number[]) => new TrajectoryGroup(rewards.map((reward, i) => new Trajectory({ reward, metrics: { win: reward > 0.5, moves: i } })));

type Trace = { type: string; x?: number[]; y: number[]; name?: string; fill?: string; mode?: string };

beforeEach(() => resetPlotlyLibrary());

describe("statistics", () => {
  it("interpolates quantiles between order statistics (numpy's default)", () => {
    expect(quantile([4, 1, 3, 2], 0.1)).toBeCloseTo(1.3, 12);
    expect(quantile([1, 2, 3, 4], 0.9)).toBeCloseTo(3.7, 12);
    expect(quantile([5], 0.9)).toBe(5);
    expect(quantile([], 0.5)).toBeNaN();
  });
  it("uses the population std and the sample standard error", () => {
    expect(std([1, 3])).toBe(1);
    expect(standardError([1, 3])).toBeCloseTo(1, 12); // sample sd √2, over √2
    expect(standardError([7])).toBe(0);
  });
});

describe("reward curve", () => {
  const history: StepRecord[] = [
    stepRecord(0, [group(0, 1), group(0.5, 0.5)]),
    stepRecord(1, [group(1, 1), group(0.5, 1)]),
    stepRecord(1, [group(0.25)], "val"),
  ];

  it("records reward and every numeric or boolean metric per step", () => {
    expect(history[0]!.values).toEqual({ reward: [0, 1, 0.5, 0.5], win: [0, 1, 0, 0], moves: [0, 1, 0, 1] });
  });

  it("draws mean lines with a percentile band and validation markers", () => {
    const plot = rewardCurve(history, { metrics: ["reward", "win"] });
    const traces = plot.figure.data as Trace[];
    const mean = traces.find((t) => t.name === "reward")!;
    expect(mean.x).toEqual([0, 1]);
    expect(mean.y).toEqual([0.5, 0.875]);
    const band = traces.filter((t) => t.mode === "lines" && t.name !== "reward" && t.name !== "win");
    expect(band[0]!.y).toEqual([quantile([0, 1, 0.5, 0.5], 0.1), quantile([1, 1, 0.5, 1], 0.1)]);
    expect(band[1]!.fill).toBe("tonexty");
    expect(traces.find((t) => t.name === "reward (val)")!.y).toEqual([0.25]);
    expect(traces.filter((t) => t.name === "win").length).toBe(1);
    expect(plot.summary).toContain("reward: step 0 0.5 → step 1 0.875 (best 0.875 at step 1)");
    expect(plot.summary).toContain("reward (val): last 0.25 at step 1");
  });

  it("uses min and max for the band when asked", () => {
    const band = rewardCurve(history, { band: "minmax" }).figure.data as Trace[];
    expect(band[0]!.y).toEqual([0, 0.5]);
    expect(band[1]!.y).toEqual([1, 1]);
  });
});

describe("distribution and comparison", () => {
  it("boxes each group and counts groups with equal rewards", () => {
    const plot = rewardDistribution([group(0, 1, 1), group(0.5, 0.5)]);
    expect((plot.figure.data as Trace[]).map((t) => t.y)).toEqual([[0, 1, 1], [0.5, 0.5]]);
    expect(plot.summary).toContain("1 with equal rewards (GRPO learns nothing from those)");
    expect(plot.summary).toContain("group 1: mean 0.667 sd 0.471 [0, 1] n=3");
  });

  it("compares series given as numbers or trajectories, with mean ± standard error", () => {
    const plot = compareRewards({ baseline: [0, 1], trained: [group(1, 1)] });
    expect(plot.summary).toContain("baseline: 0.5 ± 0.5 (n=2)");
    expect(plot.summary).toContain("trained: 1 ± 0 (n=2) (+0.5 vs baseline)");
    expect(() => compareRewards({})).toThrow(/at least one series/);
  });
});

describe("plot bundles", () => {
  it("carries plotly JSON, an HTML fallback and a text summary; plotly.js only in the first", () => {
    const first = rewardCurve([stepRecord(0, [group(1)])]).toMimeBundle();
    const second = rewardDistribution([group(1, 0)]).toMimeBundle();
    expect(first[PLOTLY_MIME]).toMatchObject({ data: expect.any(Array), layout: expect.any(Object) });
    expect(String(first["text/html"])).toContain(`<script ${PLOTLY_LIBRARY_ATTRIBUTE}>`);
    expect(String(first["text/html"]).length).toBeGreaterThan(4_000_000);
    expect(String(second["text/html"])).not.toContain(PLOTLY_LIBRARY_ATTRIBUTE);
    expect(String(second["text/html"])).toContain("window.Plotly.newPlot(el, figure.data, figure.layout");
    expect(String(second["text/plain"])).toMatch(/^reward per group/);
    resetPlotlyLibrary();
    expect(String(rewardDistribution([group(1)]).toMimeBundle()["text/html"])).toContain(PLOTLY_LIBRARY_ATTRIBUTE);
  });

  it("escapes titles in the HTML and keeps figure JSON from closing its script", () => {
    const plot = compareRewards({ "</script><img src=y>": [1] }, { title: "</script><img src=x onerror=alert(1)>" });
    const html = String(plot.toMimeBundle()["text/html"]);
    expect(html).not.toContain("</script><img");
    expect(html).toContain("&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;");
    expect(html).toContain("\\u003c/script>\\u003cimg src=y>");
    // plotly reads title text as HTML: the figure carries it escaped
    expect((plot.figure.layout.title as { text: string }).text).toBe("&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;");
  });

  it("wraps a long title into left-aligned lines clear of plotly's toolbar, with room above the plot", () => {
    const title = "Reward per step for the 2048 agent trained with RULER against the held-out validation boards";
    expect(titleLines(title)).toEqual(["Reward per step for the 2048 agent trained with RULER", "against the held-out validation boards"]);
    const { layout } = rewardCurve([stepRecord(0, [new Trajectory({ reward: 1 })])], { title }).figure;
    expect(layout.title).toMatchObject({ text: titleLines(title).join("<br>"), x: 0, xanchor: "left" });
    expect((layout.margin as { t: number }).t).toBe(70);
    expect((rewardCurve([], {}).figure.layout.margin as { t: number }).t).toBe(50);
  });

  describe("in a terminal", () => {
    let previous: string | undefined;
    beforeEach(() => {
      previous = process.env.ART_REPORT_FILE;
      process.env.ART_REPORT_FILE = join(mkdtempSync(join(tmpdir(), "art-report-")), "report.html");
    });
    afterEach(() => {
      if (previous === undefined) delete process.env.ART_REPORT_FILE;
      else process.env.ART_REPORT_FILE = previous;
    });

    it("prints the summary and collects plots into one HTML report with plotly.js inlined once", () => {
      const a = rewardCurve([stepRecord(0, [group(1)])], { title: "curve <1>" }).toTerminal();
      const b = rewardDistribution([group(1, 0)]).toTerminal();
      expect(a).toContain(`(plot in ${process.env.ART_REPORT_FILE})`);
      expect(b).toMatch(/^reward per group: 1 group\(s\)/);
      const report = readFileSync(process.env.ART_REPORT_FILE!, "utf8");
      expect(report.split("window.Plotly = Plotly").length - 1).toBe(1);
      expect(report.split("Plotly.newPlot(").length - 1).toBe(2);
      expect(report).toContain("<h2>curve &lt;1&gt;</h2>");
    });
  });
});

describe("the HTML fallback's script", () => {
  // Runs a plot's inline script against a minimal page: an element registry and a window.Plotly stand-in that
  // records the newPlot call (the real plotly.js needs a browser).
  function runScript(html: string, plotly: unknown) {
    const id = /<div id="([^"]+)"/.exec(html)![1]!;
    const element = { innerHTML: "summary", inserted: [] as string[], insertAdjacentHTML(_where: string, markup: string) { this.inserted.push(markup); } };
    const script = [...html.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]!).join("\n");
    const window = { Plotly: plotly };
    const document = { getElementById: (wanted: string) => (wanted === id ? element : null) };
    new Function("window", "document", script)(window, document);
    return element;
  }

  it("draws the figure into its own div", () => {
    const plot = rewardDistribution([group(1, 0)], { title: "</script> & co" });
    const calls: unknown[][] = [];
    const element = runScript(plot.toHtml(false), { newPlot: (...args: unknown[]) => calls.push(args) });
    expect(calls.length).toBe(1);
    expect(calls[0]![0]).toBe(element);
    expect(calls[0]![1]).toEqual(plot.figure.data);
    expect(calls[0]![2]).toEqual(plot.figure.layout);
    expect(element.innerHTML).toBe("");
  });

  it("keeps the text summary and says how to recover when plotly.js is not on the page", () => {
    const element = runScript(rewardDistribution([group(1)]).toHtml(false), undefined);
    expect(element.innerHTML).toBe("summary");
    expect(element.inserted[0]).toContain("plotly.js is not loaded in this page");
  });
});
