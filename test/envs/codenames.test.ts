import { describe, expect, it } from "vitest";
import {
  CODENAMES_REWARDS, CODENAMES_WORDS, CodenamesGame, keyCounts, legalClueFrom, legalGuessFrom, parseCodenamesClue, parseCodenamesGuess,
  randomCodenamesPolicy, rolloutCodenames, scoreCodenames, SCRIPTED_CLUE, scriptedCodenamesPolicy, SYSTEM_PROMPT_CODENAMES,
  type CardColor, type GamePolicy, type Team,
} from "../../lib/envs/mod.ts";
import { ArtError } from "../../lib/core/errors.ts";
import { seededRandom } from "../../lib/core/random.ts";
import type { Message } from "../../lib/core/trajectory.ts";

/** A 3×3 board: red apple, river, king; blue moon, bank; neutral cat, tree, sock; assassin ghost. */
const WORDS = ["apple", "river", "king", "moon", "bank", "cat", "tree", "sock", "ghost"];
const COLORS: CardColor[] = ["red", "red", "red", "blue", "blue", "neutral", "neutral", "neutral", "assassin"];
const smallGame = (maxTurns?: number) => CodenamesGame.fromBoard(WORDS, COLORS, { maxTurns });

describe("Codenames board", () => {
  it("draws the same board and key from the same seed, another from another", () => {
    const a = new CodenamesGame({ seed: 7 }), b = new CodenamesGame({ seed: 7 }), c = new CodenamesGame({ seed: 8 });
    expect(b.words).toEqual(a.words);
    expect(b.colors).toEqual(a.colors);
    expect(c.words).not.toEqual(a.words);
    expect(new Set(a.words).size).toBe(25);
  });

  it("colours 9/8/7/1 on 5×5, 6/5/4/1 on 4×4, 3/2/3/1 on 3×3, red starting", () => {
    for (const [size, counts] of [[5, [9, 8, 7, 1]], [4, [6, 5, 4, 1]], [3, [3, 2, 3, 1]]] as const) {
      const game = new CodenamesGame({ size, seed: size });
      expect(game.words.length).toBe(size * size);
      expect((["red", "blue", "neutral", "assassin"] as const).map((color) => game.colors.filter((c) => c === color).length)).toEqual(counts);
      expect(keyCounts(size * size)).toEqual({ red: counts[0], blue: counts[1], neutral: counts[2], assassin: counts[3] });
      expect(game.team).toBe("red");
      expect(game.role()).toBe("spymaster");
    }
  });

  it("rejects a bad size, turn limit or board with an ArtError saying what is allowed", () => {
    expect(() => new CodenamesGame({ size: 6 })).toThrow(/size must be 3, 4 or 5/);
    expect(() => new CodenamesGame({ maxTurns: 0 })).toThrow(ArtError);
    expect(() => CodenamesGame.fromBoard(WORDS.slice(1), COLORS.slice(1))).toThrow(/9, 16 or 25 words/);
    expect(() => CodenamesGame.fromBoard(WORDS, [...COLORS.slice(0, 8), "red"])).toThrow(/counts/);
  });

  it("has a word list of distinct lowercase nouns that the scripted clue never overlaps", () => {
    expect(CODENAMES_WORDS.length).toBeGreaterThanOrEqual(300);
    expect(new Set(CODENAMES_WORDS).size).toBe(CODENAMES_WORDS.length);
    expect(CODENAMES_WORDS.filter((w) => !/^[a-z]{3,}$/.test(w))).toEqual([]);
    expect(CODENAMES_WORDS.filter((w) => w.includes(SCRIPTED_CLUE) || SCRIPTED_CLUE.includes(w))).toEqual([]);
  });
});

