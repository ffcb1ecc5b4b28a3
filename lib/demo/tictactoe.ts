/**
 * Tic-tac-toe for the embedded demo model: the environment's board, opponents, move format and rewards
 * (lib/envs/tictactoe.ts), with a prompt made short for CPU rollouts.
 *
 * Each move is asked in a fresh one-turn conversation holding only the current board, rows of three
 * characters from "xo_" ("x_o\n_x_\n__o": 11 tokens of the tiny tokenizer, one per square, so each square sits at
 * a fixed position). The position is all a player needs, so no history is carried: a game of up to five moves
 * is a Trajectory whose first move is its main history and whose later moves are additional histories, all
 * sharing the game's reward. The agent plays x (it moves first) against a random opponent.
 */
import { Trajectory, isChoice, type History, type Message } from "../core/trajectory.ts";
import { replyItem, replyText, type PolicyReply } from "../envs/policy.ts";
import { seededRandom } from "../core/random.ts";
import {
  TicTacToeBoard, legalMoveFrom, scoreTicTacToe, randomOpponent, squareName, type Square,
} from "../envs/tictactoe.ts";

/** The demo agent's mark: x, which moves first. */
export const AGENT_MARK = "x";

/** The board as three rows of "xo_" characters. */
export function compactBoard(board: TicTacToeBoard): string {
  return board.cells.map((row) => row.join("")).join("\n");
}

/** The conversation that asks for one move. */
export function movePrompt(board: TicTacToeBoard): Message[] {
  return [{ role: "user", content: compactBoard(board) }];
}

/** The answer format of ART's tic-tac-toe: `<move>B2</move>`. */
export function moveAnswer(square: Square): string {
  return `<move>${squareName(square)}</move>`;
}

/** Asks the agent for a move given the one-turn conversation; a model returns its Choice. */
export type MovePolicy = (messages: Message[], board: TicTacToeBoard) => PolicyReply | Promise<PolicyReply>;

/**
 * Plays one game as x against the random opponent drawn from `seed`. Reward (ART's): win 1, draw 0.5, loss 0,
 * invalid answer -1 (the game stops there). Metrics: win, draw, loss, invalid_move, moves.
 */
export async function playTicTacToe(policy: MovePolicy, seed: number): Promise<Trajectory> {
  const startTime = Date.now();
  const rng = seededRandom(seed);
  const board = new TicTacToeBoard();
  const histories: History[] = [];
  const logs: string[] = [];
  let invalid = false;
  let moves = 0;
  while (!board.finished()) {
    if (board.toMove() !== AGENT_MARK) {
      board.place(randomOpponent(board, "o", rng), "o");
      continue;
    }
    const messages = movePrompt(board);
    const reply = await policy(messages, board);
    histories.push({ messagesAndChoices: [...messages, replyItem(reply)] });
    const parsed = legalMoveFrom(board, replyText(reply));
    if (!parsed.ok) {
      invalid = true;
      logs.push(`invalid move: ${parsed.error}`);
      break;
    }
    board.place(parsed.move, AGENT_MARK);
    moves++;
  }
  const { reward, metrics } = scoreTicTacToe(board, AGENT_MARK, invalid, moves);
  const [first, ...rest] = histories;
  const trajectory = new Trajectory({
    messagesAndChoices: first!.messagesAndChoices,
    additionalHistories: rest,
    reward,
    metrics,
    metadata: { env: "tic-tac-toe", seed, agent_mark: AGENT_MARK, opponent: "random", final_board: board.key() },
    logs,
    startTime,
  });
  return trajectory.finish();
}

/** The moves of a game as "x B2, o A1, …" text with its outcome: for transcripts. */
export function describeGame(trajectory: Trajectory): string {
  const histories = [trajectory.messagesAndChoices, ...trajectory.additionalHistories.map((h) => h.messagesAndChoices)];
  const turns = histories.map((items) => {
    const board = (items[0] as Message).content as string;
    const reply = items[1]!;
    const answer = isChoice(reply) ? reply.message.content ?? "" : String(reply.content ?? "");
    return `${board}\n→ ${answer}`;
  });
  const final = String(trajectory.metadata.final_board ?? "").match(/.{3}/g)?.join("\n") ?? "";
  return [...turns, `final:\n${final}`, `reward ${trajectory.reward}`].join("\n\n");
}
