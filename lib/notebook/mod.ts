export { detectKernel, setKernelKind, type KernelKind } from "./kernel.ts";
export { installKernelInterrupt } from "./interrupt.ts";
export { display, HtmlView, LiveDisplay, Renderable, type MimeBundle } from "./display.ts";
export { NotebookProgress, progress, Progress, progressHtml, progressReporter, type ProgressOptions } from "./progress.ts";
export {
  compareRewards, lossCurve, Plot, PLOTLY_MIME, rewardCurve, rewardDistribution, stepRecord,
  type ComparisonOptions, type LossCurveOptions, type PlotlyFigure, type RewardCurveOptions, type RewardDistributionOptions, type Series, type StepRecord,
} from "./plot.ts";
export { reportPath } from "./report.ts";
export { escapeHtml } from "./text.ts";
export { groupTranscript, GroupTranscript, transcript, Transcript, trajectoryAnsi, trajectoryHtml, type TranscriptOptions } from "./transcript.ts";
export { envNumber, envString } from "./params.ts";
