/**
 * 2048, as ART's example plays it: the agent sees the board as text and answers <move>left</move>.
 *
 * Rules: tiles slide toward the move's side; two equal neighbours merge once per move, the pair nearest
 * that side first ([2,2,2,2] → [4,4], [4,4,8] → [8,8]). A move that changes the board spawns one tile
 * (2 with 90%, 4 with 10%) from the game's seeded generator. A move that changes nothing is legal but
 * spawns nothing. The game ends at the winning tile or when no move changes the board.
 *
 * Reward (ART's): 2 for a win; -1 for an unparseable move; otherwise log-scaled max tile plus 0.2 x
 * log-scaled board sum, each 0 at the smallest tile and 1 at the winning tile (sum: winning tile x cells).
 */
import { ArtError } from "../core/errors.ts";
import { Trajectory, type Message } from "../core/trajectory.ts";
import { askPolicy, replyItem, replyText, withoutThinking, type GamePolicy } from "./policy.ts";
import { freshSeed, randomInt, seededRandom, type Rng } from "../core/random.ts";
import { clipText } from "../core/text.ts";

export type Direction = "left" | "right" | "up" | "down";
export const DIRECTIONS: readonly Direction[] = ["left", "right", "up", "down"];

export const WIN_REWARD_2048 = 2;
export const INVALID_MOVE_REWARD_2048 = -1;

export const SYSTEM_PROMPT_2048 =
  "You are playing 2048. Each turn you see the board; empty cells are shown as _. Choose the move most likely to " +
  "merge tiles and reach the winning tile. The moves are left, right, up and down. Answer with the move only, as " +
  "<move>left</move>.";

export interface Game2048Options {
  /** Board side; default 4. */
  size?: number;
  /** The tile that wins; default 128 (ART's example). */
  winningTile?: number;
  /** Seed for tile spawns; default a fresh one. */
  seed?: number;
}

/** Slides one line toward index 0 and merges pairs, nearest pair first, each tile merging at most once. */
export function slideLine(line: readonly number[]): number[] {
  const tiles = line.filter((v) => v !== 0);
  const result: number[] = [];
  for (let i = 0; i < tiles.length; i++) {
    if (i + 1 < tiles.length && tiles[i] === tiles[i + 1]) {
      result.push(tiles[i]! * 2);
      i++;
    } else {
      result.push(tiles[i]!);
    }
  }
  while (result.length < line.length) result.push(0);
  return result;
}

/** The board after a move, without spawning (pure; used by the game and by look-ahead policies). */
export function slideBoard(board: readonly (readonly number[])[], direction: Direction): number[][] {
  const n = board.length;
  const out = board.map((row) => [...row]);
  for (let k = 0; k < n; k++) {
    // Read line k starting from the side the tiles move toward, slide it, write it back the same way.
    const cells: [number, number][] = [];
    for (let j = 0; j < n; j++) {
      if (direction === "left") cells.push([k, j]);
      else if (direction === "right") cells.push([k, n - 1 - j]);
      else if (direction === "up") cells.push([j, k]);
      else cells.push([n - 1 - j, k]);
    }
    const slid = slideLine(cells.map(([r, c]) => board[r]![c]!));
    cells.forEach(([r, c], j) => (out[r]![c] = slid[j]!));
  }
  return out;
}

function sameBoard(a: readonly (readonly number[])[], b: readonly (readonly number[])[]): boolean {
  return a.every((row, i) => row.every((v, j) => v === b[i]![j]));
}

export type ParsedMove<T> = { ok: true; move: T } | { ok: false; error: string };

/** Parses ART's answer format: the reply (after any <think> block) must be exactly <move>direction</move>. */
export function parseMove2048(text: string): ParsedMove<Direction> {
  const answer = withoutThinking(text);
  const match = /^<move>\s*([A-Za-z]+)\s*<\/move>$/.exec(answer);
  if (!match) return { ok: false, error: `expected <move>left|right|up|down</move>, got ${JSON.stringify(clipText(answer, 80))}` };
  const direction = match[1]!.toLowerCase();
  if (!(DIRECTIONS as readonly string[]).includes(direction)) return { ok: false, error: `unknown direction ${JSON.stringify(match[1])}` };
  return { ok: true, move: direction as Direction };
}

