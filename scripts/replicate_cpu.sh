#!/usr/bin/env bash
# The CPU replication of MemAgent's headline result (docs/replication_cpu.md), in one command:
#
#   bash scripts/replicate_cpu.sh            # warm start (cached), RL x 2 seeds, ablation, evaluation, table + plot
#   QUICK=1 bash scripts/replicate_cpu.sh    # the same pipeline at toy size (CI: artefacts, not accuracy)
#   TASK=choose bash scripts/replicate_cpu.sh   # the choosing task: DISTRACTORS more needles of other keys
#
# Stages, each resumable (run the same command again after a kill: finished stages are skipped, an RL run resumes
# from its last checkpoint, the evaluation from its last finished item):
#   1. warm start   python -m experiments.needle.warm_start --cache --task TASK: built once into the models cache
#                   (~15 min on 1 thread; reused afterwards, like the other offline models); never committed. The
#                   choosing task's has its own naive stage (choosing documents, a teacher that writes one whole
#                   needle sentence) on the needle task's copy stages, kept beside it in the cache
#   2. data         needle documents: training (1-4 chunks), validation (1, 2, 4 chunks), test (every eval length)
#   3. RL           for each seed of SEEDS: scripts/train_tiny_cpu.sh TASK=needle (configs/replicate_cpu.yaml:
#                   our trainer, the memory agent, strict reward, GRPO n=4, KL loss, 16 updates per step); the RL
#                   and ablation runs go RL_PARALLEL at a time
#   4. ablations    the same run with the answers' credit only, each variant of ABLATIONS (docs/fidelity.md,
#                   "Credit on every turn"): recurrent.credit=final_same_step (memory turns carry no advantage, the
#                   answers' step as in RL) and final_token_mean (the answers' loss averaged over their own tokens),
#                   ABLATION_SEEDS of each
#   5. evaluation   python -m taskutils.memory_eval.run through `transformers serve` of each policy's exported
#                   checkpoint, on the test split at LENGTHS chunks, EVAL_DOCS documents each, greedy; the memory
#                   agent (memory-boxed) and the full-context baseline (direct-boxed: the whole document in one
#                   prompt, middle-truncated to the reader's window) for every policy; PARALLEL_MODELS policies at
#                   a time, each with its own one-thread server (taskutils/memory_eval/README.md); with --trace:
#                   every item's memory after each chunk
#   6. report       python -m experiments.needle.report: replication.md / .csv / .png (accuracy by length x policy;
#                   the .md ends with the needle's survival in memory, experiments/needle/survival.py, and what
#                   ran: commit, command line, stage times from timing.jsonl and run.jsonl); survival.{md,csv,png},
#                   survival_events.csv; each run's memories.{csv,png} (experiments/needle/rollout_memories.py:
#                   per step, the share of memories that are one whole needle, the asked one, and the reward)
#
# Environment (defaults in brackets; QUICK=1 changes the ones marked Q):
#   TASK            needle (one needle a document) or choose (the asked needle among DISTRACTORS others of other
#                   keys; the memory holds two needle sentences at most: docs/replication_cpu_notebook.md, "The choosing
#                   task") [needle]
#   DISTRACTORS     the choosing task's other needles per document [3; needle: 0]
#   CHOOSE_RECIPE   the choosing task's warm start: choice (a choice stage, whole-sentence memories) or recall (a
#                   recall stage, number memories: docs/replication_cpu_notebook.md, "The choice taught with its
#                   answer")
#                   [choice]
#   OUT_DIR         everything the run writes [.cache/replicate_cpu (choose: .cache/replicate_cpu_choose, recall
#                   recipe: .cache/replicate_cpu_choose_recall); Q: the same with _quick]
#   STEPS           RL steps per run [30; Q: 2]
#   SEEDS           RL seeds (actor_rollout_ref.rollout.seed) ["0 1"; Q: "0"]
#   ABLATIONS       credit variants of the ablation ["final_same_step final_token_mean"]
#   ABLATION_SEEDS  seeds of each ablation variant ["0"; Q: none]
#   ABLATION_STEPS  steps of the ablation [STEPS; Q: 1]
#   LENGTHS         evaluation lengths in chunks of 64 tokens ["1 2 4 8 16 32 64 128 256"; choose: "1 2 4 8 16
#                   32 64", its issue's lengths; Q: "1 2"]
#   EVAL_DOCS       test documents per length up to 64 chunks [64; Q: 2]
#   LONG_DOCS       test documents per length over 64 chunks (a 256-chunk document costs 257 turns); those lengths
#                   are evaluated for the warm start and the RL seeds, not the ablations [32]
#   NGPUS           FSDP ranks of each RL run (fake Ray GPUs) [1]
#   RL_PARALLEL     RL and ablation runs side by side (each with NGPUS ranks; a machine with more cores can take
#                   more) [2]
#   PARALLEL_MODELS policies evaluated side by side [3; Q: 2]
#   LATE_START      share of training documents that start late: the needle already in memory, filler chunks only
#                   (docs/replication_cpu_notebook.md, "Episodes that start late"); the RL runs then read each row's
#                   initial memory (recurrent.config.memory_key=memory) [0: the paper's episodes]
#   DECOY_START     share of training documents that start from a wrong memory: the asked key's needle with another
#                   number, the real needle in the context (docs/replication_cpu_notebook.md, "What each lever did") [0]
#   WARM_START      start from this warm-start folder (a Hugging Face folder, e.g. a variant built with
#                   `python -m experiments.needle.warm_start --out DIR ...`) instead of the cached build [none]
#   PYTHON          interpreter [the repo's .venv]
# Extra arguments go to every RL run as hydra overrides. Every value above is checked before any work (one line naming
# the variable and its value, exit status 2), and so is every run folder: one that a training run still holds (one
# of an earlier invocation, say) is named with the process holding it and what to do. A kill of this script, of its
# process group too (kill -9 included), ends its RL runs within seconds (scripts/lib/stages.sh, pool_lifeline_open).
#
# Output: OUT_DIR/{data,eval_data}, OUT_DIR/runs/<policy>/ (train.log, metrics.jsonl, training.png,
# memories.{csv,png}, checkpoints), OUT_DIR/policies.yaml (the evaluation's model table), OUT_DIR/results/ (the
# harness's per-item results and summary), OUT_DIR/results/replication.{md,csv,png}, OUT_DIR/timing.jsonl (wall
# seconds of every stage run, and a "total" line per invocation), OUT_DIR/run.jsonl (commit, command line, cores,
# start: one line per invocation).
# Exit status: 0 when every stage finished and every results file is complete; otherwise the failing stage's.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Every environment value is checked before any work (a folder made, data built, a trainer started): a bad one stops
# the script with one line naming the variable and its value, and exit status 2.
# refuse NAME WHY: that line (the value quoted when it holds spaces or is empty).
refuse() {
  local value="${!1-}"
  [[ "$value" =~ ^[^[:space:]\']+$ ]] || value="'$value'"
  echo "$1=$value: $2" >&2
  exit 2
}
# A whole number as the trainer and the folder names read it: no sign, no leading zero (global_step_8, not _08),
# nine digits at most (bash's arithmetic stays exact).
WHOLE="0|[1-9][0-9]{0,8}"
# need_whole NAME MIN: NAME holds a whole number >= MIN.
need_whole() { [[ "${!1}" =~ ^($WHOLE)$ ]] && ((${!1} >= $2)) || refuse "$1" "a whole number >= $2"; }
# need_words NAME WHAT ALLOWED [empty]: NAME holds words separated by spaces, each matching the regular expression
# ALLOWED and none twice; at least one unless "empty" is given. WHAT says what a word is.
need_words() {
  local name="$1" what="$2" allowed="$3" word words seen=" "
  read -r -a words <<< "${!name}"
  ((${#words[@]})) || [[ "${4:-}" == empty ]] || refuse "$name" "empty; at least one is needed: $what"
  for word in "${words[@]}"; do
    [[ "$word" =~ ^($allowed)$ ]] || refuse "$name" "$word is not $what"
    [[ "$seen" != *" $word "* ]] || refuse "$name" "$word twice"
    seen+="$word "
  done
}
# need_share NAME: NAME holds a share of the training documents, a number in [0, 1].
need_share() {
  [[ "${!1}" =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] && awk -v x="${!1}" 'BEGIN { exit !(x <= 1) }' \
    || refuse "$1" "a share of the training documents, a number in [0, 1]"
}
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
command -v "$PYTHON" > /dev/null || refuse PYTHON "no interpreter there (make setup builds the repository's .venv)"
QUICK="${QUICK:-0}"
[[ "$QUICK" == 0 || "$QUICK" == 1 ]] || refuse QUICK "0 (the full run) or 1 (toy size)"
TASK="${TASK:-needle}"
case "$TASK" in
  needle) DISTRACTORS="${DISTRACTORS:-0}" out_name=replicate_cpu all_lengths="1 2 4 8 16 32 64 128 256" ;;
  choose) DISTRACTORS="${DISTRACTORS:-3}" out_name=replicate_cpu_choose all_lengths="1 2 4 8 16 32 64" ;;
  *) echo "TASK=$TASK: one of needle, choose" >&2; exit 2 ;;
esac
CHOOSE_RECIPE="${CHOOSE_RECIPE:-choice}"
case "$TASK:$CHOOSE_RECIPE" in
  *:choice) ;;
  choose:recall) out_name=replicate_cpu_choose_recall ;;
  choose:*) echo "CHOOSE_RECIPE=$CHOOSE_RECIPE: one of choice, recall" >&2; exit 2 ;;
  *) echo "CHOOSE_RECIPE=$CHOOSE_RECIPE is a recipe of the choosing task (TASK=choose)" >&2; exit 2 ;;
