"""The harness against a careless user and a hung agent, round 3 (issue 47): an agent given by path that never
returns fails its item within --item-timeout, in one line; an eval line nested 100,000 deep, a YAML alias bomb in
--config and two methods writing the same files are each one line and exit 2; a full disk stops the run at once,
with one line and no "Task exception was never retrieved" tracebacks."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import pytest
from eval_fixtures import read_lines
from scripted_calculator import calculator_app
from test_eval_agent_files import harness_argv
from test_eval_bad_inputs import FullDisk, ScriptedServer, _dying_run, _line, run_on
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from taskutils.memory_eval.arguments import parse_args
from taskutils.memory_eval.run import main as run_main

HANGING_AGENT = """
import asyncio
from dataclasses import dataclass

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class HangConfig(WorkflowConfig):
    max_tokens: int = 8


async def hang(sample, client, config):
    await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    await asyncio.Event().wait()  # never returns


REGISTER = agent_function("hang", HangConfig, hang, columns=("input",))
"""

BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['x'] * 9)}]"]
    + [f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]" for k in range(1, 9)]
    + ["quiet: true"]
)


def test_an_agent_given_by_path_that_never_returns_fails_its_items_within_the_item_timeout(
    tmp_path: Path, tiny_model_dir, monkeypatch, caplog
):
    # The harness was still waiting at 120 s with --timeout 5: only the endpoint bounded a document.
    (tmp_path / "hang_agent.py").write_text(HANGING_AGENT)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "data", {"test": 2}, seed=0)
    with serve_in_a_thread(calculator_app([]), wait_s=30) as url:
        argv = [*harness_argv(tmp_path, url, tiny_model_dir, "hang_agent.py"), "--item-timeout", "0.5"]
        began = time.monotonic()
        code = run_main(argv)
        took = time.monotonic() - began
    lines = read_lines(tmp_path / "results" / "calculator_2" / "scripted__hang_agent.jsonl")
    assert code == 1 and len(lines) == 2 and took < 60  # a bound on the test, not a timing
    said = "TimeoutError: the agent did not finish within 0.5 s (--item-timeout), after 1 model call"
    assert all(said in line["error"] for line in lines), lines
    assert not [r for r in caplog.records if r.exc_info]


def test_an_eval_line_nested_100000_deep_is_one_line_and_exit_2(tmp_path, capsys):
    code, data, out = run_on(tmp_path, _line("[" * 100_000 + "]" * 100_000))
    err = capsys.readouterr().err
    assert code == 2 and f"error: {data}:1: not valid JSON (it nests too deep" in err
    assert "Traceback" not in err and not list(out.glob("*/*.jsonl"))


def test_a_yaml_alias_bomb_in_config_is_one_line_and_exit_2(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(BOMB + "\n")
    code, _, out = run_on(tmp_path, _line({"input": "q", "answers": ["a"]}), "--config", str(config))
    err = capsys.readouterr().err
    assert code == 2 and f"error: {config}:" in err and "with its aliases (*name) expanded it holds over 100,000" in err
    assert not out.exists()


def test_two_methods_writing_the_same_files_are_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--method", "memory,memory"])
    assert stop.value.code == 2
    assert "two methods would write the same results files (named memory)" in capsys.readouterr().err


def test_a_full_disk_stops_the_run_at_once_without_unretrieved_task_errors(tmp_path, capsys, caplog, monkeypatch):
    real_open = Path.open

    def on_full_disk(self, mode="r", *args, **kwargs):
        if mode == "ab" and self.suffix == ".jsonl":  # the results file, appended a line per item
            return FullDisk(self, "ab")
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", on_full_disk)
    FullDisk.room = 0  # the first line already does not fit
    server = ScriptedServer(drop=lambda n: False)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        code, results, _ = _dying_run(tmp_path, server, "--concurrency", "3")
        gc.collect()  # an unretrieved task error is logged when its task is collected
    err = capsys.readouterr().err
    assert code == 1 and "error: cannot go on:" in err and "No space left on device" in err
    assert "never retrieved" not in caplog.text and "Traceback" not in err
    assert server.answered <= 3  # the items in flight when the first line failed; none started after it
