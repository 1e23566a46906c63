"""A failed episode in one line (recurrent/failures.py): the deepest line of the agent's file in the traceback, else
the agent function's ``def`` line; the message on one line, an ``openai`` error's own message."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import httpx
import openai
import pytest

from recurrent.failures import describe_failure
from recurrent.functions import FunctionEpisode
from recurrent.interface import Reply, load_register

AGENT = """\
import helper


async def agent(sample, client, config):
    reply = await client.chat([{"role": "user", "content": "q"}], 4)
    return helper.parse(reply.text)


async def silent(sample, client, config):
    return "nothing"
"""
HELPER = """\
def parse(text):
    return str(int(text))
"""


class Model:
    async def chat(self, messages, max_tokens, **sampling) -> Reply:
        return Reply("not a number", "stop")


@pytest.fixture
def agent_module(tmp_path: Path, monkeypatch):
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "helper.py").write_text(HELPER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "helper", raising=False)
    spec = importlib.util.spec_from_file_location("agent_under_test", tmp_path / "agent.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failure(function) -> BaseException:
    episode = FunctionEpisode(function, {}, None, "mine")
    with pytest.raises(Exception) as raised:
        asyncio.run(episode.run(Model()))
    return raised.value


def test_a_raise_is_named_at_the_deepest_line_of_the_agents_file(agent_module):
    # the error is raised in helper.py; the agent's own line that called it is named
    error = failure(agent_module.agent)
    assert describe_failure(error, agent_module.agent) == (
        "agent.py:6: ValueError: invalid literal for int() with base 10: 'not a number'"
    )


def test_an_error_after_the_agent_returned_is_named_at_its_def_line(agent_module):
    error = failure(agent_module.silent)
    assert describe_failure(error, agent_module.silent).startswith(
        "agent.py:9: RuntimeError: agent 'mine' returned without calling the model: "
    )


def test_without_a_source_the_cause_alone_and_an_openai_errors_own_message_on_one_line():
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    body = {"message": "an agent passed\nsampling parameters ['seed']", "type": "invalid_request_error"}
    error = openai.BadRequestError("Error code: 400 - {...}", response=httpx.Response(400, request=request), body=body)
    assert describe_failure(error, None) == "BadRequestError: an agent passed sampling parameters ['seed']"


def test_an_agent_file_imports_the_module_beside_it(tmp_path: Path, monkeypatch):
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    (folder / "prompts_beside.py").write_text("QUESTION = 'Q: {}'\n")
    (folder / "my_agent.py").write_text(
        "from dataclasses import dataclass\n\nfrom prompts_beside import QUESTION\n"
        "from recurrent.functions import agent_function\n\n\n@dataclass\nclass C:\n    n: int = 1\n\n\n"
        "async def ask(sample, client, config):\n"
        "    return (await client.chat([{'role': 'user', 'content': QUESTION.format(sample['q'])}], 4)).text\n\n\n"
        "REGISTER = agent_function('ask', C, ask)\n"
    )
    monkeypatch.chdir(tmp_path)  # the file's folder is neither the working directory nor on the path
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "prompts_beside", raising=False)
    register = load_register("elsewhere/my_agent.py")
    assert sys.path[0] == str(folder.resolve())
    episode = register.for_inference(None).episode({"q": "why?"})
    asyncio.run(episode.run(Model()))
    assert episode.history[0].turn.messages[0]["content"] == "Q: why?"