esac
if [[ "$TASK" == choose ]]; then
  [[ "$DISTRACTORS" =~ ^($WHOLE)$ ]] && ((DISTRACTORS >= 1)) || refuse DISTRACTORS "the choosing task needs a whole number >= 1"
else
  need_whole DISTRACTORS 0
fi
if [[ "$QUICK" == 1 ]]; then
  OUT_DIR="${OUT_DIR:-$REPO/.cache/${out_name}_quick}"
  STEPS="${STEPS:-2}" SEEDS="${SEEDS:-0}" ABLATION_SEEDS="${ABLATION_SEEDS-}" ABLATION_STEPS="${ABLATION_STEPS:-1}"
  LENGTHS="${LENGTHS:-1 2}" EVAL_DOCS="${EVAL_DOCS:-2}" TRAIN_DOCS=64 VAL_DOCS=1 warm_args=(--cache --quick --task "$TASK" --recipe "$CHOOSE_RECIPE")
  PARALLEL_MODELS="${PARALLEL_MODELS:-2}"
  # 2 prompts x n 2 per step (2 updates), validation once, at the end: the pipeline's artefacts in minutes. A step
  # costs about its trajectories; the launch's start-up (~60 s) is the rest of the stage and does not shrink.
  quick_overrides=(data.train_batch_size=2 actor_rollout_ref.rollout.n=2 trainer.val_before_train=False
    trainer.test_freq=2 trainer.save_freq=1)
