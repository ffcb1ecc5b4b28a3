import { describe, expect, it } from "vitest";
import process from "node:process";
import { Trajectory, TrajectoryGroup, type Choice } from "../../lib/core/trajectory.ts";
import { envNumber, envString, escapeHtml, groupTranscript, transcript, trajectoryAnsi, trajectoryHtml } from "../../lib/notebook/mod.ts";
import { formatDuration, formatNumber, stripAnsi } from "../../lib/notebook/text.ts";

const choice: Choice = {
  index: 0,
  finish_reason: "tool_calls",
  logprobs: null,
  message: {
    role: "assistant", content: "", refusal: null,
    tool_calls: [{ id: "call_1", type: "function", function: { name: "search_emails", arguments: '{"keywords":["falcon"]}' } }],
  },
  token_ids: [1, 2, 3, 4],
};

function agentRun(): Trajectory {
  return new Trajectory({
    messagesAndChoices: [
      { role: "system", content: "You answer <questions> & cite sources." },
      { role: "user", content: "What is the <script>alert(1)</script> capacity?" },
      choice,
      { role: "tool", tool_call_id: "call_1", content: "x".repeat(2000) },
      { role: "assistant", content: "300 MMcf/d" },
    ],
    reward: 0.8,
    metrics: { correct: true, turns: 3 },
    metadata: { question_id: "q7" },
    logs: ["judge: correct answer, one wasted search"],
  });
}

describe("HTML transcripts", () => {
  it("escapes every piece of text", () => {
    const html = trajectoryHtml(agentRun());
    expect(html).not.toContain("<script>alert(1)</script>");
    expect(html).toContain("&lt;script&gt;alert(1)&lt;/script&gt;");
    expect(html).toContain("You answer &lt;questions&gt; &amp; cite sources.");
    expect(escapeHtml(`"'<>&`)).toBe("&quot;&#39;&lt;&gt;&amp;");
  });

  it("shows tool calls with pretty arguments, tool results with their call, reward, metrics, metadata and logs", () => {
    const html = trajectoryHtml(agentRun(), { title: "run 1" });
    expect(html).toContain("<code>search_emails</code>");
    expect(html).toContain(escapeHtml('{\n  "keywords": [\n    "falcon"\n  ]\n}'));
    expect(html).toContain("answers call_1");
    expect(html).toContain("sampled, 4 tokens");
    expect(html).toContain("finish: tool_calls");
    expect(html).toContain("reward <b>0.8</b>");
    expect(html).toContain("correct=true turns=3");
    expect(html).toContain("question_id=q7");
    expect(html).toContain("judge: correct answer, one wasted search");
    expect(html).toContain("<b>run 1</b>");
  });

  it("keeps a multi-line metadata value (a board) on its own lines", () => {
    const run = agentRun();
    run.metadata.final_board = "xo_\n_x_\no_x";
    const html = trajectoryHtml(run);
    expect(html).toMatch(/<span style="[^"]*white-space:pre;[^"]*">final_board=\nxo_\n_x_\no_x<\/span>/);
    expect(html).toMatch(/<span style="color:#6b7280;font-size:11px;">question_id=q7<\/span>/);
  });

  it("folds long content into <details> whose summaries show their marker, and leaves short content open", () => {
    const run = agentRun();
    run.additionalHistories.push({ messagesAndChoices: [{ role: "user", content: "sub-agent" }] });
    const summaries = trajectoryHtml(run).match(/<summary[^>]*>/g)!;
    expect(summaries.length).toBe(3); // long content, the additional history, the logs
    for (const summary of summaries) expect(summary).toContain("display:list-item");
    const html = trajectoryHtml(agentRun());
    expect(html.match(/<details>/g)!.length).toBe(1);
    expect(html).toContain("(2000 chars)</span></summary>");
    expect(trajectoryHtml(agentRun(), { collapseOver: 10_000 })).not.toContain("(2000 chars)");
  });

  it("folds long content without splitting an astral character (nbconvert cannot save half a surrogate pair)", () => {
    const content = `${"a".repeat(119)}${"😀".repeat(400)}`; // the 120-unit preview would end in half a pair
    const html = trajectoryHtml(new Trajectory({ messagesAndChoices: [{ role: "user", content }] }));
    expect(html).toContain(`${"a".repeat(119)}…`);
    // encodeURIComponent throws on half a surrogate pair, as nbconvert's UTF-8 writer does.
    expect(() => encodeURIComponent(html)).not.toThrow();
    expect(() => encodeURIComponent(trajectoryAnsi(new Trajectory({ messagesAndChoices: [{ role: "user", content }] }), { terminalChars: 120 }))).not.toThrow();
  });

  it("shows malformed tool-call JSON as sampled", () => {
    const bad = { ...choice, message: { ...choice.message, tool_calls: [{ id: "c", type: "function" as const, function: { name: "f", arguments: "{oops" } }] } };
    expect(trajectoryHtml(new Trajectory({ messagesAndChoices: [bad] }))).toContain("{oops");
  });
});

