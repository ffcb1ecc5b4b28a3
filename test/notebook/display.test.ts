import { afterEach, describe, expect, it, vi } from "vitest";
import process from "node:process";
import { display, HtmlView, LiveDisplay, NotebookProgress, progress, setKernelKind, detectKernel } from "../../lib/notebook/mod.ts";
import { formatProgressLine, TerminalProgress, type GatherProgressState, type ProgressReporter } from "../../lib/core/progress.ts";
import { gatherTrajectories } from "../../lib/core/gather.ts";
import { Trajectory } from "../../lib/core/trajectory.ts";
import { ArtError } from "../../lib/core/errors.ts";

type DenoDisplay = (bundle: unknown, options?: { raw?: boolean; update?: boolean; display_id?: string }) => Promise<void>;

function fakeDenoKernel(): ReturnType<typeof vi.fn<DenoDisplay>> {
  const displayFn = vi.fn<DenoDisplay>(async () => {});
  (globalThis as { Deno?: unknown }).Deno = { jupyter: { display: displayFn } };
  return displayFn;
}

afterEach(() => {
  delete (globalThis as { Deno?: unknown }).Deno;
  delete (globalThis as { __tslab__?: unknown }).__tslab__;
  Reflect.deleteProperty(process, "mainModule");
  setKernelKind(undefined);
  vi.restoreAllMocks();
});

describe("kernel detection and display", () => {
  it("detects the terminal, the Deno kernel and tslab", () => {
    expect(detectKernel()).toBe("terminal");
    fakeDenoKernel();
    expect(detectKernel()).toBe("deno");
    delete (globalThis as { Deno?: unknown }).Deno;
    (globalThis as { __tslab__?: unknown }).__tslab__ = {};
    expect(detectKernel()).toBe("tslab");
  });

  it("treats a Deno whose jupyter getter throws (outside the kernel) as no kernel", () => {
    (globalThis as { Deno?: unknown }).Deno = { get jupyter() { throw new Error("unstable API"); } };
    expect(detectKernel()).toBe("terminal");
  });

  it("prints the terminal form in a terminal", async () => {
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    await display(new HtmlView("<b>hi</b>", "hi"));
    await display({ a: 1 });
    expect(log.mock.calls.map((c) => c[0])).toEqual(["hi", "{ a: 1 }"]);
  });

  it("sends the whole bundle to the Deno kernel, raw", async () => {
    const send = fakeDenoKernel();
    await display(new HtmlView("<b>hi</b>", "hi"));
    expect(send).toHaveBeenCalledWith({ "text/html": "<b>hi</b>", "text/plain": "hi" }, { raw: true });
  });

  it("sends the whole bundle through tslab's kernel sender, with display ids for live updates", async () => {
    const write = vi.fn();
    (globalThis as { __tslab__?: unknown }).__tslab__ = {};
    Object.defineProperty(process, "mainModule", {
      configurable: true,
      value: { filename: "/x/node_modules/tslab/bin/tslab", require: (id: string) => (id === "../dist/jupyter.js" ? { lastWriteDisplayData: write } : {}) },
    });
    const live = new LiveDisplay();
    await live.show(new HtmlView("<i>1</i>", "1"));
    await live.show(new HtmlView("<i>2</i>", "2"));
    expect(write.mock.calls).toEqual([
      [{ data: { "text/html": "<i>1</i>", "text/plain": "1" }, metadata: {}, transient: { display_id: live.id } }, false],
      [{ data: { "text/html": "<i>2</i>", "text/plain": "2" }, metadata: {}, transient: { display_id: live.id } }, true],
    ]);
  });

  it("falls back to plain text when a kernel is forced but unreachable", async () => {
    setKernelKind("tslab");
    const log = vi.spyOn(console, "log").mockImplementation(() => {});
    await display(new HtmlView("<b>x</b>", "x"));
    expect(log).toHaveBeenCalledWith("x");
  });
});

