"""A run folder another run holds (scripts/lib/session.sh hold_run_lock, run_lock_free; scripts/lib/run_lock.py):
the run that finds it taken stops at once with one line naming the lock, the process holding it with its command,
and what to do. The lock here is real: a launcher shell takes it with hold_run_lock and starts a child that
inherits it, as a trainer does; the test kills the shell to leave the child holding it alone (an orphan of a killed
pipeline, whose lock file still names the dead shell)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from process_helpers import pid_alive

REPO = Path(__file__).resolve().parents[1]
CHILD = "import os, time\nprint(os.getpid(), flush=True)\nwhile True:\n    time.sleep(60)\n"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def held_lock(tmp_path):
    """Start a holder of ``DIR/.run.lock`` (``DIR`` given later); yields a function that takes the lock and returns
    (the launcher's shell, the child's pid, the child's script)."""
    started: list[subprocess.Popen] = []
    children: list[int] = []

    def hold(folder: Path, kill_launcher: bool) -> tuple[int, int, Path]:
        child = tmp_path / "trainer_child.py"
        child.write_text(CHILD)
        launcher = tmp_path / "launcher.sh"
        launcher.write_text(
            textwrap.dedent(
                f"""
                PYTHON={sys.executable}
                source {REPO}/scripts/lib/session.sh
                hold_run_lock {folder}
                "$PYTHON" {child} &
                wait
                """
            )
        )
        proc = subprocess.Popen(["bash", str(launcher)], stdout=subprocess.PIPE, text=True, start_new_session=True)
        started.append(proc)
        pid = int(proc.stdout.readline())  # the child runs: the lock is taken (before it started)
        children.append(pid)
        if kill_launcher:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        return proc.pid, pid, child

    yield hold
    for pid in children:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def expected_line(folder: Path, pid: int, command: str, others: int) -> str:
    also = f" (as do {others} other process(es) of its run)" if others else ""
    return (
        f"error: {folder} is in use by another training run: pid {pid} ({command}) holds its lock "
        f"{folder / '.run.lock'}{also}; wait for that run to end, or stop it: kill {pid}"
    )


def replicate(out: Path, tiny_model_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "QUICK": "1", "SEEDS": "0", "OUT_DIR": str(out), "WARM_START": tiny_model_dir}
    script = REPO / "scripts" / "replicate_cpu.sh"
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=50)


@pytest.mark.parametrize("launcher", ["alive", "killed"])
def test_the_pipeline_names_the_lock_its_holder_and_what_to_do_before_any_work(
    tmp_path, tiny_model_dir, held_lock, launcher
):
    out = tmp_path / "run"
    folder = out / "runs" / "rl-seed0" / "checkpoints"
    shell, child, script = held_lock(folder, kill_launcher=launcher == "killed")
    done = replicate(out, tiny_model_dir)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout == ""
    if launcher == "alive":  # the shell the lock file names: stopping it ends its run; the child holds it too
        line = expected_line(folder, shell, f"bash {tmp_path / 'launcher.sh'}", 1)
    else:  # the file names a dead shell: the process that still holds the lock
        line = expected_line(folder, child, f"{sys.executable} {script}", 0)
    assert done.stderr.splitlines() == [line]
    assert not (out / "data").exists() and not (out / "timing.jsonl").exists() and not (out / "run.jsonl").exists()


def test_the_training_launcher_names_the_lock_its_holder_and_what_to_do(tmp_path, held_lock):
    out = tmp_path / "run"
    shell, child, script = held_lock(out / "checkpoints", kill_launcher=True)
    env = {**os.environ, "OUT_DIR": str(out), "STEPS": "1", "TASK": "memory"}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "train_tiny_cpu.sh")], env=env, capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [expected_line(out / "checkpoints", child, f"{sys.executable} {script}", 0)]
    assert "task=" not in done.stdout and not (out / "data").exists()  # it started nothing


def test_a_free_lock_lets_the_pipeline_past_its_check(tmp_path, tiny_model_dir, held_lock):
    """The lock's holder gone, the same folder passes: the check goes by the lock, not by the file that is left."""
    out = tmp_path / "run"
    folder = out / "runs" / "rl-seed0" / "checkpoints"
    _, child, _ = held_lock(folder, kill_launcher=True)
    os.kill(child, signal.SIGKILL)
    for _ in range(3000):  # gone (a zombie counts as gone): the lock went with it
        if not pid_alive(child):
            break
        time.sleep(0.01)
    env = {"REPO": str(REPO), "PYTHON": sys.executable, "PATH": os.environ["PATH"]}
    check = f"source {REPO}/scripts/lib/session.sh; run_lock_free {folder} && echo free"
    done = subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True, timeout=30)
    assert (folder / ".run.lock").read_text().startswith("pid ")  # the file stays, naming the dead launcher
    assert done.stdout == "free\n" and done.stderr == ""
