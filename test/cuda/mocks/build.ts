// Builds a stand-in library of this folder (libcuda.cpp, libcublas.cpp, libnvrtc.cpp) for one test file: a
// temporary directory removed after the file's tests, and the .cpp compiled there as a shared library.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll } from "vitest";

const here = dirname(fileURLToPath(import.meta.url));

/** A fresh directory for this test file's mock libraries, removed when its tests end (call inside describe). */
export function mockDirectory(name: string): string {
  const dir = mkdtempSync(join(tmpdir(), `art-mock-${name}-`));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Compiles mocks/<source>.cpp to `path` (e.g. `<dir>/libcuda.so.1`); `flags` adds include directories. */
export function buildMock(compiler: string, source: "libcuda" | "libcublas" | "libnvrtc", path: string, flags: string[] = []): string {
  execFileSync(compiler, ["-std=c++17", "-O1", "-shared", "-fPIC", ...flags, join(here, `${source}.cpp`), "-o", path],
    { stdio: ["ignore", "ignore", "pipe"] });
  return path;
}
