/**
 * Tic-tac-toe, as ART's example plays it: the board as text with rows A–C and columns 1–3, the agent
 * answers <move>B2</move>. x moves first; the agent's mark is drawn from the seed unless given.
 * Rewards (ART's): win 1, draw 0.5, loss 0, and an invalid answer (unparseable, off the board, or an
 * occupied square) -1, far below any game result so the model learns legality first.
 */
import { ArtError } from "../core/errors.ts";
import { Trajectory } from "../core/trajectory.ts";
import type { ParsedMove } from "./game2048.ts";
import { replyItem, replyText, withoutThinking, type GamePolicy } from "./policy.ts";
import { freshSeed, pick, seededRandom, type Rng } from "../core/random.ts";
import { clipText } from "../core/text.ts";

export type Mark = "x" | "o";
export type Cell = Mark | "_";
export type Square = readonly [row: number, col: number];

export const TICTACTOE_REWARDS = { win: 1, draw: 0.5, loss: 0, invalid: -1 } as const;

export const SYSTEM_PROMPT_TICTACTOE =
  "You are playing tic-tac-toe. Each turn you see the board: rows A, B, C, columns 1, 2, 3, empty squares shown " +
  "as _. Win by getting three of your marks in a row, column or diagonal. Answer with the square you take only, " +
  "as <move>B2</move>.";

const LINES: readonly (readonly Square[])[] = [
  [[0, 0], [0, 1], [0, 2]], [[1, 0], [1, 1], [1, 2]], [[2, 0], [2, 1], [2, 2]],
  [[0, 0], [1, 0], [2, 0]], [[0, 1], [1, 1], [2, 1]], [[0, 2], [1, 2], [2, 2]],
  [[0, 0], [1, 1], [2, 2]], [[0, 2], [1, 1], [2, 0]],
];

export function otherMark(mark: Mark): Mark {
  return mark === "x" ? "o" : "x";
}

export function squareName([row, col]: Square): string {
  return `${String.fromCharCode(65 + row)}${col + 1}`;
}

export class TicTacToeBoard {
  readonly cells: Cell[][];

  constructor(cells?: Cell[][]) {
    this.cells = cells ? cells.map((r) => [...r]) : [["_", "_", "_"], ["_", "_", "_"], ["_", "_", "_"]];
  }

  /** A board from three strings like "x_o", for tests. */
  static parse(rows: string[]): TicTacToeBoard {
    if (rows.length !== 3 || rows.some((r) => !/^[xo_]{3}$/.test(r))) {
      throw new ArtError("tictactoe.board", `TicTacToeBoard.parse: expected 3 rows of 3 characters from "xo_", got ${JSON.stringify(rows)}.`);
    }
    return new TicTacToeBoard(rows.map((r) => [...r] as Cell[]));
  }

  clone(): TicTacToeBoard {
    return new TicTacToeBoard(this.cells);
  }

  emptySquares(): Square[] {
    const squares: Square[] = [];
    for (let r = 0; r < 3; r++) for (let c = 0; c < 3; c++) if (this.cells[r]![c] === "_") squares.push([r, c]);
    return squares;
  }

  place([row, col]: Square, mark: Mark): void {
    if (this.cells[row]?.[col] !== "_") throw new ArtError("tictactoe.occupied", `square ${squareName([row, col])} is not empty`);
    this.cells[row]![col] = mark;
  }

  winner(): Mark | null {
    for (const line of LINES) {
      const [a, b, c] = line.map(([r, col]) => this.cells[r]![col]!);
      if (a !== "_" && a === b && b === c) return a as Mark;
    }
    return null;
  }

  full(): boolean {
    return this.emptySquares().length === 0;
  }

  finished(): boolean {
    return this.winner() !== null || this.full();
  }

  /** Whose turn it is: x moves first. */
  toMove(): Mark {
    const marks = this.cells.flat();
    return marks.filter((c) => c === "x").length > marks.filter((c) => c === "o").length ? "o" : "x";
  }

  /** ART's text form: a header of column numbers, then "A  x | _ | o" per row. */
  render(): string {
    return ["   1   2   3", ...this.cells.map((row, r) => `${String.fromCharCode(65 + r)}  ${row.join(" | ")}`)].join("\n");
  }

  key(): string {
    return this.cells.flat().join("");
  }
}

/** Parses <move>B2</move> (after any <think> block) into a square; checks only the format and bounds. */
export function parseTicTacToeMove(text: string): ParsedMove<Square> {
  const answer = withoutThinking(text);
  const match = /^<move>\s*([A-Za-z])\s*([0-9])\s*<\/move>$/.exec(answer);
  if (!match) return { ok: false, error: `expected <move>A1</move> (rows A-C, columns 1-3), got ${JSON.stringify(clipText(answer, 80))}` };
  const row = match[1]!.toUpperCase().charCodeAt(0) - 65;
  const col = Number(match[2]) - 1;
  if (row > 2 || col < 0 || col > 2) return { ok: false, error: `square ${match[1]}${match[2]} is off the board` };
  return { ok: true, move: [row, col] };
}

/** ART's reward and the game's metrics for `agent`, once the game is over (or the agent's answer was invalid). */
export function scoreTicTacToe(board: TicTacToeBoard, agent: Mark, invalid: boolean, moves: number): { reward: number; metrics: Record<string, number | boolean> } {
  const winner = board.winner();
  const outcome = invalid ? "invalid" : winner === agent ? "win" : winner === null ? "draw" : "loss";
  return {
    reward: TICTACTOE_REWARDS[outcome],
    metrics: { win: outcome === "win", draw: outcome === "draw", loss: outcome === "loss", invalid_move: invalid, moves },
  };
}

