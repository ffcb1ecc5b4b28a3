// Where the GPU time of a pass goes, per Backend op: a wrapper around a backend that records a stream event after
// every op call and charges the time between consecutive events to the op. The time is the GPU timeline's, so it
// includes the gaps where the GPU waited for the host to queue work (a launch-bound op shows as slow, as it is).
// Beside it, `hostMs`: the time the host spent inside the op's call (queueing its launches and GEMMs, allocating).
// Where an op's hostMs comes close to its ms, the host is what paces it, and fewer or cheaper calls are the cure.
// Only the outermost op of a nested call is charged (CudaBackend.copy runs add inside: one `copy`). For benches:
// events add a few microseconds per op, so profile a pass of its own, not the timed ones.

/** The stream events the profile needs (CudaContext has them). */
export interface EventTimeline {
  createEvent(): bigint;
  recordEvent(event: bigint): void;
  /** Milliseconds from one recorded event to a later one (waits for the later one). */
  elapsedMs(start: bigint, end: bigint): number;
  destroyEvent(event: bigint): void;
}

export interface OpProfile { ms: number; hostMs: number; calls: number }

export interface ProfiledBackend<B> {
  /** Use in place of the backend: every method call is an op. */
  backend: B;
  /** Starts counting (calls outside start() .. report() record nothing). */
  start(): void;
  /** Stops counting; per op since start(), the GPU time from the event before it to the one after it, and its calls; slowest first. */
  report(): Record<string, OpProfile>;
  /** Frees the events. */
  dispose(): void;
}

/** `clock`: the host's milliseconds (performance.now; tests give their own). */
export function profileBackend<B extends object>(backend: B, timeline: EventTimeline, clock: () => number = () => performance.now()): ProfiledBackend<B> {
  const spare: bigint[] = [];
  let marks: { op: string; event: bigint; hostMs: number }[] = [];
  let depth = 0;
  const mark = (op: string, hostMs: number) => {
    const event = spare.pop() ?? timeline.createEvent();
    timeline.recordEvent(event);
    marks.push({ op, event, hostMs });
  };
  const proxy = new Proxy(backend, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver);
      if (typeof value !== "function" || typeof name !== "string") return value;
      return (...args: unknown[]) => {
        const started = depth++ === 0 ? clock() : 0;
        try {
          return (value as (...a: unknown[]) => unknown).apply(target, args);
        } finally {
          if (--depth === 0 && marks.length > 0) mark(name, clock() - started);
        }
      };
    },
  });
  const recycle = () => {
    for (const { event } of marks) spare.push(event);
    marks = [];
  };
  return {
    backend: proxy,
    start() {
      recycle();
      mark("start", 0);
    },
    report() {
      const totals = new Map<string, OpProfile>();
      for (let i = 1; i < marks.length; i++) {
        const entry = totals.get(marks[i].op) ?? { ms: 0, hostMs: 0, calls: 0 };
        entry.ms += timeline.elapsedMs(marks[i - 1].event, marks[i].event);
        entry.hostMs += marks[i].hostMs;
        entry.calls++;
        totals.set(marks[i].op, entry);
      }
      recycle();
      const sorted = [...totals].sort((a, b) => b[1].ms - a[1].ms);
      return Object.fromEntries(sorted.map(([op, { ms, hostMs, calls }]) => [op, { ms: +ms.toFixed(3), hostMs: +hostMs.toFixed(3), calls }]));
    },
    dispose() {
      recycle();
      for (const event of spare) timeline.destroyEvent(event);
      spare.length = 0;
    },
  };
}
