"""A misspelt import in an agent's helper module is one line naming the helper's file and line, in every entry
point: the preflight (which training's launchers run before Ray starts), the trainer's own build of the agent
(verl_ext/rollout.py, in its workers), the evaluation harness (taskutils/memory_eval/config.py) and the endpoint
(taskutils/endpoint/cli.py). recurrent.interface.load_register words it once for all of them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from run_configs import cpu_run_config

AGENT = """\
from dataclasses import dataclass

from my_helpers import shout
from recurrent.functions import agent_function


@dataclass
class Config:
    max_tokens: int = 8


async def my_agent(sample, client, config):
    reply = await client.chat([{"role": "user", "content": shout(sample["input"])}], config.max_tokens)
    return reply.text


REGISTER = agent_function("mine", Config, my_agent, columns=("input",))
"""
HELPERS = "import re\nfrom strng import punctuation\n\n\ndef shout(text):\n    return text.upper()\n"
SAID = "my_helpers.py:2: ModuleNotFoundError: No module named 'strng'"
AGENT_LINE = "(agent file {agent} failed on import)"


@pytest.fixture
def agent(tmp_path, monkeypatch) -> Path:
    (tmp_path / "my_agent.py").write_text(AGENT)
    (tmp_path / "my_helpers.py").write_text(HELPERS)
    monkeypatch.chdir(tmp_path)  # the user's folder: paths are shown relative to it
    return tmp_path / "my_agent.py"


def test_the_preflight_names_the_helpers_line(agent):
    from verl_ext.preflight import PreflightError, preflight
    from verl_ext.run_config import compose_run_config

    (agent.parent / "my_agent_cpu.yaml").write_text(cpu_run_config(str(agent), max_tokens=16))
    row = {"prompt": [{"role": "user", "content": "hi"}], "input": "hi", "data_source": "x"}
    pd.DataFrame([{**row, "reward_model": {"ground_truth": "hi"}}]).to_parquet(agent.parent / "train.parquet")
    config = compose_run_config(
        "my_agent_cpu.yaml",
        ["actor_rollout_ref.model.path=tiny", "data.train_files=train.parquet", "data.val_files=train.parquet"],
    )
    with pytest.raises(PreflightError) as raised:
        preflight(config, load_tokenizer=False)
    (problem,) = str(raised.value).splitlines()[1:]
    assert problem == f"  - recurrent.agent='{agent}': {SAID} {AGENT_LINE.format(agent=agent)}"


def test_the_trainers_build_names_the_helpers_line(agent):
    from verl_ext.rollout import build_agent
    from verl_ext.settings import RecurrentSettings

    with pytest.raises(ImportError) as raised:
        build_agent(RecurrentSettings(agent=str(agent)), None)
    assert str(raised.value) == f"{SAID} {AGENT_LINE.format(agent=agent)}"


def test_the_harness_names_the_helpers_line(agent):
    from taskutils.memory_eval.config import resolve_method

    with pytest.raises(ValueError) as raised:
        resolve_method("my_agent.py")
    assert str(raised.value) == f"method 'my_agent.py': {SAID} {AGENT_LINE.format(agent=agent)}"
    assert "registers no agent" not in str(raised.value)


def test_the_endpoint_names_the_helpers_line(agent, capsys):
    from taskutils.endpoint.cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--model", "m", "--upstream", "http://127.0.0.1:9/v1", "--agent", "my_agent.py"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f"--agent my_agent.py: {SAID} {AGENT_LINE.format(agent='my_agent.py')}"), last