/** A model's answer as a move on this board: the square, or why it is not a legal move (format, bounds, taken). */
export function legalMoveFrom(board: TicTacToeBoard, text: string): ParsedMove<Square> {
  const parsed = parseTicTacToeMove(text);
  if (parsed.ok && board.cells[parsed.move[0]]![parsed.move[1]] !== "_") return { ok: false, error: `square ${squareName(parsed.move)} is taken` };
  return parsed;
}

/**
 * The game value for `mark` to move with perfect play on both sides: +1 win, 0 draw, -1 loss, scaled so
 * quicker wins and slower losses score higher (the perfect player also plays the shortest win).
 * Memoised on the board: tic-tac-toe has only 5478 legal positions.
 */
const valueCache = new Map<string, number>();
function minimaxValue(board: TicTacToeBoard, mark: Mark): number {
  const key = `${board.key()}${mark}`;
  const cached = valueCache.get(key);
  if (cached !== undefined) return cached;
  const winner = board.winner();
  let value: number;
  if (winner !== null) {
    // The previous player just won; positions with more empty squares left are quicker results.
    value = (winner === mark ? 1 : -1) * (1 + board.emptySquares().length);
  } else if (board.full()) {
    value = 0;
  } else {
    value = -Infinity;
    for (const square of board.emptySquares()) {
      const next = board.clone();
      next.place(square, mark);
      value = Math.max(value, -minimaxValue(next, otherMark(mark)));
    }
  }
  valueCache.set(key, value);
  return value;
}

/** All best squares for `mark` (perfect play); the perfect opponent picks among them with its generator. */
export function bestSquares(board: TicTacToeBoard, mark: Mark): Square[] {
  let best = -Infinity;
  let squares: Square[] = [];
  for (const square of board.emptySquares()) {
    const next = board.clone();
    next.place(square, mark);
    const value = -minimaxValue(next, otherMark(mark));
    if (value > best) {
      best = value;
      squares = [square];
    } else if (value === best) {
      squares.push(square);
    }
  }
  return squares;
}

/** The outcome with perfect play from here for `mark` to move: 1 win, 0 draw, -1 loss. */
export function perfectPlayOutcome(board: TicTacToeBoard, mark: Mark): number {
  const sign = Math.sign(minimaxValue(board, mark));
  return sign === 0 ? 0 : sign; // never -0 (negamax negates draws)
}

export type Opponent = (board: TicTacToeBoard, mark: Mark, rng: Rng) => Square;

export const randomOpponent: Opponent = (board, _mark, rng) => pick(rng, board.emptySquares());
export const perfectOpponent: Opponent = (board, mark, rng) => pick(rng, bestSquares(board, mark));

export interface TicTacToeOptions {
  opponent?: "random" | "perfect" | Opponent;
  /** The agent's mark; default drawn from the seed. */
  agentMark?: Mark;
  seed?: number;
}

/** Plays one game with `policy` against the opponent; reward per ART, metrics win, draw, loss, invalid_move, moves. */
export async function rolloutTicTacToe(policy: GamePolicy<TicTacToeBoard>, options: TicTacToeOptions = {}): Promise<Trajectory> {
  const seed = options.seed ?? freshSeed();
  const rng = seededRandom(seed);
  const agent = options.agentMark ?? (rng() < 0.5 ? "x" : "o");
  const opponent = options.opponent === "perfect" ? perfectOpponent : typeof options.opponent === "function" ? options.opponent : randomOpponent;
  const board = new TicTacToeBoard();
  const trajectory = new Trajectory({
    messagesAndChoices: [{ role: "system", content: `${SYSTEM_PROMPT_TICTACTOE} You play ${agent}.` }],
    metadata: { env: "tic-tac-toe", seed, agent_mark: agent, opponent: typeof options.opponent === "string" ? options.opponent : "random" },
  });
  let invalid = false;
  let moves = 0;
  while (!board.finished()) {
    if (board.toMove() !== agent) {
      board.place(opponent(board, otherMark(agent), rng), otherMark(agent));
      continue;
    }
    trajectory.messagesAndChoices.push({ role: "user", content: board.render() });
    const reply = await policy(trajectory.messages(), board);
    trajectory.messagesAndChoices.push(replyItem(reply));
    const parsed = legalMoveFrom(board, replyText(reply));
    if (!parsed.ok) {
      invalid = true;
      trajectory.log(`invalid move: ${parsed.error}`);
      break;
    }
    board.place(parsed.move, agent);
    moves++;
  }
  const { reward, metrics } = scoreTicTacToe(board, agent, invalid, moves);
  trajectory.reward = reward;
  Object.assign(trajectory.metrics, metrics);
  trajectory.metadata.final_board = board.key();
  return trajectory.finish();
}

/** A scripted player for demos and tests: wins if it can, blocks if it must, else centre, corners, edges. */
export function heuristicPolicyTicTacToe(_messages: unknown, board: TicTacToeBoard): string {
  const mark = board.toMove();
  const completes = (who: Mark) =>
    board.emptySquares().find((square) => {
      const next = board.clone();
      next.place(square, who);
      return next.winner() === who;
    });
  const preference: Square[] = [[1, 1], [0, 0], [0, 2], [2, 0], [2, 2], [0, 1], [1, 0], [1, 2], [2, 1]];
  const square = completes(mark) ?? completes(otherMark(mark)) ?? preference.find(([r, c]) => board.cells[r]![c] === "_")!;
  return `<move>${squareName(square)}</move>`;
}
