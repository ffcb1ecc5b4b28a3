/**
 * The kernels' sources and how they become GPU code. Each `kernels/<module>.cu` compiles to one fatbin (SASS for
 * sm_80/86/89/90 plus compute_90 PTX that newer GPUs JIT) in `lib/cuda/build/`, beside a manifest holding a hash of
 * every source file and the flags. At run time the fatbins are used only when that hash matches the sources;
 * otherwise the backend compiles for the device at hand with NVRTC, or with nvcc into a per-hash cache directory.
 */
import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { ArtError } from "../core/errors.ts";
import type { KernelArg, KernelArgType } from "./kernel-args.ts";

/**
 * The kernel modules (file stems under kernels/), and in each the extern "C" kernels the backend launches with
 * their parameter types in order. The compile test checks this table against the PTX nvcc emits, and every launch
 * is checked against it, so a kernel signature and its launches cannot drift apart.
 */
const ptr = "ptr", i32 = "i32", f32 = "f32", i64 = "i64";
const attentionParameters = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr] as const;
const prefillParameters = [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32] as const;
const packedDqParameters = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32] as const;
const packedAttentionKernels = Object.fromEntries([16, 32, 64, 128].flatMap((hd) => [
  [`packed_attention_forward_hd${hd}`, [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32]],
  [`packed_attention_backward_dq_hd${hd}`, packedDqParameters],
  [`packed_attention_backward_dkdv_hd${hd}`, [ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32]],
]).concat([["packed_attention_backward_dq_hd128_two_buffers", packedDqParameters],
  ["packed_attention_group_sum", [ptr, ptr, ptr, ptr, i64, i32, i32, i32]]])) as Record<string, readonly KernelArgType[]>;
