"""A process's memory and CPU, read from /proc (Linux), for the benchmarks that measure a server from outside it
(scripts/bench_serve.py): its resident memory now and at its peak, its CPU time exact to the nanosecond or in clock
ticks, its peak while a run goes on, and when it is idle again."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, KiB: its resident memory now and at its peak."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used, all its threads, living or ended (utime + stime of /proc/PID/stat): in clock
    ticks (10 ms), too coarse for one request; :func:`thread_cpu` is exact."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def thread_cpu(pid: int) -> tuple[float, frozenset[str]]:
    """CPU time of a process's living threads, in nanoseconds made seconds (the first field of each
    /proc/PID/task/TID/schedstat), and which threads those were: between two readings with the same threads it
    is exact, where per-request differences of :func:`cpu_seconds` are ticks apart (+-0.3 ms over 150 requests)."""
    total, tids = 0, []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            tids.append(tid)
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended while this read
    return total / 1e9, frozenset(tids)


def cpu_between(before: tuple[float, frozenset[str], float], after: tuple[float, frozenset[str], float]) -> float:
    """CPU seconds between two readings of ``(thread_cpu, cpu_seconds)``: exact when the same threads lived at
    both, in ticks otherwise (a thread ended between them and took its time along)."""
    return after[0] - before[0] if after[1] == before[1] else after[2] - before[2]


def reset_peak(pid: int) -> None:
    """Reset a process's peak RSS to its current RSS (Linux: writing 5 to clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class Sampler:
    """The endpoint's RSS, read every ``interval`` seconds in a thread: its peak while the soak runs."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval, self.peak_kib = pid, interval, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            self.peak_kib = max(self.peak_kib, rss_kib(self.pid)[0])

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def wait_idle(pid: int, limit: float, window: float = 1.0, busy: float = 0.05) -> float | None:
    """Seconds until the endpoint uses under ``busy`` CPU seconds over a ``window``; None past ``limit``."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        before = cpu_seconds(pid)
        time.sleep(window)
        if cpu_seconds(pid) - before < busy:
            return time.perf_counter() - start - window
    return None
