/**
 * Codenames for self-play: red and blue, both played by policies (usually the same model), in one game.
 *
 * The board is a square of words (5×5 as in the board game, or 3×3 / 4×4 so a small model's prompt stays short) drawn
 * from CODENAMES_WORDS with the game's seed, and a key colouring each word red, blue, neutral or assassin. Red always
 * starts and has one word more (9/8/7/1 on 5×5, 6/5/4/1 on 4×4, 3/2/3/1 on 3×3).
 *
 * A team is one agent taking two kinds of turns, each a fresh conversation: as spymaster it sees the key and answers
 * <clue>word 2</clue> (one word, not a board word, not containing one nor inside one; the number between 1 and its
 * words left); as guesser it sees only the revealed colours and the clue, and answers <guess>word</guess> or <pass/>,
 * up to number + 1 guesses, stopping at the first word not its own. One agent rather than two roles because the
 * game's reward belongs to the team: both kinds of turns go into the team's one trajectory and share its reward,
 * and since every turn is its own conversation the guesser never sees the key.
 *
 * An invalid answer (wrong format, a clue on the board, a guess off the board or already revealed) loses the turn.
 * Revealing the assassin loses the game; the first team with all its words revealed wins (whoever revealed the last
 * one); after `maxTurns` team turns the game stops with no winner.
 *
 * Reward per team: outcome (win 1, loss 0, no winner 0, so stalling never pays) + 0.2 × own words revealed / own
 * words − 0.5 × invalid answers / answers (0 without answers): legality first, then progress, then winning.
 */
import { ArtError } from "../core/errors.ts";
import { Trajectory, type History, type Message } from "../core/trajectory.ts";
import type { ParsedMove } from "./game2048.ts";
import { replyItem, replyText, withoutThinking, type GamePolicy } from "./policy.ts";
import { freshSeed, pick, seededRandom, shuffleInPlace, type Rng } from "../core/random.ts";
import { clipText } from "../core/text.ts";

export type Team = "red" | "blue";
export type CardColor = Team | "neutral" | "assassin";
export interface Clue {
  word: string;
  count: number;
}
export type Guess = { kind: "guess"; word: string } | { kind: "pass" };

export const CODENAMES_REWARDS = { win: 1, loss: 0, noWinner: 0, ownRevealedWeight: 0.2, invalidWeight: 0.5 } as const;

export const SYSTEM_PROMPT_CODENAMES =
  "You play Codenames for your team, red or blue. A hidden key gives each board word a colour: red, blue, neutral " +
  "or assassin. As spymaster you see the key and give a one-word clue (not a board word, not containing one) and how " +
  "many of your words it fits, as <clue>fruit 2</clue>. As guesser you see the clue and the revealed colours and " +
  "answer one board word, <guess>apple</guess>, or <pass/> to end the turn. A word not your team's ends the turn; the " +
  "assassin loses the game. The first team with all its words revealed wins.";

/** The clue scripted players give: a word no board can hold (no word of CODENAMES_WORDS is inside it or contains it). */
export const SCRIPTED_CLUE = "hint";

