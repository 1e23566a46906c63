"""Who holds a run folder's lock (scripts/lib/session.sh, ``hold_run_lock``): the line that stops a second run.

    python scripts/lib/run_lock.py DIR [--exclude PID]...

Prints one line for a run that found ``DIR/.run.lock`` taken: the live process holding it, with its command, and
what to do (wait, or stop that pid). The lock is a ``flock`` on an open file, so it is held by every process that
has the file open: the launcher that took it (the pid the file names) and what it started and inherited the file,
such as a trainer that outlived its launcher's shell. Those are found in ``/proc/*/fd``; the pid to stop is the
launcher when it is alive (its exit ends the run: scripts/lib/session.sh), else the run's supervisor
(scripts/lib/supervise.py: a TERM ends its session), else the oldest holder. When no holder is visible (another
user's process, another machine on shared storage), the line quotes what the lock file says.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

LOCK_NAME = ".run.lock"
COMMAND_CHARS = 200  # of a holder's command line in the message


def holders(lock: Path, exclude: set[int]) -> list[int]:
    """Live processes (other than ``exclude``) with ``lock`` open, oldest first."""
    target = os.path.realpath(lock)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    found.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(found, key=started)


def started(pid: int) -> int:
    """Clock ticks after boot at which ``pid`` started (field 22 of /proc/PID/stat); 0 when unreadable."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def command(pid: int) -> str:
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."


def busy_line(folder: Path, exclude: set[int]) -> str:
    """The message for a run that found ``folder``'s lock held."""
    lock = folder / LOCK_NAME
    try:
        recorded = lock.read_text().strip()
    except OSError:
        recorded = ""
    live = holders(lock, exclude)
    if not live:
        says = f"its lock {lock} says: {recorded}" if recorded else f"its lock {lock} names no holder"
        return f"error: {folder} is in use by another training run ({says}); wait for it to end, or stop it"
    named = re.match(r"pid (\d+)", recorded)
    launcher = int(named.group(1)) if named else None
    supervisors = [pid for pid in live if "supervise.py" in command(pid)]
    pick = launcher if launcher in live else (supervisors or live)[0]
    others = f" (as do {len(live) - 1} other process(es) of its run)" if len(live) > 1 else ""
    return (
        f"error: {folder} is in use by another training run: pid {pick} ({command(pick)}) holds its lock "
        f"{lock}{others}; wait for that run to end, or stop it: kill {pick}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the run folder whose .run.lock is held")
    parser.add_argument("--exclude", type=int, action="append", default=[], help="a pid not to name (the caller)")
    args = parser.parse_args(argv)
    print(busy_line(args.folder.absolute(), {os.getpid(), *args.exclude}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
