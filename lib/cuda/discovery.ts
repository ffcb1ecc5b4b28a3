/**
 * Where the CUDA user-space libraries are. The driver (libcuda.so.1) comes with the NVIDIA driver and is opened by
 * soname only: a copy found elsewhere may not match the kernel module. cuBLASLt, cuBLAS and NVRTC are searched, in
 * this order, and the first hit wins:
 *   1. a file named by an environment variable (ART_CUBLASLT_PATH, ART_CUBLAS_PATH, ART_NVRTC_PATH,
 *      ART_NVRTC_BUILTINS_PATH), then the directories of ART_CUDA_LIB_DIR (colon-separated);
 *   2. Python NVIDIA wheels in site-packages: CUDA 13's `nvidia/cu13/lib`, CUDA 12's `nvidia/<package>/lib`;
 *   3. conda: $CONDA_PREFIX/lib;
 *   4. LD_LIBRARY_PATH, then the loader cache (`ldconfig -p`);
 *   5. CUDA toolkits: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-* (lib64, targets/<arch>/lib).
 * Within a directory, CUDA 13 sonames are preferred over CUDA 12. libnvrtc-builtins is taken from the directory
 * that holds libnvrtc (they must match) and is loaded first by absolute path.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { ArtError } from "../core/errors.ts";

export type CudaLibraryName = "cublasLt" | "cublas" | "nvrtc" | "nvrtcBuiltins";

interface LibrarySpec {
  /** File name stem: libcublas -> libcublas.so.13 */
  stem: string;
  envPath: string;
  /** Package directory of the CUDA 12 wheel layout (nvidia/<package>/lib). */
  wheelPackage: string;
  install: string;
}

const librarySpecs: Record<CudaLibraryName, LibrarySpec> = {
  cublasLt: { stem: "libcublasLt", envPath: "ART_CUBLASLT_PATH", wheelPackage: "cublas",
    install: "pip install nvidia-cublas (CUDA 13) or nvidia-cublas-cu12, or the CUDA toolkit" },
  cublas: { stem: "libcublas", envPath: "ART_CUBLAS_PATH", wheelPackage: "cublas",
    install: "pip install nvidia-cublas (CUDA 13) or nvidia-cublas-cu12, or the CUDA toolkit" },
  nvrtc: { stem: "libnvrtc", envPath: "ART_NVRTC_PATH", wheelPackage: "cuda_nvrtc",
    install: "pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12, or the CUDA toolkit" },
  nvrtcBuiltins: { stem: "libnvrtc-builtins", envPath: "ART_NVRTC_BUILTINS_PATH", wheelPackage: "cuda_nvrtc",
    install: "pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12, or the CUDA toolkit" },
};

/** CUDA major versions this package can use, most preferred first. */
export const supportedCudaMajors = [13, 12] as const;

/** Everything discovery looks at, gathered once; tests pass a fake one built over a temporary directory tree. */
export interface DiscoveryInputs {
  env: Record<string, string | undefined>;
  /** Python site-packages directories (from python3's `site`, plus common locations that exist). */
  sitePackages: string[];
  /** The loader cache: file name -> absolute path, in `ldconfig -p` order. */
  loaderCache: Array<{ name: string; path: string }>;
  /** CUDA toolkit roots in preference order. */
  toolkitRoots: string[];
}

export interface FoundLibrary {
  name: CudaLibraryName;
  path: string;
  /** Which rule found it (e.g. "ART_CUDA_LIB_DIR", "python wheel nvidia/cu13/lib"). */
  source: string;
}

/** One directory (or file) discovery considered, in order. */
interface Candidate {
  dir: string;
  source: string;
}

/** Finds `name`, or throws ArtError listing every place searched and what to install. */
export function findCudaLibrary(name: CudaLibraryName, inputs: DiscoveryInputs = systemDiscoveryInputs()): FoundLibrary {
  const found = tryFindCudaLibrary(name, inputs);
  if ("path" in found) return found;
  const spec = librarySpecs[name];
  throw new ArtError("cuda_library_missing",
    `${spec.stem}.so (CUDA ${supportedCudaMajors.join(" or ")}) not found. Looked in:\n` +
    found.searched.map((place) => `  - ${place}`).join("\n") +
    `\nInstall it (${spec.install}) or point ${spec.envPath} at the file or ART_CUDA_LIB_DIR at its directory.`);
}

