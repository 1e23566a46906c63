"""Any agent serves and streams through the endpoint, chosen by its registration, never by its name: the memory
agent, the direct baseline (a session that reads a document) and the calculator (an agent function on the
conversation) each stream one progress event per model call and then their answer; a stream that fails ends with
an error event and counts as failed; an agent that counts no tokens needs no tokenizer; ``--agent-config`` sets an
agent's own config (shown at start-up, a bad key refused before any server starts); ``--agent path/to/file.py``
serves an agent from anywhere; an answer that is not the agent's last reply fails here as in the harness."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI
from scripted_calculator import calculator_app
from serve_helpers import (
    DOCUMENT,
    HTTP,
    QUESTION,
    REPO,
    UPSTREAM_COMPLETION_TOKENS,
    UPSTREAM_PROMPT_TOKENS,
    WAIT,
    counters,
    serve_command,
    serve_env,
    serve_process,
    served,
    sse_events,
    stream_lines,
    wait_event,
)
from threaded_http import serve_in_a_thread

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig

TOOL_CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 2"}}</tool_call>'
ANSWER_1776 = "The result is \\boxed{1776}"


def read_stream(base: str, request: dict, data: bool) -> tuple[list[dict], list[str], str, dict]:
    """Stream ``request`` to its end: the progress data chunks, the SSE comments, the answer, the final summary.
    ``data``: ask for progress as data chunks (memagent.progress)."""
    ext = {**request.get("memagent", {}), **({"progress": True} if data else {})}
    body = {**request, "stream": True, "stream_options": {"include_usage": True}, "memagent": ext}
    lines = stream_lines(base, body)
    events = list(sse_events(iter(lines)))
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1]), events
    chunks = events[:-1]
    progress = [e["memagent"] for e in chunks if not e["choices"] and "memagent" in e]
    answer = "".join(e["choices"][0]["delta"].get("content") or "" for e in chunks if e["choices"])
    (summary,) = [e["memagent"] for e in chunks if e["choices"] and e["choices"][0].get("finish_reason")]
    comments = [line[2:] for line in lines if line.startswith(": ") and line != ": keepalive"]
    return progress, comments, answer, summary


def test_the_memory_agent_streams_a_progress_event_per_chunk(scripted, tiny_tokenizer):
    chunks = math.ceil(len(tiny_tokenizer.encode(DOCUMENT, add_special_tokens=False)) / 16)
    request = {"messages": [{"role": "user", "content": QUESTION}], "memagent": {"document": DOCUMENT}}
    with served(scripted.url, scripted.model, tiny_tokenizer, chunk_size=16) as (base, _):
        progress, comments, answer, summary = read_stream(base, request, data=True)
        plain = read_stream(base, request, data=False)
        with_memories = {**request, "memagent": {"document": DOCUMENT, "return_memories": True}}
        memories = read_stream(base, with_memories, data=False)
    assert chunks > 2
    assert progress == [{"chunk": c, "chunks": chunks} for c in range(1, chunks + 1)] and comments == []
    assert answer == scripted.reply and summary["turns"] == chunks + 1 and summary["chunks"] == chunks
    assert plain[0] == [] and plain[1] == [f"read chunk {c} of {chunks}" for c in range(1, chunks + 1)]
    # return_memories: the memory agent's progress fields as they always were, each chunk's memory with it
    assert memories[0] == [{"chunk": c, "chunks": chunks, "memory": scripted.reply} for c in range(1, chunks + 1)]


def test_the_memory_agents_own_config_is_set_over_its_budget_flags(scripted, tiny_tokenizer):
    chunks = math.ceil(len(tiny_tokenizer.encode(DOCUMENT, add_special_tokens=False)) / 32)
    request = {"messages": [{"role": "user", "content": QUESTION}], "memagent": {"document": DOCUMENT}}
    settings = {"chunk_size": 16, "agent_config": {"chunk_size": 32, "max_memorization_length": 7}}
    with served(scripted.url, scripted.model, tiny_tokenizer, **settings) as (base, service):
        reply = HTTP.post(f"{base}/chat/completions", json=request, timeout=WAIT).json()
    assert reply["memagent"]["chunks"] == chunks and all(b["max_tokens"] == 7 for b in scripted.bodies[:-1])
    assert "agent 'memory' (MemoryConfig: " in service.describe() and "chunk_size=32" in service.describe()


def test_the_direct_agent_reads_the_document_and_streams_its_one_call(scripted, tiny_tokenizer):
    request = {"messages": [{"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"}]}  # split mode
    with served(scripted.url, scripted.model, tiny_tokenizer, agent="direct") as (base, _):
        progress, comments, answer, summary = read_stream(base, request, data=True)
        plain = read_stream(base, request, data=False)
    call = {"agent": "direct", "call": 1, "kind": "direct", "finish_reason": "stop"}
    call |= {"prompt_tokens": UPSTREAM_PROMPT_TOKENS, "completion_tokens": UPSTREAM_COMPLETION_TOKENS}
    assert progress == [call] and comments == []
    assert plain[0] == [] and plain[1] == ["call 1 (direct) answered"]
    assert answer == plain[2] == scripted.reply
    assert summary == {"agent": "direct", "turns": 1, "question_mode": "split"}
    prompt = scripted.bodies[0]["messages"][0]["content"]  # the whole document and the question, in one prompt
    assert DOCUMENT in prompt and QUESTION in prompt and "<text>" in prompt


@pytest.fixture
def calculator_upstream():
    seen: list[list[dict]] = []
    with serve_in_a_thread(calculator_app(seen), wait_s=WAIT) as url:
        yield url, seen


def test_the_calculator_agent_streams_a_progress_event_per_call(calculator_upstream):
    url, seen = calculator_upstream
    request = {"messages": [{"role": "user", "content": "What is 37 * 48?"}]}
    with served(url, "m", None, agent="calculator") as (base, _):  # no tokenizer: it counts none
        progress, comments, answer, summary = read_stream(base, request, data=True)
        plain = read_stream(base, request, data=False)
        state = counters(base)
    usage = {"finish_reason": "stop", "prompt_tokens": 10, "completion_tokens": 5}
    assert progress == [{"agent": "calculator", "call": k, "kind": "call", **usage} for k in (1, 2)]
    assert comments == [] and plain[0] == [] and plain[1] == ["call 1 (call) answered", "call 2 (call) answered"]
    assert answer == plain[2] == ANSWER_1776 and summary == {"agent": "calculator", "turns": 2}
    assert len(seen) == 4 and seen[1][-1]["content"] == "<tool_response>1776</tool_response>"
    assert (state["completed"], state["failed"]) == (2, 0)


def test_a_stream_that_fails_ends_with_an_error_event_and_counts_as_failed(scripted):
    scripted.reply, scripted.hold = TOOL_CALL, {2}  # the calculator calls again; its second call waits
    request = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "stream": True}
    with served(scripted.url, scripted.model, None, agent="calculator") as (base, _):
        with httpx.Client(timeout=WAIT) as http, http.stream("POST", f"{base}/chat/completions", json=request) as r:
            assert r.status_code == 200  # the stream is open: its first call is in
            lines = (line for line in r.iter_lines() if line)
            assert next(sse_events(lines))["choices"][0]["delta"]["role"] == "assistant"
            assert next(lines) == ": call 1 (call) answered"
            wait_event(scripted.arrived[2], "the second call upstream")
            scripted.fail = (500, {"error": {"message": "the engine died"}})
            scripted.release()
            rest = list(sse_events(lines))
        state = counters(base)
    error, done = rest[-2:]
    assert done == "[DONE]" and set(error) == {"error"}  # OpenAI's error shape
    assert error["error"]["code"] == "upstream_500" and "the engine died" in error["error"]["message"]
    assert "after 1 calls" in error["error"]["message"]
    assert (state["failed"], state["completed"], state["cancelled"]) == (1, 0, 0)


def test_a_fault_while_writing_a_stream_ends_it_with_an_error_event_counted_failed(scripted, monkeypatch):
    from taskutils.endpoint import app

    chunk = app._chunk

    def faulty(doc, model, **fields):  # the answer's last chunk cannot be written
        if fields.get("choices") and fields["choices"][0].get("finish_reason"):
            raise RuntimeError("cannot write the finish chunk")
        return chunk(doc, model, **fields)

    monkeypatch.setattr(app, "_chunk", faulty)
    request = {"messages": [{"role": "user", "content": "Hello?"}], "stream": True}
    with served(scripted.url, scripted.model, None, agent="calculator") as (base, _):
        events = list(sse_events(iter(stream_lines(base, request))))
        state = counters(base)
    error, done = events[-2:]
    assert done == "[DONE]" and error["error"]["type"] == "server_error"
    assert "cannot write the finish chunk" in error["error"]["message"]
    assert (state["failed"], state["completed"]) == (1, 0)  # the document answered; its stream did not


def test_the_calculator_agent_is_served_by_name_without_a_tokenizer(tmp_path: Path, calculator_upstream):
    url, seen = calculator_upstream
    # A hosted model's name: nothing offline to load a tokenizer from, and this agent needs none.
    args = ("--agent", "calculator", "--model", "hosted-model", "--upstream", url)
    with serve_process(*args, log_path=tmp_path / "serve.log") as (base, _):
        client = OpenAI(base_url=base, api_key="unused", max_retries=0)
        question = [{"role": "user", "content": "What is 37 * 48?"}]
        reply = client.chat.completions.create(model="hosted-model", messages=question, temperature=0)
        streamed = client.chat.completions.create(model="hosted-model", messages=question, stream=True)
        content = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert reply.choices[0].message.content == content == ANSWER_1776
    assert len(seen) == 4  # each request: the tool call, then the answer
    assert seen[0][-1] == {"role": "user", "content": "What is 37 * 48?"} and seen[0][0]["role"] == "system"
    assert seen[1][-1] == {"role": "user", "content": "<tool_response>1776</tool_response>"}
    log = (tmp_path / "serve.log").read_text()
    assert "agent 'calculator' (CalculatorConfig: question_key='prompt', " in log and "chunks of" not in log


def run_serve(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*args), cwd=cwd, env=serve_env(), capture_output=True, text=True, timeout=WAIT)


def test_agent_config_sets_the_agents_own_config(tmp_path: Path, calculator_upstream):
    url, seen = calculator_upstream
    (tmp_path / "calculator.yaml").write_text("max_turns: 1\nmax_tokens_per_turn: 32\n")
    # The file's path is relative to the caller's working directory.
    args = ("--agent", "calculator", "--agent-config", "calculator.yaml", "--model", "m", "--upstream", url)
    with serve_process(*args, log_path=tmp_path / "serve.log", cwd=tmp_path) as (base, _):
        client = OpenAI(base_url=base, api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 3 + 4?"}])
    assert reply.choices[0].message.content.startswith("<tool_call>")  # one call allowed: its reply is the answer
    assert len(seen) == 1
    line = next(line for line in (tmp_path / "serve.log").read_text().splitlines() if "agent 'calculator'" in line)
    assert "max_turns=1, max_tokens_per_turn=32" in line

    bad = tmp_path / "bad.json"
    for text, said in (
        (
            '{"max_turns": 2,\n "max_turn": 1}',
            f"{bad}:2: agent 'calculator' (CalculatorConfig) has no setting 'max_turn'",
        ),
        ('{"max_turns": "five"}', f"{bad}:1: max_turns: 'five' is not of type int"),
        ('{"max_turns": 0}', "CalculatorConfig.max_turns must be at least 1, got 0"),
    ):
        bad.write_text(text)
        result = run_serve("--agent", "calculator", "--agent-config", str(bad), "--model", "m", "--upstream", url)
        assert result.returncode == 2 and f"error: --agent-config {bad}" in result.stderr, result.stderr
        assert said in result.stderr, result.stderr
    assert len(seen) == 1  # no server started for them


ECHO_AGENT = """
from dataclasses import dataclass

