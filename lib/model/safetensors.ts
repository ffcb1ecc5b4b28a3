/**
 * Safetensors reading and writing. A file is: u64 little-endian header length, a JSON header naming each tensor's
 * dtype, shape and byte range, then the data. Reading keeps only the header in memory and reads each tensor's byte
 * range from the file descriptor when asked, so a checkpoint is never held twice (file bytes + converted floats).
 * Sharded checkpoints (model.safetensors.index.json → weight_map) look like one store.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";

export type SafetensorsDType = "F32" | "BF16" | "F16";
const BYTES_PER_ELEMENT: Record<SafetensorsDType, number> = { F32: 4, BF16: 2, F16: 2 };

export interface TensorInfo {
  name: string;
  dtype: SafetensorsDType;
  shape: number[];
  file: string;
}

export interface TensorStore {
  names(): string[];
  info(name: string): TensorInfo | undefined;
  /** The tensor as f32 (BF16/F16 converted); errors name the file and the tensor. */
  readF32(name: string, expectedShape?: number[]): Float32Array;
  close(): void;
}

interface Entry extends TensorInfo {
  /** Absolute byte offset of the tensor's data in the file. */
  start: number;
  byteLength: number;
}

const MAX_HEADER_BYTES = 100 * 1024 * 1024;

function corrupt(file: string, detail: string): never {
  throw new ArtError("corrupt_safetensors", `${file}: truncated or corrupt safetensors file: ${detail}`);
}

function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** One .safetensors file: header parsed at open, tensors read on demand. */
class SafetensorsFile {
  readonly entries = new Map<string, Entry>();
  readonly metadata: Record<string, string> = {};
  readonly file: string;
  private fd: number | null;

  constructor(file: string) {
    this.file = file;
    if (!fs.existsSync(file)) throw new ArtError("not_found", `${file}: no such safetensors file`);
    // A FIFO or a device would block or stream forever when read.
    if (!fs.statSync(file).isFile()) throw new ArtError("corrupt_safetensors", `${file}: not a regular file; a safetensors file is a plain file`);
    this.fd = fs.openSync(file, "r");
    try {
      this.parseHeader();
    } catch (error) {
      this.close();
      throw error;
    }
  }

  private parseHeader(): void {
    const fileSize = fs.fstatSync(this.fd!).size;
    if (fileSize < 8) corrupt(this.file, `${fileSize} bytes is shorter than the 8-byte header length`);
    const lengthBytes = Buffer.alloc(8);
    fs.readSync(this.fd!, lengthBytes, 0, 8, 0);
    const headerLength = Number(lengthBytes.readBigUInt64LE(0));
    if (headerLength > MAX_HEADER_BYTES || 8 + headerLength > fileSize) {
      corrupt(this.file, `header length ${headerLength} does not fit in a ${fileSize}-byte file`);
    }
    const headerBytes = Buffer.alloc(headerLength);
    fs.readSync(this.fd!, headerBytes, 0, headerLength, 8);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(headerBytes.toString("utf8"));
    } catch {
      corrupt(this.file, "the header is not valid JSON");
    }
    if (typeof header !== "object" || header === null || Array.isArray(header)) corrupt(this.file, "the header is not a JSON object");
    const dataStart = 8 + headerLength;
    const dataLength = fileSize - dataStart;
    const isCount = (n: unknown): n is number => Number.isSafeInteger(n) && (n as number) >= 0;
    const ranges: [number, number, string][] = [];
    for (const [name, raw] of Object.entries(header)) {
      if (name === "__metadata__") {
        if (typeof raw !== "object" || raw === null || Array.isArray(raw) || !Object.values(raw).every((v) => typeof v === "string")) {
          corrupt(this.file, "__metadata__ is not an object of strings");
        }
        Object.assign(this.metadata, raw);
        continue;
      }
      if (typeof raw !== "object" || raw === null || Array.isArray(raw)) corrupt(this.file, `tensor "${name}" has a malformed header entry`);
      const { dtype, shape, data_offsets: offsets } = raw as { dtype: unknown; shape: unknown; data_offsets: unknown };
      if (typeof dtype !== "string" || !Object.hasOwn(BYTES_PER_ELEMENT, dtype)) {
        throw new ArtError(
          "unsupported_dtype",
          `${this.file}: tensor "${name}" has dtype ${String(dtype)}; art-ts reads F32, BF16 and F16 checkpoints`,
        );
      }
      if (!Array.isArray(shape) || !shape.every(isCount) || !Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isCount) || offsets[0] > offsets[1]) {
        corrupt(this.file, `tensor "${name}" has a malformed header entry (shape and data_offsets must be non-negative whole numbers, begin <= end)`);
      }
      const [begin, end] = offsets as [number, number];
      const elements = (shape as number[]).reduce((a, b) => a * b, 1);
      const byteLength = elements * BYTES_PER_ELEMENT[dtype as SafetensorsDType];
      if (end - begin !== byteLength) {
        corrupt(this.file, `tensor "${name}" of shape [${shape}] ${dtype} needs ${byteLength} bytes, header says ${end - begin}`);
      }
      if (end > dataLength) {
        corrupt(this.file, `tensor "${name}" needs data bytes [${begin}, ${end}) but the file holds only ${dataLength}`);
      }
      ranges.push([begin, end, name]);
      this.entries.set(name, {
        name, dtype: dtype as SafetensorsDType, shape: shape as number[], file: this.file, start: dataStart + begin, byteLength,
      });
    }
    // Two tensors sharing bytes would make one write show up in the other.
    ranges.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < ranges.length; i++) {
      const [previous, current] = [ranges[i - 1]!, ranges[i]!];
      if (current[0] < previous[1]) corrupt(this.file, `tensors "${previous[2]}" [${previous[0]}, ${previous[1]}) and "${current[2]}" [${current[0]}, ${current[1]}) overlap`);
    }
  }

  read(entry: Entry): Float32Array {
    if (this.fd === null) throw new ArtError("closed", `${this.file}: the tensor store was closed`);
    const elements = entry.byteLength / BYTES_PER_ELEMENT[entry.dtype];
    const out = new Float32Array(elements);
    if (entry.dtype === "F32") {
      readFully(this.fd, new Uint8Array(out.buffer), entry.start, this.file);
      return out;
    }
    const halves = new Uint16Array(elements);
    readFully(this.fd, new Uint8Array(halves.buffer), entry.start, this.file);
    if (entry.dtype === "BF16") {
      const bits = new Uint32Array(out.buffer);
      for (let i = 0; i < elements; i++) bits[i] = halves[i] << 16;
    } else {
      for (let i = 0; i < elements; i++) out[i] = f16ToF32(halves[i]);
    }
    return out;
  }

  close(): void {
    if (this.fd !== null) fs.closeSync(this.fd);
    this.fd = null;
  }
}

