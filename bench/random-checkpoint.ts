// Writes a random-weight checkpoint of a shape of bench/cuda-shapes.json (or "tiny-qwen2") with Qwen's tokenizer and
// chat template to a new temporary directory and prints its path: the model the GPU check runs the cookbook with
// (ART_NB_MODEL), at a real model's shape. It samples digits only (cuda-random-model.ts says why).
//
// Usage: node bench/random-checkpoint.ts qwen2.5-0.5b
import { writeBenchCheckpoint } from "./cuda-random-model.ts";

const shape = process.argv[2];
if (!shape) {
  console.error("usage: node bench/random-checkpoint.ts <shape of bench/cuda-shapes.json, or tiny-qwen2>");
  process.exit(2);
}
console.log(await writeBenchCheckpoint(shape));
