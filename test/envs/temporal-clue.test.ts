import { describe, expect, it } from "vitest";
import {
  clueHolds, generateTemporalClue, guessPolicyTemporalClue, parseTemporalClueAnswers, renderClue, renderTemporalClue, rolloutTemporalClue,
  scoreTemporalClue, solverPolicyTemporalClue, solveTemporalClue, SYSTEM_PROMPT_TEMPORAL_CLUE, temporalClueAnswerMatches,
  type ClueQuestion, type ClueStatement, type ClueWorld, type TemporalClueCast, type TemporalClueOptions, type TemporalCluePuzzle,
} from "../../lib/envs/mod.ts";
import { ArtError } from "../../lib/core/errors.ts";
import { seededRandom } from "../../lib/core/random.ts";
import type { Choice } from "../../lib/core/trajectory.ts";

// A hand-written evening: Mr. Green at 8 pm, Mrs. White at 9 pm (the murder, with the rope in the library), Miss Scarlet at 10 pm with the knife.
const CAST: TemporalClueCast = {
  suspect: ["Mrs. White", "Mr. Green", "Miss Scarlet"], weapon: ["rope", "knife", "candlestick"], room: ["hall", "library", "study"], motive: [],
  hours: [20, 21, 22],
};
const white = { kind: "item", category: "suspect", item: 0 } as const;
const green = { kind: "item", category: "suspect", item: 1 } as const;
const scarlet = { kind: "item", category: "suspect", item: 2 } as const;
const rope = { kind: "item", category: "weapon", item: 0 } as const;
const knife = { kind: "item", category: "weapon", item: 1 } as const;
const candlestick = { kind: "item", category: "weapon", item: 2 } as const;
const library = { kind: "item", category: "room", item: 1 } as const;
const murder = { kind: "murder" } as const;
const hour = (slot: number) => ({ kind: "hour", slot }) as const;
const MURDER_QUESTIONS: ClueQuestion[] = [
  { kind: "murder", attribute: "suspect" }, { kind: "murder", attribute: "weapon" }, { kind: "murder", attribute: "room" }, { kind: "murder", attribute: "time" },
];
const UNIQUE_CLUES: ClueStatement[] = [
  { kind: "same", a: green, b: hour(0) },
  { kind: "before", a: white, b: scarlet },
  { kind: "before", a: murder, b: scarlet, gap: 1 },
  { kind: "same", a: rope, b: library },
  { kind: "same", a: knife, b: hour(2) },
  { kind: "different", a: murder, b: candlestick },
];
const handPuzzle = (clues: ClueStatement[]) => ({ cast: CAST, clues, questions: MURDER_QUESTIONS });

describe("clues on an evening", () => {
  // Mr. Green, Mrs. White, Miss Scarlet at 8, 9, 10 pm; candlestick, rope, knife; hall, library, study; the murder at 9 pm.
  const evening: ClueWorld = { suspect: [1, 0, 2], weapon: [2, 0, 1], room: [0, 1, 2], motive: [], murder: 1 };
  it("holds or not as the evening says", () => {
    for (const clue of UNIQUE_CLUES) expect(clueHolds(clue, evening), renderClue(clue, CAST)).toBe(true);
    const holds = (clue: ClueStatement) => clueHolds(clue, evening);
    expect(holds({ kind: "before", a: murder, b: white })).toBe(false); // not before itself
    expect(holds({ kind: "before", a: scarlet, b: white })).toBe(false);
    expect(holds({ kind: "before", a: green, b: scarlet, gap: 1 })).toBe(false);
    expect(holds({ kind: "before", a: green, b: scarlet, gap: 2 })).toBe(true);
    expect(holds({ kind: "before", a: hour(0), b: knife })).toBe(true);
    expect(holds({ kind: "same", a: murder, b: white })).toBe(true);
    expect(holds({ kind: "different", a: murder, b: rope })).toBe(false);
    expect(holds({ kind: "same", a: white, b: hour(0) })).toBe(false);
    expect(holds({ kind: "present", a: library })).toBe(true);
    expect(holds({ kind: "absent", a: library })).toBe(false);
    // With a fourth suspect who never came: absent holds, and every link with her is false (or vacuously "different").
    const plum = { kind: "item", category: "suspect", item: 3 } as const;
    expect(holds({ kind: "absent", a: plum })).toBe(true);
    expect(holds({ kind: "same", a: plum, b: murder })).toBe(false);
    expect(holds({ kind: "before", a: plum, b: scarlet })).toBe(false);
    expect(holds({ kind: "different", a: plum, b: library })).toBe(true);
  });
});

