#!/usr/bin/env bash
# Everything the CUDA path must prove on a GPU machine, in one device call; results under $OUT:
#   env.txt        GPU, driver, toolkit, Node, Python packages, where art-ts finds cuBLAS/NVRTC, the kernel build log
#   tests.txt      ART_TEST_GPU=1 vitest of test/cuda (less the emulator's suites, which CI runs): the ABI check against the machine's headers and libraries,
#                  parity with the CPU backend, tiny checkpoints, greedy generation, the LoRA training ops and whole
#                  training pass vs the CPU trainer (and TrainableModel on CUDA), and (when the transformers
#                  reference could be written) logits vs transformers; kernels from the prebuilt fatbin
#   fallback.txt   the parity suite with kernels compiled at run time by NVRTC (ART_CUDA_KERNELS=nvrtc)
#   sanitizer.txt  the parity suites under compute-sanitizer's memcheck, racecheck and synccheck: out-of-bounds and
#                  misaligned accesses, shared-memory races and barrier misuse (the CPU emulator cannot see the races
#                  within a stretch between two barriers)
#   hf-fixtures.tar.gz  test/fixtures/hf as scripts/reference/hf_fixtures.py wrote it (transformers + PEFT)
#   demo.txt       art-ts demo --device cuda: the tic-tac-toe GRPO demo trained on the GPU, its win rates before and after
#   demo-cpu.txt   the same demo, same seed, on the machine's CPU, to compare with (results.tar: demo-cpu/)
#   notebooks.txt  the cookbook's notebooks on CUDA (but art-e-langgraph and mcp-rl) with a random-weight Qwen2.5-0.5B-shaped
#                  checkpoint behind Qwen's tokenizer, each notebook's code cells run as one Node module (the machine
#                  has no Jupyter; scripts/notebook-run.ts --kernel node), their printed output in results.tar
#   results.tar    demo/: the demo's summary.json, reward curve, transcripts, history.jsonl (under demo/art/);
#                  notebooks/: each notebook's output on CUDA;
#                  bench/: roofline.json (bench/peers/gpu_roofline.py), hf.json (bench/peers/hf_generate.py),
#                  decode.json (bench/cuda-decode.ts: decode and prefill, the peer's numbers beside ours when hf.json
#                  is valid), hf-train.json (bench/peers/hf_train_step.py), train.json (bench/cuda-train.ts: the
#                  LoRA step at Qwen2.5 0.5B-7B shapes, 8 x 1024 and 2 x 4096 tokens, beside the peer, with MFU
#                  against roofline.json's GEMM ceiling and where the GPU time goes), hf-grpo.json
#                  (bench/peers/hf_grpo_step.py), serve-mix.json (bench/serve-mix.ts: the batcher under random
#                  arrivals at the 0.5B shape), grpo.json (bench/grpo-step.ts: whole GRPO steps, rollouts through
#                  the in-process server and train(), at Qwen2.5 0.5B, 1.5B and 7B shapes, beside the peer),
#                  chat-tokenize.json (bench/chat-tokenize.ts: those steps' chat requests tokenized on this CPU),
#                  memory.json (the same bench's "memory" workload at the 7B and 14B shapes: 32 rollouts of 4k
#                  tokens and their LoRA step on one GPU, peak memory), cpu-engine.json and train-cpu.json (the CPU
#                  engine on the machine's cores beside its pip torch)
#   summary.json   every step with its status ("ok", "failed (exit N)", "timed out after N s", "skipped: why",
#                  "running", "pending"), rewritten after each step, so a call cut short still leaves valid JSON
#   log.txt        every step's command and stderr
# Prepare here first: bash scripts/cuda-device-bundle.sh (it builds dist/ too); then run on the device, carrying
# ".device", "lib/cuda/build" and "dist":  bash scripts/cuda-gpu-check.sh
# All steps take longer than one device call (600 s): they run in order of what a call cut short should still have
# shown (correctness, benches, the demo, the sanitizer, the rest); steps that no longer fit are "skipped: out of time";
# run them in the next calls, e.g. ART_GPU_CHECK_STEPS="sanitizer nvrtc_fallback", then "roofline hf_peer bench".
# The GRPO step bench and its peer (grpo_peer, grpo_bench) take a call of their own at every shape (550 s), so they
# come last; at the 0.5B shape alone (ART_GPU_CHECK_GRPO_SHAPES=qwen2.5-0.5b) about 200 s. A session's device time
# (15 minutes, start-up included) fits one full call: docs/cuda.md ("Not yet run on a GPU") names the steps to pick.
# ART_GPU_CHECK_STEPS picks steps (default: all, in the order below); ART_GPU_CHECK_SECONDS is the whole budget
# (default 570, under the device command's 600 s); every step's limit is cut to what is left of it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT/results/bench"
: >> "$OUT/log.txt"
# Ordered by what a call cut short should still have shown: correctness, then the benches, then the rest.
all_steps="env build hf_reference tests roofline hf_peer bench serve_mix serve_batch hf_train_peer train_bench demo demo_cpu notebooks sanitizer nvrtc_fallback hf_fixtures grpo_peer grpo_bench memory cpu_benches"
selected=" ${ART_GPU_CHECK_STEPS:-$all_steps} "
deadline=$((SECONDS + ${ART_GPU_CHECK_SECONDS:-570}))
declare -A status