else
  OUT_DIR="${OUT_DIR:-$REPO/.cache/$out_name}"
  STEPS="${STEPS:-30}" SEEDS="${SEEDS:-0 1}" ABLATION_SEEDS="${ABLATION_SEEDS-0}" ABLATION_STEPS="${ABLATION_STEPS:-$STEPS}"
  LENGTHS="${LENGTHS:-$all_lengths}" EVAL_DOCS="${EVAL_DOCS:-64}" TRAIN_DOCS=2000 VAL_DOCS=8 warm_args=(--cache --task "$TASK" --recipe "$CHOOSE_RECIPE")
  # Two policies side by side ran 1.8 times as fast as one after another on 2 idle cores, three a little faster
  # still (the server's forward pass is the cost; more documents in flight per server slowed each turn).
  PARALLEL_MODELS="${PARALLEL_MODELS:-3}"
  quick_overrides=()
fi
# Each RL run's FSDP ranks, and the runs side by side: on 2 cores two one-rank runs side by side take 13% less wall
# time than one two-rank run after another (docs/replication_cpu.md, "What it costs").
NGPUS="${NGPUS:-1}"
RL_PARALLEL="${RL_PARALLEL:-2}"
LONG_DOCS="${LONG_DOCS:-32}"
for name in STEPS ABLATION_STEPS EVAL_DOCS LONG_DOCS NGPUS RL_PARALLEL PARALLEL_MODELS; do need_whole "$name" 1; done
need_words SEEDS "a whole number (an RL seed)" "$WHOLE"
need_words ABLATION_SEEDS "a whole number (an RL seed)" "$WHOLE" empty
need_words LENGTHS "a whole number >= 1 (an evaluation length in chunks)" "[1-9][0-9]{0,8}"
# The lengths up to 64 chunks get EVAL_DOCS test documents, the longer ones LONG_DOCS.
short_lengths=() long_lengths=()
for n in $LENGTHS; do if ((n > 64)); then long_lengths+=("$n"); else short_lengths+=("$n"); fi; done
LATE_START="${LATE_START:-0}"
DECOY_START="${DECOY_START:-0}"
need_share LATE_START
need_share DECOY_START
if ! awk -v a="$LATE_START" -v b="$DECOY_START" 'BEGIN { exit !(a + b <= 1) }'; then
  echo "LATE_START=$LATE_START + DECOY_START=$DECOY_START: more than 1 (shares of the same training documents)" >&2
  exit 2