describe("the solver on hand-written puzzles", () => {
  it("finds the one answer of a sound puzzle", () => {
    expect(solveTemporalClue(handPuzzle(UNIQUE_CLUES), 10)).toEqual([["Mrs. White", "rope", "library", "9 pm"]]);
  });

  it("finds every answer the clues leave open, and stops at the limit", () => {
    // Without "the murderer did not have the candlestick" the weapon, and with it the room, stay open.
    const open = solveTemporalClue(handPuzzle(UNIQUE_CLUES.slice(0, -1)), 10);
    expect(open.map((answers) => answers.join(" | ")).sort()).toEqual([
      "Mrs. White | candlestick | hall | 9 pm", "Mrs. White | candlestick | study | 9 pm", "Mrs. White | rope | library | 9 pm",
    ]);
    expect(solveTemporalClue(handPuzzle(UNIQUE_CLUES.slice(0, -1)))).toHaveLength(2);
    // The murderer is decided though her hour is not: the same answer through three murder hours counts once.
    expect(solveTemporalClue({ cast: CAST, clues: [{ kind: "same", a: murder, b: white }], questions: MURDER_QUESTIONS.slice(0, 1) }, 10)).toEqual([["Mrs. White"]]);
    // A question the clues do decide stays unique even when others would not.
    expect(solveTemporalClue({ ...handPuzzle(UNIQUE_CLUES.slice(0, -1)), questions: [{ kind: "visit", slot: 0, attribute: "suspect" }] })).toEqual([["Mr. Green"]]);
  });

  it("finds no answer when the clues contradict each other", () => {
    expect(solveTemporalClue(handPuzzle([...UNIQUE_CLUES, { kind: "same", a: white, b: hour(0) }]))).toEqual([]);
    expect(solveTemporalClue(handPuzzle([{ kind: "before", a: white, b: green }, { kind: "before", a: green, b: white }]))).toEqual([]);
    // Every visit has an item of every category: with three suspects for three visits, none can be absent.
    expect(solveTemporalClue(handPuzzle([{ kind: "absent", a: white }]))).toEqual([]);
  });

  it("rejects questions the cast cannot answer", () => {
    expect(() => solveTemporalClue({ ...handPuzzle(UNIQUE_CLUES), questions: [{ kind: "murder", attribute: "motive" }] })).toThrow(/no motives/);
    expect(() => solveTemporalClue({ ...handPuzzle(UNIQUE_CLUES), questions: [{ kind: "visit", slot: 3, attribute: "room" }] })).toThrow(/3 visits/);
  });
});

/** Every sequence of `k` distinct indices below `n`. */
function injections(n: number, k: number): number[][] {
  if (k === 0) return [[]];
  return injections(n, k - 1).flatMap((prefix) => Array.from({ length: n }, (_, i) => i).filter((i) => !prefix.includes(i)).map((i) => [...prefix, i]));
}

/** The solver's answer, worked out the slow way: every evening of the cast, checked against every clue. */
function bruteForceAnswers(puzzle: Pick<TemporalCluePuzzle, "cast" | "clues" | "questions">): string[] {
  const { cast } = puzzle;
  const times = cast.hours.length;
  const found = new Set<string>();
  for (const suspect of injections(cast.suspect.length, times)) {
    for (const weapon of injections(cast.weapon.length, times)) {
      for (const room of injections(cast.room.length, times)) {
        for (const motive of cast.motive.length === 0 ? [[]] : injections(cast.motive.length, times)) {
          for (let m = 0; m < times; m++) {
            const world: ClueWorld = { suspect, weapon, room, motive, murder: m };
            if (!puzzle.clues.every((clue) => clueHolds(clue, world))) continue;
            found.add(puzzle.questions.map((q) => {
              if (q.attribute === "time") return `${cast.hours[m]! - 12} pm`;
              return cast[q.attribute][world[q.attribute][q.kind === "visit" ? q.slot : m]!]!;
            }).join(" | "));
          }
        }
      }
    }
  }
  return [...found].sort();
}

