#!/usr/bin/env bash
# The calculator agent trained end to end on CPU (docs/calculator_cpu.md), in one command:
#
#   bash experiments/calculator/run.sh            # data, warm start (cached), RL, held-out test before and after
#   QUICK=1 bash experiments/calculator/run.sh    # the same pipeline at toy size (artefacts, not accuracy)
#
# Stages (run the same command again after a kill: finished stages are skipped, RL resumes from its last checkpoint):
#   1. data        python -m experiments.calculator.task: two-digit + - * problems, disjoint train / validation /
#                  test splits (2000 / 64 / 128)
#   2. warm start  python -m experiments.calculator.warm_start --cache: SFT of a ~1M-parameter reader on teacher
#                  transcripts of the real agent, built once into the models cache (~11 min of one core), reused
#   3. RL          scripts/train_tiny_cpu.sh CONFIG=calculator_cpu (configs/calculator_cpu.yaml: our trainer, GRPO
#                  n=4 on the strict reward of the answer, every call's row trained with its trajectory's advantage),
#                  greedy validation on the validation problems every few steps
#   4. test        python -m experiments.calculator.evaluate: the agent, greedy, on the test problems, with the warm
#                  start and with the RL policy (the last checkpoint's Hugging Face folder)
#   5. report      python -m experiments.calculator.report: OUT_DIR/summary.json and a Markdown table
#
# Environment (defaults in brackets; QUICK=1 changes the ones marked Q):
#   OUT_DIR        everything the run writes [.cache/calculator_cpu; Q: .cache/calculator_cpu_quick]
#   STEPS          RL steps [configs/calculator_cpu.yaml's trainer.total_training_steps; Q: 2]
#   TEST_PROBLEMS  test problems of stage 4 [128; Q: 8]
#   NGPUS          FSDP ranks of the RL run (fake Ray GPUs) [2]
#   PYTHON         interpreter [the repo's .venv]
# Extra arguments go to the RL run as hydra overrides.
#
# Output: OUT_DIR/data, OUT_DIR/rl (train.log, metrics.jsonl, training.png, checkpoints, rollout and validation
# dumps), OUT_DIR/test_eval.jsonl, OUT_DIR/summary.json, OUT_DIR/timing.jsonl (wall seconds of every stage run).
# Exit status: 0 when every stage finished, else the failing stage's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
QUICK="${QUICK:-0}"
if [[ "$QUICK" == 1 ]]; then
  OUT_DIR="${OUT_DIR:-$REPO/.cache/calculator_cpu_quick}"
  STEPS="${STEPS:-2}" TEST_PROBLEMS="${TEST_PROBLEMS:-8}" data_args=(--train 64 --validation 8 --test 8)
  warm_args=(--cache --quick)
  quick_overrides=(data.train_batch_size=2 trainer.val_before_train=False trainer.test_freq=2)
else
  OUT_DIR="${OUT_DIR:-$REPO/.cache/calculator_cpu}"
  STEPS="${STEPS:-$("$PYTHON" -c "from omegaconf import OmegaConf; print(OmegaConf.load('$REPO/configs/calculator_cpu.yaml').trainer.total_training_steps)")}"
  TEST_PROBLEMS="${TEST_PROBLEMS:-128}" data_args=() warm_args=(--cache) quick_overrides=()
fi
NGPUS="${NGPUS:-2}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$REPO"

PIPELINE=calculator_cpu
source "$REPO/scripts/lib/stages.sh"  # say, timed, last_step

say "out=$OUT_DIR steps=$STEPS test_problems=$TEST_PROBLEMS quick=$QUICK"
say "1/5 data"
if [[ ! -f "$OUT_DIR/data/validation.parquet" ]]; then
  timed data "$PYTHON" -m experiments.calculator.task --out "$OUT_DIR/data" "${data_args[@]}" > /dev/null
fi

say "2/5 warm start (${warm_args[*]}): built once, then reused"
timed warm_start "$PYTHON" -m experiments.calculator.warm_start "${warm_args[@]}" | tee "$OUT_DIR/warm_start.log"
WARM="$(tail -n 1 "$OUT_DIR/warm_start.log")"
[[ -f "$WARM/config.json" ]] || { say "the warm start did not print its folder (got '$WARM')"; exit 1; }

say "3/5 RL: $STEPS steps (from step $(last_step "$OUT_DIR/rl")); log: $OUT_DIR/rl/train.log"
if [[ "$(last_step "$OUT_DIR/rl")" -lt "$STEPS" ]]; then
  mkdir -p "$OUT_DIR/rl"
  timed rl env CONFIG=calculator_cpu MODEL="$WARM" DATA_DIR="$OUT_DIR/data" OUT_DIR="$OUT_DIR/rl" STEPS="$STEPS" \
    NGPUS="$NGPUS" PYTHON="$PYTHON" bash "$REPO/scripts/train_tiny_cpu.sh" "${quick_overrides[@]}" "$@" \
    > "$OUT_DIR/rl.launcher.log" 2>&1 || { tail -n 20 "$OUT_DIR/rl.launcher.log"; exit 1; }
fi
POLICY="$OUT_DIR/rl/checkpoints/global_step_$STEPS/actor/huggingface"
[[ -f "$POLICY/config.json" ]] || { say "no exported policy at step $STEPS ($POLICY)"; exit 1; }

say "4/5 test: $TEST_PROBLEMS problems, greedy, warm start and RL policy"
if [[ ! -s "$OUT_DIR/test_eval.jsonl" || "$POLICY" -nt "$OUT_DIR/test_eval.jsonl" ]]; then
  timed test "$PYTHON" -m experiments.calculator.evaluate "$WARM" "$POLICY" --split test --problems "$TEST_PROBLEMS" \
    --out "$OUT_DIR/test_eval.jsonl"
fi

say "5/5 report"
"$PYTHON" -m experiments.calculator.report "$OUT_DIR"
say "done: $OUT_DIR/summary.json, training curve $OUT_DIR/rl/training.png"
