"""scripts/lib/stages.sh, the stage helpers of the one-command pipelines (scripts/replicate_cpu.sh,
experiments/calculator/run.sh): the lines they append to timing.jsonl and run.jsonl (read by
experiments/needle/report.py), a failed stage's exit, a stage stopped by a signal, a run folder's last step."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
set -euo pipefail
PIPELINE=demo
source "$REPO/scripts/lib/stages.sh"
record_run "STEPS=2 SEEDS='0 1'" "bash demo.sh $*"
say "hello"
echo "last: $(last_step "$OUT_DIR/run") $(last_step "$OUT_DIR/none")"
timed good true
record_total
timed bad bash -c 'exit 3'
echo "not reached"
"""


def test_the_stage_helpers_write_what_the_report_reads(tmp_path: Path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("7\n")
    env = {"REPO": str(REPO), "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", SCRIPT, "demo", "x=1"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3, done.stderr  # the failed stage's exit status
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[demo ") and lines[0].endswith("] hello")
    assert lines[1] == "last: 7 0"
    assert lines[2].endswith("] stage 'bad' failed (exit 3); run the same command again to resume")
    assert "not reached" not in done.stdout
    timing = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    assert [(t["stage"], t["rc"]) for t in timing] == [("good", 0), ("total", 0), ("bad", 3)]
    assert all(isinstance(t["seconds"], int) and t["seconds"] >= 0 for t in timing)
    (run,) = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert run["command"] == "STEPS=2 SEEDS='0 1' bash demo.sh x=1"
    assert set(run) == {"commit", "command", "cores", "processor", "started"} and run["cores"] >= 1 and run["commit"]
    # the processor's model name, read here from /proc/cpuinfo by hand
    names = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
    assert run["processor"] == names[0].split(":", 1)[1].strip()


STOPPED = """
set -euo pipefail
PIPELINE=demo
source "$REPO/scripts/lib/stages.sh"
record_run "bash demo.sh"
timed done true
# (a loop of short sleeps, not signal.pause(): a SIGINT that lands between the touch and the pause would be waited
# for forever; here it is raised at the next step of the loop)
wait_for_signal=$'import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\nwhile True:\n    time.sleep(0.05)\n'
timed slow "$PYTHON" -c "$wait_for_signal" "$OUT_DIR/ready"
echo "not reached"
"""


def signals_at_their_defaults() -> None:
    """The pipeline as started from a terminal: SIGINT and SIGTERM at their default actions. A test process may
    have come to ignore SIGINT (a library of an earlier test in the same worker), and an ignored signal is inherited
    by the children, where bash cannot trap it nor Python raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize(("signal_number", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stage_stopped_by_a_signal_is_recorded_with_the_invocations_total(tmp_path: Path, signal_number, status):
    """Ctrl-C (or kill of the process group) in a stage: its seconds and the signal's status go to timing.jsonl,
    and so does the invocation's total, so that a resumed run's stage times add up to its wall time."""
    env = {"REPO": str(REPO), "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        ["bash", "-c", STOPPED],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=signals_at_their_defaults,
    )
    ready = tmp_path / "ready"
    for _ in range(6000):  # the stage's process says it is running: then the signal comes (no race on timing)
        if ready.exists() or process.poll() is not None:
            break
        time.sleep(0.01)
    assert ready.exists(), "the stage did not start"
    os.killpg(process.pid, signal_number)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == status
    assert "not reached" not in out
    assert f"stage 'slow' stopped by a signal (exit {status})" in out
    timing = [json.loads(line) for line in (tmp_path / "timing.jsonl").read_text().splitlines()]
    assert [(t["stage"], t["rc"]) for t in timing] == [("done", 0), ("slow", status), ("total", status)]
    assert timing[2]["seconds"] >= timing[1]["seconds"] + timing[0]["seconds"]


# The side-by-side runs of scripts/replicate_cpu.sh: its own run_rl_jobs and reap_one (read from the script), each
# run a stand-in trainer that says it is running (its pid in a file) and waits for a signal.
SIDE_BY_SIDE = """
set -euo pipefail
PIPELINE=demo
source "$REPO/scripts/lib/stages.sh"
eval "$(sed -n '/^run_rl_jobs() {/,/^}/p;/^reap_one() {/,/^}/p' "$REPO/scripts/replicate_cpu.sh")"
declare -F run_rl_jobs reap_one > /dev/null
trainer=$'import os, pathlib, sys, time\npathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\n'
trainer+=$'while True:\n    time.sleep(0.05)\n'
rl_run() { "$PYTHON" -c "$trainer" "$OUT_DIR/$1.pid"; }
RL_PARALLEL=2 rl_jobs=("rl-seed0 2" "rl-seed1 2")
timed rl_runs run_rl_jobs
echo "not reached"
"""


def ended_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (not a child of ours) has ended, or ends within ``seconds`` (its pidfd becomes
    readable when it exits: an event, not a poll)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
def test_ctrl_c_reaches_every_run_started_side_by_side_and_its_trainer(tmp_path: Path):
    """Ctrl-C (SIGINT to the pipeline's process group): each run side by side is a process group of its own
    (run_rl_jobs' set -m), so it reaches the trainers only through on_signal, which signals each run's whole group,
    not its leader alone (the subshell, whose trainer would train on)."""
    env = {"REPO": str(REPO), "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        ["bash", "-c", SIDE_BY_SIDE],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=signals_at_their_defaults,
    )
    pid_files = [tmp_path / "rl-seed0.pid", tmp_path / "rl-seed1.pid"]
    for _ in range(6000):  # both trainers say they are running: then the signal comes (no race on timing)
        if all(f.exists() and f.read_text() for f in pid_files) or process.poll() is not None:
            break
        time.sleep(0.01)
    trainers = [int(f.read_text()) for f in pid_files]
    try:
        assert all(os.getpgid(pid) != process.pid for pid in trainers)  # not in the group a terminal signals
        os.killpg(process.pid, signal.SIGINT)
        try:
            out, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            out = None  # it waits for its runs, whose trainers run on
        running = [pid for pid in trainers if not ended_within(pid, 10 if out is not None else 0)]
        assert running == [], f"trainers left running: {running} (the pipeline {'ended' if out else 'waits on'})"
        assert process.returncode == 130 and "stage 'rl_runs' stopped by a signal (exit 130)" in out
    finally:
        for pid in trainers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
