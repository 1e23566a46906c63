"""The harness end to end against real servers: a `transformers serve` with the tiny model (and, marked slow,
SmolLM2), both methods at two lengths of two task kinds; a model whose endpoint answers every request with an error
(every item failed and counted; a closed port is refused before any item: test_eval_bad_inputs.py); a run killed
with SIGKILL and one stopped with SIGTERM, each resumed to exactly one line per item."""

from __future__ import annotations

import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from eval_fixtures import harness_argv, hotpotqa_set, read_lines, write_table
from process_helpers import pid_alive

from taskutils.memory_eval.run import main as run_main


def wait_for_lines(path: Path, n: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if process.poll() is not None:
            raise AssertionError(f"harness exited early with {process.returncode}")
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {n} lines in {timeout} s")


def test_harness_runs_both_methods_at_two_lengths_and_counts_failures(tiny_server, eval_data, tmp_path, capsys):
    table = write_table(tmp_path / "table.yaml", tiny_server, broken=True)
    out = tmp_path / "results"
    # fmt: off
    argv = ["--table", str(table), "--models", "tiny,broken", "--method", "memory,direct",
            "--tasks", "hotpotqa,niah_single_1", "--lengths", "2,4,256,512", "--data-dir", str(eval_data),
            "--results-dir", str(out), "--trace", "--max-retries", "1", "--backoff", "0.01", "--timeout", "60",
            "--quiet"]
    # fmt: on
    assert run_main(argv) == 1  # the broken model's items failed: the run says so
    err = capsys.readouterr().err
    assert "error: 8 results file(s) incomplete:" in err
    assert "broken memory hotpotqa_2: 4 failed, 0 not run (first error: ChatRequestError: chat request to" in err
    assert "tiny memory" not in err and "--retry-failed redoes them" in err

    for task, lengths, ids in (("hotpotqa", (2, 4), {10, 11, 12, 13}), ("niah_single_1", (256, 512), {0, 1, 2, 3})):
        for length in lengths:
            for method in ("memory", "direct"):
                lines = read_lines(out / f"{task}_{length}" / f"tiny__{method}.jsonl")
                assert {r["id"] for r in lines} == ids and len(lines) == 4
                for r in lines:
                    assert r["error"] is None and r["response"] is not None and r["prompt_tokens"] > 0
                    assert (r["task"], r["length"], r["method"]) == (task, length, method)
                    if method == "memory":  # one memory per chunk, then the answer
                        assert r["num_chunks"] >= 2 and len(r["memories"]) == r["num_chunks"]
                        assert r["turns"] == r["num_chunks"] + 1
                    else:
                        assert r["turns"] == 1 and "truncated" in r
                broken = read_lines(out / f"{task}_{length}" / f"broken__{method}.jsonl")
                assert len(broken) == 4 and all(r["error"].startswith("ChatRequestError") for r in broken)
                assert all(r["sub_em"] == 0 and r["response"] is None for r in broken)
    assert any(r["truncated"] for r in read_lines(out / "hotpotqa_4" / "tiny__direct.jsonl"))  # 400-token window

    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16
    for row in rows:
        assert row["n"] == "4" and row["expected"] == "4"
        assert row["failed"] == ("4" if row["model"] == "broken" else "0")
    assert all(float(r["sub_em"]) == 0.0 for r in rows if r["model"] == "broken")  # in the denominator
    summary = (out / "summary.md").read_text()
    assert "## hotpotqa: sub_em by length" in summary and "4 of 4 items failed" in summary
    assert (out / "accuracy_vs_length.png").stat().st_size > 10_000

    before = {p: p.read_bytes() for p in out.glob("*/*.jsonl")}
    assert run_main(argv) == 1  # nothing rerun, nothing duplicated; the failed items still fail the run
    assert {p: p.read_bytes() for p in out.glob("*/*.jsonl")} == before


def test_sigkilled_run_resumes_to_one_line_per_item(tiny_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 4, items=10, seed=1)
    table = write_table(tmp_path / "table.yaml", tiny_server)
    out = tmp_path / "results"
    argv = harness_argv(data, out, 4, "--table", str(table), "--models", "tiny", "--concurrency", "1")
    path = out / "hotpotqa_4" / "tiny__memory.jsonl"
    process = subprocess.Popen([sys.executable, "-m", "taskutils.memory_eval.run", *argv], stderr=subprocess.DEVNULL)
    try:
        wait_for_lines(path, 2, process)
    finally:
        process.kill()  # SIGKILL: no clean-up at all
        process.wait()
    done = len(read_lines(path))
    assert done < 10, "the run finished before it could be killed"
    with path.open("ab") as f:
        f.write(b'{"id": 99, "task": "hotpo')  # and the worst case: a line cut in the middle
    assert run_main(argv) == 0
    lines = read_lines(path)
    assert sorted(r["id"] for r in lines) == list(range(10, 20))  # each item exactly once, none lost


def test_sigterm_stops_the_harness_server_and_the_run_resumes(tiny_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 4, items=8, seed=2)
    out = tmp_path / "results"
    common = harness_argv(data, out, 4)
    path = out / "hotpotqa_4" / "tiny__memory.jsonl"
    log = tmp_path / "harness.log"
    with log.open("w") as stderr:  # the table's own `tiny` entry: the harness starts transformers serve itself
        process = subprocess.Popen(
            [sys.executable, "-m", "taskutils.memory_eval.run", "--models", "tiny", *common], stderr=stderr
        )
    try:
        wait_for_lines(path, 1, process, timeout=180)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143  # 128 + SIGTERM (Ctrl-C: 130)
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    server_pid = int(re.search(r"transformers serve pid (\d+)", text).group(1))
    assert not pid_alive(server_pid), "the server the harness started outlived it"
    assert "run the same command again to resume" in text
    assert len(read_lines(path)) < 8
    # Resume against the session's server (same model, same settings).
    table = write_table(tmp_path / "table.yaml", tiny_server)
    assert run_main(["--table", str(table), "--models", "tiny", *common]) == 0
    assert sorted(r["id"] for r in read_lines(path)) == list(range(10, 18))


@pytest.mark.slow
def test_smollm2_memory_agent_end_to_end(smollm2_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    hotpotqa_set(data, 2, items=1)
    table = tmp_path / "table.yaml"
    entry = {
        "name": "smollm2",
        "checkpoint": smollm2_dir,
        "serve": "transformers",
        "concurrency": 1,
        "memory": {"chunk_size": 512, "max_new": 24, "final_max_new": 24},
    }
    table.write_text(yaml.safe_dump({"models": [entry]}))
    out = tmp_path / "results"
    argv = [
        "--table",
        str(table),
        "--models",
        "smollm2",
        "--method",
        "memory-boxed",
        "--tasks",
        "hotpotqa",
        "--lengths",
        "2",
        "--data-dir",
        str(data),
        "--results-dir",
        str(out),
        "--trace",
        "--quiet",
    ]
    assert run_main(argv) == 0
    (line,) = read_lines(out / "hotpotqa_2" / "smollm2__memory-boxed.jsonl")
    assert line["error"] is None and line["num_chunks"] == 1 and len(line["memories"]) == 1
    assert line["response"].strip() and line["completion_tokens"] > 0
    with (out / "summary.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert (row["model"], row["n"], row["failed"]) == ("smollm2", "1", "0")
