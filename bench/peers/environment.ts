/**
 * The Python that runs the PyTorch peers: ART_PEER_PYTHON, else Debian's /usr/bin/python3 (python3-torch on the
 * system OpenBLAS). A pip torch (MKL or oneDNN, as users install it) is the other peer worth measuring: the GPU
 * check names its python3 here.
 */
export function peerPython(): string {
  return process.env.ART_PEER_PYTHON ?? "/usr/bin/python3";
}

/**
 * The environment a PyTorch peer runs in with `threads` threads. torch.set_num_threads sets torch's own (OpenMP)
 * pool only: the BLAS it calls keeps its own threads, all cores by default, so a "1 thread" torch multiplies on every
 * core (measured: 194 GFLOP/s for one 256 × 384 × 1536 linear on 2 cores, 96 with OPENBLAS_NUM_THREADS=1). The
 * BLAS libraries' variables pin them to the same count.
 */
export function peerEnvironment(threads: number): NodeJS.ProcessEnv {
  const count = String(threads);
  return { ...process.env, OMP_NUM_THREADS: count, OPENBLAS_NUM_THREADS: count, MKL_NUM_THREADS: count, BLIS_NUM_THREADS: count };
}

/**
 * The OpenBLAS settings both sides of a CPU bench inherit: OPENBLAS_CORETYPE pins its kernels (some machines, this
 * project's among them, pin older ones for older OpenBLAS builds), so a report says which were set; `null` is unset.
 */
export function openblasPins(): { OPENBLAS_CORETYPE: string | null; OPENBLAS_L2_SIZE: string | null } {
  return { OPENBLAS_CORETYPE: process.env.OPENBLAS_CORETYPE ?? null, OPENBLAS_L2_SIZE: process.env.OPENBLAS_L2_SIZE ?? null };
}