write_summary() {
  local entries=() name
  for name in $all_steps; do
    local state="skipped: not selected"
    [[ $selected == *" $name "* ]] && state="pending"  # not reached (yet)
    entries+=("\"$name\": {\"status\": \"${status[$name]:-$state}\"}")
  done
  (IFS=,; echo "{${entries[*]}}") > "$OUT/summary.json"
}

skip() {  # skip <name> <reason>: record a selected step that cannot run
  [[ $selected == *" $1 "* ]] && status[$1]="skipped: $2"
  write_summary
}

step() {  # step <name> <seconds limit> <stdout file> <command...>   (stderr goes to log.txt)
  local name=$1 limit=$2 file=$3; shift 3
  [[ $selected == *" $name "* ]] || return 0
  local left=$((deadline - SECONDS))
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then skip "$name" "out of time"; return 0; fi
  status[$name]="running"
  write_summary
  local started=$SECONDS
  echo "== $name (limit ${limit}s): $*" >> "$OUT/log.txt"
  timeout --kill-after=10 "$limit" "$@" >> "$OUT/$file" 2>> "$OUT/log.txt"
  local code=$?
  case $code in
    0) status[$name]="ok" ;;
    124|137) status[$name]="timed out after ${limit} s" ;;
    *) status[$name]="failed (exit $code)" ;;
  esac
  status[$name]+=", $((SECONDS - started)) s"
  write_summary
}

write_summary
# The device machine may have no Node (or one too old to run .ts files) and no node_modules: the bundle carries both.
if ! node -e "process.exit(process.features.typescript ? 0 : 1)" 2> /dev/null && [ -f .device/node.xz ]; then
  mkdir -p /tmp/nb && xz -dc .device/node.xz > /tmp/nb/node && chmod +x /tmp/nb/node && export PATH=/tmp/nb:$PATH
fi
if [ ! -d node_modules/vitest ] && [ -f .device/node_modules.tar.xz ]; then tar -xJf .device/node_modules.tar.xz; fi
node -e "process.exit(process.features.typescript ? 0 : 1)" 2> /dev/null ||
  echo "no Node >= 22.18 on PATH and no .device/node.xz: run scripts/cuda-device-bundle.sh here and carry .device" >> "$OUT/log.txt"

