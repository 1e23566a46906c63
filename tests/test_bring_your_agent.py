"""docs/write_your_own_agent.md, "Bring the agent you have", run as a reader would: the page's ``openai``-client agent
file runs as plain ``openai`` code against an OpenAI-compatible server that parses tool calls itself (as a hosted
API does), and the same file, by its path, trains through the recording route: one call per ``create``, each
prompt the chat template's rendering of the request, each reply the ids the backend sampled."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import sys
from pathlib import Path

from aiohttp import web
from threaded_http import serve_in_a_thread

from recurrent.async_manager import check_finished, run_session
from recurrent.interface import Reply, load_register
from recurrent.models import load_tokenizer

PAGE = Path(__file__).resolve().parents[1] / "docs" / "write_your_own_agent.md"
CALL_ID = "call_abc"


def section_blocks() -> list[str]:
    section = PAGE.read_text().split("## Bring the agent you have", 1)[1].split("\n## 1. ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def hosted_app(seen: list[dict]) -> web.Application:
    """A hosted model: the question gets an ``add`` call in ``tool_calls``, the tool's result gets it boxed."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            message = {"role": "assistant", "content": f"It is \\boxed{{{results[-1]}}}."}
        else:
            call = {"id": CALL_ID, "type": "function", "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if not results else "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_the_pages_openai_agent_runs_as_plain_openai_code(tmp_path: Path, monkeypatch):
    agent_file, try_it = section_blocks()
    assert agent_file.startswith("# my_openai_agent.py\n")
    (tmp_path / "my_openai_agent.py").write_text(agent_file)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_openai_agent", raising=False)
    seen: list[dict] = []
    printed = io.StringIO()
    with serve_in_a_thread(hosted_app(seen), wait_s=30) as url, contextlib.redirect_stdout(printed):
        exec(compile(try_it, "write_your_own_agent.md:bring", "exec"), {"URL": url, "MODEL": "m"})
    assert printed.getvalue() == "It is \\boxed{42}.\n"
    assert [len(body["messages"]) for body in seen] == [1, 3] and all(body["tools"] for body in seen)
    assert seen[1]["messages"][2] == {"role": "tool", "tool_call_id": CALL_ID, "content": "42"}


class TokenBackend:
    """A token backend as training has: the reply ids of the scripted texts, plus the end token."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        self.tokenizer, self.replies, self.sampled = tokenizer, list(replies), []

    async def chat(self, messages, max_tokens, *, prompt_ids=None, **sampling) -> Reply:
        assert not sampling
        ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        self.sampled.append(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Reply(text, "stop", ids, len(prompt_ids), len(ids), prompt_ids=list(prompt_ids))


def test_the_same_file_trains_through_the_recording_route(tmp_path: Path, tiny_model_dir):
    (tmp_path / "my_openai_agent.py").write_text(section_blocks()[0])
    tokenizer = load_tokenizer(tiny_model_dir)
    call = '<tool_call>{"name": "add", "arguments": {"a": 17, "b": 25}}</tool_call>'
    backend = TokenBackend(tokenizer, [call, "It is \\boxed{42}."])
    register = load_register(str(tmp_path / "my_openai_agent.py"))
    episode = register.for_training({}, tokenizer).episode({"input": "What is 17 + 25?"})
    asyncio.run(run_session(episode, backend))
    check_finished(episode)
    question = {"role": "user", "content": "What is 17 + 25?\nPut your final answer in \\boxed{}."}
    # The tiny model's template cannot render tool calls: the call and its result are written in the Qwen format.
    second = [
        question,
        {"role": "assistant", "content": call},
        {"role": "user", "content": "<tool_response>42</tool_response>"},
    ]
    expected = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
        for m in ([question], second)
    ]
    assert [r.turn.prompt_ids for r in episode.history] == [list(ids) for ids in expected]
    assert [r.reply.token_ids for r in episode.history] == backend.sampled
    assert episode.answer == "It is \\boxed{42}."