/** Common English nouns, the board's words. */
export const CODENAMES_WORDS: readonly string[] = (
  "apple bank bark bat beach bear bed bell belt berry bill bird blade block board boat bolt bomb bone book boot bottle " +
  "bow box brain branch bread brick bridge brush bucket bug button cabin cake camel camera candle cap car card carpet " +
  "castle cat cave chain chair chalk cheese chess chest chicken church circle cliff clock cloud coach coat code coin " +
  "comb comet cook copper corn cotton court cow crane crown cup curtain dance deck desert diamond doctor dog doll " +
  "dolphin door dragon dream dress drill drum duck eagle earth egg engine eye face fair fan farm feather fence field " +
  "file film fire fish flag flute fog foot forest fork fountain fox frog game garden gate ghost giant glass glove " +
  "goat gold grape grass guitar hammer hand harbor hat heart helmet hill honey hook horn horse hospital hotel house " +
  "ice iron island jacket jam jar jet jewel judge juice kettle key king kitchen kite knife knight ladder lake lamp " +
  "laser leaf lemon letter library light lion lock log magnet map marble market mask match medal mirror monkey moon " +
  "mountain mouse mouth mud nail needle nest net night novel nurse oak ocean octopus office oil olive onion opera " +
  "orange organ owl palace palm pan paper park parrot party pearl pen pencil penguin piano pie pig pillow pilot pipe " +
  "pirate pistol planet plate pocket poison pole pool post pot potato press prince printer pumpkin puzzle pyramid " +
  "queen rabbit radio rain ribbon rice ring river road robot rock rocket roof root rope rose ruler saddle sail salt " +
  "sand satellite school scale scarf screen sea seal shadow sheep shell ship shirt shoe shop silk silver sink skirt " +
  "sky snake snow soap sock soldier soup spider spoon spring square stadium stamp star station steam stick stone " +
  "storm stove straw street string sugar suit sun swan sword table tail tea teacher tent thief throne thunder ticket " +
  "tiger toast tomato tongue tooth torch tower tractor train tree truck trumpet tunnel turtle umbrella valley van " +
  "violin volcano wagon wall watch water wave whale wheel whip window wine wing wolf wool worm yard zebra"
).split(" ");

export interface CodenamesOptions {
  /** Board side: 3, 4 or 5 (default 5, the board game's 25 words). */
  size?: number;
  /** Team turns before the game stops with no winner; default 20. */
  maxTurns?: number;
  /** Seed for the board and the key; default a fresh one. */
  seed?: number;
}

/** One team turn as the other side sees it: the clue (null when it was invalid) and each guess's colour. */
export interface TurnRecord {
  team: Team;
  clue: Clue | null;
  guesses: { word: string; color: CardColor }[];
  /** Why the turn ended early: an invalid answer. */
  invalid?: string;
}

export function otherTeam(team: Team): Team {
  return team === "red" ? "blue" : "red";
}

/** How many words of each colour a board of `cells` words holds: red (who starts) one more than blue, one assassin. */
export function keyCounts(cells: number): Record<CardColor, number> {
  const red = Math.round(cells * 0.36);
  return { red, blue: red - 1, assassin: 1, neutral: cells - 2 * red };
}

export class CodenamesGame {
  readonly seed: number;
  readonly size: number;
  readonly maxTurns: number;
  readonly words: readonly string[];
  readonly colors: readonly CardColor[];
  readonly revealed: boolean[];
  /** The team to move. */
  team: Team = "red";
  /** The clue of the team to move; null while its spymaster has not given one (the spymaster's move). */
  clue: Clue | null = null;
  guessesLeft = 0;
  /** Team turns completed. */
  turnsPlayed = 0;
  winner: Team | null = null;
  endReason: "all_words" | "assassin" | "turn_limit" | null = null;
  /** Completed turns, oldest first, and the one in progress last while it runs. */
  readonly turns: TurnRecord[] = [];
  /** The game as it happened, one line per clue, guess and ending: the same for both sides' logs. */
  readonly events: string[] = [];

  /** `board`: the words and their colours, else drawn from the seed (CodenamesGame.fromBoard checks a given one). */
  constructor(options: CodenamesOptions = {}, board?: { words: readonly string[]; colors: readonly CardColor[] }) {
    this.size = options.size ?? 5;
    if (!Number.isInteger(this.size) || this.size < 3 || this.size > 5) {
      throw new ArtError("codenames.size", `Codenames: size must be 3, 4 or 5 (a board of size × size words), got ${JSON.stringify(options.size)}.`);
    }
    this.maxTurns = options.maxTurns ?? 20;
    if (!Number.isInteger(this.maxTurns) || this.maxTurns < 1) {
      throw new ArtError("codenames.max_turns", `Codenames: maxTurns must be a whole number of team turns, 1 or more, got ${JSON.stringify(options.maxTurns)}.`);
    }
    this.seed = options.seed ?? freshSeed();
    const rng = seededRandom(this.seed);
    const cells = this.size * this.size;
    const counts = keyCounts(cells);
    this.words = board?.words ?? shuffleInPlace([...CODENAMES_WORDS], rng).slice(0, cells);
    this.colors = board?.colors ?? shuffleInPlace((Object.keys(counts) as CardColor[]).flatMap((color) => Array<CardColor>(counts[color]).fill(color)), rng);
    this.revealed = this.words.map(() => false);
    this.turns.push({ team: this.team, clue: null, guesses: [] });
  }

