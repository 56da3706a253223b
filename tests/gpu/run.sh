#!/usr/bin/env bash
# The learner's GPU checks as one script, for a machine with CUDA and PyTorch (no vLLM or Ray needed):
#   tests/gpu/run.sh [OUT_DIR]
# runs tests/gpu (an FSDP2 step on CUDA/NCCL with bf16 compute and fp32 master weights, with activation
# checkpointing and with CPU offload) and bench/learner_memory.py on CUDA; the benchmark's JSON and table go to
# OUT_DIR (default bench/results). Record the figures, with the date, in docs/learner.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-bench/results}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))" | tee "$OUT/gpu_env.txt"
"$PY" -m pytest tests/gpu -p no:cacheprovider -q -rA 2>&1 | tee "$OUT/gpu_tests.txt"
tests=${PIPESTATUS[0]}
"$PY" bench/learner_memory.py --device cuda --out "$OUT/learner_memory_cuda" 2>&1 | tee "$OUT/gpu_bench.txt"
bench=${PIPESTATUS[0]}
echo "tests/gpu: exit $tests; bench/learner_memory.py --device cuda: exit $bench"
exit $(( tests || bench ))