/** A clue the evening that satisfied `clue` cannot satisfy (for "before", the reversed order). */
function negated(clue: ClueStatement): ClueStatement {
  switch (clue.kind) {
    case "present":
      return { kind: "absent", a: clue.a };
    case "absent":
      return { kind: "present", a: clue.a };
    case "before":
      return { kind: "before", a: clue.b, b: clue.a };
    case "same":
      return { kind: "different", a: clue.a, b: clue.b };
    case "different":
      return { kind: "same", a: clue.a, b: clue.b };
  }
}

describe("the solver against brute force", () => {
  const configs: TemporalClueOptions[] = [
    { times: 3, suspects: 4, rooms: 4, questions: 5 },
    { times: 3, weapons: 4, motives: 3, questions: 6 },
  ];
  it.each(configs)("agrees on generated, weakened and contradicted clue sets (%o)", (options) => {
    const kinds = new Set<number>();
    for (let seed = 0; seed < 6; seed++) {
      const puzzle = generateTemporalClue({ seed, ...options });
      const sets = [
        puzzle.clues,
        ...puzzle.clues.map((_, i) => puzzle.clues.filter((__, j) => j !== i)),
        puzzle.clues.filter((_, j) => j % 2 === 0),
        ...puzzle.clues.map((clue, i) => puzzle.clues.map((other, j) => (i === j ? negated(clue) : other))),
      ];
      for (const clues of sets) {
        const expected = bruteForceAnswers({ ...puzzle, clues });
        const solved = solveTemporalClue({ ...puzzle, clues }, 1000).map((answers) => answers.join(" | ")).sort();
        expect(solved).toEqual(expected);
        kinds.add(Math.min(expected.length, 2));
      }
    }
    // The sets cover all three cases: contradictory, sound and open.
    expect([...kinds].sort()).toEqual([0, 1, 2]);
  });
});

describe("the generator", () => {
  it("gives the same puzzle for the same seed and options, another for another seed", () => {
    const a = generateTemporalClue({ seed: 7, times: 5, motives: 5, questions: 6 });
    expect(generateTemporalClue({ seed: 7, times: 5, motives: 5, questions: 6 })).toEqual(a);
    expect(renderTemporalClue(generateTemporalClue({ seed: 7, times: 5, motives: 5, questions: 6 }))).toBe(renderTemporalClue(a));
    expect(renderTemporalClue(generateTemporalClue({ seed: 8, times: 5, motives: 5, questions: 6 }))).not.toBe(renderTemporalClue(a));
  });

  const configs: [TemporalClueOptions, number][] = [
    [{}, 40],
    [{ times: 2, questions: 1 }, 10],
    [{ times: 5, suspects: 6, weapons: 7, rooms: 6, questions: 7 }, 15],
    [{ times: 5, motives: 6, questions: 8 }, 15],
    [{ times: 8, questions: 10 }, 4],
  ];
  it.each(configs)("makes puzzles with true clues, a unique answer and no clue to spare (%o, %i seeds)", (options, seeds) => {
    for (let seed = 0; seed < seeds; seed++) {
      const puzzle = generateTemporalClue({ seed, ...options });
      const times = options.times ?? 4;
      expect(puzzle.cast.hours).toHaveLength(times);
      expect(puzzle.cast.hours.at(-1)).toBe(23);
      expect(puzzle.cast.suspect).toHaveLength(options.suspects ?? times);
      expect(puzzle.questions).toHaveLength(options.questions ?? 4);
      expect(new Set(puzzle.questions.map((q) => JSON.stringify(q))).size).toBe(puzzle.questions.length);
      for (const clue of puzzle.clues) expect(clueHolds(clue, puzzle.solution), renderClue(clue, puzzle.cast)).toBe(true);
      expect(solveTemporalClue(puzzle, 10)).toEqual([puzzle.answers]);
      for (let i = 0; i < puzzle.clues.length; i++) {
        expect(solveTemporalClue({ ...puzzle, clues: puzzle.clues.filter((_, j) => j !== i) }).length, `seed ${seed}: clue ${i + 1} is not needed`).toBe(2);
      }
    }
  });

  it("asks about the murder first (who, weapon, room, time, motive), then about single visits", () => {
    const puzzle = generateTemporalClue({ seed: 3, motives: 4, questions: 7 });
    expect(puzzle.questions.slice(0, 5)).toEqual([...MURDER_QUESTIONS, { kind: "murder", attribute: "motive" }]);
    expect(puzzle.questions.slice(5).every((q) => q.kind === "visit")).toBe(true);
    expect(puzzle.answers[0]).toBe(puzzle.cast.suspect[puzzle.solution.suspect[puzzle.solution.murder]!]);
  });

  it("rejects options it cannot honour, naming the option and its range", () => {
    const code = (options: TemporalClueOptions) => {
      try {
        generateTemporalClue(options);
      } catch (error) {
        return error instanceof ArtError ? `${error.code}: ${error.message}` : String(error);
      }
      return "no error";
    };
    expect(code({ times: 1 })).toMatch(/^temporal_clue.options: .*times must be a whole number from 2 to 8.*got 1$/);
    expect(code({ times: 9 })).toMatch(/times must be a whole number from 2 to 8/);
    expect(code({ times: 4, suspects: 3 })).toMatch(/suspects must be a whole number from 4 to 9/);
    expect(code({ times: 4, motives: 2 })).toMatch(/motives must be a whole number from 4 to 9 .*or 0 for none\); got 2$/);
    expect(code({ times: 4, rooms: 4.5 })).toMatch(/rooms must be a whole number/);
    expect(code({ questions: 0 })).toMatch(/questions must be a whole number from 1 to 16/);
    expect(code({ questions: 17 })).toMatch(/from 1 to 16/);
  });
});

