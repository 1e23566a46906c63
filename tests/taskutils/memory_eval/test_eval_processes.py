"""Processes a user never wants left behind or fooled by: servers die with the harness or the quickstart (SIGKILL
included), a server that dies mid-run stops the run with a clear error, the quickstart stops on SIGTERM, and a
second run into one results folder is refused. Every wait here is on an event (a line printed, a process exit
seen through a pidfd), never a sleep."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from eval_fixtures import harness_argv, hotpotqa_set, read_lines

from recurrent.local_server import free_port
from taskutils.memory_eval import results
from taskutils.memory_eval.run import main as run_main

REPO = Path(__file__).resolve().parents[3]


def wait_exit(pid: int, timeout: float = 120) -> bool:
    """Whether process ``pid`` has exited (zombies included) within ``timeout`` s: a pidfd becomes readable when
    the process exits, whoever its parent is."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def read_until(stream, pattern: str) -> re.Match:
    """Read lines of ``stream`` until one matches ``pattern`` (the process printed it); fail at EOF."""
    seen = []
    for line in stream:
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"{pattern!r} never printed; output:\n{''.join(seen)[-3000:]}")


PARENT = """
import sys
from pathlib import Path
from recurrent.local_server import spawn_server, transformers_serve
if sys.argv[1] == "sleep":
    process = spawn_server(["sleep", "600"], Path(sys.argv[2]))
    print("child", process.pid, flush=True)
else:
    with transformers_serve(sys.argv[1], log_path=Path(sys.argv[2])) as server:
        print("child", server.process.pid, flush=True)
        sys.stdin.read()
sys.stdin.read()
"""


@pytest.mark.parametrize("what", ["sleep", "tiny"])
def test_a_server_dies_with_its_parent_even_on_sigkill(what, tiny_model_dir, tmp_path):
    target = "sleep" if what == "sleep" else tiny_model_dir
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, target, str(tmp_path / "server.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        child = int(read_until(parent.stdout, r"^child (\d+)").group(1))
        assert not wait_exit(child, timeout=0)  # running
    finally:
        parent.kill()  # SIGKILL: none of the parent's clean-up runs
        parent.wait()
    assert wait_exit(child), "the server outlived the process that started it"
    assert (tmp_path / "server.log").exists()
    if what == "tiny":  # the server's sampling view of the model sits next to its log, not in the temp folder
        assert len(list(tmp_path.glob("model-view-*"))) == 1


def test_a_server_that_dies_mid_run_stops_the_run(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 4, items=8, seed=3)
    out = tmp_path / "results"
    # A backoff of 10 minutes: were the dead server not noticed, the run would sit in its retries, not exit.
    argv = harness_argv(data, out, 4, "--models", "tiny", "--concurrency", "1", "--backoff", "600")
    harness = subprocess.Popen(
        [sys.executable, "-u", "-m", "taskutils.memory_eval.run", *argv],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        server = int(read_until(harness.stderr, r"transformers serve pid (\d+)").group(1))
        os.kill(server, signal.SIGKILL)
        rest = harness.stderr.read()
        assert harness.wait(timeout=300) == 1
    finally:
        if harness.poll() is None:
            harness.kill()
    assert "the transformers server (pid" in rest and "exited with code -9 while items were running" in rest
    assert "error: model(s) not evaluated: tiny" in rest and "tiny memory hotpotqa_4: 0 failed" in rest
    path = out / "hotpotqa_4" / "tiny__memory.jsonl"
    done = read_lines(path) if path.exists() else []
    assert all(r["error"] is None for r in done)  # the items in flight were not recorded as failed
    assert (out / "logs" / "transformers-tiny.log").exists()  # the server log is in the run's folder
    meta = json.loads((out / "hotpotqa_4" / "tiny__memory.meta.json").read_text())
    assert meta["sampling_applied"] == "yes: applied by the server the harness starts"


def test_a_second_run_into_one_results_folder_is_refused(tmp_path, capsys):
    hotpotqa_set(tmp_path, 2, items=1)
    out = tmp_path / "results"
    argv = harness_argv(tmp_path, out, 2, "--models", "tiny", "--url", f"http://127.0.0.1:{free_port()}/v1")
    with results.locked(out):  # the first run, still going
        assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {out} is in use by another run (pid {os.getpid()}); wait for it to finish" in err
    assert not list(out.glob("*/*"))  # the second run touched nothing


@pytest.mark.slow(seconds=60)  # with the file's other server runs
def test_quickstart_stops_its_server_on_sigterm(tmp_path):
    document = tmp_path / "long.txt"
    document.write_text("The sky was grey over the quiet harbour that morning. " * 4000)  # hundreds of chunks
    log = tmp_path / "server.log"
    quickstart = subprocess.Popen(
        [
            sys.executable,
            "-u",
            str(REPO / "quickstart.py"),
            "--model",
            "tiny",
            "--chunk",
            "50",
            "--max-new",
            "4",
            "--context-file",
            str(document),
            "--server-log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in ("URL", "API_KEY")},
    )
    try:
        server = int(read_until(quickstart.stdout, r"server ready at .* \(pid (\d+), log ").group(1))
        read_until(quickstart.stdout, r"--- memory after chunk 1/")  # reading, far from done
        quickstart.send_signal(signal.SIGTERM)
        assert quickstart.wait(timeout=120) == 143  # the convention for SIGTERM (128 + 15)
    finally:
        if quickstart.poll() is None:
            quickstart.kill()
    assert "interrupted" in quickstart.stderr.read()
    assert wait_exit(server), "the quickstart's server outlived it"
    assert log.exists() and log.stat().st_size > 0  # the log went where it was asked to, not to the temp folder
    assert not list(tmp_path.glob("model-view-*"))  # the sampling view of the model, made next to it, is gone


def test_a_refused_run_leaves_the_lock_naming_the_first_run(tmp_path):
    # A refused second run leaves the first run's lock file untouched: it still names the first run.
    out = tmp_path / "results"
    with results.locked(out):
        with pytest.raises(results.ResultsBusyError), results.locked(out):
            pass
        assert (out / results.LOCK_FILE).read_text().strip() == str(os.getpid())
        assert json.dumps(sorted(p.name for p in out.iterdir())) == '[".lock"]'
    # The first run, ended, leaves neither its lock nor the empty folder it made; a folder that was there stays.
    assert not out.exists()
    out.mkdir()
    with results.locked(out):
        pass
    assert out.is_dir() and not list(out.iterdir())


def test_a_run_that_fails_leaves_no_lock(tmp_path):
    out = tmp_path / "results"
    (out / "hotpotqa_50").mkdir(parents=True)
    with pytest.raises(RuntimeError), results.locked(out):
        raise RuntimeError("the run failed")
    assert sorted(p.name for p in out.iterdir()) == ["hotpotqa_50"]
    with results.locked(out):  # and the next run takes the folder
        assert (out / results.LOCK_FILE).read_text().strip() == str(os.getpid())
