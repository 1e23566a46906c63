#!/usr/bin/env bash
# One-node smoke check of a GPU machine, to run before a multi-day MemAgent job (docs/cluster.md).
#
#   bash scripts/smoke_gpu.sh [hydra overrides]          DRY_RUN=1 bash scripts/smoke_gpu.sh   (print, do not run)
#
# The trainer of the paper runs (python -m verl_ext.main, configs/smoke_gpu.yaml on recurrent_trainer.yaml), on this
# node only (its own local Ray), with the paper's token budgets (chunk 5000, memory 1024, up to 8 chunks, vLLM
# context 9216) on a small instruct model: 16 generated questions about ~28K-token documents (6 chunks; written
# once under OUT_DIR/data), rollout.n=4, validation before training and after the last step, 2 training steps,
# a checkpoint at step 2, console + JSONL metrics, verl's memory logging (VERL_LOGGING_LEVEL=DEBUG).
# At the end (scripts/smoke_report.py): seconds per phase and step; the actor workers' peak GPU memory so far, as
# verl reads it after each step's update (since the worker started, not per phase); GPU memory at verl's logged
# points (samples, not peaks). The exit status is non-zero on any failure: the trainer's, or a step, a validation
# or the checkpoint missing.
#
# Environment:
#   MODEL_PATH   a local model folder, or a hub id already in the local Hugging Face cache
#                (default Qwen/Qwen2.5-0.5B-Instruct; download it beforehand: huggingface-cli download <id>)
#   NGPUS        GPUs of this node to train on (default: those nvidia-smi lists)
#   OUT_DIR      everything the check writes: data/, checkpoints/, metrics.jsonl, train.log, hydra/
#                (default <repository>/checkpoints/smoke_gpu)
#   DRY_RUN      1: print the command and the composed config (resolved), then exit (no Ray, no GPU, no files)
#   PYTHON       the interpreter (default: the repository's .venv, else python3)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Runs from any working directory: this checkout's packages first on every process's path (Ray's workers inherit
# it), relative paths (MODEL_PATH, OUT_DIR, overrides) read from the directory it is started in.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}
OUT_DIR=${OUT_DIR:-$REPO/checkpoints/smoke_gpu}
[[ "$OUT_DIR" == /* ]] || OUT_DIR=$PWD/$OUT_DIR
if [ -z "${NGPUS:-}" ]; then
  NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${NGPUS:-0}" -lt 1 ]; then NGPUS=1; fi  # no GPU seen: the task runner's check says so (and exits 2)
fi
STEPS=2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # nothing is downloaded at run time

# The model, resolved here as the run's pre-flight would: a clear message and exit 2 if it is not on this machine.
resolve='import sys
from recurrent.models import ModelNotAvailableError, resolve_model_path
try:
    print(resolve_model_path(sys.argv[1]))
except ModelNotAvailableError as err:
    sys.exit(f"[smoke] {err}")'
MODEL_DIR=$("$PYTHON" -c "$resolve" "$MODEL_PATH") || exit 2

DATA=$OUT_DIR/data
ARGS=(
  --config-name smoke_gpu
  "actor_rollout_ref.model.path=$MODEL_DIR"
  "data.train_files=$DATA/train.parquet"
  "data.val_files=$DATA/dev.parquet"
  "trainer.n_gpus_per_node=$NGPUS"
  "trainer.total_training_steps=$STEPS"
  "trainer.default_local_dir=$OUT_DIR/checkpoints"
  "hydra.run.dir=$OUT_DIR/hydra/\${now:%Y-%m-%d_%H-%M-%S}"
  # One node: a Ray of its own, even where `ray start` already runs a cluster on this machine.
  "++ray_kwargs.ray_init.address=local"
  "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_LOGGING_LEVEL='${VERL_LOGGING_LEVEL:-DEBUG}'"
)
ARGS+=("$@")

echo "[smoke] this node, $NGPUS GPU(s), model $MODEL_DIR, out $OUT_DIR"
printf '[smoke] command:'; printf ' %q' "$PYTHON" -m verl_ext.main "${ARGS[@]}"; echo
if [ "${DRY_RUN:-0}" = 1 ]; then
  echo "[smoke] DRY_RUN=1: composed config follows; not starting"
  exec "$PYTHON" -m verl_ext.main "${ARGS[@]}" --cfg job --resolve
fi

mkdir -p "$OUT_DIR"
# 16 questions (2 steps of 8) and 4 to validate, each about a document of 2900-3200 filler sentences: ~28K tokens.
if [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/dev.parquet" ]]; then
  "$PYTHON" -m experiments.tiny.data --task memory --train 16 --val 4 --sentences 2900 3200 --out "$DATA" >/dev/null
fi
export VERL_LOGGING_LEVEL=${VERL_LOGGING_LEVEL:-DEBUG} PYTHONUNBUFFERED=1
export VERL_FILE_LOGGER_PATH=$OUT_DIR/metrics.jsonl  # verl's file logger; truncated by each run
LOG=$OUT_DIR/train.log
unset RAY_ADDRESS

source "$REPO/scripts/lib/session.sh"  # start_supervised, stop_supervised

cleanup() {
  # The trainer runs in a session of its own under scripts/lib/supervise.py, with Ray's daemons, workers and vLLM
  # servers: the supervisor ends that session when this shell exits, or is killed (its lifeline closes).
  stop_supervised
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
set +e
: > "$LOG"  # this run's log only (the supervisor appends the trainer's output to it)
start_supervised "$LOG" -- "$PYTHON" -m verl_ext.main "${ARGS[@]}"
wait "$SUPERVISOR_PID"
rc=$?
set -e
wall=$(( $(date +%s) - start ))
echo
echo "[smoke] trainer rc=$rc, ${wall}s; log $LOG, metrics $VERL_FILE_LOGGER_PATH"
report_rc=0
"$PYTHON" "$REPO/scripts/smoke_report.py" --metrics "$VERL_FILE_LOGGER_PATH" --log "$LOG" \
  --checkpoints "$OUT_DIR/checkpoints" --steps "$STEPS" || report_rc=$?
if [ "$rc" -ne 0 ]; then echo "[smoke] FAILED: the trainer exited with $rc"; exit "$rc"; fi
if [ "$report_rc" -ne 0 ]; then exit "$report_rc"; fi
echo "[smoke] OK: validation, $STEPS steps and a checkpoint on this node"