describe("progress", () => {
  function recorder() {
    const states: { kind: string; state: GatherProgressState }[] = [];
    const reporter: ProgressReporter = {
      update: (state) => states.push({ kind: "update", state }),
      finish: (state) => void states.push({ kind: "finish", state }),
    };
    return { states, reporter };
  }

  it("keeps running averages (booleans as 0/1, NaN skipped), summed tokens and exceptions", async () => {
    let now = 0;
    const { states, reporter } = recorder();
    const bar = progress(4, "eval", { reporter, now: () => now });
    now = 1000;
    bar.update(1, { reward: 1, win: true }, 100);
    bar.update(1, { reward: 0, win: false, score: Number.NaN }, 300);
    now = 2000;
    bar.fail();
    await bar.done();
    bar.update(1, { reward: 5 });
    await bar.done();
    expect(states.map((s) => s.kind)).toEqual(["update", "update", "update", "update", "finish"]);
    expect(states.at(-1)!.state).toEqual({
      description: "eval", completed: 3, total: 4, exceptions: 1, metrics: { reward: 0.5, win: 0.5 }, completionTokens: 400, elapsedSeconds: 2,
    });
  });

  it("draws through core's terminal line in a terminal", async () => {
    const writes: string[] = [];
    const bar = progress(2, "train", { reporter: new TerminalProgress({ stream: { isTTY: false, write: (s: string) => writes.push(s) } }), now: () => 0 });
    bar.update(2, { loss: 0.25 });
    await bar.done();
    expect(writes).toEqual(["train 2/2 ████████████████████ 100% 0.0s loss=0.250\n"]);
  });

  it("updates one notebook output in place, throttled, the final state always drawn", async () => {
    const send = fakeDenoKernel();
    let now = 0;
    const bar = progress(3, "<rollouts>", { reporter: new NotebookProgress({ now: () => now, minIntervalMs: 100 }), now: () => now });
    now = 500;
    bar.update(1, { reward: 1 }, 1000);
    now = 550;
    bar.update(1, { reward: 0 }); // within 100 ms of the last draw: skipped
    now = 1000;
    bar.update(1, { reward: 0.5 });
    await bar.done();
    const calls = send.mock.calls;
    expect(calls.map((c) => c[1]!.update)).toEqual([false, true, true, true]);
    expect(new Set(calls.map((c) => c[1]!.display_id)).size).toBe(1);
    const finalBundle = calls.at(-1)![0] as Record<string, string>;
    expect(finalBundle["text/html"]).toContain("<b>&lt;rollouts&gt;</b>");
    expect(finalBundle["text/html"]).toContain("width:100.0%;height:100%;background:#16a34a");
    expect(finalBundle["text/html"]).toContain("reward 0.5 &middot; 1000 tokens (1000/s)");
    expect(finalBundle["text/plain"]).toBe(formatProgressLine(bar.state()));
  });

  it("serves as gather's reporter, and gather resolves only once the final state has been sent", async () => {
    const send = fakeDenoKernel();
    // The kernel takes a while to send each output: a gather that did not wait would resolve before the last one.
    const sent: string[] = [];
    send.mockImplementation(async (bundle) => {
      await new Promise((resolve) => setTimeout(resolve, 30));
      sent.push((bundle as Record<string, string>)["text/plain"]!);
    });
    const rollout = (reward: number) => async () => new Trajectory({ reward, metrics: { win: reward > 0 } });
    const reporter = new NotebookProgress({ minIntervalMs: 0 });
    const trajectories = await gatherTrajectories([rollout(1), rollout(0)], { description: "gather", progress: reporter });
    expect(sent.at(-1)).toMatch(/^gather 2\/2 /);
    expect(trajectories.length).toBe(2);
    const finalHtml = (send.mock.calls.at(-1)![0] as Record<string, string>)["text/html"]!;
    expect(finalHtml).toContain("2/2");
    expect(finalHtml).toContain("reward 0.5 win 0.5");
  });

  it("shows alarms under the bar until it ends, a line per kind, in the HTML and the text line", async () => {
    const send = fakeDenoKernel();
    const bar = progress(2, "train", { reporter: new NotebookProgress({ minIntervalMs: 0 }), now: () => 0 });
    bar.update(1, { reward: 0.5 });
    const jump = { kind: "reward_jump", step: 7, message: "train/reward jumped <a lot>" };
    bar.alarm(jump);
    bar.alarm(jump, { kind: "no_signal", step: 8, message: "75% of the groups were flat" });
    bar.alarm({ kind: "no_signal", step: 9, message: "every group was flat" });
    bar.update(1);
    await bar.done();
    const final = send.mock.calls.at(-1)![0] as Record<string, string>;
    expect(final["text/html"]).toContain("&#9888; ALARM reward_jump at step 7: train/reward jumped &lt;a lot&gt;");
    expect(final["text/html"].match(/ALARM reward_jump/g)).toHaveLength(1);
    expect(final["text/plain"]).toMatch(/ ALARM reward_jump at step 7: .*, no_signal at steps 8–9: every group was flat$/);
    expect(bar.state().alarms).toHaveLength(2);
  });

  it("rejects a total that is not a count", () => {
    expect(() => progress(-1)).toThrow(ArtError);
    expect(() => progress(Number.NaN)).toThrow("progress(total): total must be a finite number >= 0, got NaN.");
  });
});
