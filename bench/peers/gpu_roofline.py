"""What the GPU can do, measured with PyTorch: device-to-device copy bandwidth (bytes read + written per second) and
bf16 matrix-product TFLOP/s (8192^3, random data). The ceilings the CUDA benches are compared against.
Usage: python3 bench/peers/gpu_roofline.py   (prints JSON)
"""
import json

import torch


def cuda_seconds(fn, repeats):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
target = torch.empty_like(source)
copy = cuda_seconds(lambda: target.copy_(source), 20)
n = 8192
a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
matmul = cuda_seconds(lambda: a @ b, 20)
print(json.dumps({
    "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
    "copyBandwidthGBps": round(2 * source.numel() / copy / 1e9),
    "bf16MatmulTflops": round(2 * n ** 3 / matmul / 1e12, 1),
    "command": "python3 bench/peers/gpu_roofline.py",
}, indent=2))
