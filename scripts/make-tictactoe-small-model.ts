/**
 * Makes models/tictactoe-small, the main job's model (lib/demo, `npm start`): the tic-tac-toe task of
 * make-tictactoe-model.ts (SFT on positions of random legal play, each answered with a uniformly random legal
 * square, so it plays like the random opponent) on a network that can learn near-perfect play.
 *
 * Two things set it apart from models/tictactoe-tiny (docs/demo.md, *How the defaults were chosen*). It is wider and
 * deeper (96 wide, 3 layers, 6/2 heads: 1.5 MB), and its rotary base is 10,000 rather than Qwen's 1,000,000: a
 * 16-wide head has 8 rotary pairs, and at Qwen's base only two of them turn noticeably over the ~30 positions of a
 * move's conversation, so telling the nine squares apart by position is harder than it needs to be.
 *
 * Usage: node scripts/make-tictactoe-small-model.ts [out-dir, default models/tictactoe-small]
 */
import { TICTACTOE_TASK, TICTACTOE_TINY_OPTIONS } from "./make-tictactoe-model.ts";
import { runTaskModelScript, type TaskModelOptions } from "./task-model.ts";

export const TICTACTOE_SMALL_OPTIONS: Omit<TaskModelOptions, "log"> = {
  ...TICTACTOE_TINY_OPTIONS,
  shape: {
    hidden_size: 96, intermediate_size: 288, num_hidden_layers: 3, num_attention_heads: 6, num_key_value_heads: 2,
    max_position_embeddings: 4096, rope_theta: 10000,
  },
};

runTaskModelScript(import.meta.url, "models/tictactoe-small", TICTACTOE_TASK, TICTACTOE_SMALL_OPTIONS);
