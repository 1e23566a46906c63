"""A user's agent that raises in the harness: its results lines name the agent file's line that raised, as the
preflight and training do (recurrent/failures.py), not only the error's type and message."""

from __future__ import annotations

from pathlib import Path

import pytest
from eval_fixtures import read_lines
from scripted_calculator import calculator_app
from test_eval_agent_files import harness_argv
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from taskutils.memory_eval.run import main as run_main

RAISING_AGENT = """
from dataclasses import dataclass

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class Config(WorkflowConfig):
    max_tokens: int = 32


async def divide(sample, client, config):
    reply = await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    return str(len(reply.text) / 0)  # the line that raises


REGISTER = agent_function("divide", Config, divide, columns=("input",))
"""


@pytest.mark.timeout(120)
def test_an_items_error_names_the_agent_files_line(tmp_path: Path, tiny_model_dir, monkeypatch):
    (tmp_path / "divide_agent.py").write_text(RAISING_AGENT)
    line_no = RAISING_AGENT.splitlines().index(next(x for x in RAISING_AGENT.splitlines() if "raises" in x)) + 1
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "data", {"test": 2}, seed=0)
    with serve_in_a_thread(calculator_app([]), wait_s=30) as url:
        code = run_main(harness_argv(tmp_path, url, tiny_model_dir, "divide_agent.py"))
    lines = read_lines(tmp_path / "results" / "calculator_2" / "scripted__divide_agent.jsonl")
    assert code == 1 and len(lines) == 2
    said = f"divide_agent.py:{line_no}: ZeroDivisionError: division by zero"
    assert all(line["error"] == said for line in lines), [line["error"] for line in lines]
    assert all(line["response"] is None and line["strict"] == 0 for line in lines)
