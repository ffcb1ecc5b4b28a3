"""Which BLAS this PyTorch multiplies with, for the CPU benches' reports: the BLAS/LAPACK libraries mapped into the
process after a product (Debian's torch links libblas.so.3, which the alternatives system points at the reference
BLAS or at OpenBLAS), and torch's thread count."""
import torch


def blas_report():
    torch.ones(64, 64) @ torch.ones(64, 64)
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "blas" in line.lower() or "mkl" in line.lower()}
    return {"blas": sorted(p for p in paths if p.startswith("/")), "threads": torch.get_num_threads(),
            "torch": torch.__version__}
