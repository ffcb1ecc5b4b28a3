/** Test helper: a rollout's prompt and sampled completion as a training sequence. */
import { type TrainingSequence } from "../../lib/grpo/tokenize.ts";

/** prompt + sampled completion as a training sequence: only the sampled tokens are trained. */
export function toSequence(prompt: number[], completion: { tokenIds: number[]; logprobs: number[] }, advantage: number, trajectory: number): TrainingSequence {
  const tokens = [...prompt, ...completion.tokenIds];
  const trainable = new Uint8Array(tokens.length);
  const logprobs = new Float32Array(tokens.length).fill(NaN);
  completion.tokenIds.forEach((_, i) => {
    trainable[prompt.length + i] = 1;
    logprobs[prompt.length + i] = completion.logprobs[i];
  });
  return { tokens, trainable, logprobs, advantage, trajectory };
}
