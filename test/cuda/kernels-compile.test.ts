// Compiles every kernel module with nvcc (one architecture: fast; the build script makes the full fatbin), checks
// that each module exports exactly the kernels the backend launches, without register spills, and that each
// kernel's parameters in the PTX match the table every launch is checked against.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";
import type { KernelArgType } from "../../lib/cuda/kernel-args.ts";
import { findNvcc, kernelModules, kernelSourceDirectory, kernelSources, nvccArguments } from "../../lib/cuda/kernel-build.ts";

/** PTX parameter type of each launch argument type (PTX does not tell a pointer from a 64-bit integer). */
const ptxType = { ptr: ".u64", i64: ".u64", i32: ".u32", u32: ".u32", f32: ".f32" } as const;

/** `.entry name(.param .u64 name_param_0, ...)` of a PTX file -> name -> parameter types. */
function ptxEntries(ptx: string): Record<string, string[]> {
  const entries: Record<string, string[]> = {};
  for (const match of ptx.matchAll(/\.entry\s+(\w+)\s*\(([^)]*)\)/g)) {
    entries[match[1]] = [...match[2].matchAll(/\.param\s+(\.\w+)/g)].map((m) => m[1]);
  }
  return entries;
}

const nvcc = findNvcc();
const out = mkdtempSync(join(tmpdir(), "art-cuda-compile-"));
afterAll(() => rmSync(out, { recursive: true, force: true }));

describe.skipIf(!nvcc)(`kernels compile with nvcc${nvcc ? "" : " (skipped: nvcc not found; set ART_NVCC or CUDA_HOME)"}`, () => {
  // Start every compile at once (two cores: ~15 s in all), then check each module in its own test.
  const compiled = Object.fromEntries(Object.keys(kernelModules).map((module) => {
    const source = join(kernelSourceDirectory(), `${module}.cu`);
    const cubin = join(out, `${module}.cubin`), ptx = join(out, `${module}.ptx`);
    // One nvcc run: the cubin with ptxas' report, and the PTX kept beside it.
    const args = [...nvccArguments(source, cubin, { cubin: 80 }), "-Xptxas", "-v", "--keep", "--keep-dir", out];
    return [module, promisify(execFile)(nvcc!, args).then(
      ({ stderr }) => ({ report: stderr, ptx: readFileSync(ptx, "utf8") }),
      (e: { stderr?: string }) => {
        throw new Error(`nvcc failed on ${source}:\n${e.stderr}`);
      })];
  }));

  for (const [module, kernels] of Object.entries(kernelModules) as [string, Record<string, readonly KernelArgType[]>][]) {
    it(`${module}.cu compiles for sm_80, exports its ${Object.keys(kernels).length} kernels with the declared parameters, spills nothing`, async () => {
      const { report, ptx } = await compiled[module];
      const entries = [...report.matchAll(/Compiling entry function '(\w+)'/g)].map((m) => m[1]).sort();
      expect(entries).toEqual(Object.keys(kernels).sort());
      const spills = [...report.matchAll(/(\d+) bytes spill stores/g)].map((m) => Number(m[1]));
      expect(spills.every((bytes) => bytes === 0)).toBe(true);
      const declared = Object.fromEntries(Object.entries(kernels).map(([name, types]) => [name, types.map((t) => ptxType[t])]));
      expect(ptxEntries(ptx)).toEqual(declared);
    });
  }
});

describe("kernel sources for NVRTC", () => {
  it("carry every header a module or header includes, by the name it is included as", () => {
    const { headers, modules } = kernelSources();
    expect(Object.keys(headers)).toEqual(expect.arrayContaining(["common.cuh", "flash.cuh"]));
    for (const source of [...Object.values(modules), ...Object.values(headers)]) {
      for (const [, name] of source.matchAll(/#include "([^"]+)"/g)) expect(headers, name).toHaveProperty([name]);
    }
  });
});