export class Game2048 {
  board: number[][];
  readonly size: number;
  readonly winningTile: number;
  readonly seed: number;
  moves = 0;
  private readonly rng: Rng;

  constructor(options: Game2048Options = {}) {
    this.size = options.size ?? 4;
    this.winningTile = options.winningTile ?? 128;
    if (!Number.isInteger(this.size) || this.size < 2) throw new ArtError("2048.size", `Game2048: size must be an integer >= 2, got ${this.size}.`);
    if (!Number.isInteger(Math.log2(this.winningTile)) || this.winningTile < 8) {
      throw new ArtError("2048.winningTile", `Game2048: winningTile must be a power of two >= 8, got ${this.winningTile}.`);
    }
    this.seed = options.seed ?? freshSeed();
    this.rng = seededRandom(this.seed);
    this.board = Array.from({ length: this.size }, () => new Array<number>(this.size).fill(0));
    this.spawnTile();
    this.spawnTile();
  }

  /** A game from given rows (0 = empty), for tests and puzzles; spawns continue from `seed`. */
  static fromBoard(rows: number[][], options: Omit<Game2048Options, "size"> = {}): Game2048 {
    const size = rows.length;
    if (rows.some((row) => row.length !== size)) throw new ArtError("2048.board", `Game2048.fromBoard: rows must form a square, got ${rows.map((r) => r.length).join(",")} columns for ${size} rows.`);
    const game = new Game2048({ ...options, size });
    game.board = rows.map((row) => [...row]);
    return game;
  }

  /** Puts a 2 (90%) or 4 (10%) on a random empty cell; false when the board is full. */
  spawnTile(): boolean {
    const empty: [number, number][] = [];
    this.board.forEach((row, r) => row.forEach((v, c) => v === 0 && empty.push([r, c])));
    if (empty.length === 0) return false;
    const [r, c] = empty[randomInt(this.rng, empty.length)]!;
    this.board[r]![c] = this.rng() < 0.9 ? 2 : 4;
    return true;
  }

  /** Plays a move; returns whether it changed the board (only then is a tile spawned). */
  move(direction: Direction): boolean {
    const next = slideBoard(this.board, direction);
    this.moves++;
    if (sameBoard(next, this.board)) return false;
    this.board = next;
    this.spawnTile();
    return true;
  }

  /** The moves that change the board; the others are legal but change nothing and spawn nothing. */
  changingMoves(): Direction[] {
    return DIRECTIONS.filter((d) => !sameBoard(slideBoard(this.board, d), this.board));
  }

  canMove(): boolean {
    return this.changingMoves().length > 0;
  }

  maxTile(): number {
    return Math.max(...this.board.flat());
  }

  boardSum(): number {
    return this.board.flat().reduce((a, b) => a + b, 0);
  }

  won(): boolean {
    return this.maxTile() >= this.winningTile;
  }

  finished(): boolean {
    return this.won() || !this.canMove();
  }

  /** ART's text form: cells right-aligned to the widest tile, "_" for empty, "|" between cells. */
  render(): string {
    const width = Math.max(1, ...this.board.flat().filter((v) => v !== 0).map((v) => String(v).length));
    return this.board.map((row) => row.map((v) => (v === 0 ? "_" : String(v)).padStart(width)).join("|")).join("\n");
  }

  /** ART's reward for a game that ended without an invalid move. */
  reward(): number {
    if (this.won()) return WIN_REWARD_2048;
    const scale = (value: number, top: number) => (Math.log2(value) - 1) / (Math.log2(top) - 1);
    const cells = this.size * this.size;
    return scale(this.maxTile(), this.winningTile) + 0.2 * scale(this.boardSum(), this.winningTile * cells);
  }
}