describe("the prompt", () => {
  it("states each kind of clue in plain English", () => {
    const say = (clue: ClueStatement) => renderClue(clue, CAST);
    expect(say({ kind: "same", a: green, b: hour(0) })).toBe("Mr. Green came at 8 pm.");
    expect(say({ kind: "same", a: library, b: rope })).toBe("The person with the rope was in the library.");
    expect(say({ kind: "same", a: murder, b: white })).toBe("Mrs. White was the murderer.");
    expect(say({ kind: "different", a: murder, b: candlestick })).toBe("The murderer did not have the candlestick.");
    expect(say({ kind: "different", a: hour(2), b: library })).toBe("The person in the library did not come at 10 pm.");
    expect(say({ kind: "before", a: white, b: scarlet })).toBe("Mrs. White came before Miss Scarlet.");
    expect(say({ kind: "before", a: murder, b: knife, gap: 1 })).toBe("The murderer came exactly one hour before the person with the knife.");
    expect(say({ kind: "before", a: green, b: library, gap: 2 })).toBe("Mr. Green came exactly 2 hours before the person in the library.");
    expect(say({ kind: "before", a: hour(0), b: rope })).toBe("The person with the rope came after 8 pm.");
    expect(say({ kind: "before", a: rope, b: hour(2) })).toBe("The person with the rope came before 10 pm.");
    expect(say({ kind: "absent", a: white })).toBe("Mrs. White never came.");
    expect(say({ kind: "present", a: rope })).toBe("Someone had the rope.");
    expect(say({ kind: "absent", a: library })).toBe("Nobody was in the library.");
  });

  it("renders the story, the cast, the numbered clues, the questions and the answer format", () => {
    const puzzle = generateTemporalClue({ seed: 11, times: 4, suspects: 5, motives: 4, questions: 6 });
    const text = renderTemporalClue(puzzle);
    expect(text).toMatch(/^Someone was murdered at Tudor Mansion last night\. Between 8 pm and 11 pm there were 4 visits/);
    expect(text).toContain("driven by one motive");
    expect(text).toContain("Some may be part of none.");
    expect(text).toContain(`Suspects: ${puzzle.cast.suspect.join(", ")}\n`);
    expect(text).toContain(`Motives: ${puzzle.cast.motive.join(", ")}\n`);
    expect(text).toContain("Times: 8 pm, 9 pm, 10 pm, 11 pm\n");
    puzzle.clues.forEach((clue, i) => expect(text).toContain(`\n${i + 1}. ${renderClue(clue, puzzle.cast)}\n`));
    expect(text).toContain("\nQ1: Who is the murderer?\nQ2: With which weapon was the murder committed?\n");
    expect(text).toMatch(/\nQ6: .+\?\n/);
    expect(text.endsWith("Q5: <answer>, then Q6: <answer>.")).toBe(true);
    for (const answer of puzzle.answers) expect(text).toContain(answer); // every answer is a name the puzzle lists
    // Without motives or spare items, the story says neither.
    const plain = renderTemporalClue(generateTemporalClue({ seed: 11 }));
    expect(plain).not.toMatch(/motive|part of none/);
  });
});

