/**
 * Trajectories made readable: HTML for notebooks (long content folded into <details>), coloured text for
 * terminals, and a side-by-side view of a group (what GRPO compares). Every piece of text is escaped.
 */
import { isChoice, Trajectory, TrajectoryGroup, type MessageOrChoice } from "../core/trajectory.ts";
import { clipText } from "../core/text.ts";
import { Renderable, type MimeBundle } from "./display.ts";
import { ansi, colorEnabled, escapeHtml, formatNumber, type AnsiStyle } from "./text.ts";

export interface TranscriptOptions {
  title?: string;
  /** Content longer than this many characters (or 12 lines) is folded; default 600. */
  collapseOver?: number;
  /** Terminal form: content is cut after this many characters; default 400. */
  terminalChars?: number;
  /** HTML: the whole view folded under its title, one click away (an alarm's trajectories beside its message). */
  folded?: boolean;
}

/** `body` under `title`, or folded under it with `folded`. */
function titled(title: string | undefined, body: string, folded: boolean | undefined): string {
  if (folded) return `<details><summary style="${SUMMARY_STYLE};font-weight:600">${escapeHtml(title ?? "trajectories")}</summary>${body}</details>`;
  return (title ? `<div style="font-weight:600;margin:4px 0">${escapeHtml(title)}</div>` : "") + body;
}

/** One rendered turn, independent of how it is drawn. */
interface Turn {
  role: string;
  content: string;
  toolCalls: { name: string; arguments: string }[];
  /** For tool results: the call they answer. */
  toolCallId?: string;
  /** Sampled turns (Choices) carry their token count: these are the tokens training uses. */
  sampledTokens?: number;
  finishReason?: string;
}

function contentText(content: unknown): string {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((part: { type?: string; text?: string; refusal?: string }) =>
        part.type === "text" ? (part.text ?? "") : part.type === "refusal" ? `[refusal] ${part.refusal ?? ""}` : `[${part.type ?? "part"}]`)
      .join("\n");
  }
  return JSON.stringify(content);
}

function prettyArguments(raw: string): string {
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch {
    return raw; // the model's malformed JSON is shown as it was sampled
  }
}

function toolCallsOf(calls: unknown): Turn["toolCalls"] {
  if (!Array.isArray(calls)) return [];
  return calls.map((call: { type?: string; function?: { name: string; arguments: string }; custom?: { name: string; input: string } }) =>
    call.function
      ? { name: call.function.name, arguments: prettyArguments(call.function.arguments) }
      : { name: call.custom?.name ?? "?", arguments: call.custom?.input ?? "" });
}

function turnOf(item: MessageOrChoice): Turn {
  if (isChoice(item)) {
    return {
      role: "assistant",
      content: contentText(item.message.content) + (item.message.refusal ? `\n[refusal] ${item.message.refusal}` : ""),
      toolCalls: toolCallsOf(item.message.tool_calls),
      sampledTokens: item.token_ids?.length ?? item.logprobs?.content?.length,
      finishReason: item.finish_reason,
    };
  }
  const message = item as { role: string; content?: unknown; tool_calls?: unknown; tool_call_id?: string; name?: string };
  return {
    role: message.role,
    content: contentText(message.content),
    toolCalls: toolCallsOf(message.tool_calls),
    toolCallId: message.tool_call_id,
  };
}

const ROLE_COLORS: Record<string, string> = { system: "#6b7280", user: "#0891b2", assistant: "#16a34a", tool: "#9333ea", developer: "#6b7280" };
const ROLE_ANSI: Record<string, AnsiStyle> = { system: "gray", user: "cyan", assistant: "green", tool: "magenta", developer: "gray" };

function metricsText(t: Trajectory): string {
  return Object.entries(t.metrics)
    .map(([k, v]) => `${k}=${typeof v === "number" ? formatNumber(v) : String(v)}`)
    .join(" ");
}

/** Classic Jupyter Notebook's CSS makes <summary> a block without its marker: restore it, so folds look clickable. */
const SUMMARY_STYLE = "display:list-item;cursor:pointer";

/** Metadata as `key=value` spans; a multi-line value (a board) keeps its lines in a block of its own. */
function metadataHtml(metadata: Trajectory["metadata"]): string {
  return Object.entries(metadata).map(([key, value]) => {
    const text = String(value);
    const style = text.includes("\n") ? "display:inline-block;vertical-align:top;white-space:pre;font-family:ui-monospace,monospace;" : "";
    return `<span style="color:#6b7280;font-size:11px;${style}">${escapeHtml(`${key}=${text.includes("\n") ? "\n" : ""}${text}`)}</span>`;
  }).join("");
}