describe("Codenames rules", () => {
  it("refuses a clue that is a board word, contains one or sits inside one, or a count out of range", () => {
    const game = smallGame();
    expect(game.clueError({ word: "fruit", count: 2 })).toBe(null);
    expect(game.clueError({ word: "apple", count: 1 })).toBe('clue "apple" is a board word');
    expect(game.clueError({ word: "apples", count: 1 })).toBe('clue "apples" overlaps the board word "apple"');
    expect(game.clueError({ word: "ban", count: 1 })).toBe('clue "ban" overlaps the board word "bank"');
    expect(game.clueError({ word: "fruit", count: 0 })).toMatch(/not between 1 and 3/);
    expect(game.clueError({ word: "fruit", count: 4 })).toMatch(/not between 1 and 3/);
    expect(() => game.giveClue({ word: "apple", count: 1 })).toThrow(ArtError);
    expect(() => game.guess("apple")).toThrow(/waiting for its spymaster/);
  });

  it("allows number + 1 guesses and ends the turn after them", () => {
    const game = smallGame();
    game.giveClue({ word: "fruit", count: 1 });
    expect(game.guessesLeft).toBe(2);
    expect(game.guess("apple")).toBe("red");
    expect(game.team).toBe("red");
    expect(game.guess("river")).toBe("red");
    expect(game.team).toBe("blue");
    expect(game.role()).toBe("spymaster");
    expect(game.turnsPlayed).toBe(1);
  });

  it("stops guessing at a wrong colour: the other team's word or a neutral one", () => {
    const game = smallGame();
    game.giveClue({ word: "fruit", count: 2 });
    expect(game.guess("moon")).toBe("blue");
    expect(game.team).toBe("blue");
    game.giveClue({ word: "money", count: 1 });
    expect(game.guess("cat")).toBe("neutral");
    expect(game.team).toBe("red");
    expect(game.wordsLeft("blue")).toBe(1);
  });

  it("loses the game on the assassin", () => {
    const game = smallGame();
    game.giveClue({ word: "fruit", count: 2 });
    game.guess("apple");
    expect(game.guess("ghost")).toBe("assassin");
    expect(game.finished()).toBe(true);
    expect([game.winner, game.endReason]).toEqual(["blue", "assassin"]);
    expect(() => game.guess("river")).toThrow(/after the game ended/);
  });

  it("wins for the team whose words are all revealed, even by the other team", () => {
    const own = smallGame();
    own.giveClue({ word: "fruit", count: 3 });
    for (const word of ["apple", "river", "king"]) own.guess(word);
    expect([own.winner, own.endReason]).toEqual(["red", "all_words"]);

    const theirs = smallGame();
    theirs.giveClue({ word: "fruit", count: 3 });
    theirs.guess("apple");
    theirs.guess("moon");
    theirs.giveClue({ word: "money", count: 1 });
    expect(theirs.guess("bank")).toBe("blue");
    expect(theirs.winner).toBe("blue");

    const gift = smallGame();
    gift.giveClue({ word: "fruit", count: 1 });
    gift.guess("moon");
    gift.loseTurn("test");
    gift.giveClue({ word: "fruit", count: 1 });
    gift.guess("bank");
    expect([gift.winner, gift.endReason]).toEqual(["blue", "all_words"]);
  });

  it("stops with no winner at the turn limit", () => {
    const game = smallGame(3);
    game.loseTurn("test");
    game.giveClue({ word: "money", count: 1 });
    game.pass();
    expect(game.finished()).toBe(false);
    game.loseTurn("test");
    expect([game.winner, game.endReason, game.turnsPlayed]).toEqual([null, "turn_limit", 3]);
  });

  it("shows the spymaster the key and the guesser only revealed colours, both the other team's last turn", () => {
    const game = smallGame();
    game.giveClue({ word: "fruit", count: 1 });
    game.guess("apple");
    game.guess("cat");
    const spymaster = game.spymasterView();
    expect(spymaster).toMatch(/^You are the blue spymaster\./);
    expect(spymaster).toContain("Your words: moon, bank");
    expect(spymaster).toContain("Red's words: river, king");
    expect(spymaster).toContain("Assassin: ghost");
    expect(spymaster).toContain("Last turn: red: clue fruit 1; guessed apple (red), cat (neutral).");
    game.giveClue({ word: "money", count: 1 });
    const guesser = game.guesserView();
    expect(guesser).toMatch(/^You are the blue guesser\. Clue: money 1\. Guesses left: 2\./);
    expect(guesser).toContain("Board: river, king, moon, bank, tree, sock, ghost");
    expect(guesser).toContain("Revealed: apple (red), cat (neutral)");
    expect(guesser).not.toMatch(/assassin|Your words/i);
  });
});

