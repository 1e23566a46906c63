"""A training run dies with whatever started it (scripts/lib/session.sh, scripts/lib/supervise.py): killing the
launcher with ``kill -9``, its whole process group or only its shell, stops the trainer and every process it
started (Ray's daemons and workers, which run in the trainer's own session) within seconds and removes their
temporary folders; the log keeps what the trainer printed, also after the launcher died; two runs never share a
checkpoint folder (the second stops with status 2, naming the first).

Real processes throughout: the real launcher and trainer (``scripts/train_tiny_cpu.sh``, up to Ray and its
workers), and for the log a launcher that sources the same shell library around a small Python program that
outlives its parent's death long enough to print. Every wait is on an event (a line in a file, a process gone),
polled with a bound, never a pause.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from process_helpers import pid_alive, session_members

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "train_tiny_cpu.sh"
POLL_S = 0.1


def wait_for(what: str, condition, timeout: float):
    """Poll ``condition`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL_S)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def launcher_line(path: Path, pattern: str) -> re.Match | None:
    return re.search(pattern, path.read_text()) if path.exists() else None


def kill_launcher(proc: subprocess.Popen, how: str) -> None:
    if how == "group":
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher's whole process group
    else:
        os.kill(proc.pid, signal.SIGKILL)  # only its shell
    proc.wait()


# ---- the supervisor, around a small program (seconds) ----

PROGRAM = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    # a grandchild in a process group of its own, as Ray starts its workers
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
    def stopping(signum, frame):
        print(f"the trainer got {signal.Signals(signum).name}, after its launcher died", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, stopping)
    print(f"started worker={worker.pid}", flush=True)
    while True:
        time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["group", "shell"])
def test_killing_the_launcher_stops_a_supervised_run_and_keeps_its_log(tmp_path, how):
    remove = tmp_path / "scratch"  # stands for Ray's temporary folder
    remove.mkdir()
    (tmp_path / "program.py").write_text(PROGRAM)
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(
        textwrap.dedent(
            f"""
            set -euo pipefail
            PYTHON={sys.executable}
            source {REPO}/scripts/lib/session.sh
            start_supervised {tmp_path}/train.log {remove} -- "$PYTHON" {tmp_path}/program.py
            echo "session=$SUPERVISOR_PID"
            wait "$SUPERVISOR_PID"
            """
        )
    )
    out = tmp_path / "launcher.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            ["bash", str(launcher)], stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
    sid = int(wait_for("the supervisor's session", lambda: launcher_line(out, r"session=(\d+)"), 60).group(1))
    worker = int(wait_for("the worker", lambda: launcher_line(tmp_path / "train.log", r"worker=(\d+)"), 60).group(1))
    assert os.getsid(worker) == sid != os.getsid(proc.pid)  # the run is out of reach of the launcher's signals
    kill_launcher(proc, how)
    wait_for("the run's processes to be gone", lambda: not session_members(sid), 60)
    assert not pid_alive(worker) and not remove.exists()
    log = (tmp_path / "train.log").read_text().splitlines()
    # The trainer's last words, printed after its launcher died, are in the log; then the supervisor's.
    assert log[0].startswith("[supervise] trainer pid=") and log[1] == f"started worker={worker}"
    assert log[2:] == [
        "[supervise] the launcher is gone (its lifeline closed): stopping the trainer and its Ray processes",
        "the trainer got SIGTERM, after its launcher died",
        "[supervise] done: exit status 129; no process of the run left",
    ]


POOL = """
set -euo pipefail
PYTHON={python}
PIPELINE=demo
source {repo}/scripts/lib/stages.sh
source {repo}/scripts/lib/session.sh
launch() {{  # one run of the pool, launched as scripts/train_tiny_cpu.sh launches its trainer
  start_supervised {tmp}/train.log {tmp}/scratch -- "$PYTHON" {tmp}/program.py
  echo "session=$SUPERVISOR_PID"
  wait "$SUPERVISOR_PID"
}}
pool_lifeline_open {tmp}
set -m
pool_start launch
echo "pool=${{POOL_PIDS[0]}}"
wait
"""


@pytest.mark.timeout(120)
def test_killing_a_pipelines_group_stops_the_runs_it_started_side_by_side(tmp_path):
    """scripts/replicate_cpu.sh starts its RL runs in process groups of their own (set -m: pool_start), out of reach
    of a kill of its own group. Each run's supervisor also watches the pipeline's lifeline (RUN_PARENT_LIFELINE_FD):
    kill -9 of the pipeline's group leaves the run's launcher alive, and the run stops all the same, its log saying
    why. Without the watch, the run trained on to its end (an orphan holding its folder's lock)."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "program.py").write_text(PROGRAM)
    (tmp_path / "pipeline.sh").write_text(POOL.format(python=sys.executable, repo=REPO, tmp=tmp_path))
    out = tmp_path / "pipeline.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(
            ["bash", str(tmp_path / "pipeline.sh")], stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
    sid = None
    try:
        pool = int(wait_for("the pool's run", lambda: launcher_line(out, r"pool=(\d+)"), 60).group(1))
        sid = int(wait_for("the supervisor's session", lambda: launcher_line(out, r"session=(\d+)"), 60).group(1))
        worker = int(wait_for("the worker", lambda: launcher_line(tmp_path / "train.log", r"worker=(\d+)"), 60)[1])
        assert os.getpgid(pool) == pool != proc.pid  # the run's launcher: a process group of its own
        kill_launcher(proc, "group")
        wait_for("the run's processes to be gone", lambda: not session_members(sid), 60)
        wait_for("the run's launcher to end", lambda: not pid_alive(pool), 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if sid is not None and session_members(sid):  # a run left behind (the failure above): end it here
            os.kill(sid, signal.SIGTERM)
    assert not pid_alive(worker) and not (tmp_path / "scratch").exists()
    assert (tmp_path / "train.log").read_text().splitlines()[2:] == [
        "[supervise] the launcher's parent pipeline is gone (its lifeline closed): stopping the trainer and its Ray "
        "processes",
        "the trainer got SIGTERM, after its launcher died",
        "[supervise] done: exit status 129; no process of the run left",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lifeline")]  # the FIFO left nothing on disk


def test_a_finished_command_leaves_nothing_and_gives_its_status(tmp_path):
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(
        f"PYTHON={sys.executable}\nsource {REPO}/scripts/lib/session.sh\n"
        f'start_supervised {tmp_path}/train.log {tmp_path}/gone -- "$PYTHON" -c "print(\'bye\'); raise SystemExit(7)"\n'
        'wait "$SUPERVISOR_PID"; rc=$?; stop_supervised; exit $rc\n'
    )
    (tmp_path / "gone").mkdir()
    result = subprocess.run(["bash", str(launcher)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 7 and "bye" in result.stdout  # the output is copied to the launcher's stdout too
    assert not (tmp_path / "gone").exists()
    assert (tmp_path / "train.log").read_text().splitlines()[1:] == [
        "bye",
        "[supervise] done: exit status 7; no process of the run left",
    ]


KILLED = "[supervise] killed: "


def test_a_killed_supervisor_leaves_its_launcher_to_say_how_the_run_ended(tmp_path):
    # kill -9 of the supervisor: it cannot write its last line, and train.log ended on what the trainer printed
    # last (a progress bar). The launcher's shell outlives it: stop_supervised ends the run and says so.
    (tmp_path / "program.py").write_text(PROGRAM)
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(
        f"PYTHON={sys.executable}\nsource {REPO}/scripts/lib/session.sh\ntrap stop_supervised EXIT\n"
        f'start_supervised {tmp_path}/train.log {tmp_path}/scratch -- "$PYTHON" {tmp_path}/program.py\n'
        'echo "session=$SUPERVISOR_PID"\nwait "$SUPERVISOR_PID"\n'
    )
    (tmp_path / "scratch").mkdir()
    out = tmp_path / "launcher.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(["bash", str(launcher)], stdout=stdout, stderr=subprocess.STDOUT)
    try:
        sid = int(wait_for("the supervisor's session", lambda: launcher_line(out, r"session=(\d+)"), 60).group(1))
        log = tmp_path / "train.log"
        worker = int(wait_for("the worker", lambda: launcher_line(log, r"worker=(\d+)"), 60).group(1))
        os.kill(sid, signal.SIGKILL)  # the supervisor leads its session: its pid is the session's id
        assert proc.wait(timeout=120) == 137  # the launcher's wait: 128 + SIGKILL, the supervisor's end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not session_members(sid) and not pid_alive(worker)  # the launcher ended what was left of the run
    lines = log.read_text().splitlines()
    assert lines[1:] == [
        f"started worker={worker}",
        f"{KILLED}the supervisor (pid {sid}) was killed before it wrote how the run ended; its launcher ended what "
        "was left of the run",
    ]


def test_the_next_run_says_when_the_last_one_left_no_last_line(tmp_path):
    # Supervisor and launcher both killed with -9: nothing was left to write; the next run into the log says it.
    log = tmp_path / "train.log"
    log.write_bytes(b"[supervise] trainer pid=12\nepoch 1: 40%|####      | 4/10\repoch 1: 50%|#####     | 5/10")
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(
        f"PYTHON={sys.executable}\nsource {REPO}/scripts/lib/session.sh\n"
        f'start_supervised {log} -- "$PYTHON" -c "print(\'bye\')"\n'
        'wait "$SUPERVISOR_PID"; rc=$?; stop_supervised; exit $rc\n'
    )
    assert subprocess.run(["bash", str(launcher)], capture_output=True, timeout=120).returncode == 0
    lines = log.read_bytes().decode().split("\n")  # read_text would split at the bar's carriage return
    assert lines[:3] == [
        "[supervise] trainer pid=12",
        "epoch 1: 40%|####      | 4/10\repoch 1: 50%|#####     | 5/10",
        f"{KILLED}the run above ended without a last line: its supervisor was killed (kill -9) or the machine stopped",
    ]
    assert lines[3].startswith("[supervise] trainer pid=") and lines[4:] == [
        "bye",
        "[supervise] done: exit status 0; no process of the run left",
        "",
    ]
    # A log that ends with how its run ended gets no such line: the same command again adds only its own run.
    subprocess.run(["bash", str(launcher)], capture_output=True, timeout=120, check=True)
    assert log.read_text().count(KILLED) == 1


# ---- the real launcher and trainer (a start-up each: Ray up, its workers spawned) ----


def start_launcher(out_dir: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "STEPS": "2", "OUT_DIR": str(out_dir), "TASK": "memory"}
    env.pop("VERL_PLATFORM", None)
    env.pop("RAY_ADDRESS", None)
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir.parent / f"{out_dir.name}.launcher.log"
    with open(output, "w") as stdout:
        proc = subprocess.Popen(
            ["bash", str(SCRIPT)], env=env, stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, output


def ray_is_up(sid: int) -> bool:
    """The run's raylet and at least one Ray worker process are alive in its session."""
    lines = [cmdline(pid) for pid in session_members(sid)]
    return any("/raylet " in line for line in lines) and any("default_worker.py" in line for line in lines)


@pytest.mark.trainer
@pytest.mark.slow(seconds=120)
@pytest.mark.parametrize("how", ["group", "shell"])
def test_killing_the_launcher_stops_the_trainer_and_ray(tmp_path, how):
    out_dir = tmp_path / "run"
    proc, output = start_launcher(out_dir)
    try:
        started = wait_for("the launcher's first line", lambda: launcher_line(output, r"ray_tmp=(\S+)"), 120)
        ray_tmp = Path(started.group(1))
        sid = int(wait_for("the trainer's session", lambda: launcher_line(output, r"trainer session=(\d+)"), 120)[1])
        wait_for("Ray and its workers", lambda: ray_is_up(sid), 400)

        # A second run on the same folder stops before it does anything, naming the first.
        second = subprocess.run(
            ["bash", str(SCRIPT)],
            env={**os.environ, "OUT_DIR": str(out_dir), "STEPS": "2"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr
        # (the launcher's shell, named by the lock file, alive: the pid to stop; scripts/lib/run_lock.py)
        said = f"error: {out_dir}/checkpoints is in use by another training run: pid {proc.pid} (bash {SCRIPT}) holds"
        assert said in second.stderr and second.stderr.rstrip().endswith(f"or stop it: kill {proc.pid}")
        assert "train_tiny_cpu] task=" not in second.stdout  # it did not start

        kill_launcher(proc, how)
        began = time.monotonic()
        wait_for("the trainer and Ray's processes to be gone", lambda: not session_members(sid), 60)
        stopped_in = time.monotonic() - began
        assert not ray_tmp.exists()  # Ray's temporary folder went with them
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (out_dir / "train.log").read_text()
    assert "ray init kwargs" in log  # what the trainer printed before the kill
    assert log.splitlines()[-1] == "[supervise] done: exit status 129; no process of the run left"
    print(f"kill -9 of the launcher's {how}: the run was gone in {stopped_in:.1f} s")
    # The lock went with the run: the folder can be taken again.
    with open(out_dir / "checkpoints" / ".run.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
