import { afterEach, describe, expect, it, vi } from "vitest";
import { InvalidAnswer, parseJudgeAnswer } from "../../lib/ruler/answer.ts";

const entry = (id: string, score: number, explanation = "") => ({ trajectory_id: id, explanation, score });

describe("parseJudgeAnswer", () => {
  it("skips prose with braces before the answer, and braces inside explanation strings", () => {
    const json = JSON.stringify({ scores: [entry("1", 0.2, 'used {"x": 1} and a } brace'), entry("2", 0.4)] });
    const parsed = parseJudgeAnswer(`Format: {trajectory_id, score}. [draft] Final: ${json} done`, 2, []);
    expect(parsed.map((e) => [e.score, e.explanation])).toEqual([[0.2, 'used {"x": 1} and a } brace'], [0.4, ""]]);
  });

  it("accepts a bare array of entries and an `id` field", () => {
    expect(parseJudgeAnswer('[{"id": 2, "score": 0.5}, {"id": 1, "score": 0.1}]', 2, []).map((e) => e.score)).toEqual([0.1, 0.5]);
  });

  it("uses the last JSON-bearing fence after an unusable one", () => {
    const text = "```\nnot json\n```\nfixed:\n```json\n" + JSON.stringify({ scores: [entry("1", 1)] }) + "\n```";
    expect(parseJudgeAnswer(text, 1, [])[0].score).toBe(1);
  });

  it("finds the answer after a bracket that never closes, and inside a wrapping object", () => {
    const json = JSON.stringify({ scores: [entry("1", 0.3)] });
    expect(parseJudgeAnswer(`Scores [see below, "quoted: ${json}`, 1, [])[0]!.score).toBe(0.3);
    expect(parseJudgeAnswer(`{"result": {"note": [1, 2], "ranking": ${json}}}`, 1, [])[0]!.score).toBe(0.3);
  });

  describe("reads in linear time", () => {
    afterEach(() => vi.restoreAllMocks());
    // JSON.parse's work is the characters handed to it; the bracket scan is linear by construction (bounded rescans).
    function parsedCharacters(text: string): number {
      const parse = vi.spyOn(JSON, "parse");
      parse.mockClear();
      try {
        parseJudgeAnswer(text, 1, []);
      } catch (error) {
        if (!(error instanceof InvalidAnswer)) throw error;
      }
      return parse.mock.calls.reduce((sum, [json]) => sum + String(json).length, 0);
    }

    it("parses at most four times the answer's length, however brackets nest", () => {
      const n = 40_000;
      const answers = [
        "[".repeat(2 * n),                                   // unbalanced: every bracket an opener
        `${"[".repeat(n)}x${"]".repeat(n)}`,                 // balanced but never JSON: every span fails
        `${"[".repeat(n)}1${"]".repeat(n)}`,                 // valid JSON nested n deep, no scores in it
        `${'{"a":'.repeat(n / 5)}"}"${"}".repeat(n / 5)}`,   // objects with a brace in a string
        `${"[{".repeat(n / 2)}`,                             // the shape of the quadratic report (issue 21)
      ];
      for (const answer of answers) expect(parsedCharacters(answer), answer.slice(0, 12)).toBeLessThanOrEqual(4 * answer.length);
    });

    it("still gives each later candidate its chance within that work", () => {
      const json = JSON.stringify({ scores: [entry("1", 0.9)] });
      expect(parseJudgeAnswer(`${"[x] ".repeat(5000)}${json}`, 1, [])[0]!.score).toBe(0.9);
    });
  });

  it("clamps and counts out-of-range scores and sub-scores", () => {
    const [e] = parseJudgeAnswer(JSON.stringify({ scores: [{ trajectory_id: "1", score: -0.5, sub_scores: { a: 2, b: 0.5 } }] }), 1, ["a", "b"]);
    expect(e).toEqual({ score: 0, explanation: "", subScores: { a: 1, b: 0.5 }, clamped: 2 });
  });

  it("raises InvalidAnswer with a reason the judge can act on", () => {
    const cases: [string, RegExp][] = [
      ["", /the answer was empty/],
      ["<think>hmm</think>", /the answer was empty/],
      ['{"result": 1}', /no JSON object with a "scores" array/],
      ['{"scores": [1, 2]}', /score entry 1 is not an object/],
      ['{"scores": [{"score": null}]}', /score entry 1 has no numeric "score"/],
      [JSON.stringify({ scores: [entry("1", 0.1), entry("2", 0.2), entry("3", 0.3)] }), /expected exactly 2 scores \(trajectory_id 1 to 2\), got 3/],
    ];
    for (const [text, reason] of cases) {
      expect(() => parseJudgeAnswer(text, 2, [])).toThrow(InvalidAnswer);
      expect(() => parseJudgeAnswer(text, 2, [])).toThrow(reason);
    }
  });
});
