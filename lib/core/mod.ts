export * from "./trajectory.ts";
export { ArtError } from "./errors.ts";
export { InterruptedError, interruptScope, requestInterrupt, throwIfInterrupted, type InterruptScope } from "./interrupt.ts";
export { seededRandom, type Rng } from "./random.ts";
export { iterateDataset, limitConcurrency, retry, type DatasetStep, type IterateDatasetOptions, type RetryOptions } from "./concurrency.ts";
export * from "./gather.ts";
export { captureTrajectory, recordCompletion, type CapturedCompletion } from "./capture.ts";
export * from "./progress.ts";
