#!/usr/bin/env bash
# Builds .device/ (gitignored) with what a GPU-machine call needs beside the working tree:
#   .device/node.xz               the Node.js binary (the version this repo pins), via shared/tools/device-bundle.sh
#   .device/node_modules.tar.xz   koffi, vitest, the tokenizer packages, and their dependencies, and Qwen's tokenizer files
#                                 (scripts/cuda-device-modules.ts)
# and builds the kernels (lib/cuda/build/) and the package (dist/), both gitignored. Then one device call, carrying
# ".device", "lib/cuda/build" and "dist":
#   bash scripts/cuda-gpu-check.sh
# Usage (project root): bash scripts/cuda-device-bundle.sh
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
node=node_modules/.bin/node
tool=""
for candidate in "${ART_DEVICE_BUNDLE_TOOL:-}" ../shared/tools/device-bundle.sh ../../shared/tools/device-bundle.sh; do
  if [ -n "$candidate" ] && [ -f "$candidate" ]; then tool=$candidate; break; fi
done
[ -n "$tool" ] || { echo "shared/tools/device-bundle.sh not found; set ART_DEVICE_BUNDLE_TOOL" >&2; exit 1; }
NODE_VERSION=$($node -v | tr -d v) bash "$tool" >/dev/null
$node scripts/cuda-device-modules.ts > .device/node_modules.list
tar -cJf .device/node_modules.tar.xz --dereference -T .device/node_modules.list
$node scripts/cuda-build-kernels.ts > /dev/null
$node node_modules/typescript/bin/tsc -p tsconfig.build.json  # dist/: the notebooks import art-ts from it
du -sh .device/* lib/cuda/build dist
