/** Public names of the environments: 2048 and tic-tac-toe, and the policy type every environment rolls out with (ART·E: arte/mod.ts). */
export type { GamePolicy, PolicyReply } from "./policy.ts";
export {
  DIRECTIONS, Game2048, greedyPolicy2048, INVALID_MOVE_REWARD_2048, parseMove2048, rollout2048, slideBoard, slideLine,
  SYSTEM_PROMPT_2048, WIN_REWARD_2048, type Direction, type Game2048Options, type ParsedMove, type Rollout2048Options,
} from "./game2048.ts";
export {
  bestSquares, heuristicPolicyTicTacToe, legalMoveFrom, otherMark, scoreTicTacToe, parseTicTacToeMove, perfectOpponent, perfectPlayOutcome, randomOpponent, rolloutTicTacToe,
  squareName, SYSTEM_PROMPT_TICTACTOE, TicTacToeBoard, TICTACTOE_REWARDS, type Mark, type Opponent, type Square, type TicTacToeOptions,
} from "./tictactoe.ts";
