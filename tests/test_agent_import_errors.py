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


# ---- an agent file that loops or exits at import: stopped within its bound and named, in every entry point ----

STUCK = {
    "loops": "from blocking_agents import RELEASE\nwhile not RELEASE.is_set():  # stuck\n    pass\n",
    "exits": "import sys\nsys.exit(0)  # stuck\n",
}


@pytest.fixture(params=sorted(STUCK))
def stuck(request, tmp_path, monkeypatch):
    """my_agent.py with a module-level line that loops (released at the end) or exits; the import bound at 1 s."""
    import blocking_agents

    from recurrent import agent_import

    text = AGENT.replace("from my_helpers import shout\n", "") + STUCK[request.param]
    (tmp_path / "my_agent.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(agent_import, "IMPORT_TIMEOUT_S", 1.0)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "# stuck" in t)
    blocking_agents.reset()
    said = {
        "loops": "the agent file did not finish its import within 1 s (the bound on an agent file's import); it "
        f"was at my_agent.py:{line} (in <module>)",
        "exits": f"my_agent.py:{line}: SystemExit(0) raised on import (sys.exit), which would end the command",
    }[request.param]
    yield said
    blocking_agents.RELEASE.set()  # the abandoned import thread ends


@pytest.mark.timeout(60)
def test_the_trainers_build_stops_an_agent_file_stuck_at_import(stuck):
    from verl_ext.rollout import build_agent
    from verl_ext.settings import RecurrentSettings

    with pytest.raises(ImportError) as raised:
        build_agent(RecurrentSettings(agent="my_agent.py"), None)
    assert str(raised.value).startswith(stuck), str(raised.value)


@pytest.mark.timeout(60)
def test_the_harness_stops_an_agent_file_stuck_at_import(stuck):
    from taskutils.memory_eval.config import resolve_method

    with pytest.raises(ValueError) as raised:
        resolve_method("my_agent.py")
    assert str(raised.value).startswith(f"method 'my_agent.py': {stuck}"), str(raised.value)


@pytest.mark.timeout(60)
def test_the_endpoint_stops_an_agent_file_stuck_at_import(stuck, capsys):
    from taskutils.endpoint.cli import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--model", "m", "--upstream", "http://127.0.0.1:9/v1", "--agent", "my_agent.py"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert f"--agent my_agent.py: {stuck}" in last, last