describe("answers", () => {
  it("reads Q lines after any thinking, the last line of a question winning", () => {
    expect(parseTemporalClueAnswers("Q1: Mrs. White\nQ2: rope", 3)).toEqual({ ok: true, answers: ["Mrs. White", "rope", undefined] });
    // An empty answer line stays empty: the next line is not taken for its answer.
    expect(parseTemporalClueAnswers("Q1:\nQ2: rope", 2)).toEqual({ ok: true, answers: [undefined, "rope"] });
    expect(parseTemporalClueAnswers("Q1: Mrs. White\nQ2:\nQ3: hall", 3)).toEqual({ ok: true, answers: ["Mrs. White", undefined, "hall"] });
    expect(parseTemporalClueAnswers("<think>Q1: Mr. Green</think>\nMaybe Q1: no.\nQ1: Mr. Green\nQ1: Mrs. White", 1)).toEqual({ ok: true, answers: ["Mrs. White"] });
    expect(parseTemporalClueAnswers("**Q1:** Mrs. White.\n- Q2) the rope\n  q3. 9 pm\n> **Q4**: hall", 4)).toEqual({ ok: true, answers: ["Mrs. White", "the rope", "9 pm", "hall"] });
    // Numbers outside the questions and empty answers are skipped; with nothing left, the reply does not parse.
    expect(parseTemporalClueAnswers("Q0: x\nQ5: y\nQ2:", 4)).toEqual({ ok: false, error: expect.stringMatching(/no answer line for any of the 4 questions/) });
    expect(parseTemporalClueAnswers("<think>Q1: Mrs. White</think>", 1).ok).toBe(false);
    expect(parseTemporalClueAnswers("<move>B2</move>", 1).ok).toBe(false);
    expect(parseTemporalClueAnswers("The answer to Q1: Mrs. White", 1).ok).toBe(false); // the label starts the line
  });

  it("matches names ignoring case, 'the' and punctuation, and times by their hour", () => {
    expect(temporalClueAnswerMatches("The Rope", "rope")).toBe(true);
    expect(temporalClueAnswerMatches("Mrs White", "Mrs. White")).toBe(true);
    expect(temporalClueAnswerMatches("billiard-room", "billiard room")).toBe(true);
    expect(temporalClueAnswerMatches("Mr. Green", "Mrs. White")).toBe(false);
    expect(temporalClueAnswerMatches("rope, or the knife", "rope")).toBe(false);
    expect(temporalClueAnswerMatches("", "rope")).toBe(false);
    for (const time of ["9 pm", "9pm", "9 PM", "9:00 p.m.", "21:00"]) expect(temporalClueAnswerMatches(time, "9 pm"), time).toBe(true);
    for (const time of ["9 am", "9", "10 pm", "nine"]) expect(temporalClueAnswerMatches(time, "9 pm"), time).toBe(false);
    expect(temporalClueAnswerMatches("12 pm", "12 pm")).toBe(true);
  });

  it("scores the share of questions right; an unparseable reply scores 0", () => {
    const puzzle = { ...handPuzzle(UNIQUE_CLUES), seed: 0, solution: { suspect: [1, 0, 2], weapon: [2, 0, 1], room: [0, 1, 2], motive: [], murder: 1 }, answers: ["Mrs. White", "rope", "library", "9 pm"] };
    expect(scoreTemporalClue(puzzle, "Q1: Mrs. White\nQ2: knife\nQ3: the library").metrics).toEqual({ accuracy: 0.5, correct: 2, answered: 0.75, parse_failure: false });
    expect(scoreTemporalClue(puzzle, "Q1: mrs white\nQ2: Rope\nQ3: Library\nQ4: 9pm").reward).toBe(1);
    const garbage = scoreTemporalClue(puzzle, "I think it was Mrs. White with the rope.");
    expect(garbage.reward).toBe(0);
    expect(garbage.metrics).toEqual({ accuracy: 0, correct: 0, answered: 0, parse_failure: true });
  });
});