  /** A game on a given board, for tests: words and their colours, red first to move. */
  static fromBoard(words: string[], colors: CardColor[], options: Omit<CodenamesOptions, "seed" | "size"> = {}): CodenamesGame {
    if (![9, 16, 25].includes(words.length)) {
      throw new ArtError("codenames.board", `CodenamesGame.fromBoard: expected 9, 16 or 25 words (a 3×3, 4×4 or 5×5 board), got ${words.length}.`);
    }
    const expected = keyCounts(words.length);
    const counted = (color: CardColor) => colors.filter((c) => c === color).length;
    if (colors.length !== words.length || (Object.keys(expected) as CardColor[]).some((color) => counted(color) !== expected[color])) {
      throw new ArtError("codenames.board", `CodenamesGame.fromBoard: expected a colour per word with counts ${JSON.stringify(expected)}, got ${JSON.stringify(colors)}.`);
    }
    return new CodenamesGame({ ...options, size: Math.sqrt(words.length), seed: 0 }, { words: [...words], colors: [...colors] });
  }

  role(): "spymaster" | "guesser" {
    return this.clue === null ? "spymaster" : "guesser";
  }

  finished(): boolean {
    return this.endReason !== null;
  }

  colorOf(word: string): CardColor | undefined {
    const index = this.words.indexOf(word);
    return index < 0 ? undefined : this.colors[index];
  }

  /** Unrevealed words, of one colour or all. */
  hidden(color?: CardColor): string[] {
    return this.words.filter((word, i) => !this.revealed[i] && (color === undefined || this.colors[i] === color));
  }

  wordsLeft(team: Team): number {
    return this.hidden(team).length;
  }

  /** Why `clue` is not a legal clue for the team to move, or null: a board word, inside one or containing one, a bad count. */
  clueError(clue: Clue): string | null {
    const related = this.words.find((word) => clue.word.includes(word) || word.includes(clue.word));
    if (related !== undefined) return related === clue.word ? `clue "${clue.word}" is a board word` : `clue "${clue.word}" overlaps the board word "${related}"`;
    const left = this.wordsLeft(this.team);
    if (clue.count < 1 || clue.count > left) return `clue number ${clue.count} is not between 1 and ${left} (${this.team}'s words left)`;
    return null;
  }

  giveClue(clue: Clue): void {
    this.expectRole("spymaster", "giveClue");
    const error = this.clueError(clue);
    if (error !== null) throw new ArtError("codenames.clue", `Codenames: ${error}; check it with clueError() first.`);
    this.clue = clue;
    this.guessesLeft = clue.count + 1;
    this.currentTurn().clue = clue;
    this.events.push(`${this.team} clue: ${clue.word} ${clue.count}`);
  }

  /** Reveals `word` for the team to move; the turn ends on a word not its own or when its guesses run out. */
  guess(word: string): CardColor {
    this.expectRole("guesser", "guess");
    const index = this.words.indexOf(word);
    if (index < 0 || this.revealed[index]) throw new ArtError("codenames.guess", `Codenames: "${word}" is not an unrevealed board word; check it with guessError() first.`);
    this.revealed[index] = true;
    const color = this.colors[index]!;
    const team = this.team;
    this.currentTurn().guesses.push({ word, color });
    this.events.push(`${team} guess: ${word} → ${color}`);
    this.guessesLeft--;
    if (color === "assassin") this.end(otherTeam(team), "assassin");
    else if (this.wordsLeft("red") === 0) this.end("red", "all_words");
    else if (this.wordsLeft("blue") === 0) this.end("blue", "all_words");
    else if (color !== team || this.guessesLeft === 0) this.endTurn();
    return color;
  }

