#!/usr/bin/env bash
# Everything the CUDA path must prove on a GPU machine, in one device call; results under $OUT (at most 8 files):
#   env.txt        GPU, driver, toolkit, Python packages, where cuBLAS/NVRTC live, the kernel build log
#   tests.txt      ART_TEST_GPU=1 vitest of test/cuda (parity with the CPU backend, tiny checkpoints, greedy
#                  generation, logits vs transformers at the Qwen2.5-0.5B shape, the LoRA training ops and whole
#                  training pass vs the CPU trainer), kernels from the prebuilt fatbin
#   fallback.txt   the same parity tests with kernels compiled at run time by NVRTC (ART_CUDA_KERNELS=nvrtc)
#   hf.json        the transformers peer (bench/peers/hf_generate.py)
#   bench.json     bench/cuda-decode.ts with the peer's numbers beside ours and the roofline fraction
#   summary.json   exit status and seconds of each step
#   log.txt        every step's stderr
# Prepare here first: bash scripts/cuda-device-bundle.sh; then run on the device, carrying ".device" and
# "lib/cuda/build":  bash scripts/cuda-gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
if [ -f .device/node.xz ]; then
  mkdir -p /tmp/nb && xz -dc .device/node.xz > /tmp/nb/node && chmod +x /tmp/nb/node && export PATH=/tmp/nb:$PATH
fi
[ -d node_modules/vitest ] || tar -xJf .device/node_modules.tar.xz
# One device command may run 10 minutes: every step's limit is cut to what is left of ART_GPU_CHECK_SECONDS.
# ART_GPU_CHECK_STEPS picks steps (to split the work over two calls).
deadline=$((SECONDS + ${ART_GPU_CHECK_SECONDS:-570}))
steps=" ${ART_GPU_CHECK_STEPS:-build hf_reference tests nvrtc_fallback hf_peer bench} "
summary=()
step() {  # step <name> <seconds limit> <stdout file> <command...>   (stderr goes to log.txt)
  local name=$1 limit=$2 file=$3; shift 3
  [[ $steps == *" $name "* ]] || return 0
  local left=$((deadline - SECONDS))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then summary+=("\"$name\": {\"status\": \"skipped: out of time\"}"); return 0; fi
  local started=$SECONDS
  echo "== $name ($*)" >> "$OUT/log.txt"
  timeout "$limit" "$@" >> "$OUT/$file" 2>> "$OUT/log.txt"
  local status=$?
  summary+=("\"$name\": {\"status\": $status, \"seconds\": $((SECONDS - started)), \"limit\": $limit}")
}

{
  nvidia-smi; echo; command -v nvcc && nvcc --version; node -v
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "cuBLAS / NVRTC found on disk:"
  find / -xdev \( -name 'libcublas*.so*' -o -name 'libnvrtc*.so*' \) 2>/dev/null | head -40
} > "$OUT/env.txt" 2>&1
step build 90 env.txt node scripts/cuda-build-kernels.ts
step hf_reference 120 log.txt python3 scripts/cuda-hf-logits.py /tmp/art-hf-reference
# vitest reports on stdout and stderr: both into the file.
step tests 200 tests.txt bash -c 'ART_TEST_GPU=1 ART_HF_REFERENCE=/tmp/art-hf-reference node node_modules/vitest/vitest.mjs run test/cuda test/trainable/cuda.test.ts --reporter=verbose 2>&1'
step nvrtc_fallback 120 fallback.txt bash -c 'ART_TEST_GPU=1 ART_CUDA_KERNELS=nvrtc node node_modules/vitest/vitest.mjs run test/cuda/parity.test.ts test/cuda/training-parity.test.ts --reporter=verbose 2>&1'
step hf_peer 150 hf.json python3 bench/peers/hf_generate.py
if python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/hf.json" 2>/dev/null; then
  step bench 150 bench.json node bench/cuda-decode.ts --peer "$OUT/hf.json"
else
  step bench 150 bench.json node bench/cuda-decode.ts
fi
(IFS=,; echo "{${summary[*]}}") > "$OUT/summary.json"
cat "$OUT/summary.json"
