"""Run a training command so that it dies with whatever started it (scripts/lib/session.sh, ``start_supervised``).

    python scripts/lib/supervise.py --lifeline FIFO --log FILE [--watch-fd N] [--remove DIR]... [--grace S] \
        -- COMMAND...

This process leads a session of its own (the launcher starts it with ``setsid``) and runs COMMAND in it; Ray's
daemons and workers, started by the trainer, stay in that session too. So a signal to the launcher's process group
(Ctrl-C, ``kill -- -PGID``) does not reach the run, and the run does not stop it either: the launcher says when to
stop through the lifeline, a FIFO whose only writer is the launcher's shell. When that writer is gone, however it
went (an exit, a trap, ``kill -9`` of the shell or of its whole group), the FIFO reads end-of-file, and this
process ends every other process of its session (TERM, then KILL after ``--grace`` seconds), removes the
``--remove`` folders (Ray's temporary folder) and exits. It does the same when COMMAND ends on its own, for what
COMMAND left behind, and on SIGTERM/SIGINT/SIGHUP to itself. ``--watch-fd N``: a second lifeline, the read end of
a pipe inherited as file descriptor N whose writer is whatever started the launcher (scripts/replicate_cpu.sh, for
the runs it starts side by side in process groups of their own, which a kill of its own group does not reach): its
end-of-file stops the run the same way.

COMMAND's output (stdout and stderr) is appended to ``--log`` by this process, and copied to its own stdout while
that can be written: the log keeps everything the trainer printed, also once the launcher's terminal or pipe is
gone. Exit status: COMMAND's; 128 + the signal when stopped by one (the launcher gone: 128 + SIGHUP).

The log's last line says how the run ended: this process's ``[supervise] done: exit status N; ...``. Killed itself
(``kill -9``), it cannot write it: the launcher's shell, which outlives it, then writes ``[supervise] killed: ...``
(``python scripts/lib/supervise.py --close-log FILE --why TEXT``: a line appended only when the log does not end
with one of these two), and when nothing outlived it, the next run does so before its own first line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.05  # how often the processes being ended are looked at again
KILL_WAIT_S = 30.0  # after KILL: only a process in uninterruptible sleep takes longer


FINAL_LINES = ("[supervise] done: ", "[supervise] killed: ")  # the lines that say how a run ended
TAIL_BYTES = 65536  # of the log, read for its last line (a progress bar's many redraws fit in it)


def last_line(log: Path) -> str | None:
    """The last non-blank line of ``log`` (a progress bar's redraws, split at their carriage returns, are lines);
    None for a missing or blank log."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    lines = [line for line in tail.replace("\r", "\n").split("\n") if line.strip()]
    return lines[-1] if lines else None


def close_log(log: Path, why: str) -> bool:
    """Append ``[supervise] killed: WHY`` to ``log`` when it holds a run that did not say how it ended (its last
    line not one of :data:`FINAL_LINES`); returns whether it did."""
    last = last_line(log)
    if last is None or last.startswith(FINAL_LINES):
        return False
    with open(log, "ab+") as f:
        f.seek(-1, os.SEEK_END)  # not empty: it has a last line
        start = b"" if f.read(1) == b"\n" else b"\n"  # a progress bar's last redraw has no newline
        f.write(start + f"{FINAL_LINES[1]}{why}\n".encode())
    return True


def session_members(sid: int, exclude: int) -> list[int]:
    """Live processes (zombies excluded) of session ``sid`` other than ``exclude``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry))
    return members


class Stop(Exception):
    def __init__(self, signum: int, why: str) -> None:
        super().__init__(why)
        self.signum = signum


def _raise_stop(signum: int, _frame: object) -> None:
    raise Stop(signum, f"received {signal.Signals(signum).name}")


class Run:
    """COMMAND in this session, its output going to the log (and to our stdout while it can be written)."""

    def __init__(self, command: list[str], log: Path, lifelines: list[int]) -> None:
        self.log = open(log, "ab")  # noqa: SIM115 (open for the life of the run)
        self.echo: int | None = sys.stdout.fileno()
        self.lifelines = lifelines
        self.child: subprocess.Popen | None = None
        self.output_open = False
        self.selector = selectors.DefaultSelector()
        for lifeline in lifelines:
            self.selector.register(lifeline, selectors.EVENT_READ, "lifeline")
        self.command = command

    def start(self) -> None:
        self.child = subprocess.Popen(
            self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.output_open = True
        self.selector.register(self.child.stdout, selectors.EVENT_READ, "output")
        self.say(f"trainer pid={self.child.pid}, in session {os.getsid(0)} with its Ray processes")

    def write(self, data: bytes) -> None:
        self.log.write(data)
        self.log.flush()
        if self.echo is not None:
            try:
                os.write(self.echo, data)
            except OSError:  # the terminal or the pipe is gone: the log goes on
                self.echo = None

    def say(self, line: str) -> None:
        self.write(f"[supervise] {line}\n".encode())

    def pump(self, timeout: float | None) -> None:
        """Copy COMMAND's output until it ends (every writer of the pipe gone) or ``timeout`` seconds pass. Raises
        :class:`Stop` when a lifeline closes (the launcher, or what started it, is gone), while they are watched."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.output_open:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            for key, _ in self.selector.select(left):
                if key.data == "lifeline":
                    if os.read(key.fd, 4096) == b"":  # every writer closed it: the launcher is gone
                        self.selector.unregister(key.fd)
                        who = "the launcher is" if key.fd == self.lifelines[0] else "the launcher's parent pipeline is"
                        raise Stop(signal.SIGHUP, f"{who} gone (its lifeline closed)")
                    continue
                data = os.read(self.child.stdout.fileno(), 65536)
                if not data:
                    self.output_open = False
                    self.selector.unregister(self.child.stdout)
                    break
                self.write(data)

    def end_session(self, grace: float) -> list[int]:
        """TERM every other process of this session, KILL those left after ``grace`` seconds, copying what they
        still print; returns what is alive after that (normally nothing). The trainer, our child, is reaped."""
        me, sid = os.getpid(), os.getsid(0)
        for lifeline in self.lifelines:  # from here on, nothing stops the clean-up
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(lifeline)
        left = session_members(sid, me)
        for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + wait
            while True:
                self.pump(POLL_S if self.output_open else 0)  # their last words go to the log
                if not self.output_open:
                    time.sleep(POLL_S)
                if self.child is not None:
                    self.child.poll()
                left = session_members(sid, me)
                if not left or time.monotonic() > deadline:
                    break
            if not left:
                break
        self.pump(0)
        return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lifeline", help="a FIFO the launcher holds open for writing")
    parser.add_argument("--log", type=Path, help="COMMAND's output is appended here")
    parser.add_argument(
        "--watch-fd", type=int, default=None, help="an inherited read end of a pipe: its end-of-file stops the run too"
    )
    parser.add_argument(
        "--close-log", type=Path, help="no run: end this log with a 'killed' line if it has no last line"
    )
    parser.add_argument("--why", default="the supervisor was killed", help="with --close-log: how the run ended")
    parser.add_argument("--remove", action="append", default=[], help="a folder removed once the run is over")
    parser.add_argument("--grace", type=float, default=3.0, help="seconds between TERM and KILL (default 3)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args(argv)
    if args.close_log is not None:
        close_log(args.close_log, args.why)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.lifeline is None or args.log is None:
        parser.error("a run needs --lifeline, --log and a COMMAND after --")
    # A run before this one whose supervisor was killed along with its launcher left no last line: say so first.
    close_log(
        args.log, "the run above ended without a last line: its supervisor was killed (kill -9) or the machine stopped"
    )
    with contextlib.suppress(PermissionError):  # already a session leader when started by `setsid`
        os.setsid()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed stdout is an error on write, handled in Run.write
    lifeline = os.open(args.lifeline, os.O_RDONLY | os.O_NONBLOCK)  # the launcher holds it open: no EOF yet
    os.unlink(args.lifeline)  # nothing else opens it
    lifelines = [lifeline]
    if args.watch_fd is not None:  # (its readers share it: nothing is ever written, so readable means the end)
        lifelines.append(args.watch_fd)
    run = Run(command, args.log, lifelines)
    rc = 1
    try:
        run.start()
        run.pump(None)
        rc = run.child.wait()
    except Stop as stop:
        rc = 128 + stop.signum
        run.say(f"{stop}: stopping the trainer and its Ray processes")
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)  # the clean-up is not cut short
        left = run.end_session(args.grace)
        for folder in args.remove:
            shutil.rmtree(folder, ignore_errors=True)
        run.say(
            f"done: exit status {rc}; " + (f"still alive after KILL: {left}" if left else "no process of the run left")
        )
        run.log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