describe("Codenames answers", () => {
  it("parses clues, with or without thinking, and rejects other shapes", () => {
    expect(parseCodenamesClue("<clue>fruit 2</clue>")).toEqual({ ok: true, move: { word: "fruit", count: 2 } });
    expect(parseCodenamesClue("<think>apple, river?</think>\n<clue> Fruit  12 </clue>")).toEqual({ ok: true, move: { word: "fruit", count: 12 } });
    for (const bad of ["<clue>fruit</clue>", "<clue>ice cream 2</clue>", "<clue>x-ray 1</clue>", "<clue>fruit -1</clue>", "fruit 2", "<clue>fruit 2</clue> because", "<guess>apple</guess>"]) {
      const parsed = parseCodenamesClue(bad);
      expect(parsed.ok, bad).toBe(false);
      if (!parsed.ok) expect(parsed.error).toMatch(/expected <clue>word number<\/clue>/);
    }
  });

  it("parses guesses and passes, and rejects other shapes", () => {
    expect(parseCodenamesGuess("<guess>Apple</guess>")).toEqual({ ok: true, move: { kind: "guess", word: "apple" } });
    expect(parseCodenamesGuess("<think>hm</think><guess> moon </guess>")).toEqual({ ok: true, move: { kind: "guess", word: "moon" } });
    for (const pass of ["<pass/>", "<pass />", " <PASS/> "]) expect(parseCodenamesGuess(pass)).toEqual({ ok: true, move: { kind: "pass" } });
    for (const bad of ["apple", "<guess>apple pie</guess>", "<guess></guess>", "<pass>", "<guess>apple</guess><pass/>", "<clue>fruit 2</clue>"]) {
      expect(parseCodenamesGuess(bad).ok, bad).toBe(false);
    }
  });

  it("checks answers against the board: board-word clues, words off the board or already revealed", () => {
    const game = smallGame();
    expect(legalClueFrom(game, "<clue>kings 1</clue>")).toEqual({ ok: false, error: 'clue "kings" overlaps the board word "king"' });
    expect(legalClueFrom(game, "<clue>fruit 1</clue>")).toEqual({ ok: true, move: { word: "fruit", count: 1 } });
    game.giveClue({ word: "fruit", count: 2 });
    game.guess("apple");
    expect(legalGuessFrom(game, "<guess>apple</guess>")).toEqual({ ok: false, error: '"apple" is already revealed' });
    expect(legalGuessFrom(game, "<guess>banana</guess>")).toEqual({ ok: false, error: '"banana" is not on the board' });
    expect(legalGuessFrom(game, "<pass/>")).toEqual({ ok: true, move: { kind: "pass" } });
  });
});

describe("Codenames reward", () => {
  it("is outcome + 0.2 × own words revealed / own words − 0.5 × invalid answers / answers", () => {
    const game = smallGame();
    game.giveClue({ word: "fruit", count: 1 });
    game.guess("apple"); // red 1 of 3
    game.guess("cat");
    game.giveClue({ word: "money", count: 2 });
    game.guess("moon");
    game.guess("bank"); // blue: both words, wins
    const weights = CODENAMES_REWARDS;
    const blue = scoreCodenames(game, "blue", 1, 4);
    expect(blue.reward).toBeCloseTo(weights.win + weights.ownRevealedWeight * 1 - weights.invalidWeight * (1 / 4));
    expect(blue.metrics).toMatchObject({ win: true, loss: false, own_revealed: 1, invalid_answers: 1, correct_guesses: 2, wrong_guesses: 0, assassin: false });
    const red = scoreCodenames(game, "red", 0, 3);
    expect(red.reward).toBeCloseTo(weights.loss + weights.ownRevealedWeight / 3);
    expect(red.metrics).toMatchObject({ win: false, loss: true, correct_guesses: 1, wrong_guesses: 1, team_turns: 1 });
    expect(scoreCodenames(game, "red", 0, 0).reward).toBeCloseTo(weights.ownRevealedWeight / 3); // no answers, no penalty
    expect(() => scoreCodenames(smallGame(), "red", 0, 0)).toThrow(/still going/);
    expect([weights.win, weights.loss, weights.noWinner, weights.ownRevealedWeight, weights.invalidWeight]).toEqual([1, 0, 0, 0.2, 0.5]);
  });
});