fi
if [[ "$TASK" == choose && ( "$LATE_START" != 0 || "$DECOY_START" != 0 ) ]]; then
  echo "TASK=choose takes no LATE_START or DECOY_START" >&2
  exit 2
fi
ABLATIONS="${ABLATIONS-final_same_step final_token_mean}"
# The credit variants an ablation can be: recurrent.credit's modes but the paper's (verl_ext/settings.py).
variants="$(cd "$REPO" && "$PYTHON" -c 'from verl_ext.settings import CREDIT_MODES; print("|".join(CREDIT_MODES[1:]))' \
  2> /dev/null)" || refuse PYTHON "cannot import the repository's packages with it (verl_ext.settings)"
need_words ABLATIONS "a credit variant (${variants//|/, })" "$variants" empty
# Relative OUT_DIR and WARM_START are the caller's (read before the change of directory below).
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$PWD/$1"; fi; }
OUT_DIR="$(absolute "$OUT_DIR")"
[[ ! -e "$OUT_DIR" || -d "$OUT_DIR" ]] || refuse OUT_DIR "a file, not a folder"
if [[ -n "${WARM_START:-}" ]]; then
  WARM_START="$(absolute "$WARM_START")"
  # A folder with a model's config, weights and tokenizer (the data stage reads its tokenizer, the RL runs start
  # from it): recurrent/models.py, model_folder_problem.
  if ! problem="$(cd "$REPO" && "$PYTHON" -m recurrent.models --check "$WARM_START" 2>&1)"; then
    refuse WARM_START "${problem#"error: $WARM_START: "}"
  fi
fi
# The run (and policy) name of a credit variant: final_same_step -> ablation-same-step.
ablation_name() { local mode="${1#final_}"; echo "ablation-${mode//_/-}"; }
# Every run, one line each: NAME STEPS OVERRIDES... (the RL seeds first, then the ablations).
rl_jobs=()
for seed in $SEEDS; do rl_jobs+=("rl-seed$seed $STEPS actor_rollout_ref.rollout.seed=$seed"); done
for mode in $ABLATIONS; do
  for seed in $ABLATION_SEEDS; do
    rl_jobs+=("$(ablation_name "$mode")-seed$seed $ABLATION_STEPS actor_rollout_ref.rollout.seed=$seed recurrent.credit=$mode")
  done