describe("rollout", () => {
  const puzzle = generateTemporalClue({ seed: 5, times: 5, motives: 5, questions: 6 });

  it("scores the solver's deductions 1, from the clues alone", async () => {
    const deduced = solverPolicyTemporalClue([], { ...puzzle, answers: [], solution: { ...puzzle.solution, murder: -1 } });
    expect(deduced).toBe(puzzle.answers.map((a, i) => `Q${i + 1}: ${a}`).join("\n"));
    const trajectory = await rolloutTemporalClue(solverPolicyTemporalClue, puzzle);
    expect(trajectory.reward).toBe(1);
    expect(trajectory.metrics).toMatchObject({ accuracy: 1, correct: 6, answered: 1, parse_failure: false });
    expect(trajectory.messages().map((m) => m.role)).toEqual(["system", "user", "assistant"]);
    expect(trajectory.messages()[0]!.content).toBe(SYSTEM_PROMPT_TEMPORAL_CLUE);
    expect(trajectory.messages()[1]!.content).toBe(renderTemporalClue(puzzle));
    expect(trajectory.metadata).toMatchObject({ env: "temporal-clue", seed: 5, clues: puzzle.clues.length, questions: 6, answers: puzzle.answers.join(" | ") });
  });

  it("scores garbage 0 and logs why", async () => {
    const trajectory = await rolloutTemporalClue(() => "<move>B2</move>", puzzle);
    expect(trajectory.reward).toBe(0);
    expect(trajectory.metrics).toMatchObject({ accuracy: 0, answered: 0, parse_failure: true });
    expect(trajectory.logs.join("\n")).toMatch(/unparseable: no answer line/);
  });

  it("keeps a model's Choice as it is (training needs its tokens), and reads its text", async () => {
    const choice = { index: 0, finish_reason: "stop", logprobs: null, message: { role: "assistant", content: `Q1: ${puzzle.answers[0]}`, refusal: null }, token_ids: [1, 2] } as Choice;
    const trajectory = await rolloutTemporalClue(async (messages) => {
      expect(messages).toHaveLength(2);
      return choice;
    }, puzzle);
    expect(trajectory.messagesAndChoices.at(-1)).toBe(choice);
    expect(trajectory.reward).toBeCloseTo(1 / 6);
  });

  it("guesses names of the right kind (the chance baseline), replayable from its seed", async () => {
    const guess = (seed: number) => guessPolicyTemporalClue(seededRandom(seed))([], puzzle) as string;
    expect(guess(1)).toBe(guess(1));
    const parsed = parseTemporalClueAnswers(guess(1), 6);
    expect(parsed.ok && parsed.answers.every((a, i) => {
      const q = puzzle.questions[i]!;
      return q.attribute === "time" ? /^\d+ pm$/.test(a!) : puzzle.cast[q.attribute].includes(a!);
    })).toBe(true);
    const rewards = await Promise.all(Array.from({ length: 40 }, (_, seed) => rolloutTemporalClue(guessPolicyTemporalClue(seededRandom(seed)), puzzle).then((t) => t.reward)));
    const mean = rewards.reduce((a, b) => a + b, 0) / rewards.length;
    expect(mean).toBeGreaterThan(0.05);
    expect(mean).toBeLessThan(0.5);
  });

  it("the solver player refuses a puzzle whose clues do not decide the answers", () => {
    expect(() => solverPolicyTemporalClue([], { ...puzzle, clues: puzzle.clues.slice(1) })).toThrow(/more than one answer/);
    expect(() => solverPolicyTemporalClue([], { ...puzzle, clues: [...puzzle.clues, negated(puzzle.clues[0]!)] })).toThrow(/contradict/);
  });
});
