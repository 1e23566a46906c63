# Sourced by the one-command pipelines (scripts/replicate_cpu.sh, experiments/calculator/run.sh): their log lines,
# their timed and resumable stages, and the record of what ran. Set before sourcing: PIPELINE (the name in the log
# lines); before the first stage: OUT_DIR (where timing.jsonl and run.jsonl are appended), REPO and PYTHON.

say() { echo "[$PIPELINE $(date +%H:%M:%S)] $*"; }

# stage_line NAME SECONDS RC: one line of timing.jsonl.
stage_line() { printf '{"stage": "%s", "seconds": %d, "rc": %d}\n' "$1" "$2" "$3" >> "$OUT_DIR/timing.jsonl"; }

# timed NAME CMD...: run a stage, append its wall seconds and exit status to timing.jsonl; a failed stage ends the
# pipeline with its exit status (run the same command again to resume).
timed() {
  local name="$1" start rc
  shift
  start=$(date +%s)
  STAGE_NAME="$name" STAGE_START="$start"
  set +e
  "$@"
  rc=$?
  set -e
  STAGE_NAME=""
  stage_line "$name" $(($(date +%s) - start)) "$rc"
  if [[ "$rc" != 0 ]]; then say "stage '$name' failed (exit $rc); run the same command again to resume"; exit "$rc"; fi
}

# A run stopped by Ctrl-C or kill (of its process group: the stage's processes get the signal too, and bash acts
# on it once the stage's command has exited) records the stage it stopped with the signal's exit status, and the
# invocation's total, so that the stage times of a resumed run add up to its wall time.
on_signal() {
  local rc="$1" pid
  trap - INT TERM
  # Runs started side by side, each in a process group of its own (POOL_PIDS), get the signal too; waited for, so
  # that each ends its trainer before the pipeline's last lines.
  for pid in "${POOL_PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  ((${#POOL_PIDS[@]} == 0)) || wait "${POOL_PIDS[@]}" 2>/dev/null || true
  if [[ -n "${STAGE_NAME:-}" ]]; then
    stage_line "$STAGE_NAME" $(($(date +%s) - STAGE_START)) "$rc"
    say "stage '$STAGE_NAME' stopped by a signal (exit $rc); run the same command again to resume"
  fi
  [[ -z "${RUN_START:-}" ]] || record_total "$rc"
  exit "$rc"
}
POOL_PIDS=()  # the process groups of stages run side by side (scripts/replicate_cpu.sh, run_rl_jobs)

# Stages side by side are in process groups of their own, which a kill of this shell's group (kill -9 included: no
# trap runs) does not reach. Their runs watch a pipe instead whose only writer is this shell: its read end is
# RUN_PARENT_LIFELINE_FD (inherited; a supervised run ends when it closes: scripts/lib/session.sh, start_supervised),
# its write end POOL_LIFELINE, closed in each stage's shell (pool_start), so that it closes with this shell.
# pool_lifeline_open DIR: open both ends (a FIFO made in DIR and removed at once: nothing is left on disk).
pool_lifeline_open() {
  local fifo
  fifo="$(mktemp -u "$1/.lifeline.XXXXXX")"
  mkfifo "$fifo" || return
  exec {POOL_LIFELINE}<>"$fifo" {RUN_PARENT_LIFELINE_FD}<"$fifo"  # read-write first: opening does not wait
  rm -f "$fifo"
}
# pool_start CMD...: CMD in the background (in a process group of its own under set -m), without the write end.
pool_start() {
  { exec {POOL_LIFELINE}>&-; "$@"; } &
  POOL_PIDS+=("$!")
}
# pool_lifeline_close: the pool is done: close both ends.
pool_lifeline_close() {
  exec {POOL_LIFELINE}>&- {RUN_PARENT_LIFELINE_FD}<&-
  POOL_LIFELINE="" RUN_PARENT_LIFELINE_FD=""
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# last_step RUN_DIR: the last checkpointed step of a training run folder (0 if none).
last_step() { cat "$1/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0; }

# record_run WORDS...: what ran, one line of run.jsonl per invocation (a resumed run adds one): the commit (with
# "+changes" when the tree differs from it), the command line (WORDS joined by spaces: the settings that shape the
# experiment, then the command), the cores (getconf: nproc would read an exported OMP_NUM_THREADS=1), the processor
# (a build's weights depend on it: docs/replication_cpu_notebook.md, "The build on another machine"), and when.
# Also starts the invocation's clock for record_total.
record_run() {
  local commit
  RUN_START=$(date +%s)
  commit="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  [[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]] || commit+="+changes"
  "$PYTHON" - "$OUT_DIR/run.jsonl" "$commit" "$@" "$(getconf _NPROCESSORS_ONLN)" <<'PY'
import json, sys, time
path, commit, *command, cores = sys.argv[1:]
from experiments.sft import processor  # the build's record names it the same way
line = {"commit": commit, "command": " ".join(command).strip(), "cores": int(cores), "processor": processor(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
open(path, "a").write(json.dumps(line) + "\n")
PY
}

# record_total [RC]: the invocation's wall time since record_run, as the "total" line of timing.jsonl (RC: the
# invocation's exit status, 0 unless a signal stopped it).
record_total() { stage_line total $(($(date +%s) - RUN_START)) "${1:-0}"; }
