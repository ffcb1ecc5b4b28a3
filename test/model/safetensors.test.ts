import * as fs from "node:fs";
import * as path from "node:path";
import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { f16ToF32, f32ToBf16, f32ToF16, openSafetensors, writeSafetensors } from "../../lib/model/safetensors.ts";
import { writeTinyCheckpoint } from "../../scripts/make-tiny-checkpoint.ts";
import { tempDir } from "./helpers.ts";

const values = Float32Array.from([0, 1, -2.5, 3.14159, 1e-3, -65504, 6e-8, 1 / 3]);

describe("safetensors", () => {
  it("round-trips F32 exactly and BF16 / F16 to their precision", () => {
    const file = path.join(tempDir(), "t.safetensors");
    writeSafetensors(file, {
      a: { dtype: "F32", shape: [2, 4], data: values },
      b: { dtype: "BF16", shape: [8], data: values },
      c: { dtype: "F16", shape: [4, 2], data: values },
    }, { format: "pt" });
    const store = openSafetensors(file);
    expect(store.names()).toEqual(["a", "b", "c"]);
    expect(store.info("c")).toEqual({ name: "c", dtype: "F16", shape: [4, 2], file });
    expect(store.readF32("a", [2, 4])).toEqual(values);
    const bf16 = store.readF32("b");
    const f16 = store.readF32("c");
    for (let i = 0; i < values.length; i++) {
      expect(Math.abs(bf16[i] - values[i])).toBeLessThanOrEqual(Math.abs(values[i]) * 2 ** -8);
      expect(Math.abs(f16[i] - values[i])).toBeLessThanOrEqual(Math.max(Math.abs(values[i]) * 2 ** -11, 2 ** -25));
    }
    expect(f16[5]).toBe(-65504); // the largest half is exact
    store.close();
    // The data section starts 8-byte aligned.
    const headerLength = Number(fs.readFileSync(file).readBigUInt64LE(0));
    expect((8 + headerLength) % 8).toBe(0);
  });

  it("rounds to nearest even and keeps specials", () => {
    expect(f32ToBf16(1 + 2 ** -8)).toBe(0x3f80);          // halfway: down to even
    expect(f32ToBf16(1 + 3 * 2 ** -8)).toBe(0x3f82);      // halfway: up to even
    expect(f32ToF16(65520)).toBe(0x7c00);                 // overflows to infinity
    expect(f16ToF32(f32ToF16(-Infinity))).toBe(-Infinity);
    expect(Number.isNaN(f16ToF32(f32ToF16(NaN)))).toBe(true);
    expect(f16ToF32(0x0001)).toBe(2 ** -24);              // smallest subnormal
    expect(f32ToF16(2 ** -24)).toBe(0x0001);
  });

  it("reads a sharded checkpoint through its index as one store", () => {
    const dir = tempDir();
    writeTinyCheckpoint(dir, { arch: "qwen3", shards: 3, dtype: "BF16" });
    const store = openSafetensors(dir);
    expect(fs.readdirSync(dir).filter((f) => f.endsWith(".safetensors"))).toHaveLength(3);
    expect(store.names()).toContain("lm_head.weight");
    expect(store.readF32("model.norm.weight", [32])).toHaveLength(32);
    store.close();
  });

  describe("errors name the file and the tensor", () => {
    const dir = tempDir();
    const file = path.join(dir, "x.safetensors");
    writeSafetensors(file, { w: { dtype: "F32", shape: [2, 3], data: new Float32Array(6) } });

    it("missing tensor", () => {
      expect(() => openSafetensors(file).readF32("v")).toThrow(`${file}: missing tensor "v"`);
    });
    it("wrong shape", () => {
      expect(() => openSafetensors(file).readF32("w", [3, 2]))
        .toThrow(`${file}: tensor "w" has shape [2,3], expected [3,2] (does config.json match the weights?)`);
    });
    it("truncated file", () => {
      const cut = path.join(dir, "cut.safetensors");
      const bytes = fs.readFileSync(file);
      fs.writeFileSync(cut, bytes.subarray(0, bytes.length - 4));
      expect(() => openSafetensors(cut))
        .toThrow(`${cut}: truncated or corrupt safetensors file: tensor "w" needs data bytes [0, 24) but the file holds only 20`);
      fs.writeFileSync(cut, bytes.subarray(0, 5));
      expect(() => openSafetensors(cut)).toThrow(`${cut}: truncated or corrupt safetensors file: 5 bytes is shorter than the 8-byte header length`);
    });
    it("corrupt header", () => {
      const bad = path.join(dir, "bad.safetensors");
      const bytes = Buffer.from(fs.readFileSync(file));
      bytes[9] = "!".charCodeAt(0);
      fs.writeFileSync(bad, bytes);
      expect(() => openSafetensors(bad)).toThrow(`${bad}: truncated or corrupt safetensors file: the header is not valid JSON`);
      const huge = path.join(dir, "huge.safetensors");
      bytes.writeBigUInt64LE(1n << 40n, 0);
      fs.writeFileSync(huge, bytes);
      expect(() => openSafetensors(huge)).toThrow(/huge.safetensors: truncated or corrupt safetensors file: header length 1099511627776 does not fit/);
    });
    it("unsupported dtype", () => {
      const ints = path.join(dir, "ints.safetensors");
      const header = Buffer.from(JSON.stringify({ ids: { dtype: "I64", shape: [1], data_offsets: [0, 8] } }));
      const length = Buffer.alloc(8);
      length.writeBigUInt64LE(BigInt(header.length));
      fs.writeFileSync(ints, Buffer.concat([length, header, Buffer.alloc(8)]));
      expect(() => openSafetensors(ints)).toThrow(`${ints}: tensor "ids" has dtype I64; art-ts reads F32, BF16 and F16 checkpoints`);
    });
    it("header entries that would read outside their tensor: negative, reversed or overlapping ranges, bad shapes", () => {
      const craft = (header: Record<string, unknown>, dataBytes = 16) => {
        const file = path.join(tempDir(), "crafted.safetensors");
        const json = Buffer.from(JSON.stringify(header));
        const length = Buffer.alloc(8);
        length.writeBigUInt64LE(BigInt(json.length));
        fs.writeFileSync(file, Buffer.concat([length, json, Buffer.alloc(dataBytes)]));
        return () => openSafetensors(file);
      };
      const malformed = /has a malformed header entry \(shape and data_offsets must be non-negative whole numbers, begin <= end\)/;
      expect(craft({ w: { dtype: "F32", shape: [2], data_offsets: [-8, 0] } })).toThrow(malformed); // would read the header as weights
      expect(craft({ w: { dtype: "F32", shape: [2], data_offsets: [8, 0] } })).toThrow(malformed);
      expect(craft({ w: { dtype: "F32", shape: [-2], data_offsets: [0, 8] } })).toThrow(malformed);
      expect(craft({ w: { dtype: "F32", shape: [1.5], data_offsets: [0, 6] } })).toThrow(malformed);
      expect(craft({ w: null })).toThrow(/tensor "w" has a malformed header entry/);
      expect(craft({ w: { dtype: "toString", shape: [1], data_offsets: [0, 4] } })).toThrow(/has dtype toString; art-ts reads F32/);
      expect(craft({ __metadata__: { format: 3 } })).toThrow(/__metadata__ is not an object of strings/);
      expect(craft({ a: { dtype: "F32", shape: [2], data_offsets: [0, 8] }, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } }))
        .toThrow(/tensors "a" \[0, 8\) and "b" \[4, 12\) overlap/);
      expect(craft({ a: { dtype: "F32", shape: [2], data_offsets: [0, 8] }, b: { dtype: "F32", shape: [2], data_offsets: [8, 16] } })).not.toThrow();
    });

    it("only regular files, and only shards beside their index", () => {
      const fifo = path.join(tempDir(), "pipe.safetensors");
      expect(spawnSync("mkfifo", [fifo]).status).toBe(0);
      expect(() => openSafetensors(fifo)).toThrow(`${fifo}: not a regular file; a safetensors file is a plain file`);
      const sharded = tempDir();
      writeTinyCheckpoint(sharded, { arch: "qwen2", shards: 2 });
      const indexFile = path.join(sharded, "model.safetensors.index.json");
      const index = JSON.parse(fs.readFileSync(indexFile, "utf8"));
      for (const escape of ["../model-00001-of-00002.safetensors", path.join(sharded, "model-00001-of-00002.safetensors"), "sub/x.safetensors"]) {
        const name = Object.keys(index.weight_map)[0]!;
        fs.writeFileSync(indexFile, JSON.stringify({ ...index, weight_map: { ...index.weight_map, [name]: escape } }));
        expect(() => openSafetensors(sharded), escape).toThrow(/is not a file name in .*; an index names shards beside it/);
      }
    });

    it("no weights in a directory, and a shard the index names but lacks", () => {
      const empty = tempDir();
      expect(() => openSafetensors(empty))
        .toThrow(`${empty}: no model.safetensors or model.safetensors.index.json (is this a Hugging Face checkpoint directory?)`);
      const sharded = tempDir();
      writeTinyCheckpoint(sharded, { arch: "qwen2", shards: 2 });
      fs.rmSync(path.join(sharded, "model-00002-of-00002.safetensors"));
      expect(() => openSafetensors(sharded))
        .toThrow(`${path.join(sharded, "model.safetensors.index.json")}: names shard "model-00002-of-00002.safetensors", which does not exist`);
    });
  });
});
