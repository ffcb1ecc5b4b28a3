import { describe, expect, it } from "vitest";
import { type EventTimeline, profileBackend } from "../../bench/cuda-profile.ts";

/** A stream whose ops take known times: an event records the clock when it is recorded. */
function fakeStream() {
  let clock = 0, next = 1n;
  const times = new Map<bigint, number>();
  const live = new Set<bigint>();
  const timeline: EventTimeline = {
    createEvent: () => (live.add(next), next++),
    recordEvent: (event) => void times.set(event, clock),
    elapsedMs: (start, end) => times.get(end)! - times.get(start)!,
    destroyEvent: (event) => void live.delete(event),
  };
  return { timeline, live, advance: (ms: number) => (clock += ms), now: () => clock };
}

class FakeBackend {
  readonly name = "fake";
  readonly #advance: (ms: number) => void;
  constructor(advance: (ms: number) => void) {
    this.#advance = advance;
  }
  matmul(ms: number): number { this.#advance(ms); return ms; }
  copy(ms: number): void { this.add(ms / 2); this.add(ms / 2); } // an op made of other ops
  add(ms: number): void { this.#advance(ms); }
}

describe("per-op GPU profile of a backend", () => {
  it("charges the time between consecutive ops to the later one, outermost calls only, slowest first; the host's time in each call beside it", () => {
    const stream = fakeStream();
    // The host's clock: an op's call takes as long as its work here (the fake queues and runs at once).
    const profile = profileBackend(new FakeBackend(stream.advance), stream.timeline, stream.now);
    const b = profile.backend;
    b.matmul(100); // before start: not counted
    profile.start();
    expect(b.matmul(3)).toBe(3);
    b.add(1);
    b.copy(4);
    stream.advance(2); // the host was slow to queue the next op: the GPU waited, and the wait is that op's
    b.matmul(5);
    expect(b.name).toBe("fake");
    expect(profile.report()).toEqual({
      matmul: { ms: 10, hostMs: 8, calls: 2 }, copy: { ms: 4, hostMs: 4, calls: 1 }, add: { ms: 1, hostMs: 1, calls: 1 },
    });
    b.matmul(1); // after report: not counted
    profile.start();
    b.add(7);
    expect(profile.report()).toEqual({ add: { ms: 7, hostMs: 7, calls: 1 } });
    profile.dispose();
    expect(stream.live.size).toBe(0);
  });
});