export const kernelModules = {
  convert: { f32_to_bf16: [ptr, ptr, i64, ptr, ptr, i64, ptr, ptr, i64, ptr, ptr, i64], bf16_to_f32: [ptr, ptr, i64] },
  elementwise: {
    embedding_f32: [ptr, ptr, ptr, i32], embedding_bf16: [ptr, ptr, ptr, i32],
    add_bias_f32: [ptr, ptr, i64, i32], add_bias_bf16: [ptr, ptr, i64, i32],
    add: [ptr, ptr, ptr, i64], swiglu: [ptr, ptr, ptr, i32, i64], gather_rows: [ptr, ptr, ptr, ptr, ptr, i32],
    swiglu_lora_f32: [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, f32, f32, i32, i32], swiglu_lora_bf16: [ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, f32, f32, i32, i32],
    swiglu_backward: [ptr, ptr, ptr, ptr, ptr, i32, i32, i64], gather_rows_backward: [ptr, ptr, ptr, i32],
    swiglu_kept_lora: [ptr, ptr, ptr, i32, i32, ptr, ptr, i32, ptr, ptr, f32, f32, i32],
    swiglu_backward_kept_lora: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, ptr, ptr, i32, ptr, ptr, f32, f32, i32],
    split_columns: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i64], merge_columns_bf16: [ptr, ptr, ptr, ptr, i32, i32, i32, i64],
    column_sums_partial: [ptr, ptr, ptr, ptr, i32, i32, i32], column_sums_add: [ptr, ptr, i32, i32],
    embedding_backward: [ptr, ptr, ptr, i32, i32],
  },
  rmsnorm: {
    rmsnorm_f32: [ptr, ptr, f32, ptr, ptr, ptr, i32], rmsnorm_bf16: [ptr, ptr, f32, ptr, ptr, ptr, i32],
    add_rmsnorm_f32: [ptr, ptr, ptr, ptr, f32, ptr, ptr, ptr, i32], add_rmsnorm_bf16: [ptr, ptr, ptr, ptr, f32, ptr, ptr, ptr, i32],
    ...Object.fromEntries(["f32_f32", "f32_bf16", "bf16_f32", "bf16_bf16"].map((types) =>
      [`add_rmsnorm_lora_${types}`, [ptr, ptr, ptr, ptr, f32, ptr, ptr, ptr, i32, ptr, ptr, ptr, f32, i32, i32]])),
    rmsnorm_backward_f32: [ptr, ptr, ptr, ptr, ptr, ptr, i32], rmsnorm_backward_bf16: [ptr, ptr, ptr, ptr, ptr, ptr, i32],
  },
  rope: {
    rope_f32: [ptr, ptr, ptr, ptr, i32, i32, i32, f32], rope_bf16: [ptr, ptr, ptr, ptr, i32, i32, i32, f32],
    ...Object.fromEntries(["split_rope_f32", "split_rope_bf16", "split_rope_to_bf16_f32", "split_rope_to_bf16_bf16"].map((name) =>
      [name, [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32]])),
    ...Object.fromEntries(["f32_f32", "f32_bf16", "bf16_f32", "bf16_bf16"].map((types) => [`split_rope_lora_${types}`,
      [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, f32, f32, f32, i32, i32]])),
  },
  attention: {
    kv_write: [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32],
    kv_copy_slot: [ptr, i32, i32, i32, i32, i32, i32, i32, i32],
    attention_dpl1: attentionParameters, attention_dpl2: attentionParameters, attention_dpl3: attentionParameters,
    attention_dpl4: attentionParameters, attention_dpl8: attentionParameters,
    attention_prefill_hd16: prefillParameters, attention_prefill_hd32: prefillParameters, attention_prefill_hd64: prefillParameters,
    attention_prefill_hd128: prefillParameters,
  },
  packed_attention: packedAttentionKernels,
  sampling: {
    log_softmax: [ptr, ptr, i32],
    sample: [ptr, i32, ptr, ptr, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr],
  },
  logprobs: {
    logprob_block_stats: [ptr, i32, i32, ptr, ptr],
    logprob_block_grad: [ptr, ptr, i32, i32, ptr, ptr, ptr],
  },
  lora: {
    lora_down_f32: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32], lora_down_bf16: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32],
    lora_up_f32: [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, f32, f32, f32, i32, i32],
    lora_up_bf16: [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, f32, f32, f32, i32, i32],
    lora_fused_f32: [ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, f32, f32, f32, i32, i32, i32],
    lora_fused_bf16: [ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i32, i32, f32, f32, f32, i32, i32, i32],
  },
  adamw: {
    zero_tensors: [ptr, i32],
    sum_squares: [ptr, i32, ptr],
    adamw_update: [ptr, i32, f32, f32, f32, f32, f32, f32, f32, f32],
  },
} as const satisfies Record<string, Record<string, readonly KernelArgType[]>>;
export type KernelModuleName = keyof typeof kernelModules;
type KernelsOf<M extends KernelModuleName> = keyof (typeof kernelModules)[M] & string;
export type KernelName = { [M in KernelModuleName]: KernelsOf<M> }[KernelModuleName];

/** Every kernel's parameter types, by name. */
export const kernelParameters: Record<KernelName, readonly KernelArgType[]> = Object.assign({}, ...Object.values(kernelModules));

/** Throws ArtError when `args` do not match the kernel's parameters (count and type), before anything launches. */
export function checkKernelArgs(name: KernelName, args: readonly KernelArg[]): void {
  const expected = kernelParameters[name];
  const actual = args.map(([type]) => type);
  if (actual.length !== expected.length || actual.some((type, i) => type !== expected[i])) {
    throw new ArtError("cuda_launch", `${name} takes (${expected.join(", ")}) but was launched with (${actual.join(", ")})`);
  }
}

/** Compute capabilities that get SASS in the prebuilt fatbin; PTX of the last one covers newer GPUs. */
export const prebuiltArchitectures = [80, 86, 89, 90] as const;
const commonFlags = ["-O3", "-std=c++17"];