export interface Rollout2048Options extends Game2048Options {
  /**
   * Stops a game that is still going after this many moves (reward as if it ended there); default 1000. A game whose
   * conversation outgrows the model's context (the policy throws a context-length error) stops there the same way.
   */
  maxMoves?: number;
  /**
   * What the policy sees at each move: "game" (ART's, the default) the whole conversation so far, every board and
   * every answer; "board" the system prompt (if any) and the current board only, each move a history of its own in
   * the trajectory (the first its main history, the rest additional histories), all sharing the game's reward. The
   * board is the whole state of the game, so nothing a player needs is lost, and a move costs the same at the
   * hundredth move as at the first (the cookbook's 2048 task model plays so: docs/cookbook.md).
   */
  context?: "game" | "board";
  /**
   * The system message that opens every conversation; null for none, for a model taught the task without one
   * (models/2048-3x3-tiny). Default SYSTEM_PROMPT_2048.
   */
  systemPrompt?: string | null;
}

/**
 * Plays one game with `policy` and returns its trajectory: reward, and metrics max_tile, board_sum, moves, no_op_moves,
 * win, invalid_move, context_exceeded.
 */
export async function rollout2048(policy: GamePolicy<Game2048>, options: Rollout2048Options = {}): Promise<Trajectory> {
  const game = new Game2048(options);
  const maxMoves = options.maxMoves ?? 1000;
  const context = options.context ?? "game";
  if (context !== "game" && context !== "board") {
    throw new ArtError("2048.context", `rollout2048: context must be "game" or "board", got ${JSON.stringify(context)}.`);
  }
  const systemPrompt = options.systemPrompt === undefined ? SYSTEM_PROMPT_2048 : options.systemPrompt;
  const opening: Message[] = systemPrompt === null ? [] : [{ role: "system", content: systemPrompt }];
  const trajectory = new Trajectory({
    messagesAndChoices: [...opening],
    metadata: { env: "2048", seed: game.seed, winning_tile: game.winningTile, context },
  });
  let invalid = false;
  let contextExceeded = false;
  let noOpMoves = 0;
  while (!game.finished() && game.moves < maxMoves) {
    const board: Message = { role: "user", content: game.render() };
    const asked = await askPolicy(policy, context === "game" ? [...trajectory.messages(), board] : [...opening, board], game);
    if ("outgrown" in asked) {
      // The conversation no longer fits the model's context: the game stops here, like a game at maxMoves, the board unasked.
      trajectory.log(`stopped after ${game.moves} moves: ${asked.outgrown}`);
      contextExceeded = true;
      break;
    }
    const { reply } = asked;
    if (context === "game" || trajectory.messagesAndChoices.length === opening.length) trajectory.messagesAndChoices.push(board, replyItem(reply));
    else trajectory.additionalHistories.push({ messagesAndChoices: [...opening, board, replyItem(reply)] });
    const parsed = parseMove2048(replyText(reply));
    if (!parsed.ok) {
      invalid = true;
      trajectory.log(`invalid move: ${parsed.error}`);
      break;
    }
    if (!game.move(parsed.move)) noOpMoves++;
  }
  trajectory.reward = invalid ? INVALID_MOVE_REWARD_2048 : game.reward();
  Object.assign(trajectory.metrics, {
    max_tile: game.maxTile(), board_sum: game.boardSum(), moves: game.moves, no_op_moves: noOpMoves, win: game.won(), invalid_move: invalid,
    context_exceeded: contextExceeded,
  });
  return trajectory.finish();
}

/**
 * A scripted player for demos and tests: the move that leaves the most empty cells after one look-ahead,
 * ties broken in the order down, left, right, up (a corner strategy). Deterministic for a given board.
 */
export function greedyPolicy2048(_messages: Message[], game: Game2048): string {
  let best: Direction | undefined;
  let bestEmpty = -1;
  for (const direction of ["down", "left", "right", "up"] as const) {
    const next = slideBoard(game.board, direction);
    if (sameBoard(next, game.board)) continue;
    const empty = next.flat().filter((v) => v === 0).length;
    if (empty > bestEmpty) {
      best = direction;
      bestEmpty = empty;
    }
  }
  return `<move>${best ?? "left"}</move>`;
}