step env 60 env.txt bash -c '
  timeout 20 nvidia-smi; echo; timeout 10 nvcc --version; echo "node $(node -v)"
  timeout 30 python3 -c "import torch, transformers; print(\"torch\", torch.__version__, \"transformers\", transformers.__version__)"
  echo "where art-ts finds the CUDA libraries:"
  timeout 30 node --input-type=module -e "
    const d = await import(\"./lib/cuda/discovery.ts\");
    const inputs = d.systemDiscoveryInputs();
    for (const name of [\"cublasLt\", \"cublas\", \"nvrtc\"]) console.log(name, JSON.stringify(d.tryFindCudaLibrary(name, inputs)));
    console.log(\"include directories\", JSON.stringify(d.cudaIncludeDirectories(inputs)));"'
step build 120 env.txt node scripts/cuda-build-kernels.ts
step hf_reference 120 log.txt python3 scripts/cuda-hf-logits.py /tmp/art-hf-reference
# hf-parity runs only when the reference was written (transformers may be missing); vitest reports on both streams.
reference=""
[[ ${status[hf_reference]:-} == ok* ]] && reference="ART_HF_REFERENCE=/tmp/art-hf-reference"
step tests 200 tests.txt bash -c "ART_TEST_GPU=1 $reference node node_modules/vitest/vitest.mjs run test/cuda test/trainable/cuda.test.ts --exclude '**/*emulat*' --reporter=verbose 2>&1"
step roofline 60 results/bench/roofline.json python3 bench/peers/gpu_roofline.py
step hf_peer 240 results/bench/hf.json python3 bench/peers/hf_generate.py
peer=""
[[ ${status[hf_peer]:-} == ok* ]] && peer="--peer $OUT/results/bench/hf.json"
step bench 150 results/bench/decode.json node bench/cuda-decode.ts $peer
# The batcher under requests arriving and leaving at random (Poisson, random prompt and completion lengths, streamed):
# how busy it keeps the GPU, time to first token, tokens/s (bench/serve-mix.ts).
step serve_mix 120 results/bench/serve-mix.json node bench/serve-mix.ts --shape qwen2.5-0.5b
# The bench step's batch-64 decode (128-token prompts, 128 tokens each) through the batcher, the server and the openai
# client, answers whole as rollouts ask: what serving adds to decode() (its tokens/s beside decode.json's batch 64).
step serve_batch 90 results/bench/serve-batch.json node bench/serve-mix.ts --shape qwen2.5-0.5b --requests 64 --rate 1000000 --prompt 128-128 --generate 128-128 --whole
step hf_train_peer 240 results/bench/hf-train.json python3 bench/peers/hf_train_step.py
peer=""
[[ ${status[hf_train_peer]:-} == ok* ]] && peer="--peer $OUT/results/bench/hf-train.json"
[[ ${status[roofline]:-} == ok* ]] && peer+=" --roofline $OUT/results/bench/roofline.json"
step train_bench 300 results/bench/train.json node bench/cuda-train.ts $peer
# The first GRPO loop on the GPU: the demo trains the embedded tic-tac-toe model on CUDA (its win rates before and after
# beside the CPU's, same seed, in docs/cuda.md).
step demo 240 demo.txt bash -c "mkdir -p '$OUT/results/demo' && node lib/cli.ts demo --device cuda --quiet --out '$OUT/results/demo' --art-dir '$OUT/results/demo/art' 2>&1"
# The same demo, same seed, on this machine's CPU: learning on the GPU compared with the CPU's in one run (issue 17:
# the same win rate within noise); each run's history.jsonl is the curve.
step demo_cpu 300 demo-cpu.txt bash -c "mkdir -p '$OUT/results/demo-cpu' && node lib/cli.ts demo --device cpu --quiet --out '$OUT/results/demo-cpu' --art-dir '$OUT/results/demo-cpu/art' 2>&1"
# The cookbook on CUDA: each notebook's code cells as one Node module (the machine has no Jupyter), CI's sizes,
# ART_NB_DEVICE=cuda so a notebook that falls back to the CPU fails; needs dist/ (carried). The model: a random-weight
# checkpoint of ART_GPU_CHECK_NB_SHAPE (default Qwen2.5-0.5B's shape) behind Qwen's tokenizer, chat template and Hermes
# tool calls (bench/random-checkpoint.ts: it samples digits only), or, with ART_GPU_CHECK_NB_SHAPE=embedded, each
# notebook's own model (the tiny one CI runs).
# Every notebook but the two that import packages the device bundle does not carry (the MCP SDK, LangChain: 7 MB more
# of a 64 MiB carry limit; neither does anything on the GPU that art-e.ipynb does not).
gpu_notebooks=$(ls notebooks/*.ipynb | grep -v -e art-e-langgraph -e mcp-rl | tr '\n' ' ')
nb_shape=${ART_GPU_CHECK_NB_SHAPE:-qwen2.5-0.5b}
step notebooks 300 notebooks.txt bash -c "model=''; if [ '$nb_shape' != embedded ]; then model=\$(node bench/random-checkpoint.ts '$nb_shape') || exit 1; echo \"ART_NB_MODEL: random weights of $nb_shape at \$model\"; fi; ART_NB_MODEL=\$model ART_NB_DEVICE=cuda node scripts/notebook-run.ts $gpu_notebooks --kernel node 2>&1; status=\$?; [ -n \"\$model\" ] && rm -rf \"\$model\"; mkdir -p '$OUT/results/notebooks'; cp notebooks/.executed/*.node.txt '$OUT/results/notebooks/' 2> /dev/null; exit \$status"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null)
if [ -n "$sanitizer" ]; then
  # Every tool runs even when an earlier one reports errors, within its own limit; the step fails if any tool did.
  # Racecheck is the slowest: it runs the parity suite at the emulator's sizes (ART_TEST_PARITY_SIZES=small; the full
  # sizes did not finish under it in 160 s on an H100), the same kernels and paths.
  step sanitizer 300 sanitizer.txt bash -c "failed=0; for run in 'racecheck 160' 'memcheck 60' 'synccheck 60'; do set -- \$run; echo \"== \$1\"; ART_TEST_PARITY_SIZES=\$([ \$1 = racecheck ] && echo small) ART_TEST_GPU=1 '$sanitizer' --tool \$1 --target-processes all --error-exitcode 1 timeout \$2 node node_modules/vitest/vitest.mjs run test/cuda/parity.test.ts test/cuda/training-parity.test.ts 2>&1 || failed=1; done; exit \$failed"
else
  skip sanitizer "no compute-sanitizer on PATH or in /usr/local/cuda/bin"
fi
step nvrtc_fallback 120 fallback.txt bash -c 'ART_TEST_GPU=1 ART_CUDA_KERNELS=nvrtc node node_modules/vitest/vitest.mjs run test/cuda/parity.test.ts test/cuda/training-parity.test.ts --reporter=verbose 2>&1'
step hf_fixtures 90 log.txt bash -c "python3 scripts/reference/hf_fixtures.py /tmp/art-hf-fixtures >&2 && tar -czf '$OUT/hf-fixtures.tar.gz' -C /tmp art-hf-fixtures"
# Whole GRPO steps (2048-like and ART-E-like workloads; ART_GPU_CHECK_GRPO_SHAPES, default the 0.5B, 1.5B and 7B shapes,
# smallest first), the PEFT peer first; one measured step after the warm-up, so that more shapes fit in a call. Both
# rewrite their JSON after each workload, so a step cut at its limit keeps what it measured, and the bench takes the
# peer's numbers whatever the peer's status (the ratio only where both ran a workload).
grpo_shapes=${ART_GPU_CHECK_GRPO_SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b}
step grpo_peer 250 log.txt python3 bench/peers/hf_grpo_step.py --shapes "$grpo_shapes" --steps 1 --out "$OUT/results/bench/hf-grpo.json"
peer=""
[[ -s $OUT/results/bench/hf-grpo.json ]] && peer="--peer $OUT/results/bench/hf-grpo.json"
step grpo_bench 300 log.txt bash -c "node bench/chat-tokenize.ts --out '$OUT/results/bench/chat-tokenize.json' && node bench/grpo-step.ts --shapes '$grpo_shapes' --steps 1 --out '$OUT/results/bench/grpo.json' $peer"
# Memory on one GPU (issue 17): a 7B and a 14B shape in bf16 serve 32 concurrent 4k-token rollouts and train a LoRA
# step on them (the "memory" workload, its one step); peak memory per shape, or the out-of-memory error naming its knob.
# The two checkpoints take 15 and 30 GB of disk and a few minutes each: a call of its own, or one per shape.
memory_shapes=${ART_GPU_CHECK_MEMORY_SHAPES:-qwen2.5-7b,qwen2.5-14b}
step memory 560 log.txt node bench/grpo-step.ts --shapes "$memory_shapes" --workloads memory --steps 0 --out "$OUT/results/bench/memory.json"
# The CPU engine on this machine's cores (16 here, 2 where CI runs) beside the machine's pip torch (MKL / oneDNN, as
# users install it), issue 22: bench/cpu-engine.ts (prefill, decode) and bench/train-cpu.ts (a LoRA step), at 1 thread
# and at every core.
step cpu_benches 300 log.txt bash -c "ART_PEER_PYTHON=python3 node bench/cpu-engine.ts --quick --out '$OUT/results/bench/cpu-engine.json' && ART_PEER_PYTHON=python3 node bench/train-cpu.ts --seqs 2 --len 512 --rounds 3 && cp bench/results/train-cpu.json '$OUT/results/bench/train-cpu.json'"
# The device tool returns at most 8 files of 16 MiB: the bench and demo results travel as one archive, without the
# demo's checkpoints and saved trajectories (some 130 MB; its history.jsonl and summary say what it learned).
tar -cf "$OUT/results.tar" -C "$OUT/results" --exclude=checkpoints --exclude=trajectories . && rm -rf "$OUT/results"
cat "$OUT/summary.json"
