"""Process checks shared by the test folders (a plain module beside the root conftest, imported by name)."""

from __future__ import annotations

import os
from pathlib import Path


def session_members(sid: int) -> list[int]:
    """Pids of live processes whose session id is ``sid``: what a launcher started in its own session."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields: state ppid pgrp session ...
            members.append(int(entry))
    return members


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())
