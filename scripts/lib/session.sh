# Sourced by the training launchers: end a trainer that runs in its own session (setsid), with everything Ray
# started in it (daemons, workers, rollout servers), by pid: only processes the launcher started.

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