/** Like findCudaLibrary, but returns the searched places instead of throwing. */
export function tryFindCudaLibrary(name: CudaLibraryName, inputs: DiscoveryInputs): FoundLibrary | { searched: string[] } {
  const spec = librarySpecs[name];
  const searched: string[] = [];
  const explicit = inputs.env[spec.envPath];
  if (explicit) {
    if (isFile(explicit)) return { name, path: explicit, source: spec.envPath };
    searched.push(`${spec.envPath}=${explicit} (no such file)`);
  }
  for (const candidate of candidateDirectories(spec, inputs)) {
    const file = bestLibraryInDirectory(candidate.dir, spec.stem);
    if (file) return { name, path: file, source: candidate.source };
    searched.push(`${candidate.dir} (${candidate.source})`);
  }
  const cached = bestFromLoaderCache(inputs.loaderCache, spec.stem);
  if (cached) return { name, path: cached, source: "loader cache (ldconfig -p)" };
  searched.push(`loader cache (ldconfig -p, ${inputs.loaderCache.length} entries)`);
  return { searched };
}

/**
 * NVRTC and its builtins from the same directory, the builtins first in load order. Null when NVRTC is not found
 * (it is only needed when the precompiled kernels are missing or stale).
 */
export function findNvrtc(inputs: DiscoveryInputs = systemDiscoveryInputs()):
  { nvrtc: FoundLibrary; builtins: FoundLibrary | null } | { searched: string[] } {
  const nvrtc = tryFindCudaLibrary("nvrtc", inputs);
  if (!("path" in nvrtc)) return nvrtc;
  const dir = nvrtc.path.slice(0, nvrtc.path.lastIndexOf("/"));
  const explicit = inputs.env[librarySpecs.nvrtcBuiltins.envPath];
  const builtinsPath = explicit && isFile(explicit) ? explicit : bestLibraryInDirectory(dir, librarySpecs.nvrtcBuiltins.stem);
  return {
    nvrtc,
    builtins: builtinsPath ? { name: "nvrtcBuiltins", path: builtinsPath, source: `beside ${nvrtc.path}` } : null,
  };
}

function candidateDirectories(spec: LibrarySpec, inputs: DiscoveryInputs): Candidate[] {
  const { env } = inputs;
  const out: Candidate[] = [];
  for (const dir of splitPath(env.ART_CUDA_LIB_DIR)) out.push({ dir, source: "ART_CUDA_LIB_DIR" });
  for (const site of inputs.sitePackages) {
    out.push({ dir: join(site, "nvidia", "cu13", "lib"), source: "python wheel nvidia/cu13/lib" });
    out.push({ dir: join(site, "nvidia", spec.wheelPackage, "lib"), source: `python wheel nvidia/${spec.wheelPackage}/lib` });
  }
  if (env.CONDA_PREFIX) out.push({ dir: join(env.CONDA_PREFIX, "lib"), source: "conda ($CONDA_PREFIX/lib)" });
  for (const dir of splitPath(env.LD_LIBRARY_PATH)) out.push({ dir, source: "LD_LIBRARY_PATH" });
  const arch = process.arch === "arm64" ? "sbsa-linux" : "x86_64-linux";
  for (const root of inputs.toolkitRoots) {
    out.push({ dir: join(root, "lib64"), source: `CUDA toolkit ${root}` });
    out.push({ dir: join(root, "targets", arch, "lib"), source: `CUDA toolkit ${root}` });
  }
  return out;
}

/** CUDA header directories that exist, in preference order: toolkits' include/, then the Python wheels' include/. */
export function cudaIncludeDirectories(inputs: DiscoveryInputs): string[] {
  const candidates = [
    ...inputs.toolkitRoots.map((root) => join(root, "include")),
    ...inputs.sitePackages.flatMap((site) =>
      ["cu13", "cuda_runtime", "cuda_nvrtc", "cublas"].map((pkg) => join(site, "nvidia", pkg, "include"))),
  ];
  return candidates.filter(isDirectory);
}

