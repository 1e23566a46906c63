# Sourced by the training launchers. A trainer runs in a session of its own with everything Ray starts in it
# (daemons, workers, rollout servers), under scripts/lib/supervise.py, which ends that session when the launcher's
# shell goes, however it goes (start_supervised, stop_supervised); end_session ends a session by pid (only processes
# the launcher started); hold_run_lock keeps a second run off a run folder, run_lock_free asks whether one holds it.

# This folder, absolute, as it is when sourced: the launchers may change directory before start_supervised.
SESSION_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

session_pids() {
  # Pids of the live processes in session $1 (read from /proc/<pid>/stat: "... ) state ppid pgrp session ...").
  local sid="$1" f stat fields
  for f in /proc/[0-9]*/stat; do
    # the whole file (a name may hold a newline), without a fork per process: a scan ~0.15 s, not ~1.5 s
    stat=""
    { read -r -d '' stat < "$f"; } 2>/dev/null
    [[ -n "$stat" ]] || continue
    read -r -a fields <<< "${stat##*) }"
    if [[ "${fields[3]}" == "$sid" && "${fields[0]}" != "Z" ]]; then f="${f#/proc/}"; echo "${f%/stat}"; fi
  done
}

end_session() {
  # end_session SID GRACE_SECONDS: TERM every live process of session SID, then KILL what is left after the grace.
  local sid="$1" grace="$2" pids
  [[ -n "$sid" ]] || return 0
  pids="$(session_pids "$sid")"
  [[ -n "$pids" ]] || return 0
  kill -TERM $pids 2>/dev/null || true
  sleep "$grace"
  pids="$(session_pids "$sid")"
  [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
}

hold_run_lock() {
  # hold_run_lock DIR: hold an exclusive lock on DIR (a checkpoint folder) for as long as this shell or a process it
  # started lives, so that two runs never write one folder; another run holding it stops this one with status 2,
  # naming the process that holds it, its command and what to do (scripts/lib/run_lock.py). The lock (flock on
  # DIR/.run.lock) goes with the last process that holds it, however it ends.
  local dir="$1"
  mkdir -p "$dir"
  exec {RUN_LOCK_FD}>>"$dir/.run.lock"  # appending: the holder's pid stays readable until the lock is ours
  if ! flock -n "$RUN_LOCK_FD"; then
    "${PYTHON:-python3}" "$SESSION_LIB_DIR/run_lock.py" "$dir" --exclude "$BASHPID" >&2
    exit 2
  fi
  printf 'pid %s on %s, started %s\n' "$$" "$(hostname)" "$(date '+%F %T')" > "$dir/.run.lock"
}

run_lock_free() {
  # run_lock_free DIR: whether no run holds DIR's lock (hold_run_lock); when one does, its line goes to stderr. For
  # a pipeline's check before any work (scripts/replicate_cpu.sh); takes nothing and creates nothing.
  local dir="$1" fd
  [[ -f "$dir/.run.lock" ]] || return 0
  exec {fd}<"$dir/.run.lock"
  if flock -n "$fd"; then exec {fd}<&-; return 0; fi
  exec {fd}<&-
  "${PYTHON:-python3}" "$SESSION_LIB_DIR/run_lock.py" "$dir" --exclude "$BASHPID" >&2
  return 1
}

start_supervised() {
  # start_supervised LOG [REMOVE_DIR...] -- COMMAND...: run COMMAND in a session of its own under
  # scripts/lib/supervise.py, which appends its output to LOG (and copies it to this shell's stdout), and which ends
  # the session (COMMAND, Ray's processes) and removes each REMOVE_DIR once COMMAND ends or this shell is gone,
  # however it goes (kill -9 included): its lifeline is a FIFO this shell alone holds open. Sets SUPERVISOR_PID
  # (its session id); `wait "$SUPERVISOR_PID"` gives COMMAND's exit status; stop_supervised ends it early.
  # RUN_PARENT_LIFELINE_FD (set by a pipeline that starts this launcher: scripts/replicate_cpu.sh): an inherited
  # read end of a pipe whose writer is that pipeline; the supervisor ends the run when it closes too.
  local log="$1" fifo_dir; shift
  local remove=() watch=()
  [[ -z "${RUN_PARENT_LIFELINE_FD:-}" ]] || watch=(--watch-fd "$RUN_PARENT_LIFELINE_FD")
  while [[ $# -gt 0 && "$1" != "--" ]]; do remove+=(--remove "$1"); shift; done
  shift  # --
  fifo_dir="$(mktemp -d -t lifeline.XXXXXX)"
  mkfifo "$fifo_dir/fifo"
  exec {LIFELINE_FD}<>"$fifo_dir/fifo"  # read-write: opening does not wait for a reader
  # The supervisor and everything it starts must not hold the write end, or the lifeline would not close with us.
  setsid "${PYTHON:-python3}" "$SESSION_LIB_DIR/supervise.py" --lifeline "$fifo_dir/fifo" \
    --log "$log" ${watch[@]+"${watch[@]}"} "${remove[@]}" --remove "$fifo_dir" -- "$@" {LIFELINE_FD}>&- &
  SUPERVISOR_PID=$!
  SUPERVISOR_FIFO_DIR="$fifo_dir"
  SUPERVISOR_LOG="$log"
}

stop_supervised() {
  # Close the lifeline (the supervisor then ends the run and removes its folders) and wait for the supervisor; if
  # the supervisor itself is gone, end what is left of its session here.
  [[ -n "${SUPERVISOR_PID:-}" ]] || return 0
  if [[ -n "${LIFELINE_FD:-}" ]]; then exec {LIFELINE_FD}>&-; LIFELINE_FD=""; fi
  wait "$SUPERVISOR_PID" 2>/dev/null || true
  end_session "$SUPERVISOR_PID" 2
  # The supervisor ends the log with how the run ended; killed with -9 it could not: this shell says so instead.
  "${PYTHON:-python3}" "$SESSION_LIB_DIR/supervise.py" --close-log "$SUPERVISOR_LOG" --why "the supervisor (pid \
$SUPERVISOR_PID) was killed before it wrote how the run ended; its launcher ended what was left of the run" || true
  rm -rf "${SUPERVISOR_FIFO_DIR:-}"
}
