import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Trajectory, TrajectoryGroup } from "../../lib/core/trajectory.ts";
import {
  compareRewards, lossCurve, PLOTLY_MIME, rewardCurve, rewardDistribution, stepRecord, type StepRecord,
} from "../../lib/notebook/mod.ts";
import { titleLines } from "../../lib/notebook/plot.ts";
import { compareMeans, normalUpperTail, quantile, standardError, std } from "../../lib/notebook/stats.ts";
import { niceTicks } from "../../lib/notebook/svg.ts";

const group = (...rewards: number[]) => new TrajectoryGroup(rewards.map((reward, i) => new Trajectory({ reward, metrics: { win: reward > 0.5, moves: i } })));

type Trace = { type: string; x?: number[]; y: number[]; name?: string; fill?: string; mode?: string };

/** Problems with an XML fragment's tag nesting (what a browser needs to parse an inline SVG as drawn). */
function tagProblems(markup: string): string[] {
  const stack: string[] = [], problems: string[] = [];
  for (const [, close, name, selfClosing] of markup.matchAll(/<(\/?)([a-zA-Z]+)\b[^>]*?(\/?)>/g)) {
    if (selfClosing) continue;
    if (!close) stack.push(name!);
    else if (stack.pop() !== name) problems.push(`</${name}> closes nothing open`);
  }
  return [...problems, ...stack.map((name) => `<${name}> never closed`)];
}

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

  it("compares two samples' means with the large-sample z-test (reference values from Python's math.erfc)", () => {
    // The normal upper tail within A&S 7.1.26's stated 1.5e-7.
    for (const [z, tail] of [[0, 0.5], [0.5, 0.3085375387259869], [1.959963984540054, 0.025], [3, 0.0013498980316300957], [-1, 0.8413447460685429]]) {
      expect(Math.abs(normalUpperTail(z!) - tail!), `P(Z > ${z})`).toBeLessThan(1.5e-7);
    }
    // 120 of 200 games won before, 160 of 200 after: z = 0.2 / √(0.4 / 199) (sample variances), p = erfc(z / √2).
    const wins = (n: number) => Array.from({ length: 200 }, (_, i) => (i < n ? 1 : 0));
    const result = compareMeans(wins(120), wins(160));
    expect(result.difference).toBeCloseTo(0.2, 12);
    expect(result.z).toBeCloseTo(4.460941604639093, 9);
    expect(Math.abs(result.p - 8.160032504391084e-6)).toBeLessThan(3e-7);
    expect(compareMeans(wins(160), wins(120)).z).toBeCloseTo(-4.460941604639093, 9);
    const same = compareMeans([1, 1], [1, 1]);
    expect([same.difference, same.standardError, same.z]).toEqual([0, 0, 0]);
    expect(same.p).toBeCloseTo(1, 6);
    expect(() => compareMeans([1], [1, 2])).toThrow(/two values or more on each side, got 1 and 2/);
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

  it("draws each metric in its own panel: faint step means with their numbers on hover, the curve, a ± sd band, validation diamonds", () => {
    const plot = rewardCurve(history, { metrics: ["reward", "win"] });
    const traces = plot.figure.data as (Trace & { yaxis?: string; text?: string[]; line?: { width?: number } })[];
    const perStep = traces.find((t) => t.name === "reward per step")!;
    expect(perStep).toMatchObject({ mode: "markers", x: [0, 1], y: [0.5, 0.875], yaxis: "y" });
    expect(perStep.text![1]).toBe("reward, step 1: mean 0.875 ± 0.217 sd (n=4), range 0.5–1");
    // Two training steps: a tenth of them rounds to a window of one, so the curve is the means themselves.
    expect(traces.find((t) => t.name === "reward")).toMatchObject({ mode: "lines", y: [0.5, 0.875] });
    const [low, high] = traces.filter((t) => t.yaxis === "y" && t.line?.width === 0);
    expect(low!.y).toEqual([0.5 - std([0, 1, 0.5, 0.5]), 0.875 - std([1, 1, 0.5, 1])]);
    // ± sd, but never past the step's largest value
    expect(high!.y).toEqual([0.5 + std([0, 1, 0.5, 0.5]), 1]);
    expect(high!.fill).toBe("tonexty");
    expect(traces.find((t) => t.name === "reward (val)")).toMatchObject({ y: [0.25], yaxis: "y" });
    // win in the second panel, below the first, on its own axis; the step axis under the last panel
    expect(traces.find((t) => t.name === "win")).toMatchObject({ yaxis: "y2", y: [0.25, 0.75] });
    const layout = plot.figure.layout as Record<string, { domain?: number[]; title?: { text: string }; anchor?: string }>;
    expect(layout.yaxis!.title!.text).toBe("reward");
    expect(layout.yaxis2!.title!.text).toBe("win");
    expect(layout.yaxis2!.domain![1]).toBeLessThan(layout.yaxis!.domain![0]!);
    expect(layout.xaxis!.anchor).toBe("y2");
    expect(plot.summary).toContain("reward: step 0 0.5 → step 1 0.875 (best 0.875 at step 1)");
    expect(plot.summary).toContain("reward (val): last 0.25 at step 1");
  });

  it("draws the curve as a moving mean of the step means, a tenth of the steps wide unless told", () => {
    const long = Array.from({ length: 30 }, (_, step) => stepRecord(step, [group(step % 2, 1)]));
    const means = long.map((r) => r.values.reward!.reduce((a, b) => a + b, 0) / 2);
    const curve = (plot: ReturnType<typeof rewardCurve>) => (plot.figure.data as Trace[]).find((t) => t.name === "reward")!.y;
    expect(curve(rewardCurve(long))).toEqual(means.map((_, i) => means.slice(Math.max(0, i - 2), i + 1).reduce((a, b) => a + b, 0) / Math.min(3, i + 1)));
    expect(curve(rewardCurve(long, { smooth: 1 }))).toEqual(means);
    expect(rewardCurve(long).summary).toContain("curve = mean of 3 steps");
    expect(() => rewardCurve(long, { smooth: 0 })).toThrow(/smooth must be an integer >= 1/);
  });

  it("overlays runs, a colour per run, each in the legend once", () => {
    const other = [stepRecord(0, [group(0, 0)]), stepRecord(1, [group(1, 0)])];
    const plot = rewardCurve({ "lr 1e-5": history, "lr 1e-4": other }, { metrics: ["reward", "win"] });
    const traces = plot.figure.data as (Trace & { yaxis?: string; line?: { color?: string }; showlegend?: boolean })[];
    const curves = traces.filter((t) => t.name === "lr 1e-5" || t.name === "lr 1e-4");
    expect(curves.map((t) => [t.name, t.yaxis, t.showlegend])).toEqual([["lr 1e-5", "y", true], ["lr 1e-4", "y", true], ["lr 1e-5", "y2", false], ["lr 1e-4", "y2", false]]);
    expect(curves[0]!.line!.color).toBe(curves[2]!.line!.color);
    expect(curves[0]!.line!.color).not.toBe(curves[1]!.line!.color);
    expect(plot.summary).toContain("lr 1e-4: reward: step 0 0 → step 1 0.5");
  });

  it("draws baselines as dashed levels across the steps, for each metric they carry", () => {
    const plot = rewardCurve(history, { metrics: ["reward", "win"], baselines: { scripted: [group(1, 0.5)], fixed: [0.3] } });
    const traces = plot.figure.data as (Trace & { line?: { dash?: string } })[];
    expect(traces.find((t) => t.name === "scripted: reward (baseline)")).toMatchObject({ mode: "lines", x: [0, 1], y: [0.75, 0.75], line: { dash: "dash" } });
    expect(traces.find((t) => t.name === "scripted: win (baseline)")).toMatchObject({ y: [0.5, 0.5], line: { dash: "dot" } });
    // plain numbers are the first metric's
    expect(traces.filter((t) => t.name?.startsWith("fixed"))).toEqual([expect.objectContaining({ name: "fixed: reward (baseline)", y: [0.3, 0.3] })]);
    expect(plot.summary).toContain("scripted: reward (baseline): 0.75 ± 0.25 (n=2)");
    expect(plot.toSvg()).toMatch(/<polyline [^>]*stroke="#[0-9a-f]{6}"[^>]*stroke-dasharray="6 4"\/>/);
    // one step still gets a line a step wide; one metric needs no metric in the label
    const single = rewardCurve([stepRecord(3, [group(1)], "val")], { baselines: { base: [0.2] } }).figure.data as Trace[];
    expect(single.at(-1)).toMatchObject({ name: "base (baseline)", x: [3, 4], y: [0.2, 0.2] });
  });

  it("uses percentiles or min and max for the band when asked", () => {
    const edges = (band: "minmax" | "p10-p90") => (rewardCurve(history, { band }).figure.data as Trace[]).slice(0, 2).map((t) => t.y);
    expect(edges("minmax")).toEqual([[0, 0.5], [1, 1]]);
    expect(edges("p10-p90")).toEqual([[quantile([0, 1, 0.5, 0.5], 0.1), quantile([1, 1, 0.5, 1], 0.1)], [quantile([0, 1, 0.5, 0.5], 0.9), 1]]);
  });
});