/** The preferred versioned file for `stem` in `dir`: libX.so.13* over libX.so.12*, then an unversioned libX.so. */
export function bestLibraryInDirectory(dir: string, stem: string): string | null {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return null;
  }
  const choice = pickLibraryFile(names, stem);
  return choice ? join(dir, choice) : null;
}

function pickLibraryFile(names: string[], stem: string): string | null {
  for (const major of supportedCudaMajors) {
    // Shortest name first: libcublas.so.13 (the soname link) before libcublas.so.13.0.2.14.
    const matches = names.filter((n) => n === `${stem}.so.${major}` || n.startsWith(`${stem}.so.${major}.`))
      .sort((a, b) => a.length - b.length || a.localeCompare(b));
    if (matches.length > 0) return matches[0];
  }
  return names.includes(`${stem}.so`) ? `${stem}.so` : null;
}

function bestFromLoaderCache(cache: DiscoveryInputs["loaderCache"], stem: string): string | null {
  const choice = pickLibraryFile(cache.map((entry) => entry.name), stem);
  return choice ? cache.find((entry) => entry.name === choice)!.path : null;
}

function splitPath(value: string | undefined): string[] {
  return (value ?? "").split(":").filter((part) => part.length > 0);
}

function isFile(path: string): boolean {
  try {
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

// ---- the real system's inputs -----------------------------------------------------------------------------------

/** Discovery inputs of this machine: environment, python3's site-packages, the loader cache, CUDA toolkit roots. */
export function systemDiscoveryInputs(env: Record<string, string | undefined> = process.env): DiscoveryInputs {
  return {
    env,
    sitePackages: unique([...pythonSitePackages(env), ...commonSitePackages(env)]).filter(isDirectory),
    loaderCache: parseLdconfig(runQuietly("ldconfig", ["-p"]) ?? runQuietly("/sbin/ldconfig", ["-p"]) ?? ""),
    toolkitRoots: unique([env.CUDA_HOME, env.CUDA_PATH, "/usr/local/cuda", ...globDirs("/usr/local", /^cuda-\d/).reverse()]
      .filter((d): d is string => !!d)).filter(isDirectory),
  };
}

/** Parses the 64-bit entries of `ldconfig -p`, lines like "\tlibcublas.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcublas.so.12". */
export function parseLdconfig(text: string): Array<{ name: string; path: string }> {
  const out: Array<{ name: string; path: string }> = [];
  for (const line of text.split("\n")) {
    const match = /^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$/.exec(line);
    if (match && /x86-64|AArch64/.test(match[2])) out.push({ name: match[1], path: match[3] });
  }
  return out;
}

function pythonSitePackages(env: Record<string, string | undefined>): string[] {
  const script = "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))";
  for (const python of unique([env.ART_PYTHON, "python3", "python"].filter((p): p is string => !!p))) {
    const text = runQuietly(python, ["-c", script]);
    if (text !== null) return text.split("\n").map((line) => line.trim()).filter((line) => line.length > 0);
  }
  return [];
}

function commonSitePackages(env: Record<string, string | undefined>): string[] {
  const prefixes = [env.VIRTUAL_ENV, env.CONDA_PREFIX, join(homedir(), ".local"), "/usr/local", "/usr", "/opt/conda"]
    .filter((p): p is string => !!p);
  const out: string[] = [];
  for (const prefix of prefixes) {
    for (const python of globDirs(join(prefix, "lib"), /^python3(\.\d+)?$/)) {
      out.push(join(python, "site-packages"), join(python, "dist-packages"));
    }
  }
  out.push("/usr/lib/python3/dist-packages");
  return out;
}

function globDirs(dir: string, pattern: RegExp): string[] {
  try {
    return readdirSync(dir).filter((name) => pattern.test(name)).sort().map((name) => join(dir, name));
  } catch {
    return [];
  }
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

function unique<T>(items: T[]): T[] {
  return [...new Set(items)];
}

function runQuietly(command: string, args: string[]): string | null {
  try {
    return execFileSync(command, args, { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"], timeout: 10_000 });
  } catch {
    return null;
  }
}