done
PIPELINE=replicate_cpu
source "$REPO/scripts/lib/stages.sh"  # say, timed, last_step, record_run, record_total, pool_*
source "$REPO/scripts/lib/session.sh"  # run_lock_free
for job in "${rl_jobs[@]}"; do
  read -r name steps _ <<< "$job"
  # A run that trained past the steps asked counts as done, and the evaluation reads its checkpoint of those steps:
  # one it did not keep (a checkpoint every save_freq steps) would fail there, after every other stage.
  done_steps="$(last_step "$OUT_DIR/runs/$name")"
  if ((done_steps > steps)) && [[ ! -d "$OUT_DIR/runs/$name/checkpoints/global_step_$steps/actor/huggingface" ]]; then
    variable=STEPS
    [[ "$name" != ablation-* ]] || variable=ABLATION_STEPS
    refuse "$variable" "runs/$name in OUT_DIR trained $done_steps steps and kept no checkpoint of step $steps to \
evaluate ($variable=$done_steps evaluates its last one)"
  fi
  # No run folder held by another training run (a run of an earlier invocation that outlived it, or a second
  # invocation on the same OUT_DIR): named now, with the process that holds it, rather than after the data stages.
  run_lock_free "$OUT_DIR/runs/$name/checkpoints" || exit 2
done
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "$OUT_DIR/runs"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
cd "$REPO"

# What ran, for the report (docs/replication_cpu.md): the settings that shape the experiment and the command line.
record_run "TASK=$TASK CHOOSE_RECIPE=$CHOOSE_RECIPE DISTRACTORS=$DISTRACTORS QUICK=$QUICK STEPS=$STEPS SEEDS='$SEEDS' ABLATIONS='$ABLATIONS'" \
  "ABLATION_SEEDS='$ABLATION_SEEDS' ABLATION_STEPS=$ABLATION_STEPS LENGTHS='$LENGTHS' EVAL_DOCS=$EVAL_DOCS LONG_DOCS=$LONG_DOCS NGPUS=$NGPUS RL_PARALLEL=$RL_PARALLEL" \
  "PARALLEL_MODELS=$PARALLEL_MODELS LATE_START=$LATE_START DECOY_START=$DECOY_START${WARM_START:+ WARM_START=$WARM_START} bash scripts/replicate_cpu.sh $*"

say "task=$TASK distractors=$DISTRACTORS out=$OUT_DIR steps=$STEPS seeds=[$SEEDS] ablations=[$ABLATIONS] seeds [$ABLATION_SEEDS] x $ABLATION_STEPS steps" \
  "lengths=[$LENGTHS] docs=$EVAL_DOCS parallel=$PARALLEL_MODELS"

# ---- 1. warm start (cached) --------------------------------------------------------------------------------------
if [[ -n "${WARM_START:-}" ]]; then
  say "1/6 warm start: $WARM_START (WARM_START)"
  WARM="$(cd "$WARM_START" && pwd)"
else
  say "1/6 warm start (${warm_args[*]}): built once, then reused"
  timed warm_start "$PYTHON" -m experiments.needle.warm_start "${warm_args[@]}" | tee "$OUT_DIR/warm_start.log"
  WARM="$(tail -n 1 "$OUT_DIR/warm_start.log")"
fi
[[ -f "$WARM/config.json" ]] || { say "the warm start did not print its folder (got '$WARM')"; exit 1; }

# ---- 2. data -------------------------------------------------------------------------------------------------------
say "2/6 data"
if [[ ! -f "$OUT_DIR/data/validation.parquet" ]]; then
  timed data_train "$PYTHON" -m experiments.needle.data --out "$OUT_DIR/data" --tokenizer "$WARM" \
    --train "$TRAIN_DOCS" --validation "$VAL_DOCS" --test 0 --eval-chunks 1 2 4 --late-start "$LATE_START" \
    --decoy-start "$DECOY_START" --distractors "$DISTRACTORS" --task "$TASK" > /dev/null
