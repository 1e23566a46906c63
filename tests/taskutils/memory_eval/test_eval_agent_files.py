"""An agent file from anywhere is a method of the harness (``--method path/to/agent.py``): loaded through the
registry's loader, its results named after the file, a missing file or one that registers nothing refused (exit 2,
naming the file) before any model call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from eval_fixtures import VERIFY_AGENT, read_lines
from scripted_calculator import calculator_app
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from taskutils.memory_eval.run import main as run_main


def harness_argv(tmp_path: Path, url: str, tiny_model_dir: str, method: str) -> list[str]:
    table = tmp_path / "models.yaml"
    model = {"name": "scripted", "checkpoint": tiny_model_dir, "url": url, "served_name": "m", "concurrency": 2}
    table.write_text(yaml.safe_dump({"models": [model]}))
    argv = ["--table", str(table), "--models", "scripted", "--method", method, "--tasks", "calculator"]
    argv += ["--lengths", "2", "--data-dir", str(tmp_path / "data" / "eval" / "test")]
    return argv + ["--results-dir", str(tmp_path / "results"), "--no-report", "--quiet"]


def test_an_agent_file_outside_the_repository_is_a_method(tmp_path: Path, tiny_model_dir, monkeypatch):
    user = tmp_path / "user"
    (user / "checks").mkdir(parents=True)
    (user / "checks" / "verify_agent.py").write_text(VERIFY_AGENT)
    monkeypatch.chdir(user)  # the path is relative to the caller's working directory
    write(tmp_path / "data", {"test": 4}, seed=0)
    seen: list[list[dict]] = []
    with serve_in_a_thread(calculator_app(seen), wait_s=30) as url:
        assert run_main(harness_argv(tmp_path, url, tiny_model_dir, "checks/verify_agent.py")) == 0
    # Named after the file's stem, wherever it lies: results/<task>_<length>/<model>__verify_agent.jsonl.
    out = tmp_path / "results" / "calculator_2" / "scripted__verify_agent.jsonl"
    lines = read_lines(out)
    assert len(lines) == 4 and all(line["method"] == "verify_agent" for line in lines)
    assert all(line["turns"] == 2 and line["strict"] == 1 and line["error"] is None for line in lines)
    assert len(seen) == 8
    meta = json.loads(out.with_name("scripted__verify_agent.meta.json").read_text())
    assert meta["settings"]["agent_file"] == str(user / "checks" / "verify_agent.py")


def test_a_missing_or_empty_agent_file_is_refused_naming_it(tmp_path: Path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "data", {"test": 2}, seed=0)
    url = "http://127.0.0.1:9/v1"  # never reached: the method is checked first
    with pytest.raises(SystemExit) as missing:
        run_main(harness_argv(tmp_path, url, tiny_model_dir, "no_such_agent.py"))
    assert missing.value.code == 2
    assert f"agent file not found: {tmp_path / 'no_such_agent.py'}" in capsys.readouterr().err
    (tmp_path / "empty_agent.py").write_text("X = 1\n")
    with pytest.raises(SystemExit) as empty:
        run_main(harness_argv(tmp_path, url, tiny_model_dir, "empty_agent.py"))
    assert empty.value.code == 2
    err = capsys.readouterr().err
    assert f"agent file {tmp_path / 'empty_agent.py'} registers no agent" in err and "'REGISTER'" in err
    assert not (tmp_path / "results" / "calculator_2").exists()