function readFully(fd: number, target: Uint8Array, position: number, file: string): void {
  let done = 0;
  while (done < target.length) {
    const n = fs.readSync(fd, target, done, target.length - done, position + done);
    if (n === 0) corrupt(file, `unexpected end of file at byte ${position + done}`);
    done += n;
  }
}

class Store implements TensorStore {
  private readonly files: SafetensorsFile[];
  /** What errors name for a missing tensor: the file, or the index of a sharded set. */
  private readonly source: string;

  constructor(files: SafetensorsFile[], source: string) {
    this.files = files;
    this.source = source;
  }

  private entry(name: string): Entry | undefined {
    for (const file of this.files) {
      const entry = file.entries.get(name);
      if (entry) return entry;
    }
    return undefined;
  }

  names(): string[] {
    return this.files.flatMap((f) => [...f.entries.keys()]);
  }

  info(name: string): TensorInfo | undefined {
    const entry = this.entry(name);
    return entry && { name: entry.name, dtype: entry.dtype, shape: entry.shape, file: entry.file };
  }

  readF32(name: string, expectedShape?: number[]): Float32Array {
    const entry = this.entry(name);
    if (!entry) throw new ArtError("missing_tensor", `${this.source}: missing tensor "${name}"`);
    if (expectedShape && !sameShape(entry.shape, expectedShape)) {
      throw new ArtError(
        "wrong_shape",
        `${entry.file}: tensor "${name}" has shape [${entry.shape}], expected [${expectedShape}] (does config.json match the weights?)`,
      );
    }
    return this.files.find((f) => f.file === entry.file)!.read(entry);
  }

  close(): void {
    for (const file of this.files) file.close();
  }
}

/** Opens a .safetensors file, or a checkpoint directory (model.safetensors or a sharded set behind its index). */
export function openSafetensors(dirOrFile: string): TensorStore {
  if (!fs.existsSync(dirOrFile)) throw new ArtError("not_found", `${dirOrFile}: no such file or directory`);
  if (!fs.statSync(dirOrFile).isDirectory()) return new Store([new SafetensorsFile(dirOrFile)], dirOrFile);
  const indexFile = path.join(dirOrFile, "model.safetensors.index.json");
  if (fs.existsSync(indexFile)) return openSharded(indexFile);
  const single = path.join(dirOrFile, "model.safetensors");
  if (fs.existsSync(single)) return new Store([new SafetensorsFile(single)], single);
  throw new ArtError(
    "not_found",
    `${dirOrFile}: no model.safetensors or model.safetensors.index.json (is this a Hugging Face checkpoint directory?)`,
  );
}

