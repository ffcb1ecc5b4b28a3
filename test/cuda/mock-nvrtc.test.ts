// Nvrtc (lib/cuda/nvrtc.ts) through the FFI against mocks/libnvrtc.cpp, which reads the source, name, headers
// and include names only when compiling (so they must outlive nvrtcCreateProgram) and records what it was handed.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ArtError } from "../../lib/core/errors.ts";
import { Nvrtc } from "../../lib/cuda/nvrtc.ts";
import { findCompiler } from "./emulated-device.ts";
import { buildMock, mockDirectory } from "./mocks/build.ts";

const compiler = findCompiler();

describe.skipIf(!compiler)(`Nvrtc against a recording NVRTC${compiler ? "" : " (skipped: no C++ compiler; set CXX)"}`, () => {
  const dir = mockDirectory("nvrtc");

  it("hands NVRTC the source, headers by name and options, returns the cubin, and reports a failed compile with its log", () => {
    const path = buildMock(compiler!, "libnvrtc", join(dir, "libnvrtc.so"));
    const nvrtc = new Nvrtc({ name: "nvrtc", path, source: "test" }, null);
    const source = '#include "common.cuh"\n#include "extra.cuh"\nextern "C" __global__ void k() {}\n';
    const cubin = nvrtc.compile("convert", source, { "common.cuh": "// common", "extra.cuh": "// extra" }, 90, ["/x/include"]);
    expect(new TextDecoder().decode(cubin)).toBe(
      `convert.cu|--gpu-architecture=sm_90 -std=c++17 -default-device -I/x/include|common.cuh=// common|extra.cuh=// extra|${source.length}`);
    const failing = () => nvrtc.compile("rope", "#error no\n", {}, 80, []);
    expect(failing).toThrowError(ArtError);
    expect(failing).toThrowError(/^NVRTC failed to compile rope\.cu for sm_80:\nrope\.cu\(1\): error: #error directive in the source\n$/);
  });
});
