#!/usr/bin/env bash
# The GPU user's path, checked on a machine without a GPU (docs/cluster.md, "The GPU stack, checked on CPU"):
# builds .venv-gpu from the GPU lock (requirements/gpu-py3XX.txt: vLLM 0.24.0, torch 2.11.0 built for CUDA 13; a
# no-op when it is up to date), then runs tests/gpu_stack with it: the installed versions, the imports of verl's
# vLLM rollout and our agent loop, vLLM's own parser and config classes on every `vllm serve` line of the harness
# and on the engine arguments verl builds from the paper's configs, verl's validation, the launchers' DRY_RUN.
#
#   bash scripts/check_gpu_stack.sh [pytest options]      (make check-gpu-stack)
#   SKIP_SETUP=1 bash scripts/check_gpu_stack.sh           (.venv-gpu as it is: the suite, right after make setup)
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  VENV=.venv-gpu SKIP_MODELS=1 FLASH_ATTN=skip bash scripts/setup.sh --gpu
fi
BUILT=$(date +%s)
set +e
# One interpreter for every check; the installed versions head its output (tests/gpu_stack/conftest.py).
.venv-gpu/bin/python -m pytest tests/gpu_stack -v -p no:cacheprovider -W ignore::UserWarning "$@"
STATUS=$?
set -e
echo "[gpu-stack] environment $((BUILT - START)) s, checks $(($(date +%s) - BUILT)) s, exit $STATUS"
exit $STATUS
