/** Small text helpers shared by transcripts, plots and progress: HTML escaping, ANSI colours, number formats. */
import process from "node:process";

const HTML_ESCAPES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** Escapes text for HTML element content and quoted attribute values. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]!);
}

export type AnsiStyle = "bold" | "dim" | "red" | "green" | "yellow" | "blue" | "magenta" | "cyan" | "gray";

const ANSI_CODES: Record<AnsiStyle, [number, number]> = {
  bold: [1, 22], dim: [2, 22], red: [31, 39], green: [32, 39], yellow: [33, 39],
  blue: [34, 39], magenta: [35, 39], cyan: [36, 39], gray: [90, 39],
};

/** Colours follow the NO_COLOR / FORCE_COLOR conventions, else whether stdout is a terminal. */
export function colorEnabled(): boolean {
  if (process.env.NO_COLOR !== undefined && process.env.NO_COLOR !== "") return false;
  if (process.env.FORCE_COLOR !== undefined && process.env.FORCE_COLOR !== "0") return true;
  return process.stdout.isTTY === true;
}

export function ansi(text: string, style: AnsiStyle, enabled = colorEnabled()): string {
  if (!enabled) return text;
  const [open, close] = ANSI_CODES[style];
  return `\u001b[${open}m${text}\u001b[${close}m`;
}

/** Removes ANSI escape sequences (for width computations and plain-text forms). */
export function stripAnsi(text: string): string {
  return text.replace(/\u001b\[[0-9;]*m/g, "");
}

/** A number printed short: 3 significant digits, integers as they are, thousands as k/M. */
export function formatNumber(value: number): string {
  if (!Number.isFinite(value)) return String(value);
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${(value / 1e6).toFixed(abs >= 1e7 ? 1 : 2)}M`;
  if (abs >= 1e4) return `${(value / 1e3).toFixed(1)}k`;
  if (Number.isInteger(value)) return String(value);
  if (abs >= 100) return value.toFixed(1);
  // Trailing zeros go from the mantissa only: "1.00e-10" becomes "1e-10", never "1.00e-1".
  const [mantissa, exponent] = value.toPrecision(3).split("e");
  const trimmed = mantissa!.includes(".") ? mantissa!.replace(/\.?0+$/, "") : mantissa!;
  return exponent === undefined ? trimmed : `${trimmed}e${exponent}`;
}

/** Seconds as m:ss or h:mm:ss. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = String(s % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${rest}` : `${m}:${rest}`;
}
