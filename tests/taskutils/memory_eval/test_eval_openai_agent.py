"""An agent written against the ``openai`` client (tests/openai_user_agent.py) is a method of the harness by its path,
unmodified: its requests reach the upstream with their tools and tool messages, and its tool calls are read from
the reply whether the upstream leaves them in the text (no tool parser: ``transformers serve``, vLLM without one)
or parses them itself (``vllm serve --tool-call-parser hermes``, hosted APIs)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from eval_fixtures import read_lines
from threaded_http import serve_in_a_thread

from experiments.calculator.task import write
from taskutils.memory_eval.run import main as run_main

AGENT_FILE = Path(__file__).resolve().parents[2] / "openai_user_agent.py"
QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


def upstream_app(seen: list[dict], parses_calls: bool) -> web.Application:
    """The model: a draft request gets a calculator call on the question's operands, a check gets the tool's
    result boxed. ``parses_calls``: the call comes back in ``tool_calls`` (as vLLM's parser returns it), else in
    the text."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        message: dict = {"role": "assistant"}
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            message["content"] = f"\\boxed{{{results[-1]}}}"
        else:
            a, op, b = QUESTION.search(body["messages"][-1]["content"]).groups()
            arguments = json.dumps({"expression": f"{a} {op} {b}"})
            if parses_calls:
                call = {
                    "id": "chatcmpl-tool-1",
                    "type": "function",
                    "function": {"name": "calculate", "arguments": arguments},
                }
                message.update(content=None, tool_calls=[call])
            else:
                message["content"] = f'<tool_call>{{"name": "calculate", "arguments": {arguments}}}</tool_call>'
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": body["model"], "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.mark.parametrize("parses_calls", [False, True], ids=["calls_in_text", "calls_parsed_upstream"])
def test_an_openai_client_agent_file_is_a_method_of_the_harness(
    tmp_path: Path, tiny_model_dir, monkeypatch, parses_calls
):
    monkeypatch.chdir(tmp_path)
    shutil.copy(AGENT_FILE, tmp_path / "my_openai_agent.py")
    write(tmp_path / "data", {"test": 3}, seed=0)
    table = tmp_path / "models.yaml"
    seen: list[dict] = []
    with serve_in_a_thread(upstream_app(seen, parses_calls), wait_s=30) as url:
        model = {"name": "scripted", "checkpoint": tiny_model_dir, "url": url, "served_name": "m", "concurrency": 1}
        table.write_text(yaml.safe_dump({"models": [model]}))
        argv = [
            "--table",
            str(table),
            "--models",
            "scripted",
            "--method",
            "my_openai_agent.py",
            "--tasks",
            "calculator",
        ]
        argv += ["--lengths", "2", "--data-dir", "data/eval/test", "--results-dir", "results", "--no-report", "--quiet"]
        assert run_main(argv) == 0
    lines = read_lines(tmp_path / "results" / "calculator_2" / "scripted__my_openai_agent.jsonl")
    assert len(lines) == 3 and all(x["turns"] == 2 and x["strict"] == 1 and x["error"] is None for x in lines), lines
    drafts, checks = seen[0::2], seen[1::2]
    assert all(body["tools"][0]["function"]["name"] == "calculate" and body["model"] == "m" for body in drafts)
    assert all("tools" not in body for body in checks)
    for draft, check in zip(drafts, checks, strict=True):
        a, op, b = QUESTION.search(draft["messages"][-1]["content"]).groups()
        called, result = check["messages"][1:3]
        assert called["role"] == "assistant" and json.loads(called["tool_calls"][0]["function"]["arguments"]) == {
            "expression": f"{a} {op} {b}"
        }
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert result == {"role": "tool", "tool_call_id": called["tool_calls"][0]["id"], "content": str(expected)}
