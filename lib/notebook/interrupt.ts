/**
 * Kernel > Interrupt in the notebook kernels, which Jupyter delivers as SIGINT.
 *
 * - The Deno kernel has no handler of its own: SIGINT ends the process, and every loaded model with it.
 * - tslab rejects the running cell ("Interrupted asynchronously") but cannot stop its async work: a training loop
 *   goes on in the background, into the cells run after it.
 *
 * Inside either kernel art-ts listens for SIGINT and hands it to core's requestInterrupt(), which stops a running
 * gather at once and a train or progress loop at its next step boundary (lib/core/interrupt.ts). A terminal keeps
 * Ctrl-C's usual meaning: nothing is installed there.
 */
import process from "node:process";
import { requestInterrupt } from "../core/interrupt.ts";
import { detectKernel } from "./kernel.ts";

interface DenoSignals {
  addSignalListener(signal: "SIGINT", handler: () => void): void;
}

const STOPPING = "art-ts: interrupted; the running loop stops at its next step boundary (a training step under way finishes and is saved first).";

let installed = false;

/** Installs the SIGINT listener when running inside a notebook kernel; true once it is installed. Idempotent. */
export function installKernelInterrupt(): boolean {
  if (installed) return true;
  const kind = detectKernel();
  if (kind === "deno") {
    const deno = (globalThis as { Deno?: Partial<DenoSignals> }).Deno;
    if (typeof deno?.addSignalListener !== "function") return false;
    deno.addSignalListener("SIGINT", () => {
      console.error(requestInterrupt() ? STOPPING : "art-ts: interrupt received, but no art-ts loop is running, and the Deno kernel cannot stop other code: restart the kernel to stop it.");
    });
  } else if (kind === "tslab") {
    // Beside tslab's own listener, which ends the cell. Added once the cell's synchronous part is over: tslab runs
    // it with vm's breakOnSigint, whose watchdog puts back the default action (end the process) on its way out
    // when a SIGINT listener was added meanwhile, so the next interrupt would kill the kernel.
    setTimeout(() => process.on("SIGINT", () => {
      if (requestInterrupt()) console.error(STOPPING);
    }), 0);
  } else {
    return false;
  }
  installed = true;
  return true;
}

installKernelInterrupt();