describe("terminal transcripts", () => {
  it("colours roles when asked, cuts long content, keeps boards on their own lines", () => {
    const coloured = trajectoryAnsi(agentRun(), { color: true, terminalChars: 50 });
    expect(coloured).toContain("\u001b[36m[user]\u001b[39m");
    const plain = trajectoryAnsi(agentRun(), { color: false, terminalChars: 50 });
    expect(plain).toBe(stripAnsi(coloured));
    expect(plain).toContain(`[tool call_1] ${"x".repeat(50)}… (+1950 chars)`);
    expect(plain).toContain('  ↳ search_emails { "keywords": [ "falcon" ] }');
    expect(plain).toContain("[log] judge: correct answer");
    expect(trajectoryAnsi(new Trajectory({ messagesAndChoices: [{ role: "user", content: "a|b\nc|d" }] }), { color: false })).toContain("[user]\na|b\nc|d");
  });
});

describe("group view", () => {
  it("puts trajectories side by side, outlines the best, and has a one-line-per-trajectory table", () => {
    const worse = agentRun();
    worse.reward = 0.1;
    const group = new TrajectoryGroup([worse, agentRun()]);
    const bundle = groupTranscript(group, { title: "group <1>" }).toMimeBundle();
    const html = String(bundle["text/html"]);
    expect(html).toContain("display:flex");
    expect(html.indexOf("outline:2px solid")).toBeGreaterThan(html.indexOf("#1"));
    expect(html).toContain("group &lt;1&gt;");
    expect(String(bundle["text/plain"]).split("\n")).toEqual([
      "group <1>",
      "#1      0.1  correct=true turns=3  300 MMcf/d",
      "#2      0.8  correct=true turns=3  300 MMcf/d",
    ]);
    expect(transcript(worse).toMimeBundle()["text/plain"]).toContain("reward 0.1");
  });

  it("folds the whole view under its title when asked (an alarm's trajectories one click away)", () => {
    const group = new TrajectoryGroup([agentRun(), agentRun()]);
    const folded = String(groupTranscript(group, { title: "ALARM <jump>", folded: true }).toMimeBundle()["text/html"]);
    expect(folded).toMatch(/^<details><summary [^>]*>ALARM &lt;jump&gt;<\/summary><div style="display:flex/);
    expect(folded.endsWith("</div></details>")).toBe(true);
    const one = String(transcript(agentRun(), { title: "one <run>", folded: true }).toMimeBundle()["text/html"]);
    expect(one).toMatch(/^<details><summary [^>]*>one &lt;run&gt;<\/summary><div style="font-family/);
    expect(one.match(/one &lt;run&gt;/g)).toHaveLength(1);
  });
});

describe("formats and parameters", () => {
  it("formats numbers and durations short", () => {
    expect([0.123456, 12, 1234.5, 12_345, 2_500_000, Number.NaN].map(formatNumber)).toEqual(["0.123", "12", "1234.5", "12.3k", "2.50M", "NaN"]);
    // Exponents keep their zeros: a loss of -4.49e-10 is not -4.49e-1.
    expect([-4.49e-10, 1e-10, 2.5e-7, 1.2e-20, 0.5, 0.1, 0.000123].map(formatNumber)).toEqual(["-4.49e-10", "1e-10", "2.5e-7", "1.2e-20", "0.5", "0.1", "0.000123"]);
    expect([5, 65, 3725].map(formatDuration)).toEqual(["0:05", "1:05", "1:02:05"]);
  });

  it("reads notebook parameters from the environment", () => {
    process.env.ART_TEST_PARAM = "12";
    expect(envNumber("ART_TEST_PARAM", 3)).toBe(12);
    expect(envNumber("ART_TEST_PARAM_UNSET", 3)).toBe(3);
    process.env.ART_TEST_PARAM = "twelve";
    expect(() => envNumber("ART_TEST_PARAM", 3)).toThrow('environment variable ART_TEST_PARAM="twelve" is not a number; unset it or give a number.');
    expect(envString("ART_TEST_PARAM", "x")).toBe("twelve");
    delete process.env.ART_TEST_PARAM;
  });
});
