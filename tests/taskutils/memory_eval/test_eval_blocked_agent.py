"""The harness's --item-timeout holds whatever the agent does (issue 63): an item whose agent blocks its thread in
plain code is recorded as failed naming the deadline and the agent's line, while the agent is still blocked; the
default is finite and documented; a value that is no deadline is refused naming the flag."""

from __future__ import annotations

import math
from pathlib import Path

import blocking_agents
import pytest
from blocking_agents import BLOCK, EXIT, SPIN, agent_file, marked_line
from eval_fixtures import read_lines
from scripted_calculator import calculator_app
from test_eval_agent_files import harness_argv
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from recurrent.agent_thread import DOCUMENT_DEADLINE_S
from taskutils.memory_eval.arguments import parse_args
from taskutils.memory_eval.run import main as run_main

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", [BLOCK, SPIN], ids=["blocks", "spins"])
def test_an_item_whose_agent_blocks_its_thread_is_recorded_as_failed_naming_the_deadline(
    tmp_path: Path, tiny_model_dir, monkeypatch, how
):
    # On the caller's event loop such an agent stopped the deadline with it: the item ran to the agent's end and
    # was recorded as a success (an agent that blocked 20 s under --item-timeout 3).
    text = agent_file(how)
    (tmp_path / "block_agent.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "data", {"test": 2}, seed=0)
    blocking_agents.reset()
    try:
        with serve_in_a_thread(calculator_app([]), wait_s=30) as url:
            code = run_main([*harness_argv(tmp_path, url, tiny_model_dir, "block_agent.py"), "--item-timeout", "1"])
        still_blocked = not blocking_agents.RELEASE.is_set()
    finally:
        blocking_agents.RELEASE.set()
    lines = read_lines(tmp_path / "results" / "calculator_2" / "scripted__block_agent.jsonl")
    assert still_blocked and blocking_agents.BLOCKED.is_set()
    assert code == 1 and len(lines) == 2
    line = marked_line(text)  # named first as every failure of a user's agent is (recurrent/failures.py)
    said = (
        f"block_agent.py:{line}: ItemTimeoutError: the agent did not finish within 1 s (--item-timeout), after 1 "
        f"model call; it was at block_agent.py:{line} (in block)"
    )
    assert all(line["error"].startswith(said) for line in lines), lines
    assert all(line["strict"] == 0 for line in lines)  # a failure scores 0, never an answer


def test_the_item_timeout_is_on_by_default_finite_and_documented(tmp_path):
    args = parse_args(["--data-dir", str(tmp_path), "--results-dir", str(tmp_path / "r")])
    assert args.item_timeout == DOCUMENT_DEADLINE_S == 14_400 and math.isfinite(args.item_timeout)
    readme = " ".join((REPO / "taskutils" / "memory_eval" / "README.md").read_text().split())
    assert "`--item-timeout` seconds bound an item's whole run" in readme and "(default 14400 s" in readme
    off = parse_args(["--data-dir", str(tmp_path), "--results-dir", str(tmp_path / "r"), "--item-timeout", "0"])
    assert off.item_timeout == 0  # the documented way to turn it off


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("abc", "is a number of seconds, got 'abc'"),
        ("1e-300", "must be a finite number of seconds >= 0.1 (0: no limit), got '1e-300'"),
        ("inf", "must be a finite number of seconds >= 0.1"),
        ("-1", "must be a finite number of seconds >= 0.1"),
    ],
)
def test_an_item_timeout_that_is_no_deadline_is_refused_naming_the_flag(tmp_path, capsys, value, said):
    with pytest.raises(SystemExit) as raised:
        parse_args(["--data-dir", str(tmp_path), "--results-dir", str(tmp_path / "r"), "--item-timeout", value])
    assert raised.value.code == 2 and f"argument --item-timeout: {said}" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_an_item_whose_agent_calls_sys_exit_fails_and_the_harness_goes_on(tmp_path: Path, tiny_model_dir, monkeypatch):
    text = agent_file(EXIT)
    (tmp_path / "exit_agent.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "data", {"test": 2}, seed=0)
    with serve_in_a_thread(calculator_app([]), wait_s=30) as url:
        code = run_main(harness_argv(tmp_path, url, tiny_model_dir, "exit_agent.py"))
    lines = read_lines(tmp_path / "results" / "calculator_2" / "scripted__exit_agent.jsonl")
    assert code == 1 and len(lines) == 2  # both items ran and were recorded: the harness did not exit
    said = f"exit_agent.py:{marked_line(text)}: AgentExitError"
    assert all(x["error"].startswith(said) and x["response"] is None for x in lines), [x["error"] for x in lines]
