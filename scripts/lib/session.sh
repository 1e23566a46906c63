# Sourced by the training launchers. A trainer runs in a session of its own with everything Ray starts in it
# (daemons, workers, rollout servers), under scripts/lib/supervise.py, which ends that session when the launcher's
# shell goes, however it goes (start_supervised, stop_supervised); end_session ends a session by pid (only processes
# the launcher started); hold_run_lock keeps a second run off a run folder.

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
  # naming its pid. The lock (flock on DIR/.run.lock) goes with the last process that holds it, however it ends.
  local dir="$1" holder
  mkdir -p "$dir"
  exec {RUN_LOCK_FD}>>"$dir/.run.lock"  # appending: the holder's pid stays readable until the lock is ours
  if ! flock -n "$RUN_LOCK_FD"; then
    holder="$(cat "$dir/.run.lock" 2>/dev/null || true)"
    echo "error: $dir is in use by another training run (${holder:-pid unknown}); wait for it to end, or stop it" >&2
    exit 2
  fi
  printf 'pid %s on %s, started %s\n' "$$" "$(hostname)" "$(date '+%F %T')" > "$dir/.run.lock"
}

start_supervised() {
  # start_supervised LOG [REMOVE_DIR...] -- COMMAND...: run COMMAND in a session of its own under
  # scripts/lib/supervise.py, which appends its output to LOG (and copies it to this shell's stdout), and which ends
  # the session (COMMAND, Ray's processes) and removes each REMOVE_DIR once COMMAND ends or this shell is gone,
  # however it goes (kill -9 included): its lifeline is a FIFO this shell alone holds open. Sets SUPERVISOR_PID
  # (its session id); `wait "$SUPERVISOR_PID"` gives COMMAND's exit status; stop_supervised ends it early.
  local log="$1" fifo_dir; shift
  local remove=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do remove+=(--remove "$1"); shift; done
  shift  # --
  fifo_dir="$(mktemp -d -t lifeline.XXXXXX)"
  mkfifo "$fifo_dir/fifo"
  exec {LIFELINE_FD}<>"$fifo_dir/fifo"  # read-write: opening does not wait for a reader
  # The supervisor and everything it starts must not hold the write end, or the lifeline would not close with us.
  setsid "${PYTHON:-python3}" "$SESSION_LIB_DIR/supervise.py" --lifeline "$fifo_dir/fifo" \
    --log "$log" "${remove[@]}" --remove "$fifo_dir" -- "$@" {LIFELINE_FD}>&- &
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