function foldedHtml(text: string, collapseOver: number): string {
  const pre = (s: string) => `<div style="white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;font-size:12px">${escapeHtml(s)}</div>`;
  if (text.length <= collapseOver && text.split("\n").length <= 12) return pre(text);
  const firstLine = text.split("\n", 1)[0]!;
  const preview = clipText(firstLine, 120);
  return `<details><summary style="${SUMMARY_STYLE}">${escapeHtml(preview)} <span style="color:#6b7280">(${text.length} chars)</span></summary>${pre(text)}</details>`;
}

function turnHtml(turn: Turn, collapseOver: number): string {
  const color = ROLE_COLORS[turn.role] ?? "#6b7280";
  const badges = [
    turn.toolCallId ? `answers ${escapeHtml(turn.toolCallId)}` : "",
    turn.sampledTokens !== undefined ? `sampled, ${turn.sampledTokens} tokens` : "",
    turn.finishReason && turn.finishReason !== "stop" ? `finish: ${escapeHtml(turn.finishReason)}` : "",
  ].filter((b) => b !== "");
  const calls = turn.toolCalls
    .map((c) => `<div style="margin-top:4px;padding:4px 6px;background:#f5f3ff;border-radius:4px">` +
      `<span style="color:#9333ea">&#8627; call</span> <code>${escapeHtml(c.name)}</code>${foldedHtml(c.arguments, collapseOver)}</div>`)
    .join("");
  return (
    `<div style="border-left:3px solid ${color};padding:2px 8px;margin:6px 0">` +
    `<div style="font-size:11px;color:${color};font-weight:600;text-transform:uppercase">${escapeHtml(turn.role)}` +
    (badges.length ? ` <span style="font-weight:400;text-transform:none;color:#6b7280">${badges.join(" · ")}</span>` : "") +
    `</div>` +
    (turn.content !== "" || turn.toolCalls.length === 0 ? foldedHtml(turn.content, collapseOver) : "") +
    calls +
    `</div>`
  );
}

/** A trajectory as an HTML fragment: header (reward, metrics), turns, tool calls and results, logs. */
export function trajectoryHtml(t: Trajectory, options: TranscriptOptions = {}): string {
  const collapseOver = options.collapseOver ?? 600;
  const metrics = metricsText(t);
  const header =
    `<div style="display:flex;gap:12px;align-items:baseline;flex-wrap:wrap;border-bottom:1px solid #e5e7eb;padding-bottom:4px">` +
    (options.title ? `<b>${escapeHtml(options.title)}</b>` : "") +
    `<span>reward <b>${escapeHtml(formatNumber(t.reward))}</b></span>` +
    (metrics ? `<span style="color:#374151;font-size:12px">${escapeHtml(metrics)}</span>` : "") +
    metadataHtml(t.metadata) +
    `</div>`;
  const turns = t.messagesAndChoices.map((item) => turnHtml(turnOf(item), collapseOver)).join("");
  const histories = t.additionalHistories
    .map((h, i) => `<details><summary style="${SUMMARY_STYLE}">additional history ${i + 1} (${h.messagesAndChoices.length} turns)</summary>` +
      h.messagesAndChoices.map((item) => turnHtml(turnOf(item), collapseOver)).join("") + `</details>`)
    .join("");
  const logs = t.logs.length === 0 ? "" :
    `<details open><summary style="${SUMMARY_STYLE}">logs and judge explanations (${t.logs.length})</summary>` +
    t.logs.map((line) => foldedHtml(line, collapseOver)).join("") + `</details>`;
  return `<div style="font-family:system-ui,sans-serif;font-size:13px;border:1px solid #e5e7eb;border-radius:6px;padding:8px;margin:4px 0">` +
    header + turns + histories + logs + `</div>`;
}

function cut(text: string, limit: number): string {
  return clipText(text, limit, (hidden) => `… (+${hidden} chars)`);
}

