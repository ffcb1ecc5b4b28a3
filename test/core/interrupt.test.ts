import { afterEach, describe, expect, it, vi } from "vitest";
import { gatherTrajectories } from "../../lib/core/gather.ts";
import { InterruptedError, interruptScope, requestInterrupt, throwIfInterrupted } from "../../lib/core/interrupt.ts";
import { Trajectory } from "../../lib/core/trajectory.ts";
import { setKernelKind } from "../../lib/notebook/kernel.ts";
import { installKernelInterrupt } from "../../lib/notebook/interrupt.ts";
import { progress } from "../../lib/notebook/progress.ts";

const quiet = { update: () => {}, finish: () => {} };
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const slowRollout = (ms: number) => async () => {
  await sleep(ms);
  return new Trajectory({ reward: 1 });
};

afterEach(() => {
  delete (globalThis as { Deno?: unknown }).Deno;
  setKernelKind(undefined);
  vi.restoreAllMocks();
});

describe("interrupts", () => {
  it("are dropped when no art-ts loop runs, so a later cell is not stopped by them", async () => {
    expect(requestInterrupt()).toBe(false);
    expect(() => throwIfInterrupted("anything")).not.toThrow();
    expect(await gatherTrajectories([slowRollout(1)], { progress: quiet })).toHaveLength(1);
  });

  it("stop a gather at once, and the next gather runs", async () => {
    const gather = gatherTrajectories([slowRollout(5), slowRollout(5), slowRollout(2000)], { description: "eval", progress: quiet });
    await sleep(50);
    expect(requestInterrupt()).toBe(true);
    const started = Date.now();
    await expect(gather).rejects.toThrow(InterruptedError);
    await expect(gather).rejects.toThrow(/Interrupted \(Kernel > Interrupt\) during gather "eval" \(2\/3 rollouts finished\)\. Nothing saved was lost/);
    expect(Date.now() - started).toBeLessThan(500);
    expect(await gatherTrajectories([slowRollout(1)], { progress: quiet })).toHaveLength(1);
  });

  it("stop a progress loop at its next update, once", async () => {
    const bar = progress(10, "train", { reporter: quiet });
    bar.update(1);
    expect(requestInterrupt()).toBe(true);
    expect(() => bar.update(1)).toThrow(/during the loop of progress "train" \(1\/10 done\)/);
    expect(bar.completed).toBe(1);
    bar.update(1); // the loop's display has ended: later calls change nothing
    expect(bar.completed).toBe(1);
    const next = progress(2, "again", { reporter: quiet });
    next.update(2);
    await next.done();
    expect(requestInterrupt()).toBe(false); // every loop has ended
  });

  it("pend until the next step boundary when the running loop has no handler, and are consumed there", () => {
    const scope = interruptScope(() => "a training step");
    expect(requestInterrupt()).toBe(true);
    scope.end();
    expect(() => throwIfInterrupted("train(), before step 3")).toThrow(/during train\(\), before step 3/);
    expect(() => throwIfInterrupted("train(), before step 3")).not.toThrow();
  });

  it("arrive as SIGINT inside the Deno kernel, which would otherwise end the process", () => {
    expect(installKernelInterrupt()).toBe(false); // a terminal keeps Ctrl-C
    const listeners: (() => void)[] = [];
    (globalThis as { Deno?: unknown }).Deno = {
      jupyter: { display: async () => {} },
      addSignalListener: (signal: string, handler: () => void) => signal === "SIGINT" && listeners.push(handler),
    };
    setKernelKind("deno");
    const log = vi.spyOn(console, "error").mockImplementation(() => {});
    expect(installKernelInterrupt()).toBe(true);
    expect(installKernelInterrupt()).toBe(true);
    expect(listeners).toHaveLength(1);

    listeners[0]!();
    expect(log).toHaveBeenLastCalledWith(expect.stringMatching(/no art-ts loop is running.*restart the kernel/));
    const bar = progress(3, "steps", { reporter: quiet });
    listeners[0]!();
    expect(log).toHaveBeenLastCalledWith(expect.stringMatching(/the running loop stops at its next step boundary/));
    expect(() => bar.update(1)).toThrow(InterruptedError);
  });
});