describe("Codenames self-play rollouts", () => {
  it("a scripted side that reads the key beats a random side, as red and as blue", async () => {
    for (let seed = 0; seed < 20; seed++) {
      const perfect: Team = seed % 2 === 0 ? "red" : "blue";
      const random = perfect === "red" ? "blue" : "red";
      const sides = await rolloutCodenames(
        { [perfect]: scriptedCodenamesPolicy(Infinity), [random]: randomCodenamesPolicy(seededRandom(seed)) } as Record<Team, GamePolicy<CodenamesGame>>,
        { seed, size: 4 },
      );
      expect(sides[perfect].metrics.win, `seed ${seed}`).toBe(true);
      expect(sides[random].metrics.loss).toBe(true);
      // All its words revealed: the win and the whole revealed share; a random red may hit the assassin first, and
      // then blue wins with words left (seeds 21, 51, … of a wider range).
      const allWords = sides[perfect].metadata.end_reason === "all_words";
      expect(sides[perfect].reward).toBeCloseTo(CODENAMES_REWARDS.win + (allWords ? CODENAMES_REWARDS.ownRevealedWeight : sides[perfect].reward - 1));
      expect(sides[perfect].metrics.invalid_answers).toBe(0);
      // Red reading the key reveals all its words on the first turn: blue never moves and its trajectory is empty.
      if (perfect === "red") expect([sides.blue.messagesAndChoices, sides.blue.additionalHistories, sides.blue.metrics.answers]).toEqual([[], [], 0]);
    }
  });

  it("a one-word-a-turn scripted side reveals exactly one own word per turn", async () => {
    const sides = await rolloutCodenames({ red: scriptedCodenamesPolicy(1), blue: scriptedCodenamesPolicy(1) }, { seed: 3, size: 5 });
    // Red needs 9 turns, blue 8: blue finishes first.
    expect(sides.blue.metrics).toMatchObject({ win: true, correct_guesses: 8, wrong_guesses: 0, team_turns: 8 });
    expect(sides.red.metrics).toMatchObject({ loss: true, correct_guesses: 8, team_turns: 8 });
  });

  it("puts only a side's own turns in its trajectory, each a fresh conversation, and the whole game in both logs", async () => {
    const calls: { team: Team; role: string; reply: string }[] = [];
    const recording = (policy: GamePolicy<CodenamesGame>): GamePolicy<CodenamesGame> => async (messages, game) => {
      const reply = (await policy(messages, game)) as string;
      calls.push({ team: game.team, role: game.role(), reply });
      return reply;
    };
    const sides = await rolloutCodenames(
      { red: recording(scriptedCodenamesPolicy(1)), blue: recording(randomCodenamesPolicy(seededRandom(4))) },
      { seed: 11, size: 4 },
    );
    for (const team of ["red", "blue"] as const) {
      const own = calls.filter((c) => c.team === team);
      const histories = [sides[team].messagesAndChoices, ...sides[team].additionalHistories.map((h) => h.messagesAndChoices)];
      expect(histories.length).toBe(own.length);
      histories.forEach((history, i) => {
        const [system, user, reply] = history as Message[];
        expect(history.length).toBe(3);
        expect(system!.content).toBe(SYSTEM_PROMPT_CODENAMES);
        expect(user!.content).toMatch(new RegExp(`^You are the ${team} ${own[i]!.role}\\.`));
        expect(reply).toEqual({ role: "assistant", content: own[i]!.reply });
      });
      expect(sides[team].metrics.answers).toBe(own.length);
      expect(sides[team].logs).toEqual(sides.red.logs);
      expect(sides[team].metadata).toMatchObject({ env: "codenames", seed: 11, team, board_size: 4 });
    }
    expect(sides.red.logs.at(-1)).toMatch(/wins|no winner/);
    // The other team's moves reach a side only as observations: blue's first spymaster view reports red's turn.
    const blueFirst = (sides.blue.messagesAndChoices[1] as Message).content as string;
    expect(blueFirst).toMatch(/Last turn: red: clue hint 1; guessed /);
  });

  it("loses the turn on every invalid answer, penalised, and stops at the turn limit", async () => {
    const babble = () => "<move>B2</move>";
    const sides = await rolloutCodenames({ red: babble, blue: scriptedCodenamesPolicy(1) }, { seed: 5, size: 3, maxTurns: 3 });
    expect(sides.red.metrics).toMatchObject({ invalid_answers: 2, answers: 2, invalid_rate: 1, no_winner: true, team_turns: 2 });
    expect(sides.red.reward).toBeCloseTo(CODENAMES_REWARDS.noWinner - CODENAMES_REWARDS.invalidWeight);
    expect(sides.blue.metrics).toMatchObject({ no_winner: true, correct_guesses: 1, invalid_answers: 0 });
    expect(sides.blue.reward).toBeCloseTo(CODENAMES_REWARDS.noWinner + CODENAMES_REWARDS.ownRevealedWeight / 2);
    expect(sides.red.logs[0]).toMatch(/^red spymaster: invalid answer \(expected <clue>word number<\/clue>/);
  });

  it("replays exactly from a seed", async () => {
    const play = () => rolloutCodenames({ red: randomCodenamesPolicy(seededRandom(1)), blue: randomCodenamesPolicy(seededRandom(2)) }, { seed: 9, size: 5 });
    const [a, b] = [await play(), await play()];
    expect(b.red.logs).toEqual(a.red.logs);
    expect(b.blue.reward).toBe(a.blue.reward);
    expect(a.red.metadata.board).toBe(new CodenamesGame({ seed: 9 }).words.map((w, i) => `${w}:${new CodenamesGame({ seed: 9 }).colors[i]}`).join(" "));
  });
});