  /** Why `word` is not a legal guess, or null. */
  guessError(word: string): string | null {
    const index = this.words.indexOf(word);
    if (index < 0) return `"${word}" is not on the board`;
    return this.revealed[index] ? `"${word}" is already revealed` : null;
  }

  pass(): void {
    this.expectRole("guesser", "pass");
    this.events.push(`${this.team} passes`);
    this.endTurn();
  }

  /** An invalid answer: the team loses the rest of its turn. */
  loseTurn(reason: string): void {
    if (this.finished()) throw new ArtError("codenames.over", "Codenames: the game is over; no turn to lose.");
    this.currentTurn().invalid = reason;
    this.events.push(`${this.team} ${this.role()}: invalid answer (${reason}), turn lost`);
    this.endTurn();
  }

  /** The spymaster's prompt: the key of the unrevealed words, the score and the other team's last turn. */
  spymasterView(): string {
    const own = this.team, other = otherTeam(own);
    return [
      `You are the ${own} spymaster.`,
      `Your words: ${this.hidden(own).join(", ")}`,
      `${other[0]!.toUpperCase()}${other.slice(1)}'s words: ${this.hidden(other).join(", ")}`,
      `Neutral words: ${this.hidden("neutral").join(", ") || "none"}`,
      `Assassin: ${this.hidden("assassin").join(", ")}`,
      ...this.situation(),
      "Give your clue as <clue>word number</clue>.",
    ].join("\n");
  }

  /** The guesser's prompt: the clue, the unrevealed words without colours, the revealed ones with theirs. */
  guesserView(): string {
    const revealed = this.words.filter((_, i) => this.revealed[i]).map((word) => `${word} (${this.colorOf(word)})`);
    return [
      `You are the ${this.team} guesser. Clue: ${this.clue?.word} ${this.clue?.count}. Guesses left: ${this.guessesLeft}.`,
      `Board: ${this.hidden().join(", ")}`,
      `Revealed: ${revealed.join(", ") || "none"}`,
      ...this.situation(),
      "Answer <guess>word</guess> or <pass/>.",
    ].join("\n");
  }

  /** Both views' shared lines: words left per team, and the last completed turn (the other team's). */
  private situation(): string[] {
    const lines = [`Words left: red ${this.wordsLeft("red")}, blue ${this.wordsLeft("blue")}.`];
    const last = this.turns.at(-2);
    if (last !== undefined) lines.push(`Last turn: ${describeTurn(last)}.`);
    return lines;
  }

  private currentTurn(): TurnRecord {
    return this.turns.at(-1)!;
  }

  private expectRole(role: "spymaster" | "guesser", action: string): void {
    if (this.finished()) throw new ArtError("codenames.over", `Codenames: ${action}() after the game ended (${this.endReason}).`);
    if (this.role() !== role) throw new ArtError("codenames.role", `Codenames: ${action}() is the ${role}'s move, but ${this.team} is waiting for its ${this.role()}.`);
  }

  private endTurn(): void {
    this.turnsPlayed++;
    this.team = otherTeam(this.team);
    this.clue = null;
    this.guessesLeft = 0;
    if (this.turnsPlayed >= this.maxTurns) this.end(null, "turn_limit");
    else this.turns.push({ team: this.team, clue: null, guesses: [] });
  }

  private end(winner: Team | null, reason: "all_words" | "assassin" | "turn_limit"): void {
    this.winner = winner;
    this.endReason = reason;
    this.events.push(winner === null ? `no winner after ${this.turnsPlayed} turns` : `${winner} wins (${reason === "assassin" ? "the other team found the assassin" : "all its words revealed"})`);
  }
}

