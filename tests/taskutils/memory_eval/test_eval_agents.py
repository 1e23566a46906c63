"""Any registered agent evaluates through the harness, chosen by name: the calculator agent (an agent function,
experiments/calculator/agent.py) on its toy task, against a scripted OpenAI-compatible server that calls the tool
and then answers with the tool's result."""

from __future__ import annotations

from pathlib import Path

import yaml
from eval_fixtures import read_lines
from scripted_calculator import calculator_app
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from taskutils.memory_eval.run import main as run_main


def test_the_calculator_agent_runs_through_the_harness_by_name(tmp_path: Path, tiny_model_dir):
    write(tmp_path / "data", {"test": 6}, seed=0)
    seen: list[list[dict]] = []
    with serve_in_a_thread(calculator_app(seen), wait_s=30) as url:
        table = tmp_path / "models.yaml"
        model = {"name": "scripted", "checkpoint": tiny_model_dir, "url": url, "served_name": "m", "concurrency": 2}
        table.write_text(yaml.safe_dump({"models": [model]}))
        argv = ["--table", str(table), "--models", "scripted", "--method", "calculator", "--tasks", "calculator"]
        argv += ["--lengths", "2", "--data-dir", str(tmp_path / "data" / "eval" / "test")]
        argv += ["--results-dir", str(tmp_path / "results"), "--no-report", "--quiet", "--trace"]
        assert run_main(argv) == 0
    lines = read_lines(next((tmp_path / "results").rglob("*.jsonl")))
    items = read_lines(tmp_path / "data" / "eval" / "test" / "eval_calculator_2.jsonl")
    assert len(lines) == len(items) == 6
    # Each problem: a tool call, then the answer computed by the agent's calculator, boxed by the "model".
    assert all(line["turns"] == 2 and line["strict"] == 1 and line["error"] is None for line in lines)
    by_question = {line["question"]: line for line in lines}
    for item in items:
        assert by_question[item["input"]]["response"] == f"The result is \\boxed{{{item['answers'][0]}}}"
    # The agent sent its system prompt and the question, and grew the conversation with the tool's result.
    assert len(seen) == 12
    second_calls = [messages for messages in seen if len(messages) == 4]
    assert len(second_calls) == 6
    assert [m["role"] for m in second_calls[0]] == ["system", "user", "assistant", "user"]
