/** Public names of the demo area: the main job (GRPO on the embedded small model) and its short-prompt tic-tac-toe. */
export { runDemo, DEMO_DEFAULTS } from "./run.ts";
export type { DemoOptions, DemoResult, Outcomes } from "./run.ts";
export { playTicTacToe, compactBoard, movePrompt, moveAnswer, describeGame, AGENT_MARK } from "./tictactoe.ts";
export type { MovePolicy } from "./tictactoe.ts";
