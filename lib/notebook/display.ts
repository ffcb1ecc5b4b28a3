/**
 * One display() for the Deno kernel, the tslab kernel and the terminal.
 *
 * Rich values are Renderables: they give a MIME bundle for notebooks and a text form for terminals.
 * A Renderable left as the last expression of a Deno cell renders itself (Symbol.for("Jupyter.display")).
 */
import { randomUUID } from "node:crypto";
import process from "node:process";
import { inspect } from "node:util";
import { denoJupyter, detectKernel, tslabWriteDisplayData } from "./kernel.ts";

/** MIME type → data, as Jupyter's display_data carries it; JSON types are objects, the rest strings. */
export type MimeBundle = Record<string, unknown>;

export abstract class Renderable {
  /** The bundle for a notebook frontend, computed at display time. */
  abstract toMimeBundle(): MimeBundle;
  /** The form for a terminal (may hold ANSI colours, may write a report file). */
  abstract toTerminal(): string;

  [Symbol.for("Jupyter.display")](): MimeBundle {
    return this.toMimeBundle();
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toTerminal();
  }
}

/** Raw HTML with its plain-text form, for notebook cells that want to show a bit of markup. */
export class HtmlView extends Renderable {
  readonly html: string;
  readonly text: string;

  constructor(html: string, text: string) {
    super();
    this.html = html;
    this.text = text;
  }
  toMimeBundle(): MimeBundle {
    return { "text/html": this.html, "text/plain": this.text };
  }
  toTerminal(): string {
    return this.text;
  }
}

function bundleOf(value: unknown): MimeBundle {
  if (value instanceof Renderable) return value.toMimeBundle();
  if (typeof value === "string") return { "text/plain": value };
  return { "text/plain": inspect(value, { depth: 4, colors: false }) };
}

function terminalTextOf(value: unknown): string {
  if (value instanceof Renderable) return value.toTerminal();
  if (typeof value === "string") return value;
  return inspect(value, { depth: 4, colors: process.stdout.isTTY === true });
}

/**
 * Deno's display() resolves before its message reaches the iopub socket; when the cell ends first, the
 * kernel reports idle and the frontend (JupyterLab, nbclient) drops the late output or files it under the
 * next cell. Seen with Deno 2.9 for small and large outputs alike; waiting a moment, longer for big
 * bundles, let every output land in its cell in our runs.
 */
function denoFlushDelay(bundle: MimeBundle): Promise<void> {
  let bytes = 0;
  for (const value of Object.values(bundle)) bytes += typeof value === "string" ? value.length : JSON.stringify(value).length;
  return new Promise((resolve) => setTimeout(resolve, 40 + bytes / 20_000));
}

/** Sends a bundle to the frontend; `displayId` + `update` rewrite an earlier output in place. */
async function send(bundle: MimeBundle, displayId: string | undefined, update: boolean): Promise<void> {
  const kind = detectKernel();
  if (kind === "deno") {
    const jupyter = denoJupyter();
    if (jupyter) {
      await jupyter.display(bundle, displayId === undefined ? { raw: true } : { raw: true, display_id: displayId, update });
      await denoFlushDelay(bundle);
      return;
    }
  } else if (kind === "tslab") {
    const write = tslabWriteDisplayData();
    if (write) {
      write({ data: bundle, metadata: {}, transient: displayId === undefined ? {} : { display_id: displayId } }, update);
      return;
    }
  }
  // No frontend reachable (e.g. a kernel kind forced in a terminal): the plain text is the honest fallback.
  console.log(String(bundle["text/plain"] ?? ""));
}

/** Shows a value: rich output in a notebook, text in a terminal. Await it in Deno cells to keep output order. */
export function display(value: unknown): Promise<void> {
  if (detectKernel() === "terminal") {
    console.log(terminalTextOf(value));
    return Promise.resolve();
  }
  return send(bundleOf(value), undefined, false);
}

/**
 * One output area that is rewritten in place (display_id + update_display_data), used for progress.
 * Both kernels support it; in a terminal every show() prints (callers draw their own in-place line there).
 */
export class LiveDisplay {
  readonly id = `art-${randomUUID()}`;
  private shown = false;
  private queue: Promise<void> = Promise.resolve();

  show(value: unknown): Promise<void> {
    if (detectKernel() === "terminal") {
      console.log(terminalTextOf(value));
      return Promise.resolve();
    }
    const bundle = bundleOf(value);
    const update = this.shown;
    this.shown = true;
    // Chained so an update can never overtake the first display of the same id.
    this.queue = this.queue.then(() => send(bundle, this.id, update)).catch((error: unknown) => {
      console.error(`art-ts: display update failed: ${String(error)}`);
    });
    return this.queue;
  }
}