/** A trajectory as terminal text, coloured when colours are enabled (NO_COLOR, FORCE_COLOR, TTY). */
export function trajectoryAnsi(t: Trajectory, options: TranscriptOptions & { color?: boolean } = {}): string {
  const color = options.color ?? colorEnabled();
  const limit = options.terminalChars ?? 400;
  const lines: string[] = [];
  const head = [options.title ? ansi(options.title, "bold", color) : "", ansi(`reward ${formatNumber(t.reward)}`, "yellow", color), metricsText(t)]
    .filter((s) => s !== "")
    .join("  ");
  lines.push(`${ansi("━━", "dim", color)} ${head}`);
  for (const item of t.messagesAndChoices) {
    const turn = turnOf(item);
    const label = ansi(`[${turn.role}${turn.toolCallId ? ` ${turn.toolCallId}` : ""}]`, ROLE_ANSI[turn.role] ?? "gray", color);
    // Multi-line content (a board, an email) starts on its own line so its columns stay aligned.
    const content = cut(turn.content, limit);
    if (turn.content !== "" || turn.toolCalls.length === 0) lines.push(content.includes("\n") ? `${label}\n${content}` : `${label} ${content}`);
    else lines.push(label);
    for (const call of turn.toolCalls) lines.push(`  ${ansi("↳", "magenta", color)} ${call.name} ${cut(call.arguments.replace(/\s*\n\s*/g, " "), limit)}`);
  }
  for (const line of t.logs) lines.push(`${ansi("[log]", "dim", color)} ${cut(line, limit)}`);
  return lines.join("\n");
}

export class Transcript extends Renderable {
  readonly trajectory: Trajectory;
  readonly options: TranscriptOptions;

  constructor(trajectory: Trajectory, options: TranscriptOptions = {}) {
    super();
    this.trajectory = trajectory;
    this.options = options;
  }
  toMimeBundle(): MimeBundle {
    const html = this.options.folded
      ? titled(this.options.title, trajectoryHtml(this.trajectory, { ...this.options, title: undefined }), true)
      : trajectoryHtml(this.trajectory, this.options);
    return { "text/html": html, "text/plain": trajectoryAnsi(this.trajectory, { ...this.options, color: false }) };
  }
  toTerminal(): string {
    return trajectoryAnsi(this.trajectory, this.options);
  }
}

/** Trajectories of a group side by side (HTML), best reward outlined; a one-line-per-trajectory table in terminals. */
export class GroupTranscript extends Renderable {
  readonly trajectories: Trajectory[];
  readonly options: TranscriptOptions;

  constructor(group: TrajectoryGroup | readonly Trajectory[], options: TranscriptOptions = {}) {
    super();
    this.options = options;
    this.trajectories = group instanceof TrajectoryGroup ? group.trajectories : [...group];
  }

  private bestIndex(): number {
    return this.trajectories.reduce((best, t, i) => (t.reward > this.trajectories[best]!.reward ? i : best), 0);
  }

  toMimeBundle(): MimeBundle {
    const best = this.bestIndex();
    const columns = this.trajectories
      .map((t, i) => `<div style="flex:0 0 360px;max-width:460px;${i === best ? "outline:2px solid #16a34a;border-radius:6px;" : ""}">` +
        trajectoryHtml(t, { ...this.options, title: `#${i + 1}` }) + `</div>`)
      .join("");
    const body = `<div style="display:flex;gap:8px;overflow-x:auto;align-items:flex-start">${columns}</div>`;
    return { "text/html": titled(this.options.title, body, this.options.folded), "text/plain": this.table(false) };
  }

  toTerminal(): string {
    return this.table(colorEnabled());
  }

  /** One line per trajectory: its reward, metrics and the start of its last assistant turn. */
  table(color: boolean): string {
    const best = this.bestIndex();
    const rows = this.trajectories.map((t, i) => {
      const lastAssistant = [...t.messagesAndChoices].reverse().map(turnOf).find((turn) => turn.role === "assistant");
      const said = lastAssistant ? cut((lastAssistant.content || lastAssistant.toolCalls.map((c) => c.name).join(", ")).replace(/\s+/g, " "), 60) : "";
      const reward = ansi(formatNumber(t.reward).padStart(7), i === best ? "green" : "yellow", color);
      return `#${String(i + 1).padEnd(3)}${reward}  ${metricsText(t)}${said ? `  ${ansi(said, "dim", color)}` : ""}`;
    });
    const head = this.options.title ? [ansi(this.options.title, "bold", color)] : [];
    return [...head, ...rows].join("\n");
  }
}

export function transcript(t: Trajectory, options: TranscriptOptions = {}): Transcript {
  return new Transcript(t, options);
}

export function groupTranscript(group: TrajectoryGroup | readonly Trajectory[], options: TranscriptOptions = {}): GroupTranscript {
  return new GroupTranscript(group, options);
}