export function kernelSourceDirectory(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  // Sources run from lib/cuda; the compiled package runs from dist/lib/cuda and ships lib/ beside dist/.
  for (const dir of [join(here, "kernels"), join(here, "..", "..", "..", "lib", "cuda", "kernels")]) {
    if (existsSync(join(dir, "common.cuh"))) return dir;
  }
  throw new ArtError("cuda_kernels_missing", `CUDA kernel sources not found beside ${here}: reinstall art-ts (lib/cuda/kernels/ must ship)`);
}

export function kernelBuildDirectory(): string {
  return join(kernelSourceDirectory(), "..", "build");
}

/** sha256 over every kernel source (name + bytes) and the compile flags: changes whenever the fatbins are stale. */
export function kernelSourceHash(sourceDir: string = kernelSourceDirectory()): string {
  const hash = createHash("sha256");
  hash.update(JSON.stringify({ flags: commonFlags, architectures: prebuiltArchitectures }));
  for (const name of readdirSync(sourceDir).filter((n) => n.endsWith(".cu") || n.endsWith(".cuh")).sort()) {
    hash.update(`\0${name}\0`);
    hash.update(readFileSync(join(sourceDir, name)));
  }
  return hash.digest("hex");
}

export interface KernelManifest {
  sourceHash: string;
  architectures: number[];
  modules: Record<string, string>;
}

/** nvcc arguments for one module. `architectures` null = the prebuilt set (fatbin); a number = cubin for that sm. */
export function nvccArguments(source: string, output: string, target: "fatbin" | { cubin: number }): string[] {
  const includeDir = dirname(source);
  if (target === "fatbin") {
    const gencode = prebuiltArchitectures.flatMap((sm) => ["-gencode", `arch=compute_${sm},code=sm_${sm}`]);
    const last = prebuiltArchitectures[prebuiltArchitectures.length - 1];
    return [...commonFlags, "-I", includeDir, "-fatbin", ...gencode, "-gencode", `arch=compute_${last},code=compute_${last}`,
      "-o", output, source];
  }
  return [...commonFlags, "-I", includeDir, "-cubin", `-arch=sm_${target.cubin}`, "-o", output, source];
}

