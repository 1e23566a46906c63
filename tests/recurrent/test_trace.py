"""Memory traces: one JSON line per finished sample, appended across runs, robust to a killed writer."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recurrent.interface import Episode, Reply, Turn, TurnRecord
from recurrent.trace import TraceWriter, finished_ids, read_trace, sample_record

ROOT = Path(__file__).resolve().parents[2]  # the repository, so the child process imports recurrent


class Replayed(Episode):
    """An episode already run on fixed replies: call i asked for step i; the last one is flagged final."""

    def __init__(self, replies: list[Reply]) -> None:
        last = len(replies) - 1
        self._history = [
            TurnRecord(Turn([{"role": "user", "content": f"step {i}"}], 8, final=i == last, meta={"step": i}), reply)
            for i, reply in enumerate(replies)
        ]

    @property
    def history(self) -> list[TurnRecord]:
        return self._history

    async def run(self, client, sampling=None, final_sampling=None, on_turn=None) -> None:
        raise NotImplementedError("already run")


def finished(*replies: Reply) -> Replayed:
    return Replayed(list(replies))


MEMO = Reply("memory: Paris", "length", prompt_tokens=100, completion_tokens=8, seconds=0.25)
ANSWER = Reply("\\boxed{Paris}", "stop", prompt_tokens=40, completion_tokens=5, seconds=0.125)


def test_sample_record_holds_turns_error_seconds_and_token_totals():
    record = sample_record("q-7", finished(MEMO, ANSWER), error=None, seconds=1.5)
    assert record == {
        "id": "q-7",
        "turns": [
            {
                "step": 0,
                "final": False,
                "response": "memory: Paris",
                "finish_reason": "length",
                "prompt_tokens": 100,
                "completion_tokens": 8,
                "seconds": 0.25,
            },
            {
                "step": 1,
                "final": True,
                "response": "\\boxed{Paris}",
                "finish_reason": "stop",
                "prompt_tokens": 40,
                "completion_tokens": 5,
                "seconds": 0.125,
            },
        ],
        "error": None,
        "seconds": 1.5,
        "prompt_tokens": 140,
        "completion_tokens": 13,
    }
    failed = sample_record(3, finished(MEMO), error=TimeoutError("no answer"))
    assert failed["error"] == "TimeoutError: no answer"


def test_writer_appends_across_runs_and_reader_round_trips(tmp_path):
    path = tmp_path / "traces" / "run.jsonl"  # folders created
    with TraceWriter(path) as writer:
        writer.write_sample(0, finished(MEMO, ANSWER), seconds=1.0)
        writer.write_sample(1, finished(MEMO), error="ChatRequestError: boom", seconds=2.0)
    with TraceWriter(path) as writer:  # a second run appends
        writer.write_sample(2, finished(ANSWER), seconds=0.5)
    records = read_trace(path)
    assert [r["id"] for r in records] == [0, 1, 2]
    assert records[1]["error"] == "ChatRequestError: boom"
    assert records[2]["turns"][0]["response"] == "\\boxed{Paris}"
    assert finished_ids(path) == {0, 2}  # the failed sample is redone on resume
    assert finished_ids(path, include_errors=True) == {0, 1, 2}
    assert finished_ids(tmp_path / "missing.jsonl") == set()


def test_each_line_is_on_disk_as_soon_as_written(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    writer.write({"id": "a"})
    assert read_trace(path) == [{"id": "a"}]  # read before close: no buffering
    writer.close()


def test_partial_line_of_a_killed_run_is_ignored_then_cut(tmp_path):
    path = tmp_path / "t.jsonl"
    # A real process writes two complete lines and dies by SIGKILL half-way through the third.
    script = textwrap.dedent(
        f"""
        import os, signal
        from recurrent.trace import TraceWriter
        writer = TraceWriter({str(path)!r})
        writer.write({{"id": 0}})
        writer.write({{"id": 1}})
        os.write(writer._file.fileno(), b'{{"id": 2, "turns": [{{"resp')
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True)
    assert result.returncode == -9
    assert path.read_bytes().endswith(b'"resp')
    assert read_trace(path) == [{"id": 0}, {"id": 1}]  # the torn line is ignored by readers
    with TraceWriter(path) as writer:  # reopening cuts it off, so appending starts on a clean line
        writer.write({"id": 2})
    assert read_trace(path) == [{"id": 0}, {"id": 1}, {"id": 2}]
    assert path.read_text() == '{"id": 0}\n{"id": 1}\n{"id": 2}\n'


def test_file_holding_only_a_partial_line_is_emptied(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"id": 0, "tu')
    assert read_trace(path) == []
    TraceWriter(path).close()
    assert path.read_bytes() == b""


def test_broken_line_in_the_middle_is_corruption(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": 0}) + "\n" + "{not json\n" + json.dumps({"id": 2}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        read_trace(path)