fi
# The long lengths first: the short ones write test.parquet, the mark that the test data is complete.
if [[ ! -f "$OUT_DIR/eval_data/test.parquet" ]]; then
  for part in long short; do
    if [[ "$part" == long ]]; then
      stage=data_test_long docs="$LONG_DOCS" lengths=("${long_lengths[@]}")
    else
      stage=data_test docs="$EVAL_DOCS" lengths=("${short_lengths[@]}")
    fi
    ((${#lengths[@]})) || continue
    timed "$stage" "$PYTHON" -m experiments.needle.data --out "$OUT_DIR/eval_data" --tokenizer "$WARM" \
      --train 0 --validation 0 --test "$docs" --eval-chunks "${lengths[@]}" --distractors "$DISTRACTORS" \
      --task "$TASK" > /dev/null
  done
fi

# ---- 3-4. RL and the ablation ----------------------------------------------------------------------------------------
# rl_run NAME STEPS [overrides...]: one RL run in runs/NAME, resumed from its last checkpoint, skipped when done.
rl_run() {
  local name="$1" steps="$2" dir="$OUT_DIR/runs/$1"
  shift 2
  if [[ "$(last_step "$dir")" -ge "$steps" ]]; then say "   $name: done ($steps steps)"; return; fi
  say "   $name: $steps steps (from step $(last_step "$dir")); log: $dir/train.log"
  timed "rl:$name" launch_logged "$dir.launcher.log" env TASK=needle MODEL="$WARM" DATA_DIR="$OUT_DIR/data" \
    OUT_DIR="$dir" STEPS="$steps" NGPUS="$NGPUS" PYTHON="$PYTHON" RUN_PARENT_LIFELINE_FD="${RUN_PARENT_LIFELINE_FD:-}" \
    bash "$REPO/scripts/train_tiny_cpu.sh" "$@" "${EXTRA[@]}"
  grep -E "^step |^ +[0-9]+ " "$dir.launcher.log" | tail -n 3 || true
}
# launch_logged LOG CMD...: CMD's output into LOG; when it fails, why, before the stage's own line (timed): the
# launcher's one-line refusals ("error: ...", e.g. a run folder another run holds), else the end of its log.
launch_logged() {
  local log="$1" rc=0
  shift
  "$@" > "$log" 2>&1 || rc=$?
  ((rc)) || return 0
  grep "^error: " "$log" >&2 || tail -n 20 "$log" >&2
  return "$rc"
}
# Episodes that start late need the agent to read each row's initial memory (the column "memory" of the data).
late_overrides=()
[[ "$LATE_START" == 0 && "$DECOY_START" == 0 ]] || late_overrides=(recurrent.config.memory_key=memory)
EXTRA=("${quick_overrides[@]}" "${late_overrides[@]}" "$@")
# (rl_jobs, every run of the invocation: made with the checks at the top.)
# run_rl_jobs: the runs, RL_PARALLEL at a time (docs/replication_cpu.md, "What it costs"). Each runs in a process
# group of its own (set -m), so that a signal to this script reaches it through on_signal (scripts/lib/stages.sh)
# rather than being ignored, as it is by background jobs without job control. After a failed run no new run
# starts; the ones running finish (each resumes on the next invocation), and the first failure's status is returned.
# A kill of this script's own process group (kill -9 included) does not reach those groups: each run's supervisor
# also watches a pipe whose only writer is this shell, and ends the run when this shell is gone (pool_lifeline_open,
# scripts/lib/stages.sh).
run_rl_jobs() {
  local job words rc=0 running=0
  pool_lifeline_open "$OUT_DIR" || return
  set -m
  for job in "${rl_jobs[@]}"; do
    while ((running >= RL_PARALLEL)); do reap_one; done
    ((rc == 0)) || break
    read -r -a words <<< "$job"
    pool_start rl_run "${words[@]}"
    running=$((running + 1))
  done
  while ((running > 0)); do reap_one; done
  set +m
  POOL_PIDS=()
  pool_lifeline_close
  return "$rc"
}
# reap_one: wait for one of run_rl_jobs' runs to end; the first failure's status becomes its rc.
reap_one() {
  local status=0
  wait -n || status=$?
  running=$((running - 1))
  ((rc)) || rc=$status
}
say "3-4/6 RL: seeds [$SEEDS], $STEPS steps each; ablations (recurrent.credit in [$ABLATIONS]): seeds" \
  "[$ABLATION_SEEDS], $ABLATION_STEPS steps each; $RL_PARALLEL run(s) at a time, $NGPUS FSDP rank(s) each"
((${#rl_jobs[@]} == 0)) || timed rl_runs run_rl_jobs

# ---- 5. evaluation through the harness -----------------------------------------------------------------------------
say "5/6 evaluation: test split, lengths [$LENGTHS], $EVAL_DOCS documents each ($LONG_DOCS over 64 chunks), greedy"
# The policies' exported checkpoints (the last step's Hugging Face folder of each run) in a model table.
policies=("warm-start=$WARM")
for seed in $SEEDS; do policies+=("rl-seed$seed=$OUT_DIR/runs/rl-seed$seed/checkpoints/global_step_$STEPS/actor/huggingface"); done
long_policies=("${policies[@]}")  # evaluated over 64 chunks too
for mode in $ABLATIONS; do
  for seed in $ABLATION_SEEDS; do
    run="$(ablation_name "$mode")-seed$seed"
    policies+=("$run=$OUT_DIR/runs/$run/checkpoints/global_step_$ABLATION_STEPS/actor/huggingface")
  done
done
"$PYTHON" -m experiments.needle.eval_models "${policies[@]}" --out "$OUT_DIR/policies.yaml" > /dev/null
# Every policy up to 64 chunks; over 64 chunks the warm start and the RL seeds only (the ablations' question is
# answered at the training lengths, and a 256-chunk document costs 257 turns: docs/replication_cpu.md, "What it costs").
all_models="$(IFS=,; echo "${policies[*]%%=*}")"
long_models="$(IFS=,; echo "${long_policies[*]%%=*}")"
# harness MODELS LENGTHS...: the memory agent and the full-context baseline, greedy, resumed item by item.
harness() {
  local models="$1" lengths
  shift
  lengths="$(IFS=,; echo "$*")"
  "$PYTHON" -m taskutils.memory_eval.run --table "$OUT_DIR/policies.yaml" --models "$models" \
    --method memory-boxed,direct-boxed --tasks "$TASK" --lengths "$lengths" --limit "$((EVAL_DOCS > LONG_DOCS ? EVAL_DOCS : LONG_DOCS))" \
    --data-dir "$OUT_DIR/eval_data/eval/test" --results-dir "$OUT_DIR/results" --temperature 0 --no-report \
    --parallel-models "$PARALLEL_MODELS" --trace
}
# (timed runs its command with set +e: each call's failure is returned, not passed over.)
evaluate() {
  if ((${#short_lengths[@]})); then harness "$all_models" "${short_lengths[@]}" || return; fi
  if ((${#long_lengths[@]})); then harness "$long_models" "${long_lengths[@]}" || return; fi
}
timed evaluation evaluate

# ---- 6. report --------------------------------------------------------------------------------------------------------
say "6/6 report"
# The invocation's wall time, stages 1-5 (the report takes a second): the report reads it from timing.jsonl.
record_total
"$PYTHON" -m taskutils.memory_eval.report "$OUT_DIR/results" > /dev/null
"$PYTHON" -m experiments.needle.report "$OUT_DIR/results" --task "$TASK" --run-dir "$OUT_DIR" \
  --eval-data "$OUT_DIR/eval_data/eval/test"
for run in "$OUT_DIR"/runs/*/; do
  # What each run wrote into memory, step by step (its rollout dumps): whole and asked needles, the sampled reward.
  "$PYTHON" -m experiments.needle.rollout_memories "$run" > /dev/null || say "   $run: no memories by step (no dumps)"
  say "training curve: ${run}training.png; memories by step: ${run}memories.png"
done
say "done: $OUT_DIR/results/replication.md, replication.png; stage times: $OUT_DIR/timing.jsonl"
