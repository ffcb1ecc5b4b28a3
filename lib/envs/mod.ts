/**
 * Every environment's public names, `envs` in the art-ts entry: 2048, tic-tac-toe, Temporal Clue, Codenames, MCP
 * servers, the tool-calling turn loop they share, the policy type every environment rolls out with and the call that
 * ends a game where its conversation outgrows the model's context (ART·E's inbox:
 * arte/mod.ts, `arte` in the entry).
 */
export { askPolicy, isContextLengthError, type GamePolicy, type PolicyReply } from "./policy.ts";
export {
  CODENAMES_REWARDS, CODENAMES_WORDS, CodenamesGame, keyCounts, legalClueFrom, legalGuessFrom, otherTeam, parseCodenamesClue, parseCodenamesGuess,
  randomCodenamesPolicy, rolloutCodenames, scoreCodenames, SCRIPTED_CLUE, scriptedCodenamesPolicy, SYSTEM_PROMPT_CODENAMES,
  type CardColor, type Clue, type CodenamesOptions, type Guess, type Team, type TurnRecord,
} from "./codenames.ts";
export {
  callMcpTool, COMPLETE_TASK_TOOL, connectMcp, generateMcpScenarios, McpConnection, mcpResultText, mcpSystemPrompt, mcpTools, rolloutMcp,
  type GenerateScenariosOptions, type McpCallResult, type McpClient, type McpRolloutOptions, type McpScenario, type McpServerSpec, type McpToolInfo,
} from "./mcp.ts";
export { parseToolArguments, playToolEpisode, type ToolEpisode, type ToolEpisodeOptions } from "./tool-episode.ts";
export {
  DIRECTIONS, Game2048, greedyPolicy2048, INVALID_MOVE_REWARD_2048, parseMove2048, rollout2048, slideBoard, slideLine,
  SYSTEM_PROMPT_2048, WIN_REWARD_2048, type Direction, type Game2048Options, type ParsedMove, type Rollout2048Options,
} from "./game2048.ts";
export {
  bestSquares, heuristicPolicyTicTacToe, legalMoveFrom, otherMark, scoreTicTacToe, parseTicTacToeMove, perfectOpponent, perfectPlayOutcome, randomOpponent, rolloutTicTacToe,
  squareName, SYSTEM_PROMPT_TICTACTOE, TicTacToeBoard, TICTACTOE_REWARDS, type Mark, type Opponent, type Square, type TicTacToeOptions,
} from "./tictactoe.ts";
export {
  clueHolds, generateTemporalClue, guessPolicyTemporalClue, hourLabel, parseTemporalClueAnswers, questionText, renderClue, renderTemporalClue,
  rolloutTemporalClue, scoreTemporalClue, solverPolicyTemporalClue, solveTemporalClue, SYSTEM_PROMPT_TEMPORAL_CLUE, temporalClueAnswerMatches,
  temporalClueMessages, type ClueCategory, type ClueQuestion, type ClueRef, type ClueStatement, type ClueWorld, type ParsedClueAnswers,
  type TemporalClueCast, type TemporalClueOptions, type TemporalCluePuzzle,
} from "./temporal-clue.ts";