describe("loss curve", () => {
  it("draws each step's loss and its moving mean, and names the lowest step", () => {
    const plot = lossCurve([4, 2, 3, 1, 0.5], { window: 2, title: "SFT" });
    const traces = plot.figure.data as Trace[];
    expect(traces.find((t) => t.name === "loss")).toMatchObject({ x: [1, 2, 3, 4, 5], y: [4, 2, 3, 1, 0.5] });
    expect(traces.find((t) => t.name === "mean of 2 steps")!.y).toEqual([4, 3, 2.5, 2, 0.75]);
    expect(plot.summary).toContain("loss: step 1 4 → step 5 0.5 (lowest 0.5 at step 5)");
    expect(plot.summary).toContain("mean of the first 2 step(s) 3, of the last 2 0.75");
    // a window as long as the run, or of 1, adds no second line
    expect((lossCurve([1, 2], { window: 2 }).figure.data as Trace[]).length).toBe(1);
    expect((lossCurve([3, 1, 2], { window: 1 }).figure.data as Trace[]).length).toBe(1);
    // the means compared never share a step
    expect(lossCurve([4, 2, 3, 1]).summary).toContain("mean of the first 2 step(s) 3, of the last 2 2");
  });

  it("refuses no losses and a bad window", () => {
    expect(() => lossCurve([])).toThrow("no losses");
    expect(() => lossCurve([1], { window: 0 })).toThrow("window must be an integer >= 1");
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
  it("carry plotly JSON, a static SVG as HTML and as an image, and a text summary; no script, each on its own", () => {
    for (const plot of [rewardCurve([stepRecord(0, [group(1)])]), rewardDistribution([group(1, 0)]), compareRewards({ a: [1, 0] })]) {
      const bundle = plot.toMimeBundle();
      expect(bundle[PLOTLY_MIME]).toBe(plot.figure);
      const html = String(bundle["text/html"]);
      expect(html).toBe(`<div class="art-ts-plot">${bundle["image/svg+xml"]}</div>`);
      expect(html).toMatch(/^<div class="art-ts-plot"><svg xmlns="http:\/\/www\.w3\.org\/2000\/svg" viewBox="0 0 760 \d+"/);
      expect(html).not.toContain("<script");
      expect(tagProblems(html)).toEqual([]);
      expect(html.length).toBeLessThan(20_000);
      expect(String(bundle["text/plain"])).toBe(plot.summary);
    }
  });

  it("escapes every label in the SVG, and titles in the figure (plotly reads them as HTML)", () => {
    const plot = compareRewards({ "</svg><img src=y>": [1] }, { title: "</svg><img src=x onerror=alert(1)>" });
    const svg = plot.toSvg();
    expect(svg).not.toContain("<img");
    expect(svg).toContain(">&lt;/svg&gt;&lt;img src=x onerror=alert(1)&gt;</text>");
    expect(svg).toContain(">&lt;/svg&gt;&lt;img src=y&gt;</text>");
    expect(tagProblems(svg)).toEqual([]);
    expect((plot.figure.layout.title as { text: string }).text).toBe("&lt;/svg&gt;&lt;img src=x onerror=alert(1)&gt;");
  });

  it("draws a reward curve: the band under its curve, step means with their numbers on hover, validation diamonds, a legend", () => {
    const history = [stepRecord(0, [group(0, 1, 0.5, 0.5)]), stepRecord(1, [group(1, 1, 0.5, 1)]), stepRecord(1, [group(0.25)], "val")];
    const svg = rewardCurve(history, { metrics: ["reward"] }).toSvg();
    const polyline = /<polyline points="([^"]+)"/.exec(svg)![1]!.split(" ").map((p) => p.split(",").map(Number));
    expect(polyline.length).toBe(2);
    expect(polyline[1]![0]).toBeGreaterThan(polyline[0]![0]!); // step 1 right of step 0
    expect(polyline[1]![1]).toBeLessThan(polyline[0]![1]!);   // mean 0.875 above 0.5
    expect(svg.match(/<polygon /g)!.length).toBe(1);
    expect(svg.indexOf("<polygon ")).toBeLessThan(svg.indexOf("<polyline ")); // the band is drawn first, under the line
    expect(svg).toContain("<title>reward, step 1: mean 0.875 ± 0.217 sd (n=4), range 0.5–1</title>");
    expect(svg).toMatch(/<path d="M[^"]+Z" fill="#2563eb" stroke="white" stroke-width="1"><title>reward \(val\), step 1: mean 0.25/);
    expect(svg).toContain(">reward (val)</text>"); // legend
    expect(svg).toContain(">step</text>");         // x axis title
  });

  it("draws each panel with its own frame, axis title and scale, the step labels under the last", () => {
    const history = [stepRecord(0, [group(0, 1)]), stepRecord(1, [group(1, 1)])];
    const svg = rewardCurve(history, { metrics: ["reward", "moves"] }).toSvg();
    const frames = [...svg.matchAll(/<rect x="60" y="([\d.]+)" width="680" height="([\d.]+)" fill="none"/g)].map((m) => [Number(m[1]), Number(m[2])]);
    expect(frames.length).toBe(2);
    expect(frames[1]![0]).toBeGreaterThan(frames[0]![0]! + frames[0]![1]!); // the second panel below the first, apart
    expect(svg).toContain(">reward</text>");
    expect(svg).toContain(">moves</text>");
    // the step axis's labels sit under the lower panel only
    const labels = [...svg.matchAll(/<text x="[\d.]+" y="([\d.]+)" text-anchor="middle" font-size="11"/g)].map((m) => Number(m[1]));
    expect(labels.length).toBeGreaterThan(0);
    for (const y of labels) expect(y).toBeGreaterThan(frames[1]![0]! + frames[1]![1]!);
  });

  it("draws boxes with every point and a hover summary", () => {
    const svg = rewardDistribution([group(0, 1, 1, 0.5), group(0.5, 0.5)]).toSvg();
    expect(svg.match(/<rect [^>]*fill-opacity="0.12"/g)!.length).toBe(2);
    expect(svg).toContain("<title>group 1: median 0.75, quartiles 0.375–1, n=4</title>");
    expect(svg.match(/<circle /g)!.length).toBe(6);
    expect(svg).toContain(">group 2</text>");
  });

  it("puts ticks at 1, 2 or 5 times a power of ten", () => {
    expect(niceTicks(0, 1)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(niceTicks(-0.05, 1.05)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(niceTicks(0, 37)).toEqual([0, 10, 20, 30]);
    expect(niceTicks(0.001, 0.0042)).toEqual([0.001, 0.0015, 0.002, 0.0025, 0.003, 0.0035, 0.004]);
    expect(niceTicks(-3, 3, 4)).toEqual([-2, 0, 2]);
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

    it("prints the summary and collects plots into one HTML report, each an inline SVG", () => {
      const a = rewardCurve([stepRecord(0, [group(1)])], { title: "curve <1>" }).toTerminal();
      const b = rewardDistribution([group(1, 0)]).toTerminal();
      expect(a).toContain(`(plot in ${process.env.ART_REPORT_FILE})`);
      expect(b).toMatch(/^reward per group: 1 group\(s\)/);
      const report = readFileSync(process.env.ART_REPORT_FILE!, "utf8");
      expect(report.split("<svg ").length - 1).toBe(2);
      expect(report).not.toContain("<script");
      expect(report).toContain("<h2>curve &lt;1&gt;</h2>");
    });
  });
});
