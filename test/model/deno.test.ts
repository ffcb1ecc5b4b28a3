import { execFileSync } from "node:child_process";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { engineSummary } from "./deno-entry.ts";
import { tinyCheckpoint } from "./helpers.ts";

const root = path.join(import.meta.dirname, "..", "..");

describe("the engine under Deno 2", () => {
  // With FFI allowed both runtimes pick the same products (the system BLAS where one is installed, else portable).
  it("loads a checkpoint and generates exactly what Node does", async () => {
    const dir = tinyCheckpoint({ arch: "qwen3", seed: 8, tokenizer: true });
    const deno = path.join(root, "node_modules", ".bin", "deno");
    const output = execFileSync(deno, ["run", "--allow-read", "--allow-env", "--allow-sys", "--allow-ffi", "test/model/deno-entry.ts", dir], {
      cwd: root, encoding: "utf8",
    });
    expect(JSON.parse(output)).toEqual(await engineSummary(dir));
  });
});
