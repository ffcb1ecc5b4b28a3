// scripts/cuda-gpu-check.sh without a GPU: steps that cannot work fail or skip quickly and say so, a hung step is
// cut at the budget, and summary.json is valid JSON naming every step. A fake python3 stands in for a machine whose
// Python lacks transformers (fails) or hangs; the bench step is the real one, failing fast for want of libcuda.
import { execFileSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

const root = join(dirname(new URL(import.meta.url).pathname), "..", "..");
const work = mkdtempSync(join(tmpdir(), "art-gpu-check-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const allSteps = ["env", "build", "hf_reference", "tests", "roofline", "hf_peer", "bench", "serve_mix", "serve_batch", "hf_train_peer", "train_bench", "demo", "demo_cpu", "notebooks", "sanitizer", "nvrtc_fallback", "hf_fixtures", "grpo_peer", "grpo_bench", "memory", "cpu_benches"];

function runCheck(name: string, python: string, env: Record<string, string>): { summary: Record<string, { status: string }>; log: string } {
  const bin = join(work, name, "bin"), out = join(work, name, "out");
  mkdirSync(bin, { recursive: true });
  writeFileSync(join(bin, "python3"), `#!/bin/sh\n${python}\n`);
  chmodSync(join(bin, "python3"), 0o755);
  execFileSync("bash", [join(root, "scripts", "cuda-gpu-check.sh")], {
    // The repo's pinned Node (node_modules/.bin) runs the .ts steps, as the bundled one does on the device.
    env: { PATH: `${bin}:${join(root, "node_modules", ".bin")}:${dirname(process.execPath)}:/usr/bin:/bin`, HOME: work, OUT: out, ...env },
    stdio: ["ignore", "ignore", "pipe"], timeout: 60_000,
  });
  return { summary: JSON.parse(readFileSync(join(out, "summary.json"), "utf8")), log: readFileSync(join(out, "log.txt"), "utf8") };
}

describe.skipIf(process.platform !== "linux")("the GPU check script on a machine without a GPU", () => {
  // With a GPU the real bench step would run for minutes instead of failing.
  it.skipIf(process.env.ART_TEST_GPU === "1")("records failing steps with their exit status and every unselected step, and the bench names the missing driver", () => {
    const { summary, log } = runCheck("failing", "echo 'No module named transformers' >&2; exit 3",
      { ART_GPU_CHECK_STEPS: "hf_reference hf_peer bench grpo_peer grpo_bench" });
    expect(Object.keys(summary)).toEqual(allSteps);
    expect(summary.hf_reference.status).toMatch(/^failed \(exit 3\), \d+ s$/);
    expect(summary.hf_peer.status).toMatch(/^failed \(exit 3\)/);
    expect(summary.bench.status).toMatch(/^failed \(exit 1\)/);
    // The GRPO bench runs without the failed peer's file, and fails (the missing driver).
    expect(summary.grpo_peer.status).toMatch(/^failed \(exit 3\)/);
    expect(summary.grpo_bench.status).toMatch(/^failed \(exit 1\), \d+ s$/);
    for (const step of ["env", "build", "tests", "roofline", "serve_mix", "serve_batch", "hf_train_peer", "train_bench", "demo", "demo_cpu", "notebooks", "sanitizer", "nvrtc_fallback", "hf_fixtures"]) expect(summary[step].status).toBe("skipped: not selected");
    expect(log).toContain("No module named transformers");
    expect(log).toContain("libcuda.so.1");
  });

  const sanitizerPresent = ["/usr/local/cuda/bin/compute-sanitizer", "/usr/bin/compute-sanitizer"].some((path) => existsSync(path));
  it.skipIf(sanitizerPresent)("skips the sanitizer step where compute-sanitizer is missing, saying so", () => {
    const { summary } = runCheck("no-sanitizer", "exit 1", { ART_GPU_CHECK_STEPS: "sanitizer" });
    expect(summary.sanitizer.status).toBe("skipped: no compute-sanitizer on PATH or in /usr/local/cuda/bin");
  });

  it("cuts a hanging step at the budget and skips what no longer fits", () => {
    // The budget counts from the script's start, so the step's limit is what setup (a second or so) left of 7 s.
    const { summary } = runCheck("hanging", "sleep 60", { ART_GPU_CHECK_STEPS: "hf_reference bench", ART_GPU_CHECK_SECONDS: "7" });
    expect(summary.hf_reference.status).toMatch(/^timed out after [5-7] s/);
    expect(summary.bench.status).toBe("skipped: out of time");
  });
});
