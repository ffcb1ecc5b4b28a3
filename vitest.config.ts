import { defineConfig } from "vitest/config";

// Heavy suites (notebooks, GPU parity) live behind environment flags named in the README;
// the default run is the fast CPU suite. ART_VITEST_JSON names a file for a machine-readable report (CI uses it).
const jsonReport = process.env.ART_VITEST_JSON;

// The CPU backend computes its products on the system BLAS where one is installed (the default run) or on the
// portable kernels; the numeric suites against independent references run a second time on the portable ones, so
// both are checked on every machine that has a BLAS (on one without, both runs use the portable kernels).
const numericSuites = ["reference", "hf-fixtures", "cpu-backend", "training-ops", "training", "generate"].map((name) => `test/model/${name}.test.ts`);

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    ...(jsonReport ? { reporters: ["default", "json"], outputFile: { json: jsonReport } } : {}),
    projects: [
      { extends: true, test: { name: "cpu", include: ["test/**/*.test.ts"] } },
      { extends: true, test: { name: "cpu-portable", include: numericSuites, env: { ART_CPU_BLAS: "portable" } } },
    ],
  },
});
