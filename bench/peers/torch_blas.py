"""Which BLAS this PyTorch multiplies with, for the CPU benches' reports: the BLAS/LAPACK libraries mapped into the
process after a product (Debian's torch links libblas.so.3, which the alternatives system points at the reference
BLAS or at OpenBLAS), the kernels an OpenBLAS chose (as art-ts's side reports them), and torch's thread count."""
import ctypes

import torch


def openblas_core(paths):
    for path in paths:
        if "openblas" in path:
            library = ctypes.CDLL(path)  # already mapped: the same copy torch multiplies with
            library.openblas_get_corename.restype = ctypes.c_char_p
            return library.openblas_get_corename().decode()
    return None


def blas_report():
    torch.ones(64, 64) @ torch.ones(64, 64)
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "blas" in line.lower() or "mkl" in line.lower()}
    blas = sorted(p for p in paths if p.startswith("/"))
    return {"blas": blas, "openblasCore": openblas_core(blas), "threads": torch.get_num_threads(),
            "torch": torch.__version__}