from recurrent.functions import agent_function
from recurrent.interface import WorkflowConfig


@dataclass
class EchoConfig(WorkflowConfig):
    prefix: str = "Q: "


async def echo(sample, client, config):
    reply = await client.chat([{"role": "user", "content": config.prefix + sample["input"]}], 8)
    return reply.text


REGISTER = agent_function("echo", EchoConfig, echo, columns=("input",))
"""


def test_an_agent_file_outside_the_repository_is_served_by_its_path(tmp_path: Path, scripted):
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "echo_agent.py").write_text(ECHO_AGENT)
    args = ("--agent", "agents/echo_agent.py", "--model", scripted.model, "--upstream", scripted.url)
    with serve_process(*args, log_path=tmp_path / "serve.log", cwd=tmp_path) as (base, _):
        request = {"messages": [{"role": "user", "content": "Hello?"}]}
        progress, _, answer, summary = read_stream(base, request, data=True)
    assert answer == scripted.reply and summary == {"agent": "echo", "turns": 1}
    assert [p["call"] for p in progress] == [1]
    assert scripted.bodies[0]["messages"] == [{"role": "user", "content": "Q: Hello?"}]
    assert "agent 'echo' (EchoConfig: prefix='Q: ')" in (tmp_path / "serve.log").read_text()


# ---- an answer that is not the last reply ----


@dataclass
class NoSettings(WorkflowConfig):
    pass


async def restated(sample, client, config):
    """An agent whose answer is not its last reply: training would score text the model never wrote there."""
    reply = await client.chat([{"role": "user", "content": sample["input"]}], 16)
    return f"In short: {reply.text}"


RESTATED = agent_function("restated", NoSettings, restated, columns=("input",))


def test_an_answer_that_is_not_the_last_reply_fails_in_the_endpoint_as_in_the_harness(
    tmp_path: Path, tiny_model_dir, calculator_upstream, monkeypatch
):
    from taskutils.memory_eval import config as cfg
    from taskutils.memory_eval.run import main as harness_main
    from taskutils.memory_eval.scoring import failed

    url, _ = calculator_upstream
    question = "What is 37 * 48?"
    # The harness runs registered agents by name: this one is registered for the test's length.
    from recurrent import interface

    module = types.ModuleType("restated_agent")
    module.REGISTER = RESTATED
    monkeypatch.setitem(sys.modules, "restated_agent", module)
    spec_of = interface.registered_spec
    monkeypatch.setattr(
        interface, "registered_spec", lambda name: "restated_agent" if name == "restated" else spec_of(name)
    )
    registered = cfg.registered_agents
    monkeypatch.setattr(cfg, "registered_agents", lambda: [*registered(), "restated"])
    data = tmp_path / "data"
    data.mkdir()
    (data / "eval_calculator_2.jsonl").write_text(
        json.dumps({"index": 0, "input": question, "context": "", "answers": ["1776"]})
    )
    table = tmp_path / "models.yaml"
    model = {"name": "scripted", "checkpoint": tiny_model_dir, "url": url, "served_name": "m", "concurrency": 1}
    table.write_text(yaml.safe_dump({"models": [model]}))
    argv = ["--table", str(table), "--models", "scripted", "--method", "restated", "--tasks", "calculator"]
    argv += ["--lengths", "2", "--data-dir", str(data), "--results-dir", str(tmp_path / "results")]
    assert harness_main([*argv, "--no-report", "--quiet"]) == 1  # a failed item: the run is incomplete
    (record,) = [json.loads(line) for line in next((tmp_path / "results").rglob("*.jsonl")).read_text().splitlines()]

    with served(url, "m", None, agent=f"{__file__}:RESTATED") as (base, _):
        body = {"messages": [{"role": "user", "content": question}]}
        response = HTTP.post(f"{base}/chat/completions", json=body, timeout=WAIT)
        stream = stream_lines(base, {**body, "stream": True})
        state = counters(base)

    error = response.json()["error"]
    assert response.status_code == 500 and error["code"] == "answer_not_last_reply"
    assert error["message"].startswith("the agent's answer is not its last call's reply (agent 'restated', 1 calls")
    assert record["error"] == f"AnswerNotLastReplyError: {error['message']}"  # the same rule, the same words
    assert record["response"] is None and {k: record[k] for k in failed("calculator")} == failed("calculator")
    (streamed,) = [e for e in sse_events(iter(stream)) if isinstance(e, dict) and "error" in e]
    assert streamed["error"] == error  # streamed: the same error as the stream's last event
    assert (state["failed"], state["completed"]) == (2, 0)


def test_the_write_your_own_agent_pages_serve_command_parses(tmp_path: Path, monkeypatch):
    page = (REPO / "docs" / "write_your_own_agent.md").read_text().split("\n## 1. ", 1)[1]  # the tutorial's agent
    agent_file = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]
    blocks = [block.split() for block in re.findall(r"```sh\n(.*?)```", page, flags=re.DOTALL)]
    (command,) = [words for words in blocks if words[:3] == ["python", "-m", "taskutils.endpoint"]]  # the serve one
    (tmp_path / "my_agent.py").write_text(agent_file)
    (tmp_path / "insist.json").write_text('{"max_tries": 5}')
    monkeypatch.chdir(tmp_path)  # the page's paths are the reader's working directory
    from taskutils.endpoint.cli import parse_args

    args = parse_args(command[3:])
    assert command[:3] == ["python", "-m", "taskutils.endpoint"]
    assert args.register.name == "insist" and args.agent_values == {"max_tries": 5}
    assert not args.register.needs_tokenizer


def test_an_unknown_agent_is_refused_before_any_server_starts(tmp_path: Path):
    result = run_serve("--agent", "calculatr", "--model", "m", "--upstream", "http://x/v1")
    assert result.returncode == 2
    assert "--agent calculatr: no agent 'calculatr'" in result.stderr and "calculator" in result.stderr


pytestmark = pytest.mark.timeout(300)
