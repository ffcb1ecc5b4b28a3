/** Timing helpers shared by the micro-benchmarks (bench/cpu-matmul.ts). */

/** Mean ms per call over a short window. */
export function timeIt(run: () => void, windowMs = 300): number {
  let reps = 0;
  const start = performance.now();
  while (performance.now() - start < windowMs) {
    run();
    reps++;
  }
  return (performance.now() - start) / reps;
}

/** Alternates short windows of the variants and keeps each one's best, so load from elsewhere hits all alike. */
export function compare(variants: readonly (() => void)[], rounds = 8): number[] {
  for (let i = 0; i < 3; i++) for (const run of variants) run();
  const best = variants.map(() => Infinity);
  for (let r = 0; r < rounds; r++) variants.forEach((run, i) => (best[i] = Math.min(best[i], timeIt(run))));
  return best;
}