/** A turn in one line, as prompts show the other team's: `blue: clue sky 2; guessed moon (blue), star (neutral)`. */
function describeTurn(turn: TurnRecord): string {
  if (turn.clue === null) return `${turn.team}: invalid clue, turn lost`;
  const guesses = turn.guesses.map((g) => `${g.word} (${g.color})`).join(", ");
  const ending = turn.invalid !== undefined ? "; then an invalid guess, turn lost" : "";
  return `${turn.team}: clue ${turn.clue.word} ${turn.clue.count}; ${guesses === "" ? "no guesses" : `guessed ${guesses}`}${ending}`;
}

/** Parses <clue>word 2</clue> (after any <think> block): one word of letters and a whole number; the board is not checked. */
export function parseCodenamesClue(text: string): ParsedMove<Clue> {
  const answer = withoutThinking(text);
  const match = /^<clue>\s*([A-Za-z]+)\s+(\d+)\s*<\/clue>$/.exec(answer);
  if (!match) return { ok: false, error: `expected <clue>word number</clue> (one word, then a number), got ${JSON.stringify(clipText(answer, 80))}` };
  return { ok: true, move: { word: match[1]!.toLowerCase(), count: Number(match[2]) } };
}

/** Parses <guess>word</guess> or <pass/> (after any <think> block); the board is not checked. */
export function parseCodenamesGuess(text: string): ParsedMove<Guess> {
  const answer = withoutThinking(text);
  if (/^<pass\s*\/>$/i.test(answer)) return { ok: true, move: { kind: "pass" } };
  const match = /^<guess>\s*([A-Za-z]+)\s*<\/guess>$/.exec(answer);
  if (!match) return { ok: false, error: `expected <guess>word</guess> or <pass/>, got ${JSON.stringify(clipText(answer, 80))}` };
  return { ok: true, move: { kind: "guess", word: match[1]!.toLowerCase() } };
}

/** A spymaster's answer as a clue on this board, or why it is not a legal one (format, board word, count). */
export function legalClueFrom(game: CodenamesGame, text: string): ParsedMove<Clue> {
  const parsed = parseCodenamesClue(text);
  const error = parsed.ok ? game.clueError(parsed.move) : null;
  return error === null ? parsed : { ok: false, error };
}

/** A guesser's answer as a move on this board, or why it is not a legal one (format, off the board, revealed). */
export function legalGuessFrom(game: CodenamesGame, text: string): ParsedMove<Guess> {
  const parsed = parseCodenamesGuess(text);
  const error = parsed.ok && parsed.move.kind === "guess" ? game.guessError(parsed.move.word) : null;
  return error === null ? parsed : { ok: false, error };
}

/** The reward of `team` once the game is over (formula in the file's header) and its game metrics. */
export function scoreCodenames(game: CodenamesGame, team: Team, invalidAnswers: number, answers: number): { reward: number; metrics: Record<string, number | boolean> } {
  if (!game.finished()) throw new ArtError("codenames.unfinished", "scoreCodenames: the game is still going; score it once finished() is true.");
  const outcome = game.winner === team ? "win" : game.winner === null ? "noWinner" : "loss";
  const ownWords = keyCounts(game.words.length)[team];
  const ownRevealed = (ownWords - game.wordsLeft(team)) / ownWords;
  const invalidRate = answers === 0 ? 0 : invalidAnswers / answers;
  const reward = CODENAMES_REWARDS[outcome] + CODENAMES_REWARDS.ownRevealedWeight * ownRevealed - CODENAMES_REWARDS.invalidWeight * invalidRate;
  const ownTurns = game.turns.filter((turn) => turn.team === team);
  const guesses = ownTurns.flatMap((turn) => turn.guesses);
  return {
    reward,
    metrics: {
      win: outcome === "win", loss: outcome === "loss", no_winner: outcome === "noWinner",
      own_revealed: ownRevealed, invalid_answers: invalidAnswers, answers, invalid_rate: invalidRate,
      correct_guesses: guesses.filter((g) => g.color === team).length, wrong_guesses: guesses.filter((g) => g.color !== team).length,
      assassin: guesses.some((g) => g.color === "assassin"), team_turns: ownTurns.length,
    },
  };
}