/** nvcc from $ART_NVCC, $CUDA_HOME/bin, /usr/local/cuda/bin, or PATH; null when there is none. */
export function findNvcc(env: Record<string, string | undefined> = process.env): string | null {
  const candidates = [env.ART_NVCC, env.CUDA_HOME && join(env.CUDA_HOME, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc",
    ...(env.PATH ?? "").split(":").filter((d) => d).map((d) => join(d, "nvcc"))];
  return candidates.find((c): c is string => !!c && existsSync(c)) ?? null;
}

const run = promisify(execFile);

function nvccFailure(source: string, error: unknown): ArtError {
  const detail = (error as { stderr?: string }).stderr || (error as Error).message;
  return new ArtError("cuda_compile", `nvcc failed on ${source}:\n${detail}`, { cause: error });
}

/** Compiles one module with nvcc; rejects with ArtError carrying nvcc's diagnostics. */
export async function compileWithNvcc(nvcc: string, module: string, output: string, target: "fatbin" | { cubin: number },
                                      sourceDir: string = kernelSourceDirectory()): Promise<void> {
  const source = join(sourceDir, `${module}.cu`);
  try {
    await run(nvcc, nvccArguments(source, output, target), { maxBuffer: 16 << 20 });
  } catch (error) {
    throw nvccFailure(source, error);
  }
}

/** The run-time fallback: cubins for one device architecture, compiled once per source hash into the cache. */
export function cachedNvccCubins(nvcc: string, sm: number, sourceDir: string = kernelSourceDirectory()): Record<KernelModuleName, Uint8Array> {
  const dir = kernelCacheDirectory(kernelSourceHash(sourceDir), sm);
  mkdirSync(dir, { recursive: true });
  const images = {} as Record<KernelModuleName, Uint8Array>;
  for (const module of Object.keys(kernelModules) as KernelModuleName[]) {
    const file = join(dir, `${module}.cubin`);
    if (!existsSync(file)) {
      const source = join(sourceDir, `${module}.cu`);
      try {
        execFileSync(nvcc, nvccArguments(source, `${file}.tmp`, { cubin: sm }), { stdio: ["ignore", "ignore", "pipe"] });
      } catch (error) {
        throw nvccFailure(source, error);
      }
      renameSync(`${file}.tmp`, file);
    }
    images[module] = readFileSync(file);
  }
  return images;
}

/**
 * Builds every module's fatbin into `buildDir` (all in parallel) and writes the manifest last, so an interrupted
 * build never looks current.
 */
export async function buildKernels(nvcc: string, buildDir: string = kernelBuildDirectory(),
                                   sourceDir: string = kernelSourceDirectory()): Promise<KernelManifest> {
  mkdirSync(buildDir, { recursive: true });
  const sourceHash = kernelSourceHash(sourceDir);
  const modules: Record<string, string> = {};
  await Promise.all(Object.keys(kernelModules).map(async (module) => {
    const file = `${module}.fatbin`;
    await compileWithNvcc(nvcc, module, join(buildDir, `${file}.tmp`), "fatbin", sourceDir);
    renameSync(join(buildDir, `${file}.tmp`), join(buildDir, file));
    modules[module] = file;
  }));
  const manifest: KernelManifest = { sourceHash, architectures: [...prebuiltArchitectures], modules };
  writeFileSync(join(buildDir, "manifest.json"), `${JSON.stringify(manifest, null, 2)}\n`);
  return manifest;
}

/** The prebuilt fatbins when present and built from the current sources; otherwise why not. */
export function readPrebuiltKernels(buildDir: string = kernelBuildDirectory(), sourceDir: string = kernelSourceDirectory()):
  { images: Record<KernelModuleName, Uint8Array> } | { stale: string } {
  const manifestFile = join(buildDir, "manifest.json");
  if (!existsSync(manifestFile)) return { stale: `no prebuilt kernels (${manifestFile} missing)` };
  let manifest: KernelManifest;
  try {
    manifest = JSON.parse(readFileSync(manifestFile, "utf8")) as KernelManifest;
  } catch {
    return { stale: `${manifestFile} is not valid JSON` };
  }
  if (manifest.sourceHash !== kernelSourceHash(sourceDir)) {
    return { stale: `prebuilt kernels in ${buildDir} are stale (sources changed since the build)` };
  }
  const images = {} as Record<KernelModuleName, Uint8Array>;
  for (const module of Object.keys(kernelModules) as KernelModuleName[]) {
    const file = manifest.modules[module] && join(buildDir, manifest.modules[module]);
    if (!file || !existsSync(file)) return { stale: `prebuilt kernel ${module} missing from ${buildDir}` };
    images[module] = readFileSync(file);
  }
  return { images };
}

/** Where the nvcc fallback caches cubins for one device architecture and source hash. */
export function kernelCacheDirectory(sourceHash: string, sm: number, env: Record<string, string | undefined> = process.env): string {
  const base = env.ART_CUDA_CACHE_DIR ?? join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "art-ts", "cuda");
  return join(base, `${sourceHash.slice(0, 16)}-sm${sm}`);
}

/** Every module's source and every header (.cuh) by name, for NVRTC (which gets the headers by name). */
export function kernelSources(sourceDir: string = kernelSourceDirectory()): { headers: Record<string, string>; modules: Record<KernelModuleName, string> } {
  const modules = {} as Record<KernelModuleName, string>;
  for (const module of Object.keys(kernelModules) as KernelModuleName[]) {
    modules[module] = readFileSync(join(sourceDir, `${module}.cu`), "utf8");
  }
  const headers = Object.fromEntries(readdirSync(sourceDir).filter((name) => name.endsWith(".cuh")).sort()
    .map((name) => [name, readFileSync(join(sourceDir, name), "utf8")]));
  return { headers, modules };
}