function openSharded(indexFile: string): TensorStore {
  let index: { weight_map?: Record<string, string> };
  try {
    index = JSON.parse(fs.readFileSync(indexFile, "utf8"));
  } catch (error) {
    throw new ArtError("corrupt_index", `${indexFile}: not valid JSON (${(error as Error).message})`);
  }
  const weightMap = index.weight_map;
  if (typeof weightMap !== "object" || weightMap === null) {
    throw new ArtError("corrupt_index", `${indexFile}: missing "weight_map"`);
  }
  const dir = path.dirname(indexFile);
  const files: SafetensorsFile[] = [];
  try {
    for (const shard of new Set(Object.values(weightMap))) {
      const file = path.join(dir, String(shard));
      // An index may only name files beside it: "../x" or an absolute path would read outside the checkpoint.
      if (typeof shard !== "string" || path.isAbsolute(shard) || path.relative(dir, file).startsWith("..") || path.dirname(path.relative(dir, file)) !== ".") {
        throw new ArtError("corrupt_index", `${indexFile}: shard ${JSON.stringify(shard)} is not a file name in ${dir}; an index names shards beside it`);
      }
      if (!fs.existsSync(file)) throw new ArtError("not_found", `${indexFile}: names shard "${shard}", which does not exist`);
      files.push(new SafetensorsFile(file));
    }
    for (const [name, shard] of Object.entries(weightMap)) {
      const file = files.find((f) => f.file === path.join(dir, shard))!;
      if (!file.entries.has(name)) {
        throw new ArtError("missing_tensor", `${file.file}: missing tensor "${name}" (listed in ${indexFile})`);
      }
    }
  } catch (error) {
    for (const file of files) file.close();
    throw error;
  }
  return new Store(files, indexFile);
}

export interface TensorToWrite {
  dtype: SafetensorsDType;
  shape: number[];
  data: Float32Array;
}

/** Writes tensors (converted from f32 to each one's dtype, round-to-nearest-even) as one .safetensors file. */
export function writeSafetensors(
  file: string,
  tensors: Record<string, TensorToWrite>,
  metadata?: Record<string, string>,
): void {
  const header: Record<string, unknown> = metadata ? { __metadata__: metadata } : {};
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const elements = t.shape.reduce((a, b) => a * b, 1);
    if (elements !== t.data.length) {
      throw new ArtError("wrong_shape", `${file}: tensor "${name}" has ${t.data.length} values for shape [${t.shape}]`);
    }
    const byteLength = elements * BYTES_PER_ELEMENT[t.dtype];
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + byteLength] };
    offset += byteLength;
  }
  // The data section starts 8-byte aligned: pad the header with spaces, as the reference writer does.
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const headerBytes = Buffer.from(json, "utf8");
  const lengthBytes = Buffer.alloc(8);
  lengthBytes.writeBigUInt64LE(BigInt(headerBytes.length));
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const fd = fs.openSync(file, "w");
  try {
    fs.writeSync(fd, lengthBytes);
    fs.writeSync(fd, headerBytes);
    for (const t of Object.values(tensors)) fs.writeSync(fd, encode(t));
  } finally {
    fs.closeSync(fd);
  }
}

function encode(t: TensorToWrite): Uint8Array {
  if (t.dtype === "F32") return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  const halves = new Uint16Array(t.data.length);
  if (t.dtype === "BF16") {
    for (let i = 0; i < t.data.length; i++) halves[i] = f32ToBf16(t.data[i]);
  } else {
    for (let i = 0; i < t.data.length; i++) halves[i] = f32ToF16(t.data[i]);
  }
  return new Uint8Array(halves.buffer);
}

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

export function f32ToBf16(value: number): number {
  f32Scratch[0] = value;
  const bits = u32Scratch[0];
  if ((bits & 0x7fffffff) > 0x7f800000) return (bits >>> 16) | 0x40; // NaN stays NaN
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

export function f16ToF32(half: number): number {
  const sign = half & 0x8000 ? -1 : 1;
  const exponent = (half >> 10) & 0x1f;
  const mantissa = half & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 31) return mantissa ? NaN : sign * Infinity;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

export function f32ToF16(value: number): number {
  f32Scratch[0] = value;
  const bits = u32Scratch[0];
  const sign = (bits >>> 16) & 0x8000;
  const exponent = (bits >>> 23) & 0xff;
  let mantissa = bits & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa ? 0x200 : 0);
  let e = exponent - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal half: shift the implicit-1 mantissa right, rounding to nearest even.
    if (e < -10) return sign;
    mantissa |= 0x800000;
    const shift = 14 - e;
    const halfway = 1 << (shift - 1);
    const rest = mantissa & ((1 << shift) - 1);
    let result = mantissa >>> shift;
    if (rest > halfway || (rest === halfway && (result & 1))) result++;
    return sign | result;
  }
  const rest = mantissa & 0x1fff;
  mantissa >>>= 13;
  if (rest > 0x1000 || (rest === 0x1000 && (mantissa & 1))) {
    mantissa++;
    if (mantissa === 0x400) {
      mantissa = 0;
      e++;
      if (e >= 31) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | mantissa;
}