/**
 * Plays one game, red's turns with `policies.red` and blue's with `policies.blue`, and returns one Trajectory per team
 * holding only that team's turns: each turn is a fresh conversation (system prompt, the spymaster's or the guesser's
 * view, the reply), the first the main history and the rest additional histories; the other team's moves reach it
 * only as what the views show. Both logs hold the whole game (CodenamesGame.events). Rewards: see the file's header.
 */
export async function rolloutCodenames(policies: Record<Team, GamePolicy<CodenamesGame>>, options: CodenamesOptions = {}): Promise<Record<Team, Trajectory>> {
  const startTime = Date.now();
  const game = new CodenamesGame(options);
  const turns: Record<Team, History[]> = { red: [], blue: [] };
  const invalid: Record<Team, number> = { red: 0, blue: 0 };
  while (!game.finished()) {
    const team = game.team;
    const spymaster = game.role() === "spymaster";
    const messages: Message[] = [
      { role: "system", content: SYSTEM_PROMPT_CODENAMES },
      { role: "user", content: spymaster ? game.spymasterView() : game.guesserView() },
    ];
    const reply = await policies[team](messages, game);
    turns[team].push({ messagesAndChoices: [...messages, replyItem(reply)] });
    const text = replyText(reply);
    const parsed = spymaster ? legalClueFrom(game, text) : legalGuessFrom(game, text);
    if (!parsed.ok) {
      invalid[team]++;
      game.loseTurn(parsed.error);
    } else if ("count" in parsed.move) {
      game.giveClue(parsed.move);
    } else if (parsed.move.kind === "pass") {
      game.pass();
    } else {
      game.guess(parsed.move.word);
    }
  }
  const trajectoryOf = (team: Team) => {
    const { reward, metrics } = scoreCodenames(game, team, invalid[team], turns[team].length);
    return new Trajectory({
      messagesAndChoices: turns[team][0]?.messagesAndChoices ?? [],
      additionalHistories: turns[team].slice(1),
      reward,
      metrics,
      metadata: {
        env: "codenames", seed: game.seed, team, board_size: game.size, end_reason: game.endReason,
        board: game.words.map((word, i) => `${word}:${game.colors[i]}`).join(" "),
      },
      logs: game.events,
      startTime,
    }).finish();
  };
  return { red: trajectoryOf("red"), blue: trajectoryOf("blue") };
}

/**
 * A scripted team that reads the key (a reference player, not a fair one): its spymaster gives SCRIPTED_CLUE for
 * `wordsPerTurn` of its words (Infinity: all of them), its guesser reveals exactly that many of its own words, then passes.
 */
export function scriptedCodenamesPolicy(wordsPerTurn: number): GamePolicy<CodenamesGame> {
  if (!(wordsPerTurn >= 1)) throw new ArtError("codenames.policy", `scriptedCodenamesPolicy: wordsPerTurn must be 1 or more (Infinity for all), got ${wordsPerTurn}.`);
  return (_messages, game) => {
    const own = game.hidden(game.team);
    if (game.role() === "spymaster") return `<clue>${SCRIPTED_CLUE} ${Math.min(wordsPerTurn, own.length)}</clue>`;
    // A clue for n words allows n + 1 guesses: pass on the last one.
    return game.guessesLeft === 1 ? "<pass/>" : `<guess>${own[0]}</guess>`;
  };
}

/** A scripted team that plays legally at random: a clue for one word, then random unrevealed words. */
export function randomCodenamesPolicy(rng: Rng): GamePolicy<CodenamesGame> {
  return (_messages, game) => (game.role() === "spymaster" ? `<clue>${SCRIPTED_CLUE} 1</clue>` : `<guess>${pick(rng, game.hidden())}</guess>`);
}
