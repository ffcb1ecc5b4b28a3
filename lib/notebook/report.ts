/**
 * Terminal runs cannot show plots, so each displayed plot is also collected into one self-contained
 * HTML report (each plot an inline SVG), rewritten after every plot. Its path is printed.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import process from "node:process";
import { escapeHtml } from "./text.ts";

const sections: string[] = [];

/** ART_REPORT_FILE, else .art/report.html under the working directory (.art/ is where runs write). */
export function reportPath(): string {
  return resolve(process.env.ART_REPORT_FILE ?? ".art/report.html");
}

/** Wraps body HTML into a standalone page. */
export function htmlPage(title: string, body: string): string {
  return [
    "<!DOCTYPE html>",
    `<html><head><meta charset="utf-8"><title>${escapeHtml(title)}</title>`,
    '<style>body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#111}</style>',
    `</head><body>\n${body}\n</body></html>\n`,
  ].join("\n");
}

/** Appends a section to this process's report, rewrites the file, and returns its path. */
export function addToReport(title: string, html: string): string {
  sections.push(`<section><h2>${escapeHtml(title)}</h2>\n${html}\n</section>`);
  const path = reportPath();
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, htmlPage("art-ts report", sections.join("\n")));
  return path;
}
