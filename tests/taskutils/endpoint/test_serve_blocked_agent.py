"""The endpoint's --document-timeout holds whatever the agent does (issue 63): a document whose agent blocks its
thread in plain code gets its 504 at the deadline while the agent is still blocked, and ``/health`` answers
meanwhile (the agent's code runs on its own loop in a worker thread, never on the server's: recurrent/agent_thread.py).
Before, the 504 came when the agent unblocked (at 15.5 s under a 3 s deadline) and ``/health`` took 14.7 s. The
deadline is on by default, finite and documented; a value that is no deadline is refused naming the flag."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import blocking_agents
import pytest
from serve_helpers import QUESTION, REPO, health, served, wait_event
from test_serve_service import post

from recurrent.agent_thread import DOCUMENT_DEADLINE_S
from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig
from taskutils.endpoint.cli import build_parser
from taskutils.endpoint.settings import ServeSettings


@dataclass
class BlockConfig(WorkflowConfig):
    max_tokens: int = 8


async def block(sample, client, config):
    reply = await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    blocking_agents.BLOCKED.set()
    blocking_agents.RELEASE.wait()  # plain code: its thread blocks, not an event loop
    return reply.text


BLOCKING = agent_function("block", BlockConfig, block, columns=("input",))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("agent", ["BLOCKING", "SPINNING"])
def test_a_blocked_agents_document_gets_its_504_at_the_deadline_and_health_answers_meanwhile(scripted, agent):
    blocking_agents.reset()
    request = {"messages": [{"role": "user", "content": QUESTION}]}
    try:
        with served(scripted.url, scripted.model, None, agent=f"{__file__}:{agent}", document_timeout=1) as (base, _):
            with ThreadPoolExecutor(1) as pool:
                answered = pool.submit(post, base, request)
                wait_event(blocking_agents.BLOCKED, "the agent to block its thread")
                status = health(base)  # a reply while the agent is blocked: the server's loop is not
                health_while_blocked = not blocking_agents.RELEASE.is_set()
                response = answered.result()
            answered_while_blocked = not blocking_agents.RELEASE.is_set()
    finally:
        blocking_agents.RELEASE.set()
    assert health_while_blocked and status["status"] == "ok"
    error = response.json()["error"]
    assert answered_while_blocked and response.status_code == 504 and error["code"] == "document_timeout"
    assert "the document was not answered within 1 s (the server's --document-timeout)" in error["message"]


def test_the_document_timeout_is_on_by_default_finite_and_documented():
    args = build_parser().parse_args(["--upstream", "http://127.0.0.1:1/v1", "--model", "m"])
    assert args.document_timeout == DOCUMENT_DEADLINE_S == ServeSettings("m").document_timeout == 14_400
    assert math.isfinite(args.document_timeout)
    serving = " ".join((REPO / "docs" / "serving.md").read_text().split())
    assert "A document gets `--document-timeout` seconds (default 14400 s" in serving


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("abc", "is a number of seconds, got 'abc'"),
        ("1e-300", "must be a finite number of seconds >= 0.1 (0: no limit), got '1e-300'"),
        ("nan", "must be a finite number of seconds >= 0.1"),
    ],
)
def test_a_document_timeout_that_is_no_deadline_is_refused_naming_the_flag(capsys, value, said):
    with pytest.raises(SystemExit) as raised:
        build_parser().parse_args(["--upstream", "u", "--model", "m", "--document-timeout", value])
    assert raised.value.code == 2 and f"argument --document-timeout: {said}" in capsys.readouterr().err


async def spin(sample, client, config):
    reply = await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    blocking_agents.BLOCKED.set()
    while not blocking_agents.RELEASE.is_set():  # computes without awaiting
        pass
    return reply.text


async def exits(sample, client, config):
    await client.chat([{"role": "user", "content": sample["input"]}], config.max_tokens)
    raise SystemExit(0)  # sys.exit in agent code: its document fails, the server goes on


SPINNING = agent_function("spin", BlockConfig, spin, columns=("input",))
EXITING = agent_function("exits", BlockConfig, exits, columns=("input",))


@pytest.mark.timeout(60)
def test_an_agent_that_calls_sys_exit_fails_its_document_and_the_server_goes_on(scripted):
    request = {"messages": [{"role": "user", "content": QUESTION}]}
    with served(scripted.url, scripted.model, None, agent=f"{__file__}:EXITING") as (base, _):
        first, second = post(base, request), post(base, request)
        status = health(base)
    for response in (first, second):  # both answered: the process did not exit with the first
        assert response.status_code >= 500 and "SystemExit" in response.json()["error"]["message"], response.text
    assert status["status"] == "ok"
