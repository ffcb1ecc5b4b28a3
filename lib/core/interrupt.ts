/**
 * Interrupts delivered as a signal, turned into an error at the next step boundary of an art-ts loop.
 *
 * The Deno Jupyter kernel has no interrupt of its own: Kernel > Interrupt sends SIGINT, which ends the process.
 * art-ts's notebook layer listens for that signal there and calls requestInterrupt(); a running gather then
 * rejects at once, and train() and progress updates throw when they are next called. Each stops between steps,
 * never inside a training step, so the model, its checkpoints and the engine stay usable and re-running the cell
 * goes on from the last saved step. Under tslab and in terminals the runtime's own interrupt applies.
 */
import { ArtError } from "./errors.ts";

export class InterruptedError extends ArtError {
  constructor(where: string) {
    super("interrupted", `Interrupted (Kernel > Interrupt) during ${where}. Nothing saved was lost and the model stays loaded: re-run the cell to go on from the last saved step.`);
    this.name = "InterruptedError";
  }
}

/** A running loop that an interrupt may stop. */
export interface InterruptScope {
  /** Throws InterruptedError when an interrupt is pending (and clears it). */
  check(): void;
  /** The loop has ended: interrupts no longer concern it. */
  end(): void;
}

interface Scope {
  where: () => string;
  onInterrupt?: (error: InterruptedError) => void;
}

const scopes = new Set<Scope>();
let pending = false;

/**
 * Registers a running loop. `where` names it in the error; `onInterrupt`, when given, is called at once with the
 * error (a gather rejects with it rather than waiting for its rollouts), which consumes the interrupt.
 */
export function interruptScope(where: () => string, onInterrupt?: (error: InterruptedError) => void): InterruptScope {
  const scope: Scope = { where, onInterrupt };
  scopes.add(scope);
  return {
    check: () => throwIfInterrupted(where()),
    end: () => void scopes.delete(scope),
  };
}

/** Throws InterruptedError when an interrupt is pending (and clears it): the check at a step boundary. */
export function throwIfInterrupted(where: string): void {
  if (!pending) return;
  pending = false;
  throw new InterruptedError(where);
}

/**
 * Delivers an interrupt. Returns false, changing nothing, when no art-ts loop is running: an interrupt meant for
 * other code must not stop a later cell.
 */
export function requestInterrupt(): boolean {
  if (scopes.size === 0) return false;
  pending = true;
  for (const scope of [...scopes]) {
    if (!scope.onInterrupt) continue;
    pending = false;
    scope.onInterrupt(new InterruptedError(scope.where()));
  }
  return true;
}
